"""The measuring loop that runs inside a profiling worker process, and the profile it turns into.

`measure_loaded` drives an already-loaded variant: warm-up, then for each batch size timed windows
until the stability rule stops them, then accuracy on the validation set. The clock comes in as an
argument (``time.perf_counter`` in the worker, a manual clock in unit tests) and is read around the
runtime call only, so input preparation is never timed. `build_profile` turns a measurement into
the stored `Profile` (fit, throughput and cost included) in the parent process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infaas.types import LatencyPoint, MachineInfo, Profile, VariantSpec
from profiler import accuracy as acc
from profiler import stats
from profiler.cost import PriceTable, cost_usd_per_1k, price_usd_per_s

__all__ = [
    "CANDIDATE_BATCHES",
    "Clock",
    "MeasureConfig",
    "Measurement",
    "PointMeasurement",
    "batch_sizes",
    "build_profile",
    "failed_profile",
    "make_batch",
    "measure_loaded",
    "measure_point",
]

CANDIDATE_BATCHES: tuple[int, ...] = (1, 8, 32, 128)

Clock = Callable[[], float]
"""Monotonic seconds."""

Predict = Callable[[np.ndarray], np.ndarray]


class MeasureConfig(BaseModel):
    """How long and how carefully to measure; `normal()` for real profiles, `quick()` for tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tolerance: float = Field(default=0.10, ge=0.0)
    windows: int = Field(default=3, ge=1)
    window_iterations: int = Field(default=5, ge=1)
    window_s: float = Field(default=0.1, ge=0.0)
    max_iterations: int = Field(default=100_000, ge=1)
    max_time_s: float = Field(default=1.0, gt=0.0)
    warmup_iterations: int = Field(default=3, ge=0)
    timeout_s: float = Field(default=120.0, gt=0.0, description="Whole variant, process start included.")

    @classmethod
    def normal(cls) -> MeasureConfig:
        return cls()

    @classmethod
    def quick(cls) -> MeasureConfig:
        """Fewer, shorter windows: enough for tests that need a plausible profile, not a precise one."""
        return cls(
            window_iterations=3,
            window_s=0.02,
            max_iterations=200,
            max_time_s=0.25,
            warmup_iterations=1,
            timeout_s=90.0,
        )

    def rule(self) -> stats.StabilityRule:
        return stats.StabilityRule(
            tolerance=self.tolerance,
            windows=self.windows,
            window_iterations=self.window_iterations,
            window_s=self.window_s,
            max_iterations=self.max_iterations,
            max_time_s=self.max_time_s,
        )


class PointMeasurement(BaseModel):
    """Latency at one batch size, from the windows that stopped the measurement."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    samples: int
    iterations: int
    stop_reason: stats.StopReason
    window_p50s_ms: tuple[float, ...]

    @property
    def stable(self) -> bool:
        return self.stop_reason == "stable"


class Measurement(BaseModel):
    """Everything a worker measured for one variant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    points: tuple[PointMeasurement, ...]
    load_time_s: float
    warmup_s: float
    memory_mb: float
    accuracy: float


def batch_sizes(max_batch: int, candidates: Sequence[int] = CANDIDATE_BATCHES) -> tuple[int, ...]:
    """The candidate batch sizes up to `max_batch`, plus `max_batch` itself when it falls between
    candidates, so the router never extrapolates inside the variant's range."""
    sizes = [b for b in candidates if b <= max_batch]
    if max_batch < max(candidates) and max_batch not in sizes:
        sizes.append(max_batch)
    return tuple(sizes)


def make_batch(x: np.ndarray, batch: int) -> np.ndarray:
    """`batch` rows of real validation inputs (cycled when the set is smaller), contiguous."""
    if len(x) == 0:
        raise ValueError("no validation rows")
    idx = np.arange(batch) % len(x)
    return np.ascontiguousarray(x[idx])


