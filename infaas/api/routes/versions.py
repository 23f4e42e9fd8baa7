"""The version lifecycle over HTTP: versions, canary, promote, rollback, delete, and task owners.

Thin: each route checks its body and calls `infaas.versions.Versions`, which owns the order of
loading, switching and draining and the ownership rule (the admin, or an owner of the task)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi import Path as PathParam

from infaas.api.auth import AdminPrincipal, TenantPrincipal
from infaas.api.model_schemas import (
    CanaryIn,
    DeletedOut,
    GrantIn,
    PromoteIn,
    TaskOut,
    VersionsOut,
    task_out,
    versions_out,
)
from infaas.api.openapi import ADMIN_KEY, KEY_REQUIRED, TENANT_KEY, error_responses
from infaas.api.schemas import NAME_PATTERN
from infaas.errors import (
    ArchitectureNotFound,
    Conflict,
    Forbidden,
    InvalidInput,
    PayloadTooLarge,
    TaskNotFound,
    Unavailable,
)
from infaas.store import MetadataStore
from infaas.versions import Deleted, Versions

__all__ = ["router"]

router = APIRouter(tags=["versions"])

Name = Annotated[str, PathParam(pattern=NAME_PATTERN, examples=["digits-logreg"])]
Version = Annotated[int, PathParam(ge=1, examples=[2])]
_CHANGE = error_responses(
    InvalidInput, PayloadTooLarge, Forbidden, ArchitectureNotFound, Conflict, *TENANT_KEY
)


def _versions(request: Request) -> Versions:
    versions: Versions | None = getattr(request.app.state, "versions", None)
    if versions is None:
        raise Unavailable("the service is starting: no worker pool yet; retry")
    return versions


def _deleted(done: Deleted) -> DeletedOut:
    return DeletedOut(
        architecture=done.architecture,
        versions=list(done.versions),
        variants=done.variants,
        artifacts_removed=done.artifacts_removed,
    )


@router.get(
    "/v1/models/{architecture}/versions",
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, ArchitectureNotFound, *TENANT_KEY),
)
def list_versions(architecture: Name, request: Request, _: TenantPrincipal) -> VersionsOut:
    """An architecture's versions with their states and labels, and the canary share observed."""
    return versions_out(_versions(request).view(architecture))


@router.put("/v1/models/{architecture}/canary", dependencies=KEY_REQUIRED, responses=_CHANGE)
async def set_canary(
    architecture: Name, body: CanaryIn, request: Request, principal: TenantPrincipal
) -> VersionsOut:
    """Send `share` of the architecture's queries to `version` (loaded and warmed first)."""
    view = await _versions(request).set_canary(architecture, body.version, body.share, principal)
    return versions_out(view)


@router.delete("/v1/models/{architecture}/canary", dependencies=KEY_REQUIRED, responses=_CHANGE)
async def end_canary(architecture: Name, request: Request, principal: TenantPrincipal) -> VersionsOut:
    """Stop the canary: all of the architecture's queries go to its stable version again."""
    return versions_out(await _versions(request).end_canary(architecture, principal))


@router.post("/v1/models/{architecture}/promote", dependencies=KEY_REQUIRED, responses=_CHANGE)
async def promote(
    architecture: Name, request: Request, principal: TenantPrincipal, body: PromoteIn | None = None
) -> VersionsOut:
    """Make the canary (or `version`) stable, once loaded and warmed; refused (409) when it is less
    accurate than the stable version beyond the tolerance, unless the admin forces it."""
    body = body or PromoteIn()
    view = await _versions(request).promote(architecture, body.version, body.force, principal)
    return versions_out(view)


@router.post("/v1/models/{architecture}/rollback", dependencies=KEY_REQUIRED, responses=_CHANGE)
async def rollback(architecture: Name, request: Request, principal: TenantPrincipal) -> VersionsOut:
    """Make the previous stable version stable again (loaded first if it was unloaded)."""
    return versions_out(await _versions(request).rollback(architecture, principal))


@router.delete("/v1/models/{architecture}", dependencies=KEY_REQUIRED, responses=_CHANGE)
async def delete_architecture(architecture: Name, request: Request, principal: TenantPrincipal) -> DeletedOut:
    """Delete every version: unroutable at once, then drained, unloaded, artifacts removed."""
    return _deleted(await _versions(request).delete(architecture, None, principal))


@router.delete("/v1/models/{architecture}/versions/{version}", dependencies=KEY_REQUIRED, responses=_CHANGE)
async def delete_version(
    architecture: Name, version: Version, request: Request, principal: TenantPrincipal
) -> DeletedOut:
    """Delete one version (not the stable one while others remain)."""
    return _deleted(await _versions(request).delete(architecture, version, principal))


@router.post(
    "/v1/admin/tasks/{task}/owners",
    tags=["admin"],
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, PayloadTooLarge, TaskNotFound, *ADMIN_KEY),
)
def grant_task(task: Name, body: GrantIn, request: Request, _: AdminPrincipal) -> TaskOut:
    """Let owner key `owner` register and manage architectures in `task` too."""
    store: MetadataStore = request.app.state.store
    found = store.get_task(task)
    if found is None:
        raise TaskNotFound(f"no task {task!r}; GET /v1/tasks lists them", task=task)
    if body.owner not in found.owners:
        found = found.model_copy(update={"owners": (*found.owners, body.owner)})
        store.put_task(found)
    return task_out(found, [a.name for a in store.list_architectures(task)])
