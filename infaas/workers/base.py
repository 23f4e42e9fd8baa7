"""The worker boundary: where loaded variants run, and the batcher in front of it.

The front end never calls a runtime directly on the request path: it submits rows to the
`Batcher`, which queues them per variant and makes one `WorkerPool.run` call per batch (one Ray hop
per batch, not per request; DESIGN.md "Ray").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from infaas.types import FleetEvent, Profile, Variant, WorkerInfo

__all__ = ["BatchResult", "Batcher", "FleetSource", "WorkerPool"]


class FleetSource(Protocol):
    """What the fleet view and the metrics read: workers and recent decisions (a pool, or several)."""

    def fleet(self) -> list[WorkerInfo]: ...

    def events(self, limit: int = 50) -> list[FleetEvent]: ...


class WorkerPool(Protocol):
    """Hosts loaded variants in worker processes (Ray actors) or in-process (tests, tiny setups)."""

    async def run(self, variant: Variant, batch: np.ndarray) -> np.ndarray:
        """Run one batch (rows × input shape) on a replica of `variant`, loading it on demand.
        Returns class probabilities (rows × classes). Raises `Unavailable` when no worker can."""
        ...

    async def ensure_loaded(self, variant: Variant) -> None:
        """Load `variant` somewhere if no replica holds it (the router's hint for a cheaper variant)."""
        ...

    async def replicate(self, variant: Variant, reason: str = "") -> str:
        """Load one more replica of `variant` on a worker that does not hold it yet (the autoscaler's
        action); returns that worker's id. Raises `Unavailable` when no worker can take it.
        `reason` goes into the fleet event that records it."""
        ...

    async def unload(self, variant: str, worker_id: str | None = None, reason: str = "") -> None:
        """Drop `variant` from `worker_id` (or from every worker holding it); `reason` goes into the
        fleet event."""
        ...

    def is_loaded(self, variant: str) -> bool: ...

    def replicas(self, variant: str) -> int:
        """How many workers hold `variant` loaded now (live state for the router and autoscaler)."""
        ...

    def fleet(self) -> list[WorkerInfo]: ...

    def events(self, limit: int = 50) -> list[FleetEvent]:
        """The most recent load / evict / replicate / crash / retry decisions, newest last."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class BatchResult:
    """One request's share of a batch, and how that batch went."""

    outputs: np.ndarray  # this request's rows of the batch output
    batch_rows: int  # rows in the whole batch it ran in (cost is split by rows)
    batch_requests: int  # requests merged into that batch
    queue_ms: float  # time this request waited in the batcher
    run_ms: float  # time the batch took in the pool (Ray hop included)


class Batcher(Protocol):
    """Per-variant queues in the front end; batching parameters are per variant."""

    async def submit(
        self,
        variant: Variant,
        profile: Profile,
        rows: np.ndarray,
        deadline_s: float,
        tenant: str = "",
        weight: float = 1.0,
        background: bool = False,
        alone: bool = False,
        predicted_wait_ms: float = 0.0,
    ) -> BatchResult:
        """Queue `rows` for `variant`; `deadline_s` (monotonic clock) is the request's SLO deadline, so
        the batch is sent before waiting longer would break the tightest deadline in the queue.
        Tenants share the queue in proportion to their `weight` (`policy.fairqueue`). A
        `background` request (an offline job's batch) is not online traffic: `last_submit_s`
        does not move for it. `alone`: the caller has no other query in flight, so no other
        request could join this one's batch; one for a variant the front end runs itself then
        runs at once, without the queue's loop iterations. `predicted_wait_ms`: the queueing the
        router predicted for it (`queue_delay_ms`), against which its wait calibrates the next
        predictions."""
        ...

    async def warm(self, variant: Variant, profile: Profile) -> None:
        """Load `variant` where its batches will run (the front end's fast path or the pool), so
        that the first query does not wait for the load."""
        ...

    def queue_delay_ms(self, variant: str, tenant: str = "") -> float:
        """Predicted wait a new request of `tenant` to `variant` would see now (the router adds it
        to latency): the rows fair queuing puts ahead of it."""
        ...

    def waiting_rows(self, variant: str, tenant: str = "") -> int:
        """Rows of `tenant`'s queries waiting for `variant` (sent batches not counted): with none,
        its next query lands near the head of the fair queue, whatever the others have queued."""
        ...

    def slowdown(self, variant: str) -> float:
        """Measured run time ÷ profiled of `variant`'s compute-bound batches (1.0 until measured):
        the router prices a query's own run with it, as the queueing delay already is."""
        ...

    def queue_depths(self) -> dict[str, int]: ...

    def in_flight(self) -> dict[str, int]:
        """Batches running now per variant."""
        ...

    def last_submit_s(self) -> float:
        """When an online request was last queued (monotonic clock; -inf before the first): an
        offline job paces itself while online traffic flows."""
        ...

    async def close(self) -> None: ...
