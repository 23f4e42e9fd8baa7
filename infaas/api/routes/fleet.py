"""`GET /v1/admin/fleet`: workers, what each hosts, memory vs budget, queues, recent decisions.

Read from the worker pool (`WorkerPool.fleet()`, `WorkerPool.events()`: loads, evictions,
replicas, crashes), the batcher (`Batcher.queue_depths()`) and the routing log (`RouteLog`: which
variant each task is routed to, and when that changes) the app factory put on `app.state`. A
front end without a pool shows an empty fleet rather than failing.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict

from infaas.api.auth import AdminPrincipal
from infaas.api.openapi import ADMIN_KEY, KEY_REQUIRED, error_responses
from infaas.errors import InvalidInput
from infaas.routelog import RouteLog
from infaas.types import FleetEvent, WorkerInfo
from infaas.workers.base import Batcher, FleetSource

__all__ = ["Fleet", "FleetView", "fleet_sources", "fleet_view", "router"]

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class FleetView(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: tuple[WorkerInfo, ...]
    memory_used_mb: float  # all workers together
    memory_budget_mb: float
    loaded_variants: int  # replicas: a variant on two workers counts twice
    queue_depths: dict[str, int]  # requests waiting in the batcher, per variant
    events: tuple[FleetEvent, ...]  # newest first


def fleet_view(
    workers: list[WorkerInfo], queue_depths: dict[str, int], events: list[FleetEvent]
) -> FleetView:
    """Assemble the view; events come oldest first from the pool and are shown newest first."""
    return FleetView(
        workers=tuple(sorted(workers, key=lambda w: w.worker_id)),
        memory_used_mb=sum(w.memory_used_mb for w in workers),
        memory_budget_mb=sum(w.memory_budget_mb for w in workers),
        loaded_variants=sum(len(w.loaded) for w in workers),
        queue_depths=dict(sorted(queue_depths.items())),
        events=tuple(sorted(events, key=lambda e: e.at_s, reverse=True)),
    )


class Fleet:
    """Several pools seen as one fleet: the Ray workers and the front end's fast-path pool."""

    def __init__(self, pools: Sequence[FleetSource]) -> None:
        self._pools = pools

    def fleet(self) -> list[WorkerInfo]:
        return [worker for pool in self._pools for worker in pool.fleet()]

    def events(self, limit: int = 50) -> list[FleetEvent]:
        merged = heapq.merge(*(p.events(limit) for p in self._pools), key=lambda e: e.at_s)
        return list(merged)[-limit:] if limit else []


def fleet_sources(state: Any) -> tuple[FleetSource | None, Batcher | None]:
    """The pools and batcher on `app.state`, or None where the app runs without them."""
    pools = [p for p in (getattr(state, "pool", None), getattr(state, "local_pool", None)) if p is not None]
    batcher: Batcher | None = getattr(state, "batcher", None)
    return (Fleet(pools) if pools else None), batcher


@router.get("/fleet", dependencies=KEY_REQUIRED, responses=error_responses(InvalidInput, *ADMIN_KEY))
async def fleet(
    request: Request,
    _: AdminPrincipal,
    events: Annotated[int, Query(ge=0, le=1000, description="how many recent decisions")] = 50,
) -> FleetView:
    """Workers, loaded variants, memory used vs budget, queue depths and recent decisions with reasons."""
    pool, batcher = fleet_sources(request.app.state)
    route_log: RouteLog | None = getattr(request.app.state, "route_log", None)
    recent = pool.events(limit=events) if pool is not None and events else []
    recent += route_log.events(limit=events) if route_log is not None else []
    view = fleet_view(
        pool.fleet() if pool is not None else [],
        batcher.queue_depths() if batcher is not None else {},
        recent,
    )
    return view.model_copy(update={"events": view.events[:events]})
