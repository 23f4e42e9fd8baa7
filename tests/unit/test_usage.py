"""Usage reports: windows, bucketing, totals and latency percentiles (pure, no store)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infaas.errors import InvalidInput
from infaas.types import (
    LATENCY_BUCKETS_MS,
    UsageKey,
    UsageRecord,
    latency_bucket_counter,
    usd_to_pusd,
)
from infaas.usage import (
    MAX_BUCKETS,
    UsageWindow,
    build_report,
    estimate_quantile_ms,
    parse_duration_s,
    parse_time_s,
    resolve_window,
    stats_from_counters,
)

NOW_S = 1_767_225_600.0 + 37 * 60 + 13  # 2026-01-01 00:37:13 UTC


def row(tenant: str, minute: int, task: str = "digits", variant: str = "v1", **counters: int) -> UsageRecord:
    return UsageRecord(
        key=UsageKey(tenant=tenant, task=task, variant=variant, minute=minute), counters=counters
    )


# ---- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("5m", 300), ("1h", 3600), ("2d", 172800), ("1w", 604800), ("120", 120), ("1.5h", 5400)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-5m", "0s", "5 parsecs", "1e400"])
def test_bad_durations_are_invalid_input(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_duration_s(text)


def test_times_in_every_accepted_form() -> None:
    assert parse_time_s("now", NOW_S) == NOW_S
    assert parse_time_s("1767225600", NOW_S) == 1767225600.0
    assert parse_time_s("2026-01-01T00:00:00Z", NOW_S) == 1767225600.0
    assert parse_time_s("2026-01-01T01:00:00+01:00", NOW_S) == 1767225600.0
    assert parse_time_s("2026-01-01T00:00:00", NOW_S) == 1767225600.0  # naive is UTC
    assert parse_time_s("1h", NOW_S) == NOW_S - 3600
    assert parse_time_s("-15m", NOW_S) == NOW_S - 900
    with pytest.raises(InvalidInput, match="ISO 8601"):
        parse_time_s("yesterday", NOW_S)


def test_default_window_is_the_last_hour_in_minutes() -> None:
    w = resolve_window(NOW_S)
    assert w.step_s == 60
    assert w.from_s == 1767225600 - 23 * 60  # 23:37:00, aligned down
    assert w.to_s == 1767225600 + 38 * 60  # 00:38:00, aligned up: the current minute is included
    assert len(w.buckets) == 61
    assert w.from_minute == w.from_s // 60 and w.to_minute == w.to_s // 60 - 1


def test_default_step_keeps_at_most_120_buckets() -> None:
    assert resolve_window(NOW_S, "24h").step_s == 900
    assert resolve_window(NOW_S, "7d").step_s == 3 * 3600
    assert len(resolve_window(NOW_S, "7d").buckets) <= 121


def test_window_is_widened_to_whole_steps() -> None:
    w = resolve_window(NOW_S, "2026-01-01T00:07:00Z", "2026-01-01T00:31:00Z", "15m")
    assert (w.from_s, w.to_s, w.step_s) == (1767225600, 1767225600 + 45 * 60, 900)
    assert w.buckets == (1767225600, 1767225600 + 900, 1767225600 + 1800)


def test_bad_windows_are_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="before"):
        resolve_window(NOW_S, "now", "1h")
    with pytest.raises(InvalidInput, match="whole number of minutes"):
        resolve_window(NOW_S, step_text="90s")
    with pytest.raises(InvalidInput, match=f"at most {MAX_BUCKETS}"):
        resolve_window(NOW_S, "52w", step_text="1m")


# ---- percentiles ---------------------------------------------------------------------------------


def test_quantile_interpolates_inside_the_bucket() -> None:
    # 100 samples: 50 in (0, 0.25], 50 in (5, 7.5]
    hist = {latency_bucket_counter(0.1): 50, latency_bucket_counter(6.0): 50}
    assert latency_bucket_counter(6.0) == "lat_le_7.5"
    assert estimate_quantile_ms(hist, 0.5) == pytest.approx(0.25)
    assert estimate_quantile_ms(hist, 0.99) == pytest.approx(5.0 + 2.5 * 49 / 50)
    assert estimate_quantile_ms(hist, 0.01) == pytest.approx(0.25 * 1 / 50)


def test_quantile_in_the_open_bucket_is_the_largest_bound() -> None:
    hist = {"lat_le_1": 1, "lat_inf": 99}
    assert estimate_quantile_ms(hist, 0.99) == LATENCY_BUCKETS_MS[-1]
    assert estimate_quantile_ms({}, 0.5) is None
    assert estimate_quantile_ms({"queries": 3}, 0.5) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.01, max_value=2000.0), min_size=1, max_size=300))
def test_quantile_estimate_lies_in_the_true_quantiles_bucket(latencies_ms: list[float]) -> None:
    hist: dict[str, int] = {}
    for lat in latencies_ms:
        name = latency_bucket_counter(lat)
        hist[name] = hist.get(name, 0) + 1
    for q in (0.5, 0.99):
        true = sorted(latencies_ms)[max(math.ceil(q * len(latencies_ms)) - 1, 0)]
        estimate = estimate_quantile_ms(hist, q)
        assert estimate is not None
        bounds = (0.0, *LATENCY_BUCKETS_MS)
        i = next((k for k, b in enumerate(LATENCY_BUCKETS_MS) if true <= b), None)
        if i is None:
            assert estimate == LATENCY_BUCKETS_MS[-1]
        else:
            assert bounds[i] <= estimate <= bounds[i + 1]


# ---- stats and reports ---------------------------------------------------------------------------


def test_stats_from_counters() -> None:
    s = stats_from_counters(
        {
            "queries": 4,
            "rows": 9,
            "cost_pusd": usd_to_pusd(2.5e-9),
            "slo_met": 3,
            "slo_missed": 1,
            "lat_le_2": 4,
        }
    )
    assert (s.queries, s.rows, s.cost_pusd, s.slo_met, s.slo_missed) == (4, 9, 2500, 3, 1)
    assert s.cost_usd == pytest.approx(2.5e-9)
    assert s.slo_attainment == 0.75
    assert s.p50_ms == pytest.approx(1.5)
    empty = stats_from_counters({})
    assert empty.slo_attainment is None and empty.p99_ms is None and empty.queries == 0


def test_report_buckets_totals_and_breakdowns() -> None:
    window = UsageWindow(from_s=600 * 60, to_s=630 * 60, step_s=600)  # three 10-minute buckets
    rows = [
        row("acme", 600, queries=2, cost_pusd=10, slo_met=2, lat_le_1=2),
        row("acme", 609, variant="v2", queries=1, cost_pusd=30, slo_missed=1, lat_le_50=1),
        row("acme", 625, task="iris", variant="v3", queries=5, cost_pusd=5, slo_met=5, lat_le_3=5),
        row("beta", 610, queries=7, cost_pusd=700, slo_met=7, lat_le_2=7),
        row("beta", 630, queries=99, cost_pusd=99),  # at to_s: outside
        row("beta", 599, queries=99, cost_pusd=99),  # before from_s: outside
    ]
    report = build_report(rows, window, tenants=["idle", "acme"])
    assert report.buckets == (36000, 36600, 37200)
    assert [t.tenant for t in report.tenants] == ["acme", "beta", "idle"]
    acme, beta, idle = report.tenants
    assert [p.stats.queries for p in acme.series] == [3, 0, 5]
    assert [p.stats.cost_pusd for p in acme.series] == [40, 0, 5]
    assert [p.stats.queries for p in beta.series] == [0, 7, 0]
    assert acme.totals.queries == 8 and acme.totals.cost_pusd == 45
    assert acme.totals.slo_attainment == pytest.approx(7 / 8)
    assert [(u.task, u.stats.queries) for u in acme.by_task] == [("digits", 3), ("iris", 5)]
    assert [(u.variant, u.stats.cost_pusd) for u in acme.by_variant] == [("v2", 30), ("v1", 10), ("v3", 5)]
    assert idle.totals.queries == 0 and len(idle.series) == 3 and idle.by_variant == ()
    assert report.totals.queries == 15 and report.totals.cost_pusd == 745
    assert [(u.variant, u.stats.cost_pusd) for u in report.by_variant] == [("v1", 710), ("v2", 30), ("v3", 5)]


usage_rows = st.lists(
    st.builds(
        row,
        tenant=st.sampled_from(["a", "b", "c"]),
        minute=st.integers(min_value=1000, max_value=1200),
        task=st.sampled_from(["t1", "t2"]),
        variant=st.sampled_from(["v1", "v2", "v3"]),
        queries=st.integers(min_value=0, max_value=10**6),
        cost_pusd=st.integers(min_value=0, max_value=10**15),
        slo_met=st.integers(min_value=0, max_value=100),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(usage_rows, st.sampled_from([60, 300, 900, 3600]), st.integers(1000, 1100), st.integers(1, 120))
def test_series_sum_to_totals_and_totals_to_rows(
    rows: list[UsageRecord], step_s: int, from_minute: int, span_min: int
) -> None:
    window = resolve_window(0.0, str(from_minute * 60), str((from_minute + span_min) * 60), f"{step_s}s")
    report = build_report(rows, window)
    inside = [r for r in rows if window.from_s <= r.key.minute * 60 < window.to_s]
    assert report.totals.queries == sum(r.counters["queries"] for r in inside)
    assert report.totals.cost_pusd == sum(r.counters["cost_pusd"] for r in inside)  # exact integers
    assert sum(t.totals.cost_pusd for t in report.tenants) == report.totals.cost_pusd
    assert sum(v.stats.cost_pusd for v in report.by_variant) == report.totals.cost_pusd
    for tenant in report.tenants:
        assert len(tenant.series) == len(report.buckets)
        assert sum(p.stats.queries for p in tenant.series) == tenant.totals.queries
        assert sum(p.stats.cost_pusd for p in tenant.series) == tenant.totals.cost_pusd
        assert sum(u.stats.cost_pusd for u in tenant.by_task) == tenant.totals.cost_pusd
        for point in tenant.series:
            mine = [
                r
                for r in inside
                if r.key.tenant == tenant.tenant
                and point.start_s <= r.key.minute * 60 < point.start_s + step_s
            ]
            assert point.stats.cost_pusd == sum(r.counters["cost_pusd"] for r in mine)


def test_slo_attainment_counts_every_query_sent_refused_and_failed_included() -> None:
    from infaas.usage import stats_from_counters

    stats = stats_from_counters({"queries": 8, "slo_met": 6, "slo_missed": 2, "refused": 1, "failed": 1})
    assert (stats.refused, stats.failed) == (1, 1)
    assert stats.slo_attainment == 0.6  # 6 in SLO of 10 sent
    assert stats_from_counters({"refused": 3}).slo_attainment == 0.0
    assert stats_from_counters({}).slo_attainment is None
