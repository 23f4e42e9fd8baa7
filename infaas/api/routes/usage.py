"""Usage: `GET /v1/admin/usage` (every tenant, admin key) and `GET /v1/usage` (the caller's own).

Both return the same `UsageReport` shape (`infaas.usage`), built from the store's per-minute rows;
the tenant route is the admin report restricted to one tenant, so the two cannot disagree.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request

from infaas.api.auth import AdminPrincipal, TenantPrincipal
from infaas.api.openapi import ADMIN_KEY, KEY_REQUIRED, TENANT_KEY, error_responses
from infaas.errors import Forbidden, InvalidInput
from infaas.store import MetadataStore
from infaas.usage import UsageReport, build_report, resolve_window

__all__ = ["router", "usage_report"]

router = APIRouter(tags=["usage"])

FromParam = Annotated[
    str | None,
    Query(
        alias="from",
        description="window start: epoch seconds, ISO 8601, or a duration ago such as 1h (default: to − 1h)",
    ),
]
ToParam = Annotated[str | None, Query(description="window end: same forms as 'from' (default: now)")]
StepParam = Annotated[
    str | None,
    Query(description="bucket size, whole minutes: 1m, 5m, 1h, 1d (default: at most 120 buckets)"),
]


def usage_report(
    store: MetadataStore,
    now_s: float,
    from_text: str | None,
    to_text: str | None,
    step_text: str | None,
    tenant: str | None = None,
) -> UsageReport:
    """The report for one tenant, or for every tenant (idle active tenants included)."""
    window = resolve_window(now_s, from_text, to_text, step_text)
    rows = store.usage(tenant=tenant, from_minute=window.from_minute, to_minute=window.to_minute)
    if tenant is not None:
        found = store.get_tenant(tenant)
        listed: list[str] = [tenant]
        shares = {tenant: found.share} if found is not None else {}
    else:
        active = [t for t in store.list_tenants() if not t.revoked]
        listed = [t.name for t in active if t.role == "tenant"]
        shares = {t.name: t.share for t in active}
    return build_report(rows, window, tenants=listed, shares=shares)


def _store(request: Request) -> MetadataStore:
    store: MetadataStore = request.app.state.store
    return store


# Plain `def` routes: the store is synchronous, so FastAPI runs them in its thread pool instead of
# blocking the event loop that also serves queries.
@router.get(
    "/v1/admin/usage",
    tags=["admin"],
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, *ADMIN_KEY),
)
def admin_usage(
    request: Request,
    _: AdminPrincipal,
    from_: FromParam = None,
    to: ToParam = None,
    step: StepParam = None,
    tenant: Annotated[str | None, Query(description="only this tenant")] = None,
) -> UsageReport:
    """Per tenant: queries, cost, SLO attainment, p50/p99; totals, a time series, by task and variant."""
    return usage_report(_store(request), time.time(), from_, to, step, tenant)


@router.get(
    "/v1/usage",
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, Forbidden, *TENANT_KEY),  # 403: the admin key has no own usage
)
def own_usage(
    request: Request,
    principal: TenantPrincipal,
    from_: FromParam = None,
    to: ToParam = None,
    step: StepParam = None,
) -> UsageReport:
    """The calling tenant's own usage, in the shape of `/v1/admin/usage`."""
    if principal.role == "admin":
        raise Forbidden("this route shows a tenant's own usage: use /v1/admin/usage with the admin key")
    return usage_report(_store(request), time.time(), from_, to, step, principal.name)
