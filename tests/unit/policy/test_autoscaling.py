"""The autoscaling policy driven through simulated ticks (no Ray, no clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infaas.policy.autoscaling import AutoscalingConfig, ScalingState, VariantLoad, decide

CONFIG = AutoscalingConfig(
    target_utilization=0.5, max_replicas=4, upscale_delay_s=2.0, downscale_delay_s=10.0
)


def tick(load: VariantLoad, state: ScalingState, now_s: float) -> tuple[int | None, ScalingState]:
    decisions, state = decide([load], CONFIG, state, now_s)
    return (decisions[0].replicas if decisions else None), state


def test_scales_up_only_after_the_delay() -> None:
    load = VariantLoad("v", arrival_rows_per_s=1500, capacity_rows_per_s=1000, replicas=1)
    state = ScalingState()
    got, state = tick(load, state, 0.0)
    assert got is None
    got, state = tick(load, state, 1.0)
    assert got is None
    got, state = tick(load, state, 2.0)
    assert got == 3  # 1500 / (0.5 × 1000)


def test_a_burst_shorter_than_the_delay_changes_nothing() -> None:
    hot = VariantLoad("v", arrival_rows_per_s=1500, capacity_rows_per_s=1000, replicas=1)
    calm = VariantLoad("v", arrival_rows_per_s=400, capacity_rows_per_s=1000, replicas=1)
    _, state = tick(hot, ScalingState(), 0.0)
    got, state = tick(calm, state, 1.0)
    assert got is None and state.wanting_since_s == {}
    got, _ = tick(hot, state, 2.5)  # the clock restarted at 2.5
    assert got is None


def test_scales_down_slowly_and_to_zero_when_idle() -> None:
    idle = VariantLoad("v", arrival_rows_per_s=0, capacity_rows_per_s=1000, replicas=2)
    _, state = tick(idle, ScalingState(), 0.0)
    got, state = tick(idle, state, 9.9)
    assert got is None
    got, _ = tick(idle, state, 10.0)
    assert got == 0


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        AutoscalingConfig(target_utilization=0)
    with pytest.raises(ValueError):
        AutoscalingConfig(min_replicas=3, max_replicas=2)


@given(
    arrival=st.floats(0, 1e6), capacity=st.floats(1, 1e5), replicas=st.integers(0, 4), now=st.floats(100, 1e6)
)
def test_decisions_stay_within_bounds_and_cover_the_load(
    arrival: float, capacity: float, replicas: int, now: float
) -> None:
    load = VariantLoad("v", arrival_rows_per_s=arrival, capacity_rows_per_s=capacity, replicas=replicas)
    _, state = decide([load], CONFIG, ScalingState(), 0.0)
    decisions, _ = decide([load], CONFIG, state, now)
    for d in decisions:
        assert CONFIG.min_replicas <= d.replicas <= CONFIG.max_replicas
        assert d.replicas != replicas
        if d.replicas < CONFIG.max_replicas:
            assert arrival <= CONFIG.target_utilization * capacity * d.replicas + 1e-6
