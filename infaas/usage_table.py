"""`infaas usage`: fetch a usage report over HTTP and print it as rich tables.

The admin key gets every tenant (`/v1/admin/usage`); a tenant key gets its own usage
(`/v1/usage`), the same report shape, so one table renders both.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
from rich.table import Table

from infaas.errors import Forbidden, InfaasError, InvalidInput, Unauthenticated, Unavailable
from infaas.usage import UsageReport, UsageStats

__all__ = ["fetch_usage_report", "tenants_table", "variants_table", "window_line"]


def _raise_for(response: httpx.Response, url: str) -> None:
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    detail = body.get("detail", "") if isinstance(body, dict) else response.text[:200]
    if response.status_code == 401:
        raise Unauthenticated(f"the server refused the key: {detail}; check --key")
    if response.status_code == 403:
        raise Forbidden(str(detail))
    if response.status_code == 400:
        raise InvalidInput(str(detail))
    raise InfaasError(f"HTTP {response.status_code} from {url}: {detail}")


def fetch_usage_report(
    url: str,
    api_key: str,
    *,
    since: str,
    tenant: str | None = None,
    step: str | None = None,
    timeout_s: float = 30.0,
) -> tuple[UsageReport, bool]:
    """The report and whether it is the admin's view. With a tenant key, `tenant` must be that
    tenant (or None): a tenant sees only its own usage."""
    params = {"from": since} | ({"step": step} if step else {})
    headers = {"Authorization": f"Bearer {api_key}"}
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s) as http:
            admin = http.get("/v1/admin/usage", params=params | ({"tenant": tenant} if tenant else {}))
            if admin.status_code == 200:
                return UsageReport.model_validate(admin.json()), True
            if admin.status_code != 403:
                _raise_for(admin, url)
            own = http.get("/v1/usage", params=params)
            if own.status_code != 200:
                _raise_for(own, url)
    except httpx.HTTPError as exc:
        raise Unavailable(f"cannot reach infaas at {url}: {exc}; is `infaas serve` running there?") from exc
    report = UsageReport.model_validate(own.json())
    names = [t.tenant for t in report.tenants]
    if tenant is not None and tenant not in names:
        raise Forbidden(f"this is the key of tenant {names[0] if names else '?'}; it cannot read {tenant!r}")
    return report, False


def _usd(x: float) -> str:
    return f"{x:.2f}" if x >= 1 else f"{x:.4g}" if x >= 1e-4 else f"{x:.3e}"


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _row(stats: UsageStats) -> list[str]:
    return [
        str(stats.queries),
        _usd(stats.cost_usd),
        _pct(stats.slo_attainment),
        _ms(stats.p50_ms),
        _ms(stats.p99_ms),
    ]


def tenants_table(report: UsageReport) -> Table:
    """One row per tenant and a total: the dashboard's tenants table."""
    table = Table(
        "tenant", "queries", "cost USD", "SLO attainment", "p50 ms", "p99 ms", title="usage by tenant"
    )
    for col in table.columns[1:]:
        col.justify = "right"
    for tenant in report.tenants:
        table.add_row(tenant.tenant, *_row(tenant.totals))
    if len(report.tenants) > 1:
        table.add_section()
        table.add_row("[bold]total[/]", *_row(report.totals))
    return table


def variants_table(report: UsageReport, limit: int = 10) -> Table:
    """The costliest variants in the window, all tenants of the report together."""
    table = Table("variant", "task", "queries", "cost USD", "p99 ms", title="cost by variant")
    for col in table.columns[2:]:
        col.justify = "right"
    for v in report.by_variant[:limit]:
        table.add_row(v.variant, v.task, str(v.stats.queries), _usd(v.stats.cost_usd), _ms(v.stats.p99_ms))
    return table


def window_line(report: UsageReport) -> str:
    """The report's window in words, e.g. '2026-01-01 00:00 – 01:00 UTC, 60 buckets of 1 min'."""

    def fmt(s: int) -> str:
        return datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%d %H:%M")

    buckets = f"{len(report.buckets)} buckets of {report.step_s // 60} min"
    return f"{fmt(report.from_s)} – {fmt(report.to_s)} UTC, {buckets}"
