"""One variant's queue, in weighted fair order across tenants (pure: no clock, no I/O).

A FIFO queue shared by tenants lets the heaviest one decide everyone's wait: admission fills a
variant's queue up to the edge of the targets, and a quiet tenant's query then finds that edge
already taken by its neighbour's backlog. Measured on main c3fe54d (issue 32): a tenant at 20 q/s
beside one at ~900 q/s on `digits-resnet`, 60 ms target, got 44 % of its queries answered in SLO
and 117 × 429.

So the queue orders queries by start-time fair queuing (SFQ, Goyal et al. 1996), in rows: a
query of tenant *t* with weight *w* gets the start tag ``max(V, F_t)`` and moves ``F_t`` on by
``rows / w``; the queue is kept sorted by start tag (stable for equal tags) and batches are taken
from its head; ``V`` is the start tag of the last query taken. A tenant alone keeps FIFO order; a
tenant with no backlog starts at ``V`` and goes in the next batch, whatever its neighbours have
queued; a tenant with a backlog waits behind its own rows, and behind only its weighted share
of the others'. SFQ rather than WFQ's finish tags: it needs no estimate of a query's service
time (a batch's time is not additive in its queries), and its bound on a newcomer's wait is one
query per backlogged tenant.

`rows_ahead` is the admission side of the same rule: how many rows a query of this tenant would
find ahead of it, so that its predicted wait is its own, not the queue's depth.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["FairQueue", "HasRows"]


class HasRows(Protocol):
    @property
    def rows(self) -> int: ...


T = TypeVar("T", bound=HasRows)


class FairQueue(Generic[T]):
    """Items in start-tag order; see the module docstring. ``len``, indexing and iteration read
    it in the order batches take it (what `policy.batching.decide` reads)."""

    __slots__ = ("_finish", "_items", "_rows_of", "_tags", "_tenants", "queued_rows", "virtual")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._tags: list[float] = []
        self._tenants: list[str] = []
        self._finish: dict[str, float] = {}  # tenant → finish tag of its last query pushed
        self._rows_of: dict[str, int] = {}  # tenant → its rows queued (absent: none)
        self.virtual = 0.0
        self.queued_rows = 0

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __getitem__(self, index: int) -> T:
        return self._items[index]

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    @property
    def items(self) -> Sequence[T]:
        """The queue in the order batches take it (read-only)."""
        return self._items

    def _start(self, tenant: str) -> float:
        return max(self.virtual, self._finish.get(tenant, self.virtual))

    def push(self, item: T, tenant: str = "", weight: float = 1.0) -> None:
        """Queue `item` for `tenant` (`weight` > 0: its share relative to the others')."""
        start = self._start(tenant)
        self._finish[tenant] = start + item.rows / weight
        at = bisect_right(self._tags, start)
        self._items.insert(at, item)
        self._tags.insert(at, start)
        self._tenants.insert(at, tenant)
        self.queued_rows += item.rows
        self._rows_of[tenant] = self._rows_of.get(tenant, 0) + item.rows

    def popleft(self) -> T:
        """Take the head (the next query a batch takes)."""
        item = self._items.pop(0)
        self.virtual = self._tags.pop(0)
        tenant = self._tenants.pop(0)
        self.queued_rows -= item.rows
        left = self._rows_of[tenant] - item.rows
        if left > 0:
            self._rows_of[tenant] = left
        else:
            del self._rows_of[tenant]
        if not self._items:
            self._finish.clear()  # every tag is <= V now: nothing to remember
        elif len(self._finish) > 256:
            self._finish = {t: f for t, f in self._finish.items() if f > self.virtual}
        return item

    def rows_ahead(self, tenant: str = "") -> int:
        """Rows a query of `tenant` pushed now would find ahead of it. Sums the shorter side of
        the queue: a tenant with no backlog lands near the head, a flooding one at the tail."""
        at = bisect_right(self._tags, self._start(tenant))
        items = self._items
        if at <= len(items) - at:
            return sum(items[i].rows for i in range(at))
        return self.queued_rows - sum(items[i].rows for i in range(at, len(items)))

    def rows_of(self, tenant: str = "") -> int:
        """Rows of `tenant`'s queries in the queue: with none, its next query lands near the head."""
        return self._rows_of.get(tenant, 0)

    def rows_by_tenant(self) -> dict[str, int]:
        """Queued rows per tenant (the dashboard's and the tests' view)."""
        return dict(self._rows_of)
