"""Weighted fair order of one variant's queue (`infaas.policy.fairqueue`): pure, no clock."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from infaas.policy.fairqueue import FairQueue


@dataclass(frozen=True)
class Item:
    rows: int
    tenant: str
    seq: int = 0


def test_one_tenant_alone_is_served_in_arrival_order() -> None:
    q: FairQueue[Item] = FairQueue()
    for i in range(10):
        q.push(Item(1 + i % 3, "a", i), "a")
    assert [q.popleft().seq for _ in range(10)] == list(range(10))
    assert q.queued_rows == 0 and not q


def test_a_quiet_tenant_goes_ahead_of_a_neighbours_backlog() -> None:
    q: FairQueue[Item] = FairQueue()
    for i in range(100):
        q.push(Item(8, "noisy", i), "noisy")
    assert q.rows_ahead("noisy") == 800
    assert q.rows_ahead("quiet") <= 8  # at most the one query that shares its start tag
    q.push(Item(8, "quiet"), "quiet")
    assert [q.popleft().tenant for _ in range(2)].count("quiet") == 1


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 16)), min_size=1, max_size=200))
def test_rows_ahead_is_what_the_query_then_finds_ahead(pushes: list[tuple[str, int]]) -> None:
    q: FairQueue[Item] = FairQueue()
    for n, (tenant, rows) in enumerate(pushes):
        if n % 5 == 4 and q:
            q.popleft()
        predicted = q.rows_ahead(tenant)
        q.push(Item(rows, tenant, n), tenant)
        taken_before = 0
        for item in q:
            if item.seq == n:
                break
            taken_before += item.rows
        assert predicted == taken_before
    assert q.queued_rows == sum(item.rows for item in q)


@given(st.integers(1, 4), st.integers(1, 4))
def test_backlogged_tenants_share_the_head_by_weight(wa: int, wb: int) -> None:
    q: FairQueue[Item] = FairQueue()
    for i in range(400):
        q.push(Item(1, "a", i), "a", float(wa))
        q.push(Item(1, "b", i), "b", float(wb))
    head = [q.popleft().tenant for _ in range(200)]
    share_a = head.count("a") / len(head)
    assert abs(share_a - wa / (wa + wb)) <= 0.02


def test_rows_by_tenant() -> None:
    q: FairQueue[Item] = FairQueue()
    q.push(Item(3, "a"), "a")
    q.push(Item(2, "b"), "b")
    q.push(Item(4, "a"), "a")
    assert q.rows_by_tenant() == {"a": 7, "b": 2}
    assert (q.rows_of("a"), q.rows_of("b"), q.rows_of("c")) == (7, 2, 0)
    while q:
        q.popleft()
        assert sum(q.rows_by_tenant().values()) == q.queued_rows
    assert q.rows_by_tenant() == {} and q.rows_of("a") == 0
