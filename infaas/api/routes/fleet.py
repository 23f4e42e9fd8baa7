"""`GET /v1/admin/fleet`: workers, what each hosts, memory vs budget, queues, replicas, what
they cost, and recent decisions.

Read from the placement layer (`fleet()`, `events()`: loads, evictions, replicas, crashes), the
autoscaler (its actions with their reasons, and `FleetCost`), the batcher (`queue_depths()`) and
the routing log (`RouteLog`: which variant each task is routed to, and when that changes) the app
factory put on `app.state`. A front end without a pool shows an empty fleet rather than failing.
"""

from __future__ import annotations

import heapq
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict

from infaas.api.auth import AdminPrincipal
from infaas.api.openapi import ADMIN_KEY, KEY_REQUIRED, error_responses
from infaas.autoscaler import Autoscaler, FleetCost
from infaas.errors import InvalidInput
from infaas.peers import Peers
from infaas.policy.versions import CanarySplit, version_states
from infaas.routelog import RouteLog
from infaas.router import Router
from infaas.snapshot import Snapshot
from infaas.types import FleetEvent, VersionState, WorkerInfo
from infaas.workers.base import Batcher, FleetSource
from infaas.workers.placement import LONE_FAMILY

__all__ = [
    "Fleet",
    "FleetCostView",
    "FleetView",
    "FrontEndView",
    "LineLabels",
    "VariantCost",
    "fleet_sources",
    "fleet_view",
    "router",
    "version_lines",
]

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class VariantCost(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    replicas: int
    usd: float  # held so far: replica-seconds × the price of what each replica holds
    usd_per_hour: float  # at the replicas held now


class FleetCostView(BaseModel):
    """What the fleet's resources cost the operator (tenants are charged busy time instead)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_usd: float
    usd_per_hour: float
    by_variant: dict[str, VariantCost]


class LineLabels(BaseModel):
    """One architecture's versions as the router serves them now."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    architecture: str
    stable: int
    canary: int | None
    canary_share: float  # the share set
    observed_queries: int  # queries to the architecture since that share was set
    observed_canary_share: float | None  # the share the canary really took
    versions: dict[int, VersionState]


def version_lines(snapshot: Snapshot, split: CanarySplit) -> tuple[LineLabels, ...]:
    """Every architecture's labels and version states, and the canary share observed (no I/O)."""
    lines = []
    for name in sorted({a.line for a in snapshot.architectures.values()}):
        labels = snapshot.labels[name]
        queries, canary = split.observed(name, labels.canary) if labels.canary else (0, 0)
        lines.append(
            LineLabels(
                architecture=name,
                stable=labels.stable,
                canary=labels.canary,
                canary_share=labels.canary_share,
                observed_queries=queries,
                observed_canary_share=canary / queries if queries else None,
                versions=version_states(labels, snapshot.versions_of(name)),
            )
        )
    return tuple(lines)


class FrontEndView(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    last_report_s: float  # wall clock
    leader: bool  # holds the autoscaler lease
    this: bool  # the front end answering this request


class FleetView(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: tuple[WorkerInfo, ...]
    memory_used_mb: float  # all workers together
    memory_budget_mb: float
    loaded_variants: int  # replicas: a variant on two workers counts twice
    replicas: dict[str, int]  # per variant
    queue_depths: dict[str, int]  # requests waiting in the batcher, per variant
    cost: FleetCostView
    events: tuple[FleetEvent, ...]  # newest first
    versions: tuple[LineLabels, ...] = ()  # per architecture: labels, states, canary share seen
    # On a shared fleet: the front ends that reported lately, and which one scales the fleet.
    front_ends: tuple[FrontEndView, ...] = ()


def fleet_view(
    workers: list[WorkerInfo],
    queue_depths: dict[str, int],
    events: list[FleetEvent],
    cost: FleetCost | None = None,
) -> FleetView:
    """Assemble the view; events come oldest first from the pool and are shown newest first."""
    replicas: dict[str, int] = {}
    for worker in workers:
        if worker.family == LONE_FAMILY:
            continue  # a copy for queries arriving alone, not a replica (`workers.placement`)
        for name in worker.loaded:
            replicas[name] = replicas.get(name, 0) + 1
    cost = cost or FleetCost()
    return FleetView(
        workers=tuple(sorted(workers, key=lambda w: w.worker_id)),
        memory_used_mb=sum(w.memory_used_mb for w in workers),
        memory_budget_mb=sum(w.memory_budget_mb for w in workers),
        loaded_variants=sum(replicas.values()),
        replicas=dict(sorted(replicas.items())),
        queue_depths=dict(sorted(queue_depths.items())),
        cost=FleetCostView(
            total_usd=cost.total_usd,
            usd_per_hour=cost.total_usd_per_hour,
            by_variant={
                name: VariantCost(
                    replicas=replicas.get(name, 0),
                    usd=cost.usd.get(name, 0.0),
                    usd_per_hour=cost.usd_per_s.get(name, 0.0) * 3600.0,
                )
                for name in sorted(set(cost.usd) | set(cost.usd_per_s))
            },
        ),
        events=tuple(sorted(events, key=lambda e: e.at_s, reverse=True)),
    )


class Fleet:
    """The fleet as the views read it: the placement's workers (Ray and the front end's fast
    path), its load / evict events and the autoscaler's actions, and what the replicas cost."""

    def __init__(self, pool: FleetSource, autoscaler: Autoscaler | None = None) -> None:
        self._pool = pool
        self._autoscaler = autoscaler

    def fleet(self) -> list[WorkerInfo]:
        return self._pool.fleet()

    def events(self, limit: int = 50) -> list[FleetEvent]:
        streams = [self._pool.events(limit)]
        if self._autoscaler is not None:
            streams.append(self._autoscaler.events(limit))
        merged = list(heapq.merge(*streams, key=lambda e: e.at_s))
        return merged[-limit:] if limit else []

    @property
    def cost(self) -> FleetCost | None:
        return self._autoscaler.cost if self._autoscaler is not None else None


def fleet_sources(state: Any) -> tuple[Fleet | None, Batcher | None]:
    """The fleet and batcher on `app.state`, or None where the app runs without them."""
    placement: FleetSource | None = getattr(state, "placement", None)
    batcher: Batcher | None = getattr(state, "batcher", None)
    if placement is None:
        return None, batcher
    return Fleet(placement, getattr(state, "autoscaler", None)), batcher


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
        pool.cost if pool is not None else None,
    )
    routing: Router | None = getattr(request.app.state, "router", None)
    lines = version_lines(routing.snapshot, routing.canary_split) if routing is not None else ()
    peers: Peers | None = getattr(request.app.state, "peers", None)
    front_ends = (
        tuple(
            FrontEndView(name=f.name, last_report_s=f.at_s, leader=f.leader, this=f.name == peers.name)
            for f in peers.front_ends
        )
        if peers is not None
        else ()
    )
    update = {"events": view.events[:events], "versions": lines, "front_ends": front_ends}
    return view.model_copy(update=update)
