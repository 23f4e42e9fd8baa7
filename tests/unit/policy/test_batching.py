"""The batching policy: doomed, full, deadline, idle, busy and wait, plus properties over random queues."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infaas.policy.batching import (
    QUANTUM_SHARE,
    BatchParams,
    InFlight,
    decide,
    follow_slowdown,
    predicted_queue_delay_ms,
    quantum_rows,
)


@dataclass(frozen=True)
class Req:
    rows: int
    deadline_s: float


def linear(intercept_ms: float, slope_ms: float):  # type: ignore[no-untyped-def]
    return lambda n: intercept_ms + slope_ms * n


LAT = linear(2.0, 0.1)  # 2.1 ms for one row, 5.2 ms for 32


def test_empty_queue_waits_for_an_arrival() -> None:
    d = decide([], LAT, BatchParams(max_batch=8), in_flight=0, now_s=0.0)
    assert not d.send and d.wait_until_s is None and d.reason == "empty"


def test_idle_worker_sends_at_once() -> None:
    d = decide([Req(1, 10.0)], LAT, BatchParams(max_batch=8), in_flight=0, now_s=0.0)
    assert (d.send_requests, d.send_rows, d.reason) == (1, 1, "idle")


def test_full_batch_goes_even_while_one_runs() -> None:
    queue = [Req(4, 10.0), Req(4, 10.0), Req(3, 10.0)]
    d = decide(queue, LAT, BatchParams(max_batch=8, max_in_flight=2), in_flight=1, now_s=0.0)
    assert (d.send_requests, d.send_rows, d.reason) == (2, 8, "full")


def test_busy_waits_for_a_completion_even_when_full() -> None:
    queue = [Req(8, 0.001)]
    d = decide(queue, LAT, BatchParams(max_batch=8, max_in_flight=1), in_flight=1, now_s=0.0)
    assert not d.send and d.reason == "busy" and d.wait_until_s is None


def test_partial_batch_waits_while_one_runs_until_the_tightest_deadline_needs_it() -> None:
    params = BatchParams(max_batch=8, max_in_flight=2)
    queue = [Req(1, 0.050), Req(2, 0.020)]
    d = decide(queue, LAT, params, in_flight=1, now_s=0.0)
    assert d.reason == "wait"
    assert d.wait_until_s == pytest.approx(0.020 - LAT(3) / 1000)
    at_deadline = decide(queue, LAT, params, in_flight=1, now_s=d.wait_until_s)
    assert (at_deadline.send_requests, at_deadline.send_rows, at_deadline.reason) == (2, 3, "deadline")


def test_a_batch_stops_where_one_more_request_would_miss_its_deadline() -> None:
    slow = linear(1.0, 5.0)  # 5 ms a row: 32 rows take 161 ms, 64 take 321 ms
    queue = [Req(32, 0.250), Req(32, 0.260), Req(32, 0.270)]
    d = decide(queue, slow, BatchParams(max_batch=128, max_in_flight=2), in_flight=1, now_s=0.0)
    assert (d.send_requests, d.send_rows, d.reason) == (1, 32, "full")  # not 96 rows, all late
    # the batcher's queue is a deque: the shrinking path must not slice it
    d = decide(deque(queue), slow, BatchParams(max_batch=128, max_in_flight=2), in_flight=1, now_s=0.0)
    assert (d.send_requests, d.send_rows) == (1, 32)
    roomy = [Req(32, 1.0), Req(32, 1.0)]
    d = decide(roomy, slow, BatchParams(max_batch=128, max_in_flight=2), in_flight=0, now_s=0.0)
    assert (d.send_requests, d.send_rows) == (2, 64)


def test_oversized_request_goes_alone() -> None:
    d = decide([Req(20, 1.0), Req(1, 1.0)], LAT, BatchParams(max_batch=8), in_flight=0, now_s=0.0)
    assert (d.send_requests, d.send_rows, d.reason) == (1, 20, "full")


FLOOR = linear(1.0, 0.1)  # the typical run: 1.1 ms for one row


def test_a_head_request_that_cannot_meet_its_deadline_is_shed() -> None:
    queue = [Req(1, 0.0100), Req(1, 0.0107), Req(1, 0.0500)]
    params = BatchParams(max_batch=8, max_in_flight=1)
    # sent now (t=9.5 ms) after 0.5 ms for a replica, the first two would answer at 11.1 ms
    d = decide(queue, LAT, params, in_flight=0, now_s=0.0095, floor_ms=FLOOR, wait_ms=0.5)
    assert (d.reason, d.shed_requests, d.send) == ("doomed", 2, False)
    # without the wait, the second would be in time: only the first goes
    d = decide(queue, LAT, params, in_flight=0, now_s=0.0095, floor_ms=FLOOR)
    assert (d.reason, d.shed_requests) == ("doomed", 1)
    # no floor, no shedding (the rule is the caller's to ask for)
    assert decide(queue, LAT, params, in_flight=0, now_s=0.0095).reason != "doomed"


def test_a_busy_variant_wakes_when_its_head_would_become_doomed() -> None:
    queue = [Req(1, 0.0100), Req(1, 0.0500)]
    params = BatchParams(max_batch=8, max_in_flight=1)
    d = decide(queue, LAT, params, in_flight=1, now_s=0.0, floor_ms=FLOOR, wait_ms=2.0)
    assert d.reason == "busy" and d.wait_until_s == pytest.approx(0.0100 - 0.0011, abs=1e-5)
    # at that moment, still busy (the batch ahead overran): the head is shed
    later = d.wait_until_s
    assert later is not None
    d = decide(queue, LAT, params, in_flight=1, now_s=later, floor_ms=FLOOR)
    assert (d.reason, d.shed_requests) == ("doomed", 1)


@given(
    queue=st.lists(st.builds(Req, st.integers(1, 16), st.floats(0.0, 0.5)), min_size=1, max_size=40),
    in_flight=st.integers(0, 2),
    now_s=st.floats(0.0, 0.5),
    wait_ms=st.floats(0.0, 50.0),
    slope=st.floats(0.0, 2.0),
)
def test_shedding_takes_exactly_the_doomed_head(
    queue: list[Req], in_flight: int, now_s: float, wait_ms: float, slope: float
) -> None:
    """Shed requests could not answer in time even sent now; the next one could, or it would be
    shed too; a request that could is never shed."""
    floor = linear(1.0, slope)
    d = decide(
        queue, linear(2.0, slope), BatchParams(max_batch=8, max_in_flight=2), in_flight, now_s, floor, wait_ms
    )

    def late(r: Req) -> bool:
        return now_s + (wait_ms + floor(r.rows)) / 1000 > r.deadline_s + 1e-6

    assert d.shed_requests == 0 or d.reason == "doomed"
    assert all(late(r) for r in queue[: d.shed_requests])
    if d.reason != "doomed":
        assert not late(queue[0])
    elif d.shed_requests < len(queue):
        assert not late(queue[d.shed_requests])


def test_params_are_validated() -> None:
    with pytest.raises(ValueError):
        BatchParams(max_batch=0)


queues = st.lists(
    st.builds(Req, st.integers(1, 16), st.floats(0.0, 0.5, allow_nan=False)), min_size=1, max_size=40
)


@given(
    queue=queues,
    max_batch=st.integers(1, 64),
    max_in_flight=st.integers(1, 4),
    in_flight=st.integers(0, 4),
    now_s=st.floats(0.0, 0.5, allow_nan=False),
    intercept=st.floats(0.0, 20.0),
    slope=st.floats(0.0, 2.0),
)
def test_decision_properties(
    queue: list[Req],
    max_batch: int,
    max_in_flight: int,
    in_flight: int,
    now_s: float,
    intercept: float,
    slope: float,
) -> None:
    lat = linear(intercept, slope)
    params = BatchParams(max_batch=max_batch, max_in_flight=max_in_flight)
    d = decide(queue, lat, params, in_flight, now_s)
    total = sum(r.rows for r in queue)
    if in_flight >= max_in_flight:
        assert not d.send  # never more than max_in_flight batches of a variant
        return
    if d.send:
        # a FIFO prefix, within max batch unless it is one oversized request
        assert 1 <= d.send_requests <= len(queue)
        assert d.send_rows == sum(r.rows for r in queue[: d.send_requests])
        assert d.send_rows <= max_batch or d.send_requests == 1
        if d.send_requests < len(queue):
            # as full as FIFO allows: one more request would overflow the batch, or make it miss
            # the tightest deadline in it
            more = queue[: d.send_requests + 1]
            rows = d.send_rows + queue[d.send_requests].rows
            live = [r.deadline_s for r in more if r.deadline_s >= now_s]
            late = bool(live) and now_s + lat(rows) / 1000 > min(live)
            assert rows > max_batch or late
    else:
        # waiting only with something running, a partial batch, and a wake-up before the deadline
        assert in_flight > 0 and total < max_batch
        assert d.wait_until_s is not None and d.wait_until_s > now_s
        tightest = min(r.deadline_s for r in queue)
        assert d.wait_until_s + lat(total) / 1000 <= tightest + 1e-9
    if total >= max_batch:
        assert d.send and d.reason == "full"
    if in_flight == 0:
        assert d.send  # work-conserving: an idle variant never waits


def test_queue_delay_is_zero_when_idle() -> None:
    assert predicted_queue_delay_ms(0, [], LAT, BatchParams(max_batch=8)) == 0.0


def test_queue_delay_waits_for_the_running_batch() -> None:
    assert predicted_queue_delay_ms(0, [3.0], LAT, BatchParams(max_batch=8, max_in_flight=2)) == 3.0


def test_queue_delay_counts_full_batches_ahead() -> None:
    params = BatchParams(max_batch=8, max_in_flight=1)
    # 16 queued rows = two full batches ahead, each 2.8 ms, after the running one (1 ms left)
    assert predicted_queue_delay_ms(16, [1.0], LAT, params) == pytest.approx(1.0 + 2 * LAT(8))


def test_queue_delay_counts_the_rows_that_share_its_batch() -> None:
    """A request joins the queued rows the full batches ahead leave: its batch runs them too. The
    22nd query of a flood's first read on a 1.7 ms-a-row model waits ~36 ms for its batch of 22
    rows, not the one row its own run is priced at."""
    per_row = lambda n: 1.7 * n  # noqa: E731 - a compute-bound model, latency in proportion
    idle = BatchParams(max_batch=64, max_in_flight=2)
    assert predicted_queue_delay_ms(21, [], per_row, idle) == pytest.approx(per_row(22) - per_row(1))
    # 16 queued rows and batches of 8: two full batches ahead, then its own batch of one row
    params = BatchParams(max_batch=8, max_in_flight=1)
    assert predicted_queue_delay_ms(16, [], per_row, params) == pytest.approx(2 * per_row(8))
    # 18 queued: two full batches ahead, then a batch of 3 rows, it among them
    assert predicted_queue_delay_ms(18, [], per_row, params) == pytest.approx(
        2 * per_row(8) + per_row(3) - per_row(1)
    )


@given(
    queued=st.integers(0, 200),
    running=st.lists(st.floats(0.0, 50.0), max_size=4),
    max_batch=st.integers(1, 64),
)
def test_queue_delay_grows_with_the_queue(queued: int, running: list[float], max_batch: int) -> None:
    params = BatchParams(max_batch=max_batch, max_in_flight=4)
    a = predicted_queue_delay_ms(queued, running, LAT, params)
    b = predicted_queue_delay_ms(queued + max_batch, running, LAT, params)
    assert 0.0 <= a <= b


def test_batches_beyond_the_replicas_wait_for_one_to_free() -> None:
    # Two batches in flight on one replica run one after the other: a new request's batch starts
    # when the later one ends, not when the earlier does.
    params = BatchParams(max_batch=8, max_in_flight=2)
    assert predicted_queue_delay_ms(0, [10.0, 20.0], lambda n: 5.0, params) == pytest.approx(10.0)
    assert predicted_queue_delay_ms(0, [10.0, 20.0], lambda n: 5.0, params, servers=1) == pytest.approx(20.0)
    assert predicted_queue_delay_ms(0, [10.0, 20.0], lambda n: 5.0, params, servers=2) == pytest.approx(10.0)


def test_in_flight_reanchors_the_batch_waiting_behind_one_that_is_back() -> None:
    flight = InFlight()
    assert flight.wait(0.0, servers=1) == (0.0, None)
    flight.sent(1, 0.0, 0.0, 2.0, None)  # runs now, predicted back at 2 ms
    wait_ms, ahead = flight.wait(0.0, servers=1)
    assert (wait_ms, ahead) == (2.0, 1)
    flight.sent(2, 0.0, wait_ms, 2.0, ahead)  # predicted back at 4 ms
    assert flight.remaining_ms(0.0) == [2.0, 4.0]
    flight.done(1, 0.0005)  # back at 0.5 ms: the second starts then, and is back 2 ms later
    assert len(flight) == 1 and flight.remaining_ms(0.0005) == pytest.approx([2.0])
    flight.done(2, 0.003)  # later than predicted: fine, and nothing left
    assert len(flight) == 0 and flight.wait(0.003, servers=1) == (0.0, None)


def test_in_flight_typical_wait_takes_each_batchs_typical_run() -> None:
    """The doomed rule's wait: the batch ahead predicted at 10 ms (its p99), typically 6 ms."""
    flight = InFlight()
    flight.sent(1, 0.0, 0.0, 10.0, None, floor_ms=6.0)
    assert flight.wait(0.002, 1) == (pytest.approx(8.0), 1)
    assert flight.wait(0.002, 1, typical=True) == (pytest.approx(4.0), 1)
    flight.sent(2, 0.002, 8.0, 10.0, 1)  # no floor given: its typical run is its predicted one
    assert flight.wait(0.002, 1, typical=True)[0] == pytest.approx(18.0)
    flight.done(1, 0.003)
    assert flight.wait(0.003, 1, typical=True) == (pytest.approx(10.0), 2)
    assert flight.waits(0.003, 1) == (pytest.approx(10.0), pytest.approx(10.0), 2)  # what a pump reads
    assert InFlight().waits(0.0, 1) == (0.0, 0.0, None)


