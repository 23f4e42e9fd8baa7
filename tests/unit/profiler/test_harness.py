"""profiler.harness: the measuring loop on a simulated model and clock, and the built profile."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infaas.types import MachineInfo, VariantSpec
from profiler.cost import PriceTable
from profiler.fakes import ManualClock, SimulatedModel
from profiler.harness import (
    MeasureConfig,
    Measurement,
    PointMeasurement,
    batch_sizes,
    build_profile,
    failed_profile,
    make_batch,
    measure_loaded,
    measure_point,
)
from profiler.stats import StabilityRule

RULE = StabilityRule(window_iterations=5, window_s=0.1, max_iterations=10_000, max_time_s=1.0)
MACHINE = MachineInfo(cpu_model="AMD EPYC", cores=2)
TABLE = PriceTable(
    provider="t", region="r", as_of="2024-01-01", source="s", vcpu_hour_usd=0.036, gpu_hour_usd=1.0
)


def test_batch_sizes_up_to_the_max() -> None:
    assert batch_sizes(128) == (1, 8, 32, 128)
    assert batch_sizes(512) == (1, 8, 32, 128)
    assert batch_sizes(32) == (1, 8, 32)
    assert batch_sizes(50) == (1, 8, 32, 50)
    assert batch_sizes(1) == (1,)


def test_make_batch_cycles_real_rows() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = make_batch(x, 5)
    assert b.shape == (5, 2) and b.flags["C_CONTIGUOUS"]
    assert b[3].tolist() == x[0].tolist()


def test_constant_latency_is_stable_after_three_windows() -> None:
    clock = ManualClock()
    model = SimulatedModel(clock, lambda b, i: 2.0)
    point = measure_point(model.predict, np.zeros((8, 4), np.float32), RULE, clock)
    assert point.stable and point.stop_reason == "stable"
    assert point.batch == 8
    assert point.p50_ms == pytest.approx(2.0)
    assert point.p99_ms == pytest.approx(2.0)
    assert len(point.window_p50s_ms) == 3
    # Each window lasts ≥ 0.1 s at 2 ms per call: 50 calls.
    assert point.iterations == 150 and point.samples == 150


def test_the_point_summarises_the_stable_windows_not_the_noisy_start() -> None:
    clock = ManualClock()
    model = SimulatedModel(clock, lambda b, i: 10.0 if i < 10 else 1.0)
    point = measure_point(model.predict, np.zeros((1, 4), np.float32), RULE, clock)
    assert point.stable
    assert point.p99_ms == pytest.approx(1.0)
    assert point.window_p50s_ms[0] == pytest.approx(10.0)


def test_drifting_latency_stops_at_the_time_cap() -> None:
    clock = ManualClock()
    model = SimulatedModel(clock, lambda b, i: 1.0 + 0.05 * i)
    point = measure_point(model.predict, np.zeros((1, 4), np.float32), RULE, clock)
    assert point.stop_reason == "max_time" and not point.stable
    assert clock() <= RULE.max_time_s + 0.2  # stops within one call of the cap


def test_drifting_latency_stops_at_the_iteration_cap() -> None:
    clock = ManualClock()
    model = SimulatedModel(clock, lambda b, i: 0.01 * (1.02**i))
    rule = StabilityRule(window_iterations=10, window_s=0.0, max_iterations=60, max_time_s=100.0)
    point = measure_point(model.predict, np.zeros((1, 4), np.float32), rule, clock)
    assert point.stop_reason == "max_iterations"
    assert point.iterations == 60


def test_a_slow_model_does_not_overrun_the_time_cap_to_fill_windows() -> None:
    clock = ManualClock()
    model = SimulatedModel(clock, lambda b, i: 400.0 * (1.5 if i % 2 else 1.0))
    point = measure_point(model.predict, np.zeros((1, 4), np.float32), RULE, clock)
    assert point.stop_reason == "max_time"
    assert point.iterations == 2  # 400 + 600 ms reach the 1 s cap
    assert clock() == pytest.approx(1.0)


def test_measure_loaded_measures_each_batch_and_accuracy() -> None:
    clock = ManualClock()
    model = SimulatedModel(clock, lambda b, i: 0.5 + 0.1 * b)
    x = np.arange(40, dtype=np.float32).reshape(40, 1)
    y = np.where(np.arange(40) < 30, np.arange(40) % 10, 0)
    config = MeasureConfig.quick()
    points, warmup_s, accuracy = measure_loaded(model.predict, x, y, 32, config, clock)
    assert [p.batch for p in points] == [1, 8, 32]
    for p in points:
        assert p.p50_ms == pytest.approx(0.5 + 0.1 * p.batch)
    assert warmup_s == pytest.approx(sum(0.5 + 0.1 * b for b in (1, 8, 32)) / 1000.0)
    expected = float(np.mean((np.arange(40) % 10) == y))
    assert accuracy == pytest.approx(expected)


def _point(batch: int, mean_ms: float, reason: str = "stable") -> PointMeasurement:
    return PointMeasurement(
        batch=batch,
        p50_ms=mean_ms,
        p95_ms=mean_ms * 1.2,
        p99_ms=mean_ms * 1.5,
        mean_ms=mean_ms,
        samples=30,
        iterations=30,
        stop_reason=reason,  # type: ignore[arg-type]
        window_p50s_ms=(mean_ms, mean_ms, mean_ms),
    )


def test_build_profile_adds_throughput_cost_and_fit() -> None:
    spec = VariantSpec(architecture="a", runtime="onnxruntime", threads=2, max_batch=32)
    m = Measurement(
        points=(_point(32, 6.0, "max_time"), _point(1, 1.0), _point(8, 2.0)),
        load_time_s=0.2,
        warmup_s=0.01,
        memory_mb=3.0,
        accuracy=0.95,
    )
    profile = build_profile(spec, m, MACHINE, TABLE, measured_at_s=123.0)
    assert profile.variant == "a/onnx-cpu-fp32-t2" and profile.status == "ok"
    assert [p.batch for p in profile.points] == [1, 8, 32]
    assert profile.price_usd_per_s == pytest.approx(2 * 0.036 / 3600)
    b32 = profile.points[2]
    assert b32.throughput_qps == pytest.approx(32 * 1000 / 6.0)
    assert not b32.stable and b32.stop_reason == "max_time"
    assert b32.cost_usd_per_1k == pytest.approx(profile.cost_usd_per_1k(32))
    assert profile.latency_ms(8, "p99") == pytest.approx(3.0)
    assert profile.fit_slope_ms > 0 and 0 <= profile.fit_error < 0.5
    assert (profile.accuracy, profile.memory_mb, profile.load_time_s) == (0.95, 3.0, 0.2)


def test_failed_profile_is_never_feasible() -> None:
    spec = VariantSpec(architecture="a", runtime="tensorflow")
    profile = failed_profile(spec, "boom", MACHINE, TABLE, measured_at_s=1.0)
    assert profile.status == "failed" and profile.error == "boom"
    assert math.isinf(profile.latency_ms(1))
