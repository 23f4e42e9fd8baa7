"""Statistics of latency samples: percentiles, the stability rule, the latency-vs-batch fit.

Pure functions over plain numbers: no clock, no I/O. The harness feeds them samples it timed.

The stability rule follows perf_analyzer: a measurement is stable once the p50 of three
consecutive windows are within 10 % of each other (``(max - min) / min <= 0.10``). Windows whose
p50 keeps drifting (a busy machine, a runtime still tuning itself) stop at a cap on iterations or
on time instead, and the measured point records which of the three stopped it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "LatencySummary",
    "LinearFit",
    "StabilityRule",
    "StopReason",
    "fit_latency",
    "percentile",
    "stop_reason",
    "summarize",
    "throughput_qps",
    "within_tolerance",
]

StopReason = Literal["stable", "max_iterations", "max_time"]


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0 ≤ q ≤ 100) with linear interpolation between closest ranks
    (numpy's default method), so p50 of an even-sized sample is the mean of the middle two."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    if lo == hi:
        return float(ordered[lo])
    frac = rank - lo
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * frac)


@dataclass(frozen=True)
class LatencySummary:
    """Quantiles and mean of one set of latency samples (milliseconds)."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    samples: int


def summarize(samples_ms: Sequence[float]) -> LatencySummary:
    """p50, p95, p99 and mean of latency samples."""
    if not samples_ms:
        raise ValueError("summary of no samples")
    return LatencySummary(
        p50_ms=percentile(samples_ms, 50.0),
        p95_ms=percentile(samples_ms, 95.0),
        p99_ms=percentile(samples_ms, 99.0),
        mean_ms=math.fsum(samples_ms) / len(samples_ms),
        samples=len(samples_ms),
    )


def throughput_qps(batch: int, mean_ms: float) -> float:
    """Inferences (rows) per second when batches of `batch` rows take `mean_ms` each, back to back."""
    if batch < 1:
        raise ValueError("batch must be ≥ 1")
    if mean_ms <= 0.0:
        raise ValueError("mean latency must be positive")
    return batch * 1000.0 / mean_ms


@dataclass(frozen=True)
class StabilityRule:
    """When to stop measuring one batch size.

    A window is at least `window_iterations` calls and at least `window_s` seconds, so that a
    window's p50 is meaningful for both sub-millisecond and 100 ms models.
    """

    tolerance: float = 0.10
    windows: int = 3
    window_iterations: int = 5
    window_s: float = 0.1
    max_iterations: int = 2000
    max_time_s: float = 1.0

    def __post_init__(self) -> None:
        if self.tolerance < 0 or self.windows < 1 or self.window_iterations < 1:
            raise ValueError("tolerance ≥ 0, windows ≥ 1 and window_iterations ≥ 1 are required")
        if self.window_s < 0 or self.max_iterations < 1 or self.max_time_s <= 0:
            raise ValueError("window_s ≥ 0, max_iterations ≥ 1 and max_time_s > 0 are required")


def within_tolerance(values: Sequence[float], tolerance: float) -> bool:
    """True when all values are within `tolerance` of each other: (max − min) / min ≤ tolerance."""
    if not values:
        return False
    low, high = min(values), max(values)
    if low <= 0.0:
        return high == low
    # The epsilon keeps 1.0 vs 1.1 within 10 % despite binary floating point.
    return (high - low) / low <= tolerance + 1e-12


def stop_reason(
    window_p50s_ms: Sequence[float], iterations: int, elapsed_s: float, rule: StabilityRule
) -> StopReason | None:
    """Whether to stop after the windows measured so far, and why; None means measure another window.

    Stability is checked first: a point that became stable on the very window that reached a cap
    is reported as stable.
    """
    recent = window_p50s_ms[-rule.windows :]
    if len(recent) == rule.windows and within_tolerance(recent, rule.tolerance):
        return "stable"
    if iterations >= rule.max_iterations:
        return "max_iterations"
    if elapsed_s >= rule.max_time_s:
        return "max_time"
    return None


@dataclass(frozen=True)
class LinearFit:
    """latency_ms(batch) ≈ intercept_ms + slope_ms × batch; `error` is the largest relative error
    of the line at the measured points (0.05 = 5 %)."""

    intercept_ms: float
    slope_ms: float
    error: float

    def predict_ms(self, batch: int) -> float:
        return self.intercept_ms + self.slope_ms * batch


def fit_latency(batches: Sequence[int], latencies_ms: Sequence[float]) -> LinearFit:
    """Least-squares line through (batch, latency) weighted by 1 / latency².

    Unweighted least squares in milliseconds is dominated by the largest batch and can miss the
    batch-1 latency — the one most queries ask about — by more than 100 %; weighting by the inverse
    square of the latency minimises relative error instead. One point gives a flat line.
    """
    if len(batches) != len(latencies_ms) or not batches:
        raise ValueError("need as many latencies as batch sizes, and at least one")
    if any(v <= 0.0 for v in latencies_ms):
        raise ValueError("latencies must be positive")
    if len(set(batches)) == 1:
        mean = math.fsum(latencies_ms) / len(latencies_ms)
        return LinearFit(
            intercept_ms=mean, slope_ms=0.0, error=_max_rel_error(batches, latencies_ms, mean, 0.0)
        )
    weights = [1.0 / (v * v) for v in latencies_ms]
    sw = math.fsum(weights)
    sx = math.fsum(w * b for w, b in zip(weights, batches, strict=True))
    sy = math.fsum(w * v for w, v in zip(weights, latencies_ms, strict=True))
    sxx = math.fsum(w * b * b for w, b in zip(weights, batches, strict=True))
    sxy = math.fsum(w * b * v for w, b, v in zip(weights, batches, latencies_ms, strict=True))
    denom = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / denom
    intercept = (sy - slope * sx) / sw
    return LinearFit(
        intercept_ms=intercept,
        slope_ms=slope,
        error=_max_rel_error(batches, latencies_ms, intercept, slope),
    )


def _max_rel_error(
    batches: Sequence[int], latencies_ms: Sequence[float], intercept: float, slope: float
) -> float:
    return max(abs(intercept + slope * b - v) / v for b, v in zip(batches, latencies_ms, strict=True))
