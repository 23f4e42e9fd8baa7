"""Usage reports: per-minute usage rows from the store → per-tenant totals and time series.

Pure: rows, the window and the clock's value come in as arguments; nothing here reads the store or
the clock. The HTTP routes (`infaas.api.routes.usage`), the dashboard and `infaas usage` all show
what `build_report` returns, so the three cannot disagree.

Money stays integer pico-dollars through every sum (`cost_pusd`) and is converted to USD once per
figure. Latency percentiles are estimated from the histogram counters each usage row carries
(`lat_le_<ms>` / `lat_inf`, see `infaas.types.LATENCY_BUCKETS_MS`) by linear interpolation inside
the bucket that holds the quantile, as Prometheus' `histogram_quantile` does.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from infaas.errors import InvalidInput
from infaas.types import (
    COUNTER_COST_PUSD,
    COUNTER_FAILED,
    COUNTER_QUERIES,
    COUNTER_REFUSED,
    COUNTER_RESERVED_PUSD,
    COUNTER_ROWS,
    COUNTER_SLO_MET,
    COUNTER_SLO_MISSED,
    LATENCY_BUCKETS_MS,
    Share,
    UsageRecord,
    latency_bucket_counter,
    pusd_to_usd,
)

__all__ = [
    "MAX_BUCKETS",
    "NICE_STEPS_S",
    "SeriesPoint",
    "TaskUsage",
    "TenantUsage",
    "UsageReport",
    "UsageStats",
    "UsageWindow",
    "VariantUsage",
    "build_report",
    "estimate_quantile_ms",
    "parse_duration_s",
    "parse_time_s",
    "resolve_window",
    "stats_from_counters",
]

MAX_BUCKETS = 5000
"""Most time-series buckets one report may hold (a guard against `step=1m` over a year)."""

NICE_STEPS_S: tuple[int, ...] = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)
"""Steps the default picks from: the smallest that gives at most `_DEFAULT_POINTS` buckets."""

_DEFAULT_POINTS = 120
_DEFAULT_SPAN_S = 3600

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

# Latency histogram counters in bucket order, with their upper bounds; `lat_inf` last.
_HIST: tuple[tuple[str, float], ...] = (
    *((latency_bucket_counter(b), b) for b in LATENCY_BUCKETS_MS),
    ("lat_inf", math.inf),
)
_HIST_NAMES = frozenset(name for name, _ in _HIST)


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class UsageStats(_Out):
    """Aggregated counters of a set of usage rows, and what follows from them."""

    queries: int = 0
    rows: int = 0
    cost_pusd: int = 0  # charged for answers
    cost_usd: float = 0.0
    # The fleet's cost beyond the charges, attributed by traffic (`policy.attribution`):
    # charged + reserved over all tenants is what the fleet cost.
    reserved_pusd: int = 0
    reserved_usd: float = 0.0
    slo_met: int = 0
    slo_missed: int = 0  # answered late
    refused: int = 0  # 429 overloaded: neither answered nor charged
    failed: int = 0  # 5xx or 504 on the service's side: not charged
    # What the tenant saw: in-SLO answers over every query sent (answered, refused or failed; bad
    # requests not counted). None without any.
    slo_attainment: float | None = None
    p50_ms: float | None = None  # estimated from the latency histogram; None without samples
    p99_ms: float | None = None


class SeriesPoint(_Out):
    start_s: int  # bucket start, epoch seconds, a multiple of the step
    stats: UsageStats


class TaskUsage(_Out):
    task: str
    stats: UsageStats


class VariantUsage(_Out):
    variant: str
    task: str
    stats: UsageStats


class TenantUsage(_Out):
    tenant: str
    share: Share | None = None  # its weight and rate quota (admin settings), where known
    totals: UsageStats
    series: tuple[SeriesPoint, ...]
    by_task: tuple[TaskUsage, ...]
    by_variant: tuple[VariantUsage, ...]


class UsageReport(_Out):
    """The shape of `GET /v1/admin/usage` (all tenants) and `GET /v1/usage` (one)."""

    from_s: int  # window start (inclusive), aligned down to the step
    to_s: int  # window end (exclusive), aligned up to the step
    step_s: int
    buckets: tuple[int, ...]  # bucket starts, epoch seconds
    totals: UsageStats
    tenants: tuple[TenantUsage, ...]
    by_variant: tuple[VariantUsage, ...]  # all tenants together


class UsageWindow(_Out):
    """A resolved report window: [from_s, to_s) in whole steps."""

    from_s: int
    to_s: int
    step_s: int

    @property
    def from_minute(self) -> int:
        return self.from_s // 60

    @property
    def to_minute(self) -> int:
        """Last epoch minute inside the window (inclusive, as `MetadataStore.usage` takes it)."""
        return self.to_s // 60 - 1

    @property
    def buckets(self) -> tuple[int, ...]:
        return tuple(range(self.from_s, self.to_s, self.step_s))


# ---- parsing the query parameters ------------------------------------------------------------


def parse_duration_s(text: str) -> int:
    """'90s', '5m', '1h', '2d', '1w' or a bare number of seconds → whole seconds (≥ 1)."""
    match = _DURATION.match(text)
    if match is None:
        raise InvalidInput(f"bad duration {text!r}: use a number with s, m, h, d or w (e.g. 5m, 1h)")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if seconds < 1 or not math.isfinite(seconds):
        raise InvalidInput(f"duration {text!r} must be at least one second")
    return int(seconds)


def parse_time_s(text: str, now_s: float) -> float:
    """A point in time: epoch seconds ('1767225600'), ISO 8601 ('2026-01-01T00:00:00Z'; naive means
    UTC), 'now', or a duration back from now ('1h' or '-1h' = one hour ago)."""
    value = text.strip()
    if value == "now":
        return now_s
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if math.isfinite(number):
        return number
    if _DURATION.match(value.lstrip("-")):
        return now_s - parse_duration_s(value.lstrip("-"))
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"bad time {text!r}: use epoch seconds, ISO 8601, 'now' or a duration ago such as 1h"
        ) from None
    if parsed.tzinfo is None:
        return (parsed - datetime(1970, 1, 1)).total_seconds()
    return parsed.timestamp()


def resolve_window(
    now_s: float, from_text: str | None = None, to_text: str | None = None, step_text: str | None = None
) -> UsageWindow:
    """The report window for the `from`, `to` and `step` parameters (each optional).

    Defaults: the last hour up to now, and the smallest of `NICE_STEPS_S` that gives at most 120
    buckets. Steps are whole minutes (usage is stored per minute). The window is widened to whole
    steps, so the series always sums to the totals."""
    to_s = parse_time_s(to_text, now_s) if to_text else now_s
    from_s = parse_time_s(from_text, now_s) if from_text else to_s - _DEFAULT_SPAN_S
    if from_s >= to_s:
        raise InvalidInput("'from' must be before 'to'", from_s=from_s, to_s=to_s)
    if step_text:
        step_s = parse_duration_s(step_text)
        if step_s % 60:
            raise InvalidInput(f"step {step_text!r} must be a whole number of minutes (usage is per minute)")
    else:
        span = to_s - from_s
        step_s = next((s for s in NICE_STEPS_S if span / s <= _DEFAULT_POINTS), NICE_STEPS_S[-1])
    start = math.floor(from_s / step_s) * step_s
    end = math.ceil(to_s / step_s) * step_s
    if end == start:
        end = start + step_s
    if (end - start) // step_s > MAX_BUCKETS:
        raise InvalidInput(
            f"{(end - start) // step_s} buckets requested; at most {MAX_BUCKETS}: use a larger step",
            max_buckets=MAX_BUCKETS,
        )
    return UsageWindow(from_s=int(start), to_s=int(end), step_s=step_s)


# ---- aggregation -----------------------------------------------------------------------------


def estimate_quantile_ms(histogram: Mapping[str, int], q: float) -> float | None:
    """The q-quantile (0 < q ≤ 1) of a latency histogram of `lat_le_<ms>` / `lat_inf` counters.

    Linear interpolation inside the bucket that holds the quantile (the first bucket from 0 ms).
    A quantile in the open-ended last bucket is reported as the largest finite bound: the truth is
    "at least that", and a made-up larger number would be worse. None without samples."""
    counts = [(bound, histogram.get(name, 0)) for name, bound in _HIST]
    total = sum(count for _, count in counts)
    if total <= 0:
        return None
    rank = q * total
    cumulative = 0
    lower = 0.0
    for bound, count in counts:
        if count > 0 and cumulative + count >= rank:
            if math.isinf(bound):
                return LATENCY_BUCKETS_MS[-1]
            return lower + (bound - lower) * max(rank - cumulative, 0.0) / count
        cumulative += count
        if not math.isinf(bound):
            lower = bound
    return LATENCY_BUCKETS_MS[-1]


def stats_from_counters(counters: Mapping[str, int]) -> UsageStats:
    """`UsageStats` of one set of summed counters."""
    met = counters.get(COUNTER_SLO_MET, 0)
    missed = counters.get(COUNTER_SLO_MISSED, 0)
    refused = counters.get(COUNTER_REFUSED, 0)
    failed = counters.get(COUNTER_FAILED, 0)
    sent = met + missed + refused + failed
    cost_pusd = counters.get(COUNTER_COST_PUSD, 0)
    reserved_pusd = counters.get(COUNTER_RESERVED_PUSD, 0)
    return UsageStats(
        queries=counters.get(COUNTER_QUERIES, 0),
        rows=counters.get(COUNTER_ROWS, 0),
        cost_pusd=cost_pusd,
        cost_usd=pusd_to_usd(cost_pusd),
        reserved_pusd=reserved_pusd,
        reserved_usd=pusd_to_usd(reserved_pusd),
        slo_met=met,
        slo_missed=missed,
        refused=refused,
        failed=failed,
        slo_attainment=met / sent if sent else None,
        p50_ms=estimate_quantile_ms(counters, 0.50),
        p99_ms=estimate_quantile_ms(counters, 0.99),
    )


class _Sum:
    """Integer counters summed over rows; only the counters a report uses are kept."""

    __slots__ = ("counters",)

    _KEPT = frozenset(
        {
            COUNTER_QUERIES,
            COUNTER_ROWS,
            COUNTER_COST_PUSD,
            COUNTER_RESERVED_PUSD,
            COUNTER_SLO_MET,
            COUNTER_SLO_MISSED,
            COUNTER_REFUSED,
            COUNTER_FAILED,
        }
    )

    def __init__(self) -> None:
        self.counters: dict[str, int] = defaultdict(int)

    def add(self, counters: Mapping[str, int]) -> None:
        for name, value in counters.items():
            if name in self._KEPT or name in _HIST_NAMES:
                self.counters[name] += value

    def stats(self) -> UsageStats:
        return stats_from_counters(self.counters)


def _by_variant(sums: Mapping[tuple[str, str], _Sum]) -> tuple[VariantUsage, ...]:
    items = [VariantUsage(variant=v, task=t, stats=s.stats()) for (v, t), s in sums.items()]
    return tuple(sorted(items, key=lambda u: (-u.stats.cost_pusd, u.variant, u.task)))


def build_report(
    rows: Iterable[UsageRecord],
    window: UsageWindow,
    tenants: Iterable[str] = (),
    shares: Mapping[str, Share] | None = None,
) -> UsageReport:
    """Totals, per-tenant time series and breakdowns of the rows inside `window`.

    `tenants` are listed even without usage (the dashboard shows an idle tenant as zeros). Rows
    outside the window are ignored, so a caller may pass a wider set."""
    buckets = window.buckets
    grand = _Sum()
    per_tenant: dict[str, _Sum] = {t: _Sum() for t in tenants}
    series: dict[str, list[_Sum]] = {}
    tasks: dict[str, dict[str, _Sum]] = defaultdict(dict)
    variants: dict[str, dict[tuple[str, str], _Sum]] = defaultdict(dict)
    all_variants: dict[tuple[str, str], _Sum] = {}
    for row in rows:
        at_s = row.key.minute * 60
        if not window.from_s <= at_s < window.to_s:
            continue
        key = row.key
        grand.add(row.counters)
        per_tenant.setdefault(key.tenant, _Sum()).add(row.counters)
        tenant_series = series.get(key.tenant)
        if tenant_series is None:
            tenant_series = series[key.tenant] = [_Sum() for _ in buckets]
        tenant_series[(at_s - window.from_s) // window.step_s].add(row.counters)
        tasks[key.tenant].setdefault(key.task, _Sum()).add(row.counters)
        variants[key.tenant].setdefault((key.variant, key.task), _Sum()).add(row.counters)
        all_variants.setdefault((key.variant, key.task), _Sum()).add(row.counters)
    tenant_reports = []
    for name in sorted(per_tenant):
        sums = series.get(name)
        points = tuple(
            SeriesPoint(start_s=start, stats=sums[i].stats() if sums else UsageStats())
            for i, start in enumerate(buckets)
        )
        by_task = tuple(
            sorted(
                (TaskUsage(task=t, stats=s.stats()) for t, s in tasks[name].items()),
                key=lambda u: (-u.stats.cost_pusd, u.task),
            )
        )
        tenant_reports.append(
            TenantUsage(
                tenant=name,
                share=(shares or {}).get(name),
                totals=per_tenant[name].stats(),
                series=points,
                by_task=by_task,
                by_variant=_by_variant(variants[name]),
            )
        )
    return UsageReport(
        from_s=window.from_s,
        to_s=window.to_s,
        step_s=window.step_s,
        buckets=buckets,
        totals=grand.stats(),
        tenants=tuple(tenant_reports),
        by_variant=_by_variant(all_variants),
    )
