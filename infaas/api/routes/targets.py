"""A tenant's default targets per task: `PUT /v1/targets/{task}`, `GET /v1/targets`.

What a request that carries no targets is held to (the KServe V2 and TensorFlow Serving protocols
often carry none); without stored targets, `INFAAS_DEFAULT_LATENCY_MS` and no accuracy floor.
Plain `def` routes: the store is synchronous, FastAPI runs them in its thread pool."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi import Path as PathParam

from infaas.api.auth import TenantPrincipal
from infaas.api.openapi import KEY_REQUIRED, TENANT_KEY, error_responses
from infaas.api.schemas import NAME_PATTERN, TargetsIn, TargetsOut
from infaas.dataplane import DataPlane
from infaas.errors import InvalidInput, PayloadTooLarge, TaskNotFound
from infaas.store import MetadataStore
from infaas.types import Targets

__all__ = ["router"]

router = APIRouter(tags=["query"])


def _out(t: Targets) -> TargetsOut:
    return TargetsOut(
        task=t.task,
        latency_ms=t.latency_ms,
        min_accuracy=t.min_accuracy,
        max_cost_usd_per_1k=t.max_cost_usd_per_1k,
    )


@router.put(
    "/v1/targets/{task}",
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, PayloadTooLarge, TaskNotFound, *TENANT_KEY),
)
def set_targets(
    task: Annotated[str, PathParam(pattern=NAME_PATTERN, examples=["digits-classification"])],
    body: TargetsIn,
    request: Request,
    principal: TenantPrincipal,
) -> TargetsOut:
    """Store the caller's default targets for `task` (effective for its next query here)."""
    store: MetadataStore = request.app.state.store
    if store.get_task(task) is None:
        raise TaskNotFound(f"no task {task!r}; GET /v1/tasks lists them", task=task)
    targets = Targets(tenant=principal.name, task=task, **body.model_dump())
    store.put_targets(targets)
    dataplane: DataPlane | None = getattr(request.app.state, "dataplane", None)
    if dataplane is not None:
        dataplane.forget_targets(principal.name, task)
    return _out(targets)


@router.get("/v1/targets", dependencies=KEY_REQUIRED, responses=error_responses(*TENANT_KEY))
def list_targets(request: Request, principal: TenantPrincipal) -> list[TargetsOut]:
    """The caller's default targets, per task."""
    store: MetadataStore = request.app.state.store
    return [_out(t) for t in store.list_targets(principal.name)]
