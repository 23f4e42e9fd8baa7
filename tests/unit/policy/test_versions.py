"""Label transitions, the accuracy guard and the canary split (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infaas.errors import Conflict, InvalidInput
from infaas.policy.versions import (
    CanarySplit,
    accuracy_guard,
    end_canary,
    promote,
    remove_version,
    rollback,
    set_canary,
)
from infaas.types import Labels

KNOWN = {1, 2, 3}


def test_canary_then_promote_then_rollback() -> None:
    labels = Labels(architecture="net")
    assert labels.serving == (1,) and labels.state(2) == "ready"
    canary = set_canary(labels, 2, 0.2, KNOWN)
    assert canary.serving == (1, 2) and canary.state(2) == "serving"
    promoted = promote(canary, None, KNOWN)
    assert (promoted.stable, promoted.canary, promoted.previous) == (2, None, (1,))
    assert promoted.state(1) == "retired" and promoted.state(2) == "serving"
    back = rollback(promoted, KNOWN)
    assert (back.stable, back.previous) == (1, ())
    assert back.state(2) == "retired" and back.state(1) == "serving"
    with pytest.raises(Conflict, match="no earlier stable"):
        rollback(back, KNOWN)


def test_a_canary_must_be_a_routable_other_version_with_a_share_in_0_1() -> None:
    labels = Labels(architecture="net", states={3: "failed"})
    with pytest.raises(InvalidInput, match="share"):
        set_canary(labels, 2, 1.0, KNOWN)
    with pytest.raises(Conflict, match="already stable"):
        set_canary(labels, 1, 0.1, KNOWN)
    with pytest.raises(InvalidInput, match="no version 7"):
        set_canary(labels, 7, 0.1, KNOWN)
    with pytest.raises(Conflict, match="failed"):
        set_canary(labels, 3, 0.1, KNOWN)
    with pytest.raises(Conflict, match="no canary"):
        end_canary(labels)
    replaced = set_canary(set_canary(Labels(architecture="net"), 2, 0.1, KNOWN), 3, 0.5, KNOWN)
    assert replaced.canary == 3 and replaced.state(2) == "ready"
    assert end_canary(replaced).serving == (1,)


def test_promote_without_a_canary_names_a_version() -> None:
    labels = Labels(architecture="net")
    with pytest.raises(Conflict, match="no canary to promote"):
        promote(labels, None, KNOWN)
    direct = promote(labels, 3, KNOWN)
    assert direct.stable == 3 and direct.previous == (1,)
    # Promoting another version while a canary runs keeps the canary.
    kept = promote(set_canary(labels, 2, 0.3, KNOWN), 3, KNOWN)
    assert (kept.stable, kept.canary, kept.canary_share) == (3, 2, 0.3)


def test_removing_a_version_keeps_the_stable_one() -> None:
    labels = promote(set_canary(Labels(architecture="net"), 2, 0.1, KNOWN), None, KNOWN)
    with pytest.raises(Conflict, match="stable version"):
        remove_version(labels, 2)
    gone = remove_version(labels, 1)
    assert gone.previous == () and 1 not in gone.states
    canary_gone = remove_version(set_canary(labels, 3, 0.1, KNOWN), 3)
    assert canary_gone.canary is None and canary_gone.canary_share == 0.0


def test_the_accuracy_guard_allows_the_tolerance_and_says_why_beyond_it() -> None:
    assert accuracy_guard(0.95, 0.955, 0.01) is None
    assert accuracy_guard(0.99, 0.95, 0.01) is None
    why = accuracy_guard(0.90, 0.95, 0.01)
    assert why is not None and "0.9000" in why and "0.9500" in why


@given(share=st.floats(min_value=0.01, max_value=0.99), n=st.integers(min_value=1, max_value=5000))
def test_the_split_is_exact_after_any_number_of_queries(share: float, n: int) -> None:
    split = CanarySplit()
    taken = sum(split.take("net", 2, share) for _ in range(n))
    assert abs(taken - n * share) < 1.0 + 1e-6
    assert split.observed("net", 2) == (n, taken)


def test_the_split_restarts_with_a_new_share_and_counts_misses_as_stable() -> None:
    split = CanarySplit()
    assert [split.take("net", 2, 0.5) for _ in range(4)] == [False, True, False, True]
    split.missed("net", 2)
    assert split.observed("net", 2) == (4, 1)
    split.take("net", 2, 0.25)
    assert split.observed("net", 2) == (1, 0)
