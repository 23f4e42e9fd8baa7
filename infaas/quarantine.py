"""Unhealthy variants: set aside after repeated failures, retried after a growing backoff.

A variant whose artifact is corrupt on disk, or whose batches keep crashing their worker, would
otherwise stay the router's cheapest choice and turn every query to it into a 503. After
`after_failures` failed loads or batches in a row it is quarantined: the router leaves it out (and
`Snapshot.excluded` says why) for `backoff_s`, doubled on each relapse up to `max_backoff_factor`
times. When the backoff ends the variant is on probation: one success clears its record, one more
failure quarantines it again, for twice as long.

Pure bookkeeping: the time comes in as `now_s` (monotonic seconds); nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Quarantine", "Verdict"]


@dataclass
class _Record:
    failures: int = 0  # in a row
    strikes: int = 0  # quarantines so far, for the backoff
    until_s: float | None = None  # quarantined until then
    reason: str = ""


@dataclass(frozen=True)
class Verdict:
    """A variant just quarantined: for how long and why."""

    variant: str
    until_s: float
    backoff_s: float
    reason: str


class Quarantine:
    def __init__(
        self, after_failures: int = 3, backoff_s: float = 30.0, max_backoff_factor: int = 32
    ) -> None:
        self.after_failures = after_failures
        self.backoff_s = backoff_s
        self.max_backoff_factor = max_backoff_factor
        self._records: dict[str, _Record] = {}
        self.version = 0
        """Bumped whenever the set of quarantined variants changes (readers cache on it)."""
        self.next_change_s = float("inf")
        """The earliest end of a quarantine: readers must look again from then on."""

    def failure(self, variant: str, reason: str, now_s: float) -> Verdict | None:
        """Count a failed load or batch; the `Verdict` when this one quarantines the variant."""
        rec = self._records.setdefault(variant, _Record())
        if rec.until_s is not None and now_s < rec.until_s:
            return None  # already set aside (a batch sent before the quarantine began)
        rec.failures += 1
        rec.reason = reason
        if rec.failures < self.after_failures:
            return None
        backoff_s = self.backoff_s * min(2**rec.strikes, self.max_backoff_factor)
        rec.strikes += 1
        rec.until_s = now_s + backoff_s
        # On probation after this: the next failure alone sets it aside again.
        rec.failures = self.after_failures - 1
        self.version += 1
        self.next_change_s = min(self.next_change_s, rec.until_s)
        return Verdict(variant, rec.until_s, backoff_s, reason)

    def success(self, variant: str) -> None:
        """A batch or load of `variant` worked: its record is cleared."""
        if variant in self._records:
            rec = self._records.pop(variant)
            if rec.until_s is not None:
                self.version += 1

    def blocked(self, now_s: float) -> dict[str, str]:
        """Variants quarantined at `now_s`, with why and until when."""
        if now_s >= self.next_change_s:
            self._expire(now_s)
        return {
            name: f"quarantined after {self.after_failures} failures in a row, retried in "
            f"{rec.until_s - now_s:.0f} s (last: {rec.reason})"
            for name, rec in self._records.items()
            if rec.until_s is not None
        }

    def _expire(self, now_s: float) -> None:
        for rec in self._records.values():
            if rec.until_s is not None and now_s >= rec.until_s:
                rec.until_s = None
        pending = [r.until_s for r in self._records.values() if r.until_s is not None]
        self.next_change_s = min(pending, default=float("inf"))
        self.version += 1
