"""The *path's overhead*: what the service adds on top of the profiled run time (parsing, the
batching wait beyond prediction, the Ray hop, the reply), measured on every answered query as
``latency_ms - (profile p99 + predicted queueing)`` and kept, per path (the front end, or a Ray
runtime family), as a high quantile over a sliding window (`OverheadTracker`). Adding that
quantile to every prediction is what makes ``slo_met`` hold for the great majority of answers,
not just the model's own p99.

The router (`infaas.router`) keeps one tracker per path and feeds it every answered query.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DEFAULT_OVERHEAD_MS", "OverheadTracker"]

DEFAULT_OVERHEAD_MS = 1.0
"""Overhead assumed until enough answers are measured: the Ray hop is ~0.7 ms here (DESIGN.md)."""


class OverheadTracker:
    """A high quantile of the prediction's residual over the last `window` answers of the last
    `short_age_s` seconds when they hold `short_min_samples` answers (a busy path, or probes
    after a stall), else of the last `max_age_s` (pure: residuals and times come in as numbers).

    With fewer than `min_samples` answers in `max_age_s` — every query refused because of the estimate,
    or no traffic — the estimate decays towards `prior_ms` with time constant `decay_s` instead of
    dropping to it: dropping at once admitted a whole burst again, whose late answers sent the
    estimate back up, refusing everything for the next `max_age_s` (a bang-bang cycle measured at
    ~2 s under 10× overload). Decaying, admission opens gradually and settles where the answers
    admitted meet the estimate. `current` refreshes a stale estimate on read, so it moves even
    when nothing is answered.

    **A stall that has ended is let go** (`clear_run` > 0): when the window's late answers form one
    unbroken run (an episode: a shared core taken away, a pause of the loop, and every answer in
    flight came late together) and the newest `clear_run` answers after it all came within
    `stall_ms` (or their own level, if higher) of what they predicted, the estimate is the
    quantile of the answers since the episode. Held instead, the episode refused every query
    with a tight target for the rest of the window, after the stall was over, whose late answers
    refusing could no longer prevent (one of three replays of `bench_adaptive`'s trace on this
    2-core machine: 501 refusals at 150 q/s, every one "its path ~10-22 ms beyond its profile";
    docs/benchmarks.md). Late answers spread over the window (a tail, not an episode) still set
    the quantile: they are what the next query risks."""

    def __init__(
        self,
        prior_ms: float = DEFAULT_OVERHEAD_MS,
        *,
        quantile: float = 0.99,
        window: int = 2048,
        max_age_s: float = 1.0,
        short_age_s: float = 0.25,
        short_min_samples: int = 8,
        min_samples: int = 32,
        refresh_every: int = 16,
        decay_s: float = 0.5,
        stale_s: float = 0.05,
        clear_run: int = 8,
        stall_ms: float = 2.0,
    ) -> None:
        if not 0.0 < quantile <= 1.0:
            raise ValueError("quantile must be in (0, 1]")
        if window < 1:
            raise ValueError("window must hold at least one answer")
        self._prior_ms = prior_ms
        self._quantile = quantile
        self._max_age_s = max_age_s
        self._short_age_s = min(short_age_s, max_age_s)
        self._short_min_samples = short_min_samples
        self._min_samples = min_samples
        self._refresh_every = refresh_every
        self._decay_s = decay_s
        self._stale_s = stale_s
        self._clear_run = clear_run
        self._stall_ms = stall_ms
        self._refreshed_s = float("-inf")
        # A ring buffer in two arrays, not a deque of tuples: `refresh` then filters and takes
        # the quantile without a Python loop over the window (~1 ms for 2 048 tuples, paid every
        # `refresh_every` answers, cost tens of µs per answer on the query path).
        self._at_s = np.zeros(window, dtype=np.float64)
        self._residual_ms = np.zeros(window, dtype=np.float64)
        self._held = 0  # slots filled so far (≤ window)
        self._next = 0  # slot the next answer goes to
        self._since_refresh = 0
        self._value_ms = prior_ms
        self.measured = False
        """Whether the estimate is a quantile of enough answers, not a decay towards the prior."""
        self.last_s = float("-inf")
        """When the last answer was recorded."""

    @property
    def value_ms(self) -> float:
        return self._value_ms

    @property
    def samples(self) -> int:
        """Answers held in the window (recent or not: age is applied when the estimate is made)."""
        return self._held

    def observe(self, residual_ms: float, now_s: float) -> None:
        """Record one answer's ``latency_ms - (profiled run time + predicted queueing)``."""
        i = self._next
        self.last_s = now_s
        self._at_s[i] = now_s
        self._residual_ms[i] = residual_ms
        self._next = (i + 1) % self._at_s.shape[0]
        self._held = max(self._held, i + 1)
        self._since_refresh += 1
        if self._since_refresh >= self._refresh_every:
            self.refresh(now_s)

    def refresh(self, now_s: float) -> None:
        """Recompute the estimate (every `refresh_every` answers, not on each: a quantile over
        2 048 floats costs ~30 µs)."""
        self._since_refresh = 0
        elapsed_s, self._refreshed_s = now_s - self._refreshed_s, now_s
        held = self._held
        at_s = self._at_s[:held]
        # The freshest `short_age_s` when it holds enough answers (a busy path), else `max_age_s`.
        # One stall of a few ms puts a handful of answers in the tail: judged over a whole second,
        # at 500 queries/s that p99 refused every query for the second after it (558 of one
        # burst's queries in bench_adaptive, a replay the service now answers in full).
        since_s = now_s - self._short_age_s
        recent = self._residual_ms[:held][at_s >= since_s]
        if recent.shape[0] < self._short_min_samples:
            since_s = now_s - self._max_age_s
            recent = self._residual_ms[:held][at_s >= since_s]
            if recent.shape[0] < self._min_samples:
                weight = math.exp(-max(0.0, elapsed_s) / self._decay_s) if self._decay_s > 0 else 0.0
                self._value_ms = self._prior_ms + (self._value_ms - self._prior_ms) * weight
                self.measured = False
                return
        if self._clear_run > 0 and recent.shape[0] > self._clear_run:
            after = self._after_episode(recent, since_s)
            if after is not None:
                recent = after
        self._value_ms = max(0.0, _quantile(recent, self._quantile))
        self.measured = True

    def _after_episode(self, recent: np.ndarray, since_s: float) -> np.ndarray | None:
        """The residuals recorded after the window's one episode of late answers, when the newest
        `clear_run` all came in clear of it; None when there is no such episode (see the class
        docstring). `recent`: the window's residuals since `since_s`, more than `clear_run`."""
        window = self._at_s.shape[0]
        # The ring's slots from the one written last, backwards (`_next` is `_held` until it wraps).
        newest = (self._next - 1 - np.arange(self._clear_run)) % window
        level = float(self._residual_ms[newest].max())
        late_ms = level + max(self._stall_ms, level)
        if not (recent > late_ms).any():
            return None  # the usual case, found without ordering the window
        order = (self._next - 1 - np.arange(self._held)) % window
        residual = self._residual_ms[order][self._at_s[order] >= since_s]
        late = np.flatnonzero(residual > late_ms)
        if late[-1] - late[0] != late.shape[0] - 1:
            return None  # more than one run of late answers: a tail, not an episode
        return residual[: late[0]]

    def current(self, now_s: float) -> float:
        """The estimate, refreshed first when older than `stale_s`."""
        if now_s - self._refreshed_s >= self._stale_s:
            self.refresh(now_s)
        return self._value_ms


def _quantile(values: np.ndarray, q: float) -> float:
    """`np.quantile(values, q)` (its default, linear interpolation) by one partial sort: the same
    number at a fraction of the cost, which is mostly `np.quantile`'s own argument handling."""
    pos = q * (values.shape[0] - 1)
    lo = int(pos)
    hi = min(lo + 1, values.shape[0] - 1)
    part = np.partition(values, (lo, hi))
    return float(part[lo] + (part[hi] - part[lo]) * (pos - lo))
