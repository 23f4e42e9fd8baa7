"""The change feed: what another front end wrote reaches this one's key cache and router."""

from __future__ import annotations

import asyncio

from infaas.changes import ChangeFeed
from infaas.errors import StoreError
from infaas.store import MemoryStore
from infaas.store.base import CHANGE_LOG_LENGTH
from infaas.types import Share, Tenant


class Seen:
    def __init__(self) -> None:
        self.tenants: list[str] = []
        self.model_rounds = 0
        self.reads: list[float] = []
        self.gaps = 0

    async def models(self) -> None:
        self.model_rounds += 1

    def gap(self) -> None:
        self.gaps += 1


class DownStore(MemoryStore):
    """A store whose change log cannot be read (an outage)."""

    def changes_since(self, seq: int, limit: int = 1000) -> list:  # type: ignore[type-arg]
        raise StoreError("down")


def feed(store: MemoryStore, seen: Seen, clock: list[float]) -> ChangeFeed:
    return ChangeFeed(
        store,
        on_tenant=seen.tenants.append,
        on_models=seen.models,
        on_read=seen.reads.append,
        on_gap=seen.gap,
        clock=lambda: clock[0],
    )


def test_the_feed_applies_what_was_written_after_its_start() -> None:
    store, seen, clock = MemoryStore(), Seen(), [1.0]
    store.create_tenant(Tenant(name="before"), "k0")
    store.revoke_tenant("before")
    f = feed(store, seen, clock)
    asyncio.run(f.tick())
    assert f.cursor == store.change_cursor() and seen.tenants == [] and seen.reads == [1.0]
    store.create_tenant(Tenant(name="acme"), "k1")
    store.set_share("acme", Share(weight=3.0))
    store.delete_labels("arch-1")
    store.delete_labels("arch-2")
    store.revoke_tenant("acme")
    clock[0] = 2.0
    asyncio.run(f.tick())
    assert seen.tenants == ["acme", "acme"]
    assert seen.model_rounds == 1  # one router refresh per round, however many models changed
    assert seen.reads == [1.0, 2.0] and seen.gaps == 0
    asyncio.run(f.tick())
    assert seen.tenants == ["acme", "acme"] and seen.model_rounds == 1


def test_a_store_outage_confirms_nothing() -> None:
    store, seen, clock = DownStore(), Seen(), [5.0]
    f = feed(store, seen, clock)
    asyncio.run(f.tick())  # the cursor (change_cursor still answers)
    asyncio.run(f.tick())
    assert seen.reads == [5.0]


def test_a_reader_behind_the_log_drops_everything() -> None:
    store, seen, clock = MemoryStore(), Seen(), [0.0]
    f = feed(store, seen, clock)
    store.publish_change("tenant", "a")
    asyncio.run(f.tick())
    for _ in range(CHANGE_LOG_LENGTH + 5):
        store.publish_change("tenant", "b")
    asyncio.run(f.tick())
    assert seen.gaps == 1
