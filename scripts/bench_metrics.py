"""Per-query cost of the admin views' hooks on the query path, and the cost of a scrape.

Baseline: `Meter.charge` + `Meter.settle` with no listener (the bookkeeping every answered query
already pays). Then the same with the Prometheus listener, and with it and the routing log. The
hooks run on the event loop once per query, so their cost adds to every request's CPU time. Also times
`/metrics` rendering and a usage report over a day of per-minute rows. Prints µs and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from infaas.metering import Meter
from infaas.metrics import Metrics
from infaas.routelog import RouteLog
from infaas.store import MemoryStore
from infaas.types import Tenant, UsageKey, UsageRecord
from infaas.usage import build_report, resolve_window

TENANTS = [f"tenant-{i}" for i in range(8)]
VARIANTS = [f"arch-{i}/onnx-cpu-fp32-t1" for i in range(20)]


def per_call_us(fns: dict[str, Callable[[int], None]], n: int, repeats: int) -> dict[str, float]:
    """Median over `repeats` runs of n calls, in µs per call. The candidates take turns within each
    repeat, so a burst of load on this shared machine hits all of them alike."""
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for i in range(n):
                fn(i)
            runs[name].append((time.perf_counter() - start) / n * 1e6)
    return {name: statistics.median(r) for name, r in runs.items()}


def meter_with(listeners: list[Callable[..., None]]) -> Callable[[int], None]:
    meter = Meter(MemoryStore())
    for fn in listeners:
        meter.add_listener(fn)

    def record(i: int) -> None:
        charged = meter.charge(
            tenant=TENANTS[i % len(TENANTS)],
            task="digits",
            variant=VARIANTS[i % len(VARIANTS)],
            rows=1,
            batch_rows=8,
            cost_pusd=137,
            latency_ms=2.5,
            slo_met=True,
            now_s=1_800_000_000.0 + i * 0.001,
        )
        meter.settle(charged, 2.5, True)

    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000, help="calls per run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    store = MemoryStore()
    for t in TENANTS:
        store.create_tenant(Tenant(name=t), f"key-{t}")
    metrics = Metrics(store, time.monotonic)
    # Admit the bench's names as the store would know them after registration.
    metrics.tasks = type(metrics.tasks)(lambda: ["digits"], time.monotonic)
    metrics.variants = type(metrics.variants)(lambda: VARIANTS, time.monotonic, fixed=("none",))

    us = per_call_us(
        {
            "base": meter_with([]),
            "metrics": meter_with([metrics.listener]),
            "both": meter_with([metrics.listener, RouteLog().listener]),
        },
        args.n,
        args.repeats,
    )
    base, with_metrics, with_both = us["base"], us["metrics"], us["both"]
    print(f"per answered query ({args.n} calls × {args.repeats} runs, median)")
    print(f"  meter alone (baseline)        {base:7.2f} µs   1.00×")
    print(f"  + Prometheus listener         {with_metrics:7.2f} µs   {with_metrics / base:.2f}×")
    print(f"  + Prometheus + routing log    {with_both:7.2f} µs   {with_both / base:.2f}×")
    print(f"  hooks' own cost               {with_both - base:7.2f} µs per query")

    series = len(TENANTS) * len(VARIANTS)

    def render(_i: int) -> None:
        metrics.render()

    render_ms = per_call_us({"render": render}, 20, args.repeats)["render"] / 1000
    print(f"/metrics render, {series} label sets: {render_ms:.2f} ms")

    rows = [
        UsageRecord(
            key=UsageKey(tenant=t, task="digits", variant=v, minute=30_000_000 + m),
            counters={"queries": 10, "cost_pusd": 1370, "slo_met": 10, "lat_le_3": 10},
        )
        for m in range(0, 1440, 5)
        for t in TENANTS
        for v in VARIANTS[:5]
    ]
    window = resolve_window((30_000_000 + 1440) * 60.0, "24h")
    start = time.perf_counter()
    build_report(rows, window)
    report_ms = (time.perf_counter() - start) * 1000
    print(f"usage report over 24 h, {len(rows)} rows, {len(window.buckets)} buckets: {report_ms:.1f} ms")


if __name__ == "__main__":
    main()