def test_in_flight_with_two_replicas_waits_for_the_earlier_of_their_last_batches() -> None:
    flight = InFlight()
    flight.sent(1, 0.0, 0.0, 5.0, None)
    flight.sent(2, 0.0, 0.0, 3.0, None)
    assert flight.wait(0.0, servers=2) == (3.0, 2)
    assert flight.wait(0.0, servers=3) == (0.0, None)


def test_the_slowdown_rises_at_once_and_falls_slowly() -> None:
    estimate = follow_slowdown(1.0, 3.0)  # one batch 3x its profile: believed at once, mostly
    assert estimate >= 2.0
    after_one_fast = follow_slowdown(estimate, 1.0)  # one quick batch after it: still careful
    assert after_one_fast >= 0.9 * estimate
    for _ in range(60):  # a quiet spell: back to the profile
        estimate = follow_slowdown(estimate, 1.0)
    assert estimate == pytest.approx(1.0, abs=0.01)


@given(
    st.floats(min_value=0.5, max_value=20.0),
    st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=1, max_size=50),
)
def test_the_slowdown_stays_between_what_it_saw_and_within_bounds(start: float, ratios: list[float]) -> None:
    estimate = start
    for ratio in ratios:
        before = estimate
        estimate = follow_slowdown(estimate, ratio)
        seen = min(max(ratio, 0.5), 20.0)
        assert min(before, seen) - 1e-9 <= estimate <= max(before, seen) + 1e-9
        assert 0.5 <= estimate <= 20.0


@given(st.floats(0.1, 5.0), st.floats(0.01, 2.0), st.lists(st.floats(1.0, 500.0), min_size=2, max_size=5))
def test_a_shared_variants_batch_fits_a_quantum_of_the_tightest_target(
    base_ms: float, per_row_ms: float, budgets_ms: list[float]
) -> None:
    def latency(rows: int) -> float:
        return base_ms + per_row_ms * rows

    rows = quantum_rows(latency, 128, budgets_ms)
    assert 1 <= rows <= 128
    quantum_ms = QUANTUM_SHARE * min(budgets_ms)
    assert rows == 1 or latency(rows) <= quantum_ms  # fits
    assert rows == 128 or latency(rows + 1) > quantum_ms  # and is the most that fits
    assert quantum_rows(latency, 128, budgets_ms[:1]) == 128  # one tenant keeps the whole batch
