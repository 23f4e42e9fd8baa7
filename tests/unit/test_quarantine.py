"""Quarantine of failing variants: pure bookkeeping driven by a fake clock."""

from __future__ import annotations

from infaas.quarantine import Quarantine


def test_quarantined_after_n_failures_in_a_row_then_on_probation_with_a_doubled_backoff() -> None:
    q = Quarantine(after_failures=3, backoff_s=10.0)
    assert q.failure("v", "load failed", now_s=0.0) is None
    q.success("v")  # a success in between resets the count
    assert q.failure("v", "load failed", now_s=1.0) is None
    assert q.failure("v", "load failed", now_s=2.0) is None
    verdict = q.failure("v", "corrupt artifact", now_s=3.0)
    assert verdict is not None and verdict.until_s == 13.0 and verdict.backoff_s == 10.0
    assert "corrupt artifact" in q.blocked(now_s=5.0)["v"]
    assert q.failure("v", "a batch sent before", now_s=6.0) is None  # already out: not counted
    assert q.blocked(now_s=13.0) == {}  # retried after the backoff
    second = q.failure("v", "still corrupt", now_s=14.0)  # probation: one failure is enough
    assert second is not None and second.backoff_s == 20.0
    assert q.blocked(now_s=33.9) and not q.blocked(now_s=34.0)
    q.success("v")
    assert q.failure("v", "x", now_s=40.0) is None  # cleared: back to N in a row


def test_backoff_is_capped_and_variants_are_independent() -> None:
    q = Quarantine(after_failures=1, backoff_s=1.0, max_backoff_factor=4)
    backoffs = []
    now = 0.0
    for _ in range(5):
        verdict = q.failure("a", "boom", now_s=now)
        assert verdict is not None
        backoffs.append(verdict.backoff_s)
        now = verdict.until_s
    assert backoffs == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert q.failure("b", "boom", now_s=now) is not None
    assert set(q.blocked(now_s=now)) == {"b"}  # "a" served its last backoff just now


def test_version_changes_only_when_the_blocked_set_does() -> None:
    q = Quarantine(after_failures=2, backoff_s=5.0)
    v0 = q.version
    q.failure("v", "x", now_s=0.0)
    q.success("v")
    assert q.version == v0  # never blocked: readers need not rebuild
    q.failure("v", "x", now_s=1.0)
    q.failure("v", "x", now_s=2.0)
    assert q.version > v0 and q.next_change_s == 7.0
