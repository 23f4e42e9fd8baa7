"""profiler.stats on known samples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from profiler.stats import (
    StabilityRule,
    fit_latency,
    percentile,
    stop_reason,
    summarize,
    throughput_qps,
    within_tolerance,
)


def test_percentiles_of_one_to_hundred() -> None:
    samples = [float(v) for v in range(1, 101)]
    assert percentile(samples, 50) == pytest.approx(50.5)
    assert percentile(samples, 0) == 1.0
    assert percentile(samples, 100) == 100.0
    assert percentile(samples, 99) == pytest.approx(99.01)
    assert percentile(samples, 95) == pytest.approx(95.05)


def test_percentile_ignores_order_and_odd_median() -> None:
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5


@given(
    st.lists(st.floats(min_value=0.001, max_value=1e4), min_size=1, max_size=200),
    st.floats(min_value=0.0, max_value=100.0),
)
def test_percentile_matches_numpy(samples: list[float], q: float) -> None:
    assert percentile(samples, q) == pytest.approx(float(np.percentile(samples, q)), rel=1e-9, abs=1e-9)


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summary_of_known_samples() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 10.0])
    assert (s.p50_ms, s.mean_ms, s.samples) == (3.0, 4.0, 5)
    assert s.p95_ms == pytest.approx(8.8)
    assert s.p99_ms == pytest.approx(9.76)


def test_throughput_is_rows_per_second() -> None:
    assert throughput_qps(1, 2.0) == 500.0
    assert throughput_qps(32, 4.0) == 8000.0
    with pytest.raises(ValueError):
        throughput_qps(0, 1.0)


def test_within_tolerance_is_relative_to_the_smallest() -> None:
    assert within_tolerance([1.0, 1.1, 1.05], 0.10)
    assert not within_tolerance([1.0, 1.11, 1.05], 0.10)
    assert within_tolerance([2.0], 0.0)
    assert not within_tolerance([], 0.1)


RULE = StabilityRule(tolerance=0.10, windows=3, max_iterations=100, max_time_s=2.0)


def test_three_close_windows_are_stable() -> None:
    assert stop_reason([5.0, 1.0, 1.05, 1.08], iterations=20, elapsed_s=0.4, rule=RULE) == "stable"


def test_two_windows_are_never_enough() -> None:
    assert stop_reason([1.0, 1.0], iterations=10, elapsed_s=0.2, rule=RULE) is None


def test_drifting_windows_continue_until_a_cap() -> None:
    drifting = [1.0, 1.2, 1.44, 1.73]
    assert stop_reason(drifting, iterations=40, elapsed_s=0.5, rule=RULE) is None
    assert stop_reason(drifting, iterations=100, elapsed_s=0.5, rule=RULE) == "max_iterations"
    assert stop_reason(drifting, iterations=40, elapsed_s=2.0, rule=RULE) == "max_time"


def test_only_the_last_windows_count() -> None:
    # Stable earlier, then a jump: the last three are what must agree.
    assert stop_reason([1.0, 1.0, 1.0, 3.0], iterations=40, elapsed_s=0.5, rule=RULE) is None


def test_stable_wins_over_a_cap_reached_on_the_same_window() -> None:
    assert stop_reason([1.0, 1.0, 1.0], iterations=100, elapsed_s=5.0, rule=RULE) == "stable"


def test_fit_recovers_an_exact_line() -> None:
    batches = [1, 8, 32, 128]
    fit = fit_latency(batches, [0.5 + 0.25 * b for b in batches])
    assert fit.intercept_ms == pytest.approx(0.5)
    assert fit.slope_ms == pytest.approx(0.25)
    assert fit.error == pytest.approx(0.0, abs=1e-9)
    assert fit.predict_ms(64) == pytest.approx(16.5)


def test_fit_error_is_the_largest_relative_miss() -> None:
    batches = [1, 8, 32, 128]
    latencies = [1.0, 1.2, 2.0, 40.0]  # sharply superlinear: no line fits
    fit = fit_latency(batches, latencies)
    worst = max(abs(fit.predict_ms(b) - v) / v for b, v in zip(batches, latencies, strict=True))
    assert fit.error == pytest.approx(worst)
    assert fit.error > 0.1


def test_fit_keeps_batch_one_close_where_plain_least_squares_would_not() -> None:
    batches = [1, 8, 32, 128]
    latencies = [0.1, 0.3, 1.0, 4.5]
    fit = fit_latency(batches, latencies)
    assert abs(fit.predict_ms(1) - 0.1) / 0.1 < 0.3
    plain_slope, plain_intercept = np.polyfit(batches, latencies, 1)
    assert abs(plain_intercept + plain_slope - 0.1) / 0.1 > abs(fit.predict_ms(1) - 0.1) / 0.1


def test_fit_of_one_point_is_flat() -> None:
    fit = fit_latency([1], [2.5])
    assert (fit.intercept_ms, fit.slope_ms, fit.error) == (2.5, 0.0, 0.0)


def test_fit_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        fit_latency([1, 2], [1.0])
    with pytest.raises(ValueError):
        fit_latency([1, 2], [1.0, 0.0])
