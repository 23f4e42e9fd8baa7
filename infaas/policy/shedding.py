"""Shedding at the door: refuse, before a query's body is read, the share of queries that
admission is refusing anyway (pure: outcomes and the clock come in as arguments).

Admission (the router) refuses a query only after its body was read, parsed and routed: on a slow
front end that costs ~0.8 ms a refusal, as much as an answer. Past ~2× what the service sustains,
refusing took the whole event loop; the loop's lag went into every answer and into the path's
overhead estimate, which refused more: measured on an AVX2 EPYC at 2× overload, 32-60 queries
answered a second out of 380-520 sustained, 26-54 % of them late. A refusal at the door costs the
authentication and the error reply only.

The share refused at the door follows what admission does with the queries that pass it (integral
control): each admission refusal raises it by ``gain × (1 - keep)``, each admitted query lowers it
by ``gain × keep``; and it decays at all times, with time constant `decay_s`. Under a steady
overload it settles where admission's refusals hold it up against the decay: admission keeps the
last word (it knows the queues and the deadlines) and refuses some of what reaches it (`keep`,
plus what the decay lets through), the door takes the bulk. When admission stops refusing the
share falls by a factor e every `decay_s`, however few queries the door lets through meanwhile. (The share
used to decay only once admission had seen no query for 0.5 s, and to fall by ``gain × keep``
per admitted query otherwise: at a share of 0.95 the few admitted queries took seconds to bring
it down. One stall of ~60 ms at half the load the service sustains got ~190 queries refused by
admission in 0.5 s, and the door then shed 1 350 of the next 4 s's queries, measured
2026-12-03.) Which arrivals are refused is deterministic (a credit counter), so a share of 0.25
refuses every fourth query.

A refusal raises the share only while the front end's event loop is busy (`loop_busy`: it ran a
timer 10 ms late within the last second, `LoopWatch`): admission also refuses
queries for their own targets (a tight latency on a busy variant), and the door, which has not
read the targets, would then shed the tenant's other queries, which admission would take. Only
when refusing is what costs the front end its loop is the door's coarse refusal worth it. (A
threshold on the loop's average lag instead oscillated: the door's shedding brought the average
under it, the share fell, and the lag came back: 71 % in SLO against 95 %.)

And only for a refusal with room to spare: the query's target at least `min_margin_ms` beyond
what an idle fleet would answer it in. A target a few ms from its variant's profile is refused
whenever the path runs a little slow (a collection, a neighbour on the core), and that says
nothing about the load: one client trying near-edge targets in turn on a noisy CI host had a fifth
of its queries refused at the door, even those no variant could serve (422 by rights). (Counting
the front end's queries in flight instead kept the door open in a collapse: admitted queries are
few in flight when the loop answers few.)"""

from __future__ import annotations

import math

__all__ = ["DoorShedder", "LoopWatch", "RefusalPacer"]


class DoorShedder:
    """The share of queries to refuse at the door, learned from admission's outcomes."""

    def __init__(
        self,
        *,
        keep: float = 0.1,
        gain: float = 0.02,
        max_share: float = 0.95,
        decay_s: float = 1.0,
        min_margin_ms: float = 10.0,
    ) -> None:
        if not 0.0 < keep < 1.0:
            raise ValueError("keep must be in (0, 1)")
        if not 0.0 < gain <= 1.0 or not 0.0 <= max_share < 1.0 or decay_s <= 0.0:
            raise ValueError("gain in (0, 1], max_share in [0, 1), decay_s > 0")
        self._keep = keep
        self._gain = gain
        self._max_share = max_share
        self._decay_s = decay_s
        self._min_margin_ms = min_margin_ms
        self._share = 0.0
        self._credit = 0.0
        self._last_s = 0.0
        self.retry_after_s = 0.0
        """The last admission refusal's `retry_after_s` (what a door refusal tells the client)."""

    @property
    def share(self) -> float:
        return self._share

    def observe(
        self,
        refused: bool,
        now_s: float,
        *,
        loop_busy: bool,
        margin_ms: float = 0.0,
        retry_after_s: float = 0.0,
    ) -> None:
        """Admission's decision on one query that passed the door, whether the loop is busy,
        and for a refusal, its target's margin over the idle prediction (0: unknown)."""
        self._decay(now_s)
        raise_share = refused and loop_busy and margin_ms >= self._min_margin_ms
        step = self._gain * ((1.0 - self._keep) if raise_share else -self._keep)
        self._share = min(self._max_share, max(0.0, self._share + step))
        if refused:
            self.retry_after_s = retry_after_s

    def admit(self, now_s: float) -> bool:
        """Whether the query arriving now goes on to admission (False: refuse it at the door)."""
        self._decay(now_s)
        if self._share <= 0.0:
            return True
        self._credit += self._share
        if self._credit >= 1.0:
            self._credit -= 1.0
            return False
        return True

    def _decay(self, now_s: float) -> None:
        if now_s > self._last_s:
            if self._share > 0.0:
                self._share *= math.exp(-(now_s - self._last_s) / self._decay_s)
            self._last_s = now_s


