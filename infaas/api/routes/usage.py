"""Usage: `GET /v1/admin/usage` (every tenant, admin key) and `GET /v1/usage` (the caller's own).

Both return the same `UsageReport` shape (`infaas.usage`), built from the store's per-minute rows;
the tenant route is the admin report restricted to one tenant, so the two cannot disagree.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict

from infaas.advice import RecentTraffic, advise
from infaas.api.auth import AdminPrincipal, TenantPrincipal
from infaas.api.openapi import ADMIN_KEY, KEY_REQUIRED, TENANT_KEY, error_responses
from infaas.errors import Forbidden, InvalidInput
from infaas.router import Router
from infaas.sim.engine import SimConfig
from infaas.sim.zoo import Zoo
from infaas.store import MetadataStore
from infaas.types import pusd_to_usd
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


class AdvicePointOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    latency_factor: float  # each query's latency target × this
    accuracy_delta: float  # each query's accuracy floor + this
    median_latency_ms: float  # the sample's median latency target at this point
    queries: int
    in_slo_share: float
    charged_pusd: int
    charged_usd: float
    cost_change: float | None  # vs the targets as sent (-0.37: 37 % less); None when that cost 0
    variants: dict[str, int]  # answers per variant


class AdviceOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    tenant: str
    window_s: float
    sampled_queries: int
    points: list[AdvicePointOut]
    summary: str


ADVICE_TTL_S = 60.0


def _advice(request: Request, tenant: str) -> AdviceOut:
    state = request.app.state
    cached = state.advice_cache.get(tenant)
    now_s = time.time()
    if cached is not None and cached[0] > now_s:
        return cached[1]  # type: ignore[no-any-return]
    traffic: RecentTraffic = state.recent_traffic
    queries = traffic.sample(tenant, now_s)
    router: Router | None = getattr(state, "router", None)
    points: list[AdvicePointOut] = []
    summary = "no queries with a latency target in the window: nothing to replay"
    if queries and router is not None:
        snap = router.snapshot
        zoo = Zoo(
            variants={n: (v, p) for n, (v, p) in snap.variants.items() if p is not None},
            tasks={a.name: a.task for a in snap.architectures.values()},
        )
        config = SimConfig(workers=1, cores=max(2, os.cpu_count() or 2))
        median_ms = statistics.median(q.latency_ms for q in queries)
        found = advise(zoo, queries, config)
        base = next(p for p in found if p.latency_factor == 1.0 and p.accuracy_delta == 0.0)
        for p in found:
            change = p.charged_pusd / base.charged_pusd - 1.0 if base.charged_pusd else None
            points.append(
                AdvicePointOut(
                    latency_factor=p.latency_factor,
                    accuracy_delta=p.accuracy_delta,
                    median_latency_ms=median_ms * p.latency_factor,
                    queries=p.queries,
                    in_slo_share=p.in_slo_share,
                    charged_pusd=p.charged_pusd,
                    charged_usd=pusd_to_usd(p.charged_pusd),
                    cost_change=change,
                    variants=p.variants,
                )
            )
        summary = _summary(points, median_ms)
    out = AdviceOut(
        tenant=tenant, window_s=traffic.window_s, sampled_queries=len(queries), points=points, summary=summary
    )
    state.advice_cache[tenant] = (now_s + ADVICE_TTL_S, out)
    return out


def _summary(points: list[AdvicePointOut], median_ms: float) -> str:
    """The one saving worth a sentence: the looser latency target at the same accuracy that cost
    least while answering as many queries in time (within a point)."""
    base = next(p for p in points if p.latency_factor == 1.0 and p.accuracy_delta == 0.0)
    better = [
        p
        for p in points
        if p.accuracy_delta == 0.0
        and p.latency_factor > 1.0
        and p.cost_change is not None
        and p.cost_change < 0
        and p.in_slo_share >= base.in_slo_share - 0.01
    ]
    if not better:
        return f"at a median latency target of {median_ms:g} ms, no looser target would have cost less"
    best = min(better, key=lambda p: p.charged_pusd)
    assert best.cost_change is not None
    return (
        f"a {best.median_latency_ms:g} ms latency target instead of {median_ms:g} ms (median) would have "
        f"cost {-100.0 * best.cost_change:.0f} % less at the same accuracy"
    )


@router.get(
    "/v1/usage/advice",
    dependencies=KEY_REQUIRED,
    responses=error_responses(Forbidden, *TENANT_KEY),
)
def usage_advice(
    request: Request,
    principal: TenantPrincipal,
    tenant: Annotated[str | None, Query(description="admin key only: this tenant's advice")] = None,
) -> AdviceOut:
    """What the caller's recent queries would have cost, and how many would have been answered
    in time, at looser and tighter targets: its traffic replayed through the simulator."""
    if principal.role == "admin":
        if tenant is None:
            raise Forbidden("the admin key has no traffic of its own: pass ?tenant=NAME")
        return _advice(request, tenant)
    if tenant is not None and tenant != principal.name:
        raise Forbidden("a tenant key reads its own advice only", tenant=tenant)
    return _advice(request, principal.name)
