"""How many of this host's cores are idle, measured: whether a second variant on the same cores
would add capacity or only slow down the one already busy (`Router`, "a core for each thread").

Measured, not read from Ray's logical CPUs: those count what replicas hold, not what the front
end, the load and other processes use (the load-step test gives the local Ray 6 logical CPUs on
2 real cores)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

import psutil

__all__ = ["FixedHostCpu", "HostCpu", "MeasuredHostCpu"]


class HostCpu(Protocol):
    def sample(self, now_s: float, busy: bool) -> None:
        """Called as queries come: `busy` says whether replicas have batches running now."""
        ...

    def idle_cores(self) -> float:
        """Cores idle on this host the last time its replicas were busy (0 … its core count)."""
        ...


def _idle_cpu_s() -> float:
    """The host's cumulative idle CPU seconds, all cores together."""
    times = psutil.cpu_times()
    return float(times.idle + getattr(times, "iowait", 0.0))


class MeasuredHostCpu:
    """The host's idle CPU time (psutil: idle + iowait on Linux) over windows of `window_s`
    during which replicas were busy, read at most once per window, so sampling per query is
    cheap. Only busy windows count: the question is what is left beside the work already
    running, and a quiet spell before a burst would say "all of it" (in the overload test the
    first 250 ms of a burst after a pause took the spill that this rule exists to refuse).
    `idle_s` reads the cumulative idle CPU seconds (psutil's, unless a test gives its own)."""

    def __init__(self, window_s: float = 0.25, idle_s: Callable[[], float] | None = None) -> None:
        self._window_s = window_s
        self._idle_now_s = idle_s if idle_s is not None else _idle_cpu_s
        self._at_s: float | None = None
        self._idle_s = 0.0
        self._value = float(os.cpu_count() or 1)

    def sample(self, now_s: float, busy: bool) -> None:
        if not busy:
            self._at_s = None
            return
        if self._at_s is not None and now_s - self._at_s < self._window_s:
            return
        idle_s = self._idle_now_s()
        # A window longer than two may have spanned a quiet spell with no query to see it.
        if self._at_s is not None and now_s - self._at_s <= 2 * self._window_s:
            self._value = max(0.0, (idle_s - self._idle_s) / (now_s - self._at_s))
        self._at_s, self._idle_s = now_s, idle_s

    def idle_cores(self) -> float:
        return self._value


class FixedHostCpu:
    """A host whose idle cores are what the test sets (`idle`)."""

    def __init__(self, idle: float) -> None:
        self.idle = idle

    def sample(self, now_s: float, busy: bool) -> None:
        pass

    def idle_cores(self) -> float:
        return self.idle