class LoopWatch:
    """Whether the event loop is busy: fed the times a timer set every `tick_s` really ran, it
    says busy for `hold_s` after one that ran `late_s` late or more, and while the next one is
    that late already (the loop is in a long pass now).

    Why the second: at a flood's onset the loop's first passes took 47-68 ms each, every arrival
    in them judged by admission at full price, and the door learned to refuse only once a tick
    had come back late, a pass or two later; a batch that finished meanwhile was answered up to
    227 ms after its queries were admitted, and queries queued behind it were answered 504
    (docs/benchmarks.md, "Early drop")."""

    def __init__(self, tick_s: float = 0.01, late_s: float = 0.01, hold_s: float = 1.0) -> None:
        self.tick_s = tick_s
        self.late_s = late_s
        self._hold_s = hold_s
        self._last_s: float | None = None
        self._busy_until_s = float("-inf")

    def tick(self, now_s: float) -> None:
        if self._last_s is not None and now_s - self._last_s - self.tick_s >= self.late_s:
            self._busy_until_s = now_s + self._hold_s
        self._last_s = now_s

    def busy(self, now_s: float) -> bool:
        if now_s < self._busy_until_s:
            return True
        return self._last_s is not None and now_s - self._last_s - self.tick_s >= self.late_s

    def mark(self, now_s: float) -> None:
        """Busy from now for `hold_s`, as after a late tick: the front end put work off (a
        `RefusalPacer` deferred a read), so its loop has more to do than time to do it in."""
        self._busy_until_s = max(self._busy_until_s, now_s + self._hold_s)


class RefusalPacer:
    """How much of the front end's time refusing at the door may take while answers are in
    flight: a bucket of seconds, refilled at `share` of the wall clock up to `burst_s`, that
    each refusing read spends by its measured cost. While it is empty the door reads no more of
    a refused connection's requests (TCP holds them at the client) until it has refilled.

    Why: a refusal costs the front end ~75-95 µs, so a 10x flood (~5 000 arrivals/s) took half
    its core, and in bursts: one pass of the event loop over 256 flood connections with data
    waiting refused them all before it ran a single answer's next step, ~20 ms a pass, and an
    answer takes several passes. Admitted queries then waited 40-100 ms in the loop (the path's
    overhead estimate said so, and admission refused the quiet tenant as busy). Paced, a pass
    holds at most `burst_s` of refusals; the flood's excess waits in its own sockets, and is
    refused later (or when nothing admitted is in flight, at once)."""

    def __init__(self, share: float = 0.3, burst_s: float = 0.002) -> None:
        if not 0.0 < share <= 1.0 or burst_s <= 0.0:
            raise ValueError("share in (0, 1], burst_s > 0")
        self.share = share
        self._burst_s = burst_s
        self._tokens_s = burst_s
        self._at_s: float | None = None

    def _refill(self, now_s: float) -> None:
        if self._at_s is not None and now_s > self._at_s:
            self._tokens_s = min(self._burst_s, self._tokens_s + (now_s - self._at_s) * self.share)
        self._at_s = now_s if self._at_s is None else max(self._at_s, now_s)

    def spend(self, cost_s: float, now_s: float) -> None:
        """A refusing read took `cost_s` of the front end's time, ending now."""
        self._refill(now_s)
        self._tokens_s -= cost_s

    def ready(self, now_s: float) -> bool:
        """Whether a refused connection's next read may go ahead now."""
        self._refill(now_s)
        return self._tokens_s >= -1e-9  # `wait_s` later, whatever the float rounding

    def wait_s(self, now_s: float) -> float:
        """How long until `ready` (0: it is)."""
        self._refill(now_s)
        return max(0.0, -self._tokens_s / self.share)