def measure_point(
    predict: Predict, inputs: np.ndarray, rule: stats.StabilityRule, clock: Clock
) -> PointMeasurement:
    """Time `predict(inputs)` in windows until `rule` says stop; summarise the last windows."""
    windows: list[list[float]] = []
    p50s: list[float] = []
    iterations = 0
    start = clock()
    while True:
        window: list[float] = []
        window_start = clock()
        while len(window) < rule.window_iterations or clock() - window_start < rule.window_s:
            t0 = clock()
            predict(inputs)
            t1 = clock()
            window.append((t1 - t0) * 1000.0)
            iterations += 1
            # A slow model must not overrun the point's time cap just to fill a window.
            if clock() - start >= rule.max_time_s or iterations >= rule.max_iterations:
                break
        windows.append(window)
        p50s.append(stats.percentile(window, 50.0))
        reason = stats.stop_reason(p50s, iterations, clock() - start, rule)
        if reason is not None:
            break
    kept = [sample for w in windows[-rule.windows :] for sample in w]
    summary = stats.summarize(kept)
    return PointMeasurement(
        batch=len(inputs),
        p50_ms=summary.p50_ms,
        p95_ms=summary.p95_ms,
        p99_ms=summary.p99_ms,
        mean_ms=summary.mean_ms,
        samples=summary.samples,
        iterations=iterations,
        stop_reason=reason,
        window_p50s_ms=tuple(p50s),
    )


def measure_loaded(
    predict: Predict,
    x: np.ndarray,
    y: np.ndarray,
    max_batch: int,
    config: MeasureConfig,
    clock: Clock,
) -> tuple[tuple[PointMeasurement, ...], float, float]:
    """Warm up and measure every batch size, then measure accuracy.

    Returns (points, warm-up seconds, top-1 accuracy). Each batch size gets its own warm-up because
    runtimes allocate and tune per input shape on first sight of it.
    """
    rule = config.rule()
    points: list[PointMeasurement] = []
    warmup_s = 0.0
    for batch in batch_sizes(max_batch):
        inputs = make_batch(x, batch)
        t0 = clock()
        for _ in range(config.warmup_iterations):
            predict(inputs)
        warmup_s += clock() - t0
        points.append(measure_point(predict, inputs, rule, clock))
    accuracy = acc.measure_accuracy(predict, x, y, max_batch)
    return tuple(points), warmup_s, accuracy


def build_profile(
    spec: VariantSpec,
    measurement: Measurement,
    machine: MachineInfo,
    prices: PriceTable,
    measured_at_s: float,
) -> Profile:
    """The stored profile: points with throughput and cost, the latency-vs-batch fit (on p50)."""
    price = price_usd_per_s(spec, prices)
    points = tuple(
        LatencyPoint(
            batch=p.batch,
            p50_ms=p.p50_ms,
            p95_ms=p.p95_ms,
            p99_ms=p.p99_ms,
            mean_ms=p.mean_ms,
            throughput_qps=stats.throughput_qps(p.batch, p.mean_ms),
            samples=p.samples,
            stable=p.stable,
            stop_reason=p.stop_reason,
            cost_usd_per_1k=cost_usd_per_1k(price, p.mean_ms, p.batch),
        )
        for p in sorted(measurement.points, key=lambda p: p.batch)
    )
    fit = stats.fit_latency([p.batch for p in points], [p.p50_ms for p in points])
    return Profile(
        variant=spec.name,
        status="ok",
        machine=machine,
        measured_at_s=measured_at_s,
        points=points,
        fit_intercept_ms=fit.intercept_ms,
        fit_slope_ms=fit.slope_ms,
        fit_error=fit.error,
        load_time_s=measurement.load_time_s,
        warmup_s=measurement.warmup_s,
        memory_mb=measurement.memory_mb,
        accuracy=measurement.accuracy,
        price_usd_per_s=price,
    )


def failed_profile(
    spec: VariantSpec, error: str, machine: MachineInfo, prices: PriceTable, measured_at_s: float
) -> Profile:
    """A variant that could not be profiled: no points, so the router never picks it."""
    return Profile(
        variant=spec.name,
        status="failed",
        error=error,
        machine=machine,
        measured_at_s=measured_at_s,
        price_usd_per_s=price_usd_per_s(spec, prices),
    )
