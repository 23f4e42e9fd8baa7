"""Tenants and owners and their API keys (admin only; an owner key is a tenant key that may also
register and manage models in the tasks it owns). A key is returned once; the store keeps its hash.

The routes are plain `def`: FastAPI runs them in its thread pool, so a store that is slow or down
(each call bounded by `INFAAS_STORE_TIMEOUT_S`) never stalls the event loop that answers queries."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from infaas.api.auth import AdminPrincipal, KeyCache, new_api_key
from infaas.api.openapi import ADMIN_KEY, KEY_REQUIRED, error_responses
from infaas.api.schemas import ShareIn, TenantCreate, TenantCreated, TenantOut
from infaas.errors import Conflict, InvalidInput, PayloadTooLarge, TenantNotFound
from infaas.store import MetadataStore
from infaas.types import Share, Tenant

router = APIRouter(prefix="/v1/admin/tenants", tags=["admin"])

RESERVED_NAMES = frozenset({"admin"})


def _store(request: Request) -> MetadataStore:
    store: MetadataStore = request.app.state.store
    return store


@router.post(
    "",
    status_code=201,
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, PayloadTooLarge, Conflict, *ADMIN_KEY),
)
def create_tenant(body: TenantCreate, request: Request, _: AdminPrincipal) -> TenantCreated:
    if body.name in RESERVED_NAMES:
        # Usage, metrics and the dashboard name the admin key "admin": a tenant of that name
        # would be indistinguishable from it.
        raise InvalidInput(f"{body.name!r} is a reserved name; choose another", tenant=body.name)
    key = new_api_key()
    now_s = time.time()
    expires_at_s = now_s + body.expires_in_s if body.expires_in_s is not None else None
    tenant = Tenant(name=body.name, role=body.role, created_at_s=now_s, expires_at_s=expires_at_s)
    _store(request).create_tenant(tenant, key)
    return TenantCreated(name=body.name, role=body.role, api_key=key, expires_at_s=expires_at_s)


@router.get("", dependencies=KEY_REQUIRED, responses=error_responses(*ADMIN_KEY))
def list_tenants(request: Request, _: AdminPrincipal) -> list[TenantOut]:
    store = _store(request)
    used = store.last_used()
    return [_out(t, used.get(t.name)) for t in store.list_tenants()]


def _out(tenant: Tenant, last_used_s: float | None = None) -> TenantOut:
    return TenantOut(
        **tenant.model_dump(exclude={"share"}),
        share=ShareIn(**tenant.share.model_dump()),
        last_used_s=last_used_s,
    )


@router.put(
    "/{name}/share",
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, TenantNotFound, PayloadTooLarge, *ADMIN_KEY),
)
def set_share(name: str, body: ShareIn, request: Request, _: AdminPrincipal) -> TenantOut:
    """Set a tenant's weight and optional rate quota. Its keys are dropped from this front end's
    key cache, so its next query here carries the new share (other front ends: within
    `change_poll_interval_s`, through the store's change log)."""
    if name in RESERVED_NAMES:
        raise InvalidInput("the admin key has no share: it is not a tenant", tenant=name)
    tenant = _store(request).set_share(name, Share(**body.model_dump()))
    cache: KeyCache = request.app.state.key_cache
    cache.drop_tenant(name)
    return _out(tenant)


@router.delete(
    "/{name}",
    status_code=204,
    dependencies=KEY_REQUIRED,
    # A DELETE may carry a body: the body limit applies to it as to any other write.
    responses=error_responses(TenantNotFound, PayloadTooLarge, *ADMIN_KEY),
)
def revoke_tenant(name: str, request: Request, _: AdminPrincipal) -> Response:
    _store(request).revoke_tenant(name)
    cache: KeyCache = request.app.state.key_cache
    cache.drop_tenant(name)  # its keys stop working here at once, not after the cache's TTL
    return Response(status_code=204)
