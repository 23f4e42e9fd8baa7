"""The store's change log, read by every front end: a write on one reaches the others at once.

A revocation, a share or expiry change, a registration, a version label or a profile written
through any front end (or the CLI) appends an entry to the store's change log (`Change`; the typed
store writes it). Each front end reads the entries after its cursor every `interval_s` (0.25 s by
default: one small store read) and acts on them: a tenant's cached keys are dropped (the next
request re-reads the store, so a revoked key is refused within one interval), and the router
re-reads its snapshot once per round that named a model. A successful read also confirms every
cached key (`KeyCache.confirm_all`): no revocation happened up to that point. A reader that fell
behind the log's length (`CHANGE_LOG_LENGTH`) sees a gap and drops everything it caches.

A log read by polling rather than a Redis channel: it works on every store (SQLite is the
embedded default, and several front ends share its file), a front end that was away reads what it
missed instead of losing it, and at 4 reads a second it costs nothing measurable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from infaas.errors import StoreError
from infaas.periodic import Periodic
from infaas.store import MetadataStore
from infaas.store.base import Change

__all__ = ["ChangeFeed"]

log = logging.getLogger(__name__)


class ChangeFeed:
    def __init__(
        self,
        store: MetadataStore,
        *,
        on_tenant: Callable[[str], None],
        on_models: Callable[[], Awaitable[object]],
        on_read: Callable[[float], None],
        on_gap: Callable[[], None],
        interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._on_tenant = on_tenant
        self._on_models = on_models
        self._on_read = on_read
        self._on_gap = on_gap
        self._clock = clock
        self.cursor: int | None = None  # None until the first read (start, or the store was down)
        self._loop = Periodic("change-feed", interval_s, self.tick)

    def start(self) -> None:
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    async def tick(self) -> None:
        """Read and apply the entries after the cursor (the first read only sets it)."""
        now_s = self._clock()  # before the read: the log is known up to at least here
        try:
            if self.cursor is None:
                self.cursor = await asyncio.to_thread(self._store.change_cursor)
                self._on_read(now_s)
                return
            changes = await asyncio.to_thread(self._store.changes_since, self.cursor)
        except StoreError as exc:
            log.debug("change feed: store unreachable (%s)", exc.message)
            return
        if changes:
            await self.apply(changes)
        self._on_read(now_s)

    async def apply(self, changes: list[Change]) -> None:
        assert self.cursor is not None
        if changes[0].seq > self.cursor + 1 and self.cursor > 0:
            # Entries this front end never saw were trimmed (or a write's number was skipped):
            # forget every cached key and re-read the models rather than guess what they were.
            log.warning(
                "change feed: entries %d-%d unread; re-reading everything",
                self.cursor + 1,
                changes[0].seq - 1,
            )
            self._on_gap()
        models = False
        for change in changes:
            if change.kind == "tenant":
                self._on_tenant(change.name)
            else:
                models = True
        self.cursor = changes[-1].seq
        if models:
            await self._on_models()
