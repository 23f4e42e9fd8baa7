"""`Peers`: one autoscaler lease among the front ends of a shared fleet, and their merged demand."""

from __future__ import annotations

import asyncio

from infaas.peers import Peers
from infaas.policy.demand import DemandWindow
from infaas.store import MemoryStore
from tests.unit.test_autoscaler import record


class Clock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def two_front_ends(store: MemoryStore, clock: Clock) -> tuple[Peers, DemandWindow, Peers, DemandWindow]:
    wa, wb = DemandWindow(window_s=5.0), DemandWindow(window_s=5.0)
    return Peers(store, "a", wa, clock=clock), wa, Peers(store, "b", wb, clock=clock), wb


def test_one_front_end_leads_and_the_demand_is_everyones() -> None:
    store, clock = MemoryStore(), Clock()
    a, wa, b, wb = two_front_ends(store, clock)
    for i in range(5):
        wa.listener(record("m/v", rows=10, at_s=clock.now_s - i))
    wb.listener(record("m/v", rows=40, at_s=clock.now_s - 1))
    wb.listener(record("m/other", rows=5, at_s=clock.now_s - 1))

    asyncio.run(a.tick())
    asyncio.run(b.tick())
    asyncio.run(a.tick())  # now a has b's report too

    assert (a.leader, b.leader) == (True, False)
    assert a.demand("m/v", clock.now_s).rows_per_s == (50 + 40) / 5.0
    assert b.demand("m/v", clock.now_s).rows_per_s == (50 + 40) / 5.0
    assert a.demand("m/other", clock.now_s).rows_per_s == 1.0  # only b saw it
    assert a.demand("m/none", clock.now_s).rows_per_s == 0.0
    merged = a.demand("m/v", clock.now_s)
    assert (merged.latency_target_ms, merged.required_accuracy) == (50.0, 0.8)  # the records' targets
    assert set(a.last_seen_s) == {"m/v", "m/other"}
    assert {f.name: f.leader for f in a.front_ends} == {"a": True, "b": False}


def test_the_lease_moves_when_the_leader_leaves_or_goes_silent() -> None:
    store, clock = MemoryStore(), Clock()
    a, _, b, _ = two_front_ends(store, clock)
    asyncio.run(a.tick())
    asyncio.run(b.tick())
    assert (a.leader, b.leader) == (True, False)

    asyncio.run(a.close())  # a clean stop gives the lease up at once
    asyncio.run(b.tick())
    assert b.leader and [f.name for f in b.front_ends] == ["b"]

    # b dies without a word: a (back) gets the lease once it expires, and b's report goes stale.
    a2 = Peers(store, "a", DemandWindow(), clock=clock)
    asyncio.run(a2.tick())
    assert not a2.leader
    store._leases["autoscaler"] = ("b", 0.0)  # the TTL passed (MemoryStore's clock is monotonic)
    clock.now_s += b.stale_after_s + 1
    asyncio.run(a2.tick())
    assert a2.leader and [f.name for f in a2.front_ends] == ["a"]
