"""The cores of this host that the front end leaves to replicas: whether a second variant on
the same cores would add capacity or only slow down the one already busy (`Router`, "a core
for each thread").

Counted from the host's cores, not from Ray's logical CPUs: those count what replicas hold, not
what the front end uses (the load-step test gives the local Ray 6 logical CPUs on 2 real
cores)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

import psutil

__all__ = ["FRONT_END_FLOOR_CORES", "FixedHostCpu", "HostCpu", "MeasuredHostCpu"]

FRONT_END_FLOOR_CORES = 0.25
"""The least the front end is counted as using while it serves: the share of a core it takes to
admit and answer what the replicas run. After a quiet spell its measured use is ~0, and on 2
cores with one replica busy that left exactly one "spare" core for a second replica, which the
burst then took from the front end itself."""


class HostCpu(Protocol):
    def sample(self, now_s: float) -> None:
        """Called as queries come (`now_s` monotonic): measures at most once per window."""
        ...

    def spare_cores(self) -> float:
        """This host's cores less what the front end used lately."""
        ...


def _host_cores() -> float:
    """The cores this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return float(len(os.sched_getaffinity(0)))
    return float(os.cpu_count() or 1)


def _own_cpu_s() -> float:
    """This process's cumulative CPU seconds (user + system, all its threads)."""
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


class MeasuredHostCpu:
    """The host's cores (those this process may run on) less this process's CPU use over the last
    window of `window_s` (at least `FRONT_END_FLOOR_CORES`). `cpu_s` reads the process's
    cumulative CPU seconds (psutil's, unless a test gives its own); `cores` defaults to the
    host's."""

    def __init__(
        self, window_s: float = 0.25, cpu_s: Callable[[], float] | None = None, cores: float | None = None
    ) -> None:
        self._window_s = window_s
        self._cpu_now_s = cpu_s if cpu_s is not None else _own_cpu_s
        self._cores = cores if cores is not None else _host_cores()
        self._at_s: float | None = None
        self._cpu_s = 0.0
        self._used = 0.0

    def sample(self, now_s: float) -> None:
        if self._at_s is not None and now_s - self._at_s < self._window_s:
            return
        cpu_s = self._cpu_now_s()
        if self._at_s is not None:
            self._used = max(0.0, (cpu_s - self._cpu_s) / (now_s - self._at_s))
        self._at_s, self._cpu_s = now_s, cpu_s

    def spare_cores(self) -> float:
        return self._cores - max(FRONT_END_FLOOR_CORES, self._used)


class FixedHostCpu:
    """A host whose spare cores are what the test sets (`spare`)."""

    def __init__(self, spare: float) -> None:
        self.spare = spare

    def sample(self, now_s: float) -> None:
        pass

    def spare_cores(self) -> float:
        return self.spare
