"""Query traces for the simulator: generators (Poisson with a rate schedule, diurnal, bursty) and
the CSV format a recorded trace uses (``time_s,tenant,task,rows,latency_ms,min_accuracy``).

A trace is held as columns (numpy arrays, plus the tenant and task names they index), not as a
list of objects: a million queries would otherwise cost a million Python objects before the
simulation starts. `Trace.queries` gives the row view (`Query`) for readers and tests.

Arrivals are open-loop (independent of answers), which is what overload looks like to a service;
every generator takes a seeded `numpy.random.Generator`, so a trace is reproducible from its seed.
Each arrival is assigned a tenant by its share of the mix, and takes that tenant's task, rows and
targets: a tenant here is a traffic class with one SLO, which is how the benchmarks use tenants.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "CSV_FIELDS",
    "Query",
    "TenantSpec",
    "Trace",
    "bursty",
    "diurnal",
    "poisson",
    "read_csv",
    "write_csv",
]

CSV_FIELDS = ("time_s", "tenant", "task", "rows", "latency_ms", "min_accuracy")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Query(NamedTuple):
    """One arrival: when, who, what, how many rows, and its targets."""

    time_s: float
    tenant: str
    task: str
    rows: int
    latency_ms: float
    min_accuracy: float


@dataclass(frozen=True)
class TenantSpec:
    """A traffic class: its task, rows per query, targets, and share of the arrivals."""

    name: str
    task: str
    latency_ms: float
    min_accuracy: float = 0.0
    rows: int = 1
    share: float = 1.0


@dataclass(frozen=True)
class Trace:
    """Arrivals as columns, sorted by time. `tenant` and `task` index `tenants` and `tasks`."""

    time_s: FloatArray
    tenant: IntArray
    task: IntArray
    rows: IntArray
    latency_ms: FloatArray
    min_accuracy: FloatArray
    tenants: tuple[str, ...]
    tasks: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.time_s.shape[0])

    @property
    def duration_s(self) -> float:
        return float(self.time_s[-1]) if len(self) else 0.0

    def head(self, n: int) -> Trace:
        """The first `n` arrivals."""
        return Trace(
            self.time_s[:n],
            self.tenant[:n],
            self.task[:n],
            self.rows[:n],
            self.latency_ms[:n],
            self.min_accuracy[:n],
            self.tenants,
            self.tasks,
        )

    def queries(self) -> Iterator[Query]:
        for i in range(len(self)):
            yield Query(
                float(self.time_s[i]),
                self.tenants[int(self.tenant[i])],
                self.tasks[int(self.task[i])],
                int(self.rows[i]),
                float(self.latency_ms[i]),
                float(self.min_accuracy[i]),
            )

    @classmethod
    def from_queries(cls, queries: Sequence[Query]) -> Trace:
        ordered = sorted(queries, key=lambda q: q.time_s)
        tenants = tuple(sorted({q.tenant for q in ordered}))
        tasks = tuple(sorted({q.task for q in ordered}))
        t_index = {n: i for i, n in enumerate(tenants)}
        k_index = {n: i for i, n in enumerate(tasks)}
        return cls(
            time_s=np.array([q.time_s for q in ordered], dtype=np.float64),
            tenant=np.array([t_index[q.tenant] for q in ordered], dtype=np.int64),
            task=np.array([k_index[q.task] for q in ordered], dtype=np.int64),
            rows=np.array([q.rows for q in ordered], dtype=np.int64),
            latency_ms=np.array([q.latency_ms for q in ordered], dtype=np.float64),
            min_accuracy=np.array([q.min_accuracy for q in ordered], dtype=np.float64),
            tenants=tenants,
            tasks=tasks,
        )


def _assign(times: FloatArray, mix: Sequence[TenantSpec], rng: np.random.Generator) -> Trace:
    """Give each arrival a tenant drawn by share; the tenant fixes task, rows and targets."""
    if not mix:
        raise ValueError("a trace needs at least one tenant")
    shares = np.array([t.share for t in mix], dtype=np.float64)
    if (shares < 0).any() or shares.sum() <= 0:
        raise ValueError("tenant shares must be non-negative and not all zero")
    who = np.asarray(rng.choice(len(mix), size=times.shape[0], p=shares / shares.sum()), dtype=np.int64)
    tasks = tuple(sorted({t.task for t in mix}))
    task_of = np.array([tasks.index(t.task) for t in mix], dtype=np.int64)
    return Trace(
        time_s=times,
        tenant=who,
        task=task_of[who],
        rows=np.array([t.rows for t in mix], dtype=np.int64)[who],
        latency_ms=np.array([t.latency_ms for t in mix], dtype=np.float64)[who],
        min_accuracy=np.array([t.min_accuracy for t in mix], dtype=np.float64)[who],
        tenants=tuple(t.name for t in mix),
        tasks=tasks,
    )


def _segment(start_s: float, length_s: float, rate: float, rng: np.random.Generator) -> FloatArray:
    """Poisson arrivals at a constant rate over one interval: a Poisson count, uniform times."""
    if rate <= 0 or length_s <= 0:
        return np.empty(0, dtype=np.float64)
    n = int(rng.poisson(rate * length_s))
    return np.sort(start_s + rng.random(n) * length_s)


def poisson(
    schedule: Sequence[tuple[float, float]], mix: Sequence[TenantSpec], rng: np.random.Generator
) -> Trace:
    """Poisson arrivals with a piecewise-constant rate: `schedule` is ``(seconds, queries/s)`` per
    phase, in order (a load step is ``[(30, 10), (30, 200), (30, 10)]``)."""
    parts: list[FloatArray] = []
    start_s = 0.0
    for length_s, rate in schedule:
        parts.append(_segment(start_s, length_s, rate, rng))
        start_s += length_s
    times = np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
    return _assign(times, mix, rng)


def diurnal(
    seconds: float,
    mean_rate: float,
    mix: Sequence[TenantSpec],
    rng: np.random.Generator,
    *,
    amplitude: float = 0.8,
    period_s: float | None = None,
) -> Trace:
    """A sinusoidal rate ``mean × (1 + amplitude × sin(2πt / period))`` (one period over the
    trace unless given), drawn by thinning a Poisson process at the peak rate."""
    if not 0 <= amplitude <= 1:
        raise ValueError("amplitude must be in [0, 1]")
    period = period_s if period_s is not None else seconds
    peak = mean_rate * (1 + amplitude)
    candidates = _segment(0.0, seconds, peak, rng)
    rate = mean_rate * (1 + amplitude * np.sin(2 * math.pi * candidates / period))
    keep = rng.random(candidates.shape[0]) * peak < rate
    return _assign(candidates[keep], mix, rng)


def bursty(
    seconds: float,
    mean_rate: float,
    mix: Sequence[TenantSpec],
    rng: np.random.Generator,
    *,
    burst_ratio: float = 8.0,
    mean_calm_s: float = 20.0,
    mean_burst_s: float = 5.0,
) -> Trace:
    """A two-state Markov-modulated Poisson process: calm and burst states with exponential
    sojourns (means `mean_calm_s`, `mean_burst_s`), the burst rate `burst_ratio` × the calm one,
    the calm rate set so that the long-run mean is `mean_rate`."""
    calm_share = mean_calm_s / (mean_calm_s + mean_burst_s)
    calm_rate = mean_rate / (calm_share + (1 - calm_share) * burst_ratio)
    parts: list[FloatArray] = []
    t, burst = 0.0, False
    while t < seconds:
        stay = float(rng.exponential(mean_burst_s if burst else mean_calm_s))
        stay = min(stay, seconds - t)
        parts.append(_segment(t, stay, calm_rate * (burst_ratio if burst else 1.0), rng))
        t += stay
        burst = not burst
    times = np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
    return _assign(times, mix, rng)


def write_csv(trace: Trace, path: Path) -> None:
    """Write `trace` as ``time_s,tenant,task,rows,latency_ms,min_accuracy`` with a header."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(CSV_FIELDS)
        for q in trace.queries():
            out.writerow([repr(q.time_s), q.tenant, q.task, q.rows, repr(q.latency_ms), repr(q.min_accuracy)])


def read_csv(path: Path) -> Trace:
    """Read a recorded trace (the header names the columns; order is free, rows are sorted)."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = set(CSV_FIELDS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
        queries = [
            Query(
                float(r["time_s"]),
                r["tenant"],
                r["task"],
                int(r["rows"]),
                float(r["latency_ms"]),
                float(r["min_accuracy"]),
            )
            for r in reader
        ]
    return Trace.from_queries(queries)
