"""How many admitted queries one front end keeps in flight: a limit learned from late answers
(pure: outcomes and the clock come in as arguments).

Admission (the router) predicts each query's latency from profiles, queues and the path's
measured overhead, and refuses what it predicts late. Under overload those predictions fail
together: every step of an admitted query waits for an event-loop iteration, and an iteration
grows with the queries in flight (a batch of 16 answers comes back at once, and their handlers,
replies and journal records run back to back). Measured in the overload test (2026-12-04, one
front end at 2× what it sustains): the late answers had been predicted at 34 ms p50 for a 50 ms
target and answered in 71 ms — queue 20 ms, batch round trip 14 ms, back to the handler 9 ms,
journal 27 ms — while the answers in time had 1.3 ms of queue.

So admission also holds the number of queries in flight under a limit that follows the answers'
verdicts, as TCP's window follows losses (additive increase, multiplicative decrease): an answer
in time raises it by 1/limit while the limit is full (TCP grows only a window in use), a late answer (or
one dropped at its deadline) cuts it by `backoff`, at most once per `cooldown_s` (the late answers
of one slow batch are one signal). It never falls below `min_limit`: a few clients never meet it,
whatever their targets (a client trying near-edge targets gets some late answers on any host).

`late_for_load` is the verdict. An answer counts as late for the load when it missed its target
though predicted with a fifth of it to spare, and also when it came more than a quarter of its
target after its prediction, in time or not: queues grow before they miss, and a limit cut on
misses alone cuts after the damage.

Both rules came from the overload test (2026-12-04, an AMD EPYC, 2× what the front end
sustains, 50 ms targets after 2 000 queries from 64 clients with 60 s targets). Grown while half
full, the limit rose from 64 to ~95 under those 64 lenient clients, let in the first ~130
overload queries at once (predicted at 8 ms, answered in 54) and gave 96.7 and 97.2 % of admitted
answers in SLO; with the early verdict too, 98.1-98.8 % (3 runs); with both rules, 99.6 and
99.9 % at 1 146 and 1 356 answered/s, the same throughput.
"""

from __future__ import annotations

__all__ = ["ConcurrencyLimit", "late_for_load"]


def late_for_load(latency_ms: float, target_ms: float, predicted_ms: float, queued_ms: float = 0.0) -> bool:
    """Whether an answer tells the limit the front end holds too many queries (module docstring).
    A miss by a target at the edge of its prediction is the prediction's noise, on any host:
    counted, one tenant's near-edge targets would cut every tenant's limit. Unless it was
    predicted to wait (`queued_ms`) a quarter of its target or more behind other queries: then a
    shorter queue would have met it. Under a sustained overload admission fills the queue to
    the edge of the target, and the noise of those edge predictions made 1-6 % of the answers
    late while the limit stood still (load step and 10x overload, 2026-12-05)."""
    if latency_ms - predicted_ms > 0.25 * target_ms:
        return True
    if latency_ms <= target_ms:
        return False
    return predicted_ms <= 0.8 * target_ms or queued_ms >= 0.25 * target_ms


class ConcurrencyLimit:
    """See the module docstring. `try_admit` takes a slot, `release` gives it back with the verdict."""

    def __init__(
        self,
        *,
        initial: float = 64.0,
        min_limit: float = 8.0,
        max_limit: float = 4096.0,
        backoff: float = 0.8,
        cooldown_s: float = 0.05,
    ) -> None:
        if not 1.0 <= min_limit <= initial <= max_limit:
            raise ValueError("need 1 <= min_limit <= initial <= max_limit")
        if not 0.0 < backoff < 1.0 or cooldown_s < 0.0:
            raise ValueError("backoff in (0, 1), cooldown_s >= 0")
        self._min = min_limit
        self._max = max_limit
        self._backoff = backoff
        self._cooldown_s = cooldown_s
        self.limit = initial
        self.in_flight = 0
        self._cut_s = float("-inf")

    @property
    def full(self) -> bool:
        """Whether a query arriving now would be refused (the door asks, before reading it)."""
        return self.in_flight >= int(self.limit)

    def try_admit(self) -> bool:
        """Take a slot for a query, or False: the limit is reached (refuse it as busy)."""
        if self.full:
            return False
        self.in_flight += 1
        return True

    def release(self, late: bool | None, now_s: float) -> None:
        """Give back a slot: `late` is the verdict (None: no answer that says anything about
        the load, e.g. refused by the router after the slot was taken)."""
        self.in_flight = max(0, self.in_flight - 1)
        if late:
            if now_s - self._cut_s >= self._cooldown_s:
                self._cut_s = now_s
                self.limit = max(self._min, self.limit * self._backoff)
        elif late is not None and self.in_flight + 1 >= int(self.limit):
            # Raised only while the limit is what holds the traffic back (the slot given back was
            # its last): clients that never fill it must not grow it without bound, nor to what
            # their lenient targets allow and another tenant's strict ones do not.
            self.limit = min(self._max, self.limit + 1.0 / self.limit)
