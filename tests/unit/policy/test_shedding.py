"""The door's shedder: it follows what admission does with the queries that pass it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infaas.policy.shedding import DoorShedder, LoopWatch, RefusalPacer

ROOMY = 48.0  # a 50 ms target for a variant that answers in 2 ms idle


def run(
    door: DoorShedder, arrivals: int, capacity: float, rate_per_s: float = 1000.0
) -> tuple[int, int, int]:
    """`arrivals` queries at `rate_per_s`; admission admits `capacity` of the arrival rate (a
    token bucket) and refuses the rest of what reaches it. Returns (refused at the door, passed,
    refused by admission), counted over the second half."""
    at_door = passed = by_admission = 0
    tokens = 0.0
    for i in range(arrivals):
        now_s = i / rate_per_s
        late = i >= arrivals // 2
        tokens = min(tokens + capacity, 5.0)
        if not door.admit(now_s):
            at_door += late
            continue
        refused = tokens < 1.0
        if not refused:
            tokens -= 1.0
        passed += late
        by_admission += late and refused
        door.observe(refused, now_s, loop_busy=True, margin_ms=ROOMY, retry_after_s=0.2)
    return at_door, passed, by_admission


def test_no_refusal_by_admission_means_none_at_the_door() -> None:
    door = DoorShedder()
    assert run(door, 5000, capacity=1.0) == (0, 2500, 0)
    assert door.share == 0.0


def test_under_overload_the_door_takes_the_bulk_and_admission_keeps_a_share() -> None:
    door = DoorShedder(keep=0.1)
    at_door, passed, by_admission = run(door, 20_000, capacity=0.2)  # 5× what it admits
    # The door takes the bulk; admission refuses a share of what passes, enough to hold the door's
    # share up against its decay (~24 % here: `keep` plus what a 1 s decay lets through).
    assert 0.65 < at_door / 10_000 < 0.85, at_door
    assert 0.05 < by_admission / passed < 0.35, (by_admission, passed)
    assert door.retry_after_s == 0.2


def test_the_share_is_applied_exactly_and_decays_once_admission_is_quiet() -> None:
    door = DoorShedder(gain=0.25, keep=0.5, decay_s=0.5)
    door.observe(True, 0.0, loop_busy=True, margin_ms=ROOMY)  # +0.125
    door.observe(True, 0.0, loop_busy=True, margin_ms=ROOMY)  # 0.25
    assert door.share == pytest.approx(0.25)
    assert [door.admit(0.0) for _ in range(8)] == [True, True, True, False] * 2
    door.admit(0.5)  # one time constant later
    assert door.share == pytest.approx(0.25 * math.exp(-1.0))
    door.admit(5.0)  # e^-10 of it left
    assert door.share < 0.0001


@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 0.01)), max_size=300))
def test_the_share_stays_within_its_bounds(outcomes: list[tuple[bool, float]]) -> None:
    door = DoorShedder(max_share=0.9)
    now_s = 0.0
    for refused, dt in outcomes:
        now_s += dt
        door.observe(refused, now_s, loop_busy=True, margin_ms=ROOMY)
        door.admit(now_s)
        assert 0.0 <= door.share <= 0.9


def test_refusals_while_the_loop_keeps_up_do_not_close_the_door() -> None:
    """Admission refusing a tight target on an idle front end says nothing about the load."""
    door = DoorShedder()
    for i in range(1000):
        door.observe(True, i / 1000.0, loop_busy=False, margin_ms=ROOMY)
    assert door.share == 0.0
    assert all(door.admit(1.0) for _ in range(100))


def test_refusals_of_near_edge_targets_do_not_close_the_door() -> None:
    """One client trying targets a few ms from their variant's profile, on a host whose loop is
    late for other reasons: its refusals are for its targets, and the door stays open."""
    door = DoorShedder(min_margin_ms=10.0)
    for i in range(1000):
        door.observe(True, i / 1000.0, loop_busy=True, margin_ms=(i % 10) * 0.99)
    door.observe(True, 1.0, loop_busy=True)  # a cold variant's refusal: no idle prediction
    assert door.share == 0.0
    door.observe(True, 1.0, loop_busy=True, margin_ms=10.0)
    assert door.share > 0.0


def test_the_door_opens_soon_after_admission_stops_refusing() -> None:
    """Half the load the service sustains, and a stall: for 0.5 s admission refuses everything
    (the path's overhead estimate holds the stall), then admits everything. Measured before the
    share decayed in time: the door, at its maximum share, let through too few admitted queries
    to bring the share down, and shed ~1 350 queries over the next 4 s."""
    door = DoorShedder()
    shed_later = 0
    for i in range(600 * 4):  # 600 arrivals/s for 4 s
        now_s = i / 600.0
        if not door.admit(now_s):
            shed_later += now_s >= 1.5
            continue
        door.observe(now_s < 0.5, now_s, loop_busy=True, margin_ms=ROOMY)
    assert door.share < 0.05
    assert shed_later < 0.05 * 600 * 2.5, shed_later


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        DoorShedder(keep=1.0)
    with pytest.raises(ValueError):
        DoorShedder(max_share=1.0)


def test_the_loop_is_busy_for_a_second_after_a_late_timer() -> None:
    watch = LoopWatch(tick_s=0.01, late_s=0.01, hold_s=1.0)
    for i in range(100):  # on time, 10 ms apart
        watch.tick(i * 0.01 + 0.001)
    assert not watch.busy(1.0)
    watch.tick(1.0 + 0.025)  # 15 ms late
    for i in range(1, 110):  # then on time again
        watch.tick(1.025 + i * 0.01)
    assert watch.busy(1.5) and not watch.busy(2.03)


def test_the_loop_is_busy_while_its_next_timer_is_already_late() -> None:
    """In a long pass of the loop, before the late timer has run to say so."""
    watch = LoopWatch(tick_s=0.01, late_s=0.01, hold_s=1.0)
    watch.tick(1.0)
    assert not watch.busy(1.019)  # the next tick is due at 1.01: 9 ms late is not late
    assert watch.busy(1.021)


def test_the_loop_is_busy_for_a_second_after_work_is_put_off() -> None:
    watch = LoopWatch(hold_s=1.0)
    assert not watch.busy(5.0)
    watch.mark(5.0)
    assert watch.busy(5.9) and not watch.busy(6.01)


def test_the_pacer_lets_a_burst_through_then_waits_its_refill() -> None:
    pacer = RefusalPacer(share=0.25, burst_s=0.002)
    assert pacer.ready(0.0) and pacer.wait_s(0.0) == 0.0
    pacer.spend(0.003, 0.0)  # 1 ms beyond the burst
    assert not pacer.ready(0.0)
    assert pacer.wait_s(0.0) == pytest.approx(0.004)  # 1 ms at a quarter of the clock
    assert not pacer.ready(0.0039) and pacer.ready(0.0041)
    assert pacer.ready(100.0) and pacer.wait_s(100.0) == 0.0  # refilled to the burst, not beyond
    pacer.spend(0.0021, 100.0)
    assert not pacer.ready(100.0)


@given(st.lists(st.floats(min_value=1e-5, max_value=0.01), min_size=1, max_size=300), st.floats(0.05, 1.0))
def test_paced_refusals_take_at_most_their_share_of_the_clock(costs: list[float], share: float) -> None:
    """Reading whenever the pacer is ready, the time spent refusing stays within `share` of the
    time elapsed, give or take one burst and one read."""
    pacer = RefusalPacer(share=share, burst_s=0.002)
    now_s = spent_s = 0.0
    for cost in costs:
        now_s += pacer.wait_s(now_s)
        assert pacer.ready(now_s)
        now_s += cost
        pacer.spend(cost, now_s)
        spent_s += cost
    assert spent_s <= share * now_s + 0.002 + max(costs) + 1e-9


def test_pacer_parameters_are_checked() -> None:
    with pytest.raises(ValueError):
        RefusalPacer(share=0.0)
    with pytest.raises(ValueError):
        RefusalPacer(share=1.5)
    with pytest.raises(ValueError):
        RefusalPacer(burst_s=0.0)
