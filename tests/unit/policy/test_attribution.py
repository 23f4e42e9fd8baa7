"""Reserved cost attributed to the tenants whose traffic caused it, exactly (issue 36)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from infaas.policy.attribution import OPERATOR, ReservedCost, apportion

names = st.sampled_from(["acme", "beta", "gamma", "delta"])


@given(st.integers(-(10**15), 10**15), st.dictionaries(names, st.floats(0.0, 1e6), min_size=1))
def test_apportioned_parts_add_up_exactly_and_follow_the_weights(
    amount: int, weights: dict[str, float]
) -> None:
    parts = apportion(amount, weights)
    positive = {k: w for k, w in weights.items() if w > 0}
    if not positive:
        assert parts == {}
        return
    assert sum(parts.values()) == amount
    total = sum(positive.values())
    for name, part in parts.items():
        assert abs(part - amount * positive[name] / total) < 1.0 + 1e-6 * abs(amount)


def test_the_interval_gives_each_variant_its_cost_less_its_charges() -> None:
    r = ReservedCost(horizon_s=3600.0)
    r.charged("acme", "a/v1", rows=30, cost_pusd=100, now_s=10.0)
    r.charged("beta", "a/v2", rows=10, cost_pusd=50, now_s=10.0)
    out = r.close({"a/v1": 1_000, "a/v2": 20, "b/v1": 500}, now_s=11.0)
    # a/v1: 900 reserved, split 3:1 by rows on architecture a; a/v2 charged 30 more than it cost:
    # given back in the same proportions (the odd one to the name first in order); b has had no
    # traffic: the operator's.
    assert out == {
        ("acme", "a/v1"): 675,
        ("beta", "a/v1"): 225,
        ("acme", "a/v2"): -23,
        ("beta", "a/v2"): -7,
        (OPERATOR, "b/v1"): 500,
    }
    assert r.close({}, now_s=12.0) == {}  # the charges belonged to the interval that closed


def test_traffic_older_than_the_horizon_no_longer_carries_a_replica() -> None:
    r = ReservedCost(horizon_s=120.0, bucket_s=60.0)
    r.charged("acme", "a/v1", rows=5, cost_pusd=0, now_s=0.0)
    r.charged("beta", "a/v1", rows=5, cost_pusd=0, now_s=100.0)
    assert r.close({"a/v1": 10}, now_s=130.0) == {("acme", "a/v1"): 5, ("beta", "a/v1"): 5}
    assert r.close({"a/v1": 10}, now_s=200.0) == {("beta", "a/v1"): 10}  # acme's minute aged out
    assert r.close({"a/v1": 10}, now_s=400.0) == {(OPERATOR, "a/v1"): 10}
