"""Demand per variant as the meter sees it, and one replica's capacity: what the autoscaler
(`infaas.autoscaler`) and the simulator (`infaas.sim.engine`) build a `FleetSnapshot` from.

`DemandWindow` is fed one `MeterRecord` per answered, refused or failed query (a meter listener)
and keeps per-second buckets over its window; `merge_totals` / `as_demand` combine the windows of
several front ends (`infaas.peers`). No I/O, no clock of its own: times are the records' `at_s`
and the caller's `now_s`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infaas.types import Profile

if TYPE_CHECKING:
    from infaas.metering import MeterRecord

__all__ = [
    "Demand",
    "DemandWindow",
    "as_demand",
    "capacity_rows_per_s",
    "merge_totals",
]

_PRESSURE_OUTCOMES = frozenset({"slo_missed", "overloaded", "deadline_exceeded"})


def capacity_rows_per_s(profile: Profile, batch_rows: float | None = None) -> float:
    """One replica's rows/s when it runs batches of `batch_rows` (its p50 there); with no batch
    size, the best throughput the profiler measured."""
    if batch_rows is None:
        return max((p.throughput_qps for p in profile.points), default=0.0)
    rows = max(1, round(batch_rows))
    ms = profile.latency_ms(rows, "p50")
    return rows * 1000.0 / ms if 0.0 < ms < math.inf else 0.0


@dataclass(frozen=True)
class Demand:
    rows_per_s: float = 0.0
    pressure_rows_per_s: float = 0.0  # answered late, refused or expired
    latency_target_ms: float = math.inf  # tightest asked
    required_accuracy: float = 0.0  # highest asked
    mean_batch_rows: float | None = None  # request-weighted, over answered queries


class DemandWindow:
    """Per variant, one-second buckets over the last `window_s` seconds of what the meter saw.

    Times are the records' `at_s` (wall clock), so the autoscaler's clock must be the same."""

    def __init__(self, window_s: float = 5.0) -> None:
        if window_s < 1.0:
            raise ValueError("window_s must be at least one second")
        self.window_s = window_s
        # variant → second → [rows, pressure rows, min latency target, max accuracy, Σ batch rows, answers]
        self._buckets: dict[str, dict[int, list[float]]] = {}
        self.last_seen_s: dict[str, float] = {}

    def listener(self, record: MeterRecord) -> None:
        # Failures of a routed variant count too: they are demand its replicas did not meet.
        if not record.variant:
            return
        buckets = self._buckets.setdefault(record.variant, {})
        second = int(record.at_s)
        b = buckets.get(second)
        if b is None:
            b = buckets[second] = [0.0, 0.0, math.inf, 0.0, 0.0, 0.0]
        b[0] += record.rows
        if record.outcome in _PRESSURE_OUTCOMES:
            b[1] += record.rows
        b[2] = min(b[2], record.latency_target_ms)
        b[3] = max(b[3], record.min_accuracy)
        if record.batch_rows:
            b[4] += record.batch_rows
            b[5] += 1
        self.last_seen_s[record.variant] = max(self.last_seen_s.get(record.variant, 0.0), record.at_s)

    def totals(self, variant: str, now_s: float) -> tuple[float, ...] | None:
        """The window's sums for `variant` (rows, pressure rows, tightest target, highest accuracy,
        Σ batch rows, answers), or None without traffic: what another front end merges
        (`merge_totals`). Drops buckets older than the window."""
        buckets = self._buckets.get(variant)
        if not buckets:
            return None
        oldest = int(now_s - self.window_s) + 1
        for second in [s for s in buckets if s < oldest]:
            del buckets[second]
        if not buckets:
            return None
        return merge_totals(tuple(b) for b in buckets.values())

    def all_totals(self, now_s: float) -> dict[str, tuple[float, ...]]:
        found = {name: self.totals(name, now_s) for name in list(self._buckets)}
        return {name: t for name, t in found.items() if t is not None}

    def demand(self, variant: str, now_s: float) -> Demand:
        totals = self.totals(variant, now_s)
        return as_demand(totals, self.window_s) if totals is not None else Demand()


def merge_totals(parts: Iterable[tuple[float, ...]]) -> tuple[float, ...]:
    """Sums of several windows (or buckets): counts add, the tightest target and the highest
    accuracy win."""
    rows = pressure = batch_rows = answers = 0.0
    target, accuracy = math.inf, 0.0
    for p in parts:
        rows += p[0]
        pressure += p[1]
        target = min(target, p[2])
        accuracy = max(accuracy, p[3])
        batch_rows += p[4]
        answers += p[5]
    return rows, pressure, target, accuracy, batch_rows, answers


def as_demand(totals: tuple[float, ...], window_s: float) -> Demand:
    rows, pressure, target, accuracy, batch_rows, answers = totals[:6]
    return Demand(
        rows / window_s,
        pressure / window_s,
        target,
        accuracy,
        batch_rows / answers if answers else None,
    )
