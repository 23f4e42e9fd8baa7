"""The concurrency limit of admitted queries (`infaas.policy.admission`): pure, driven by verdicts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infaas.policy.admission import ConcurrencyLimit, RateQuota, late_for_load


def test_a_late_answer_cuts_the_limit_and_the_cut_bounds_what_is_admitted() -> None:
    limit = ConcurrencyLimit(initial=20, min_limit=4, backoff=0.5, cooldown_s=0.0)
    assert all(limit.try_admit() for _ in range(20))
    assert not limit.try_admit()  # full
    limit.release(True, 1.0)  # late: 20 -> 10
    assert limit.limit == 10
    assert not limit.try_admit()  # 19 in flight over a limit of 10
    for _ in range(10):
        limit.release(None, 1.0)  # refused downstream: no signal
    assert limit.limit == 10 and limit.in_flight == 9
    assert limit.try_admit() and not limit.try_admit()


def test_late_answers_of_one_batch_count_once() -> None:
    limit = ConcurrencyLimit(initial=64, backoff=0.5, cooldown_s=0.05)
    for _ in range(16):
        assert limit.try_admit()
    for _ in range(16):  # one batch's answers, all late, at once
        limit.release(True, 2.0)
    assert limit.limit == 32
    limit.try_admit()
    limit.release(True, 2.06)  # a later batch
    assert limit.limit == 16


def test_it_never_falls_below_its_floor() -> None:
    limit = ConcurrencyLimit(initial=16, min_limit=8, backoff=0.5, cooldown_s=0.0)
    for i in range(10):
        limit.try_admit()
        limit.release(True, float(i))
    assert limit.limit == 8
    assert all(limit.try_admit() for _ in range(8))  # a few clients never meet it


def test_answers_in_time_grow_it_only_while_it_holds_traffic_back() -> None:
    limit = ConcurrencyLimit(initial=16, min_limit=4)
    for i in range(1000):  # one client at a time: far below the limit
        limit.try_admit()
        limit.release(False, float(i))
    assert limit.limit == 16
    for _ in range(8):  # half full: still not what holds the clients back
        limit.try_admit()
    for _ in range(8):
        limit.release(False, 0.0)
    assert limit.limit == 16
    for _ in range(16):
        limit.try_admit()
    limit.release(False, 0.0)  # the limit was binding
    assert limit.limit == pytest.approx(16 + 1 / 16)


def test_an_answer_is_late_for_the_load_when_it_misses_or_comes_well_after_its_prediction() -> None:
    assert late_for_load(60.0, 50.0, 30.0)  # missed, predicted with room to spare
    assert not late_for_load(52.0, 50.0, 45.0)  # missed at the edge of its prediction: noise
    assert late_for_load(45.0, 50.0, 20.0)  # in time, but 25 ms after its prediction: queues grow
    assert not late_for_load(30.0, 50.0, 20.0)
    assert not late_for_load(5.0, 500.0, 0.5)  # 4.5 ms late on a 500 ms target says nothing
    assert late_for_load(float("inf"), 50.0, 49.0)  # no answer at all (a 504): always a signal
    # At the edge of its prediction, but after waiting behind other queries for a quarter of its
    # target: a shorter queue would have met it (a sustained overload fills queues to the edge).
    assert late_for_load(252.0, 250.0, 245.0, queued_ms=70.0)
    assert not late_for_load(252.0, 250.0, 245.0, queued_ms=50.0)
    assert not late_for_load(240.0, 250.0, 245.0, queued_ms=200.0)  # in time


@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from([True, False, None]), st.floats(0.0, 0.2)),
        max_size=300,
    )
)
def test_property_in_flight_never_exceeds_the_limit_nor_the_limit_its_bounds(
    steps: list[tuple[bool, bool | None, float]],
) -> None:
    limit = ConcurrencyLimit(initial=12, min_limit=4, max_limit=40, backoff=0.7, cooldown_s=0.05)
    now_s = 0.0
    for admit, late, dt_s in steps:
        now_s += dt_s
        before = limit.in_flight
        if admit:
            if limit.try_admit():
                assert before < int(limit.limit)  # admitted only under the limit
            else:
                assert limit.in_flight == before >= int(limit.limit)
        elif limit.in_flight:
            limit.release(late, now_s)
        assert 4 <= limit.limit <= 40
        assert limit.in_flight >= 0


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        ConcurrencyLimit(initial=2, min_limit=8)
    with pytest.raises(ValueError):
        ConcurrencyLimit(backoff=1.0)


# ---- shares of the limit and rate quotas -------------------------------------------------


def test_a_tenant_within_its_share_is_admitted_when_a_neighbour_fills_the_limit() -> None:
    limit = ConcurrencyLimit(initial=20, min_limit=4)
    admitted = [limit.try_admit("noisy", 1.0, 0.0) for _ in range(21)]
    assert admitted == [True] * 20 + [False]
    assert limit.full and limit.held("noisy") == 20
    assert limit.over_share("noisy", 1.0, 0.0)
    assert not limit.over_share("quiet", 1.0, 0.0)
    assert limit.try_admit("quiet", 1.0, 0.0)  # borrowed from the tenant over its share
    assert not limit.try_admit("noisy", 1.0, 0.0)
    limit.release(None, 0.1, "noisy")
    assert not limit.try_admit("noisy", 1.0, 0.1)  # 20 + 1 in flight: still full
    limit.release(None, 0.1, "quiet")
    assert limit.try_admit("noisy", 1.0, 0.1)


def test_shares_follow_the_weights_of_the_active_tenants() -> None:
    limit = ConcurrencyLimit(initial=30, min_limit=4, active_s=1.0)
    limit.try_admit("a", 2.0, 0.0)
    limit.try_admit("b", 1.0, 0.0)
    assert limit.share("a", 2.0, 0.0) == 20.0 and limit.share("b", 1.0, 0.0) == 10.0
    limit.release(None, 0.5, "b")
    assert limit.share("a", 2.0, 5.0) == 30.0  # b idle for longer than active_s: a has it all


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans()), max_size=300),
    st.integers(8, 64),
)
def test_the_total_stays_within_twice_the_limit_and_a_tenant_under_its_share_is_never_refused(
    steps: list[tuple[str, bool]], initial: int
) -> None:
    limit = ConcurrencyLimit(initial=float(initial), min_limit=8.0)
    for tenant, admit in steps:
        if admit:
            under = limit.held(tenant) < max(1, int(limit.share(tenant, 1.0, 0.0)))
            took = limit.try_admit(tenant, 1.0, 0.0)
            assert took or not under
        elif limit.held(tenant):
            limit.release(None, 0.0, tenant)
        assert limit.in_flight <= 2 * int(limit.limit) + 3
        assert limit.in_flight == sum(limit.held(t) for t in "abc")


def test_a_rate_quota_is_a_token_bucket() -> None:
    quota = RateQuota(10.0, burst=2.0, now_s=0.0)
    assert quota.take(0.0) == 0.0 and quota.take(0.0) == 0.0
    wait_s = quota.take(0.0)
    assert wait_s == pytest.approx(0.1) and quota.empty
    assert quota.wait_s(0.05) == pytest.approx(0.05)  # peeking takes nothing
    assert quota.take(0.1) == 0.0
    with pytest.raises(ValueError):
        RateQuota(0.0)


def test_a_late_answer_admitted_into_an_uncrowded_front_end_does_not_cut_the_limit() -> None:
    limit = ConcurrencyLimit(initial=64, backoff=0.5, cooldown_s=0.0)
    assert limit.try_admit() and not limit.crowded
    limit.release(True, 1.0, crowded=False)  # one query in flight, answered late: the host, not the load
    assert limit.limit == 64
    for _ in range(32):
        limit.try_admit()
    assert limit.crowded
    limit.release(True, 2.0, crowded=True)
    assert limit.limit == 32
