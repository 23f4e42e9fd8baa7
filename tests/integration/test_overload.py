"""Overload through the real service (issue 10): open-loop arrivals well past what the pinned
variant sustains. Admitted queries meet their SLO, the rest are refused at once with 429 and
Retry-After (or, if their deadline passes in the queue, 504), nothing is a 5xx, the front end's
memory stays bounded, and usage is exactly what the 200 answers charged."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from infaas.settings import Settings
from tests.integration.conftest import serve_process, tensorflow_variant
from tests.integration.load import BareOpenLoopLoad, closed_loop
from tests.integration.test_admin_views import metric_samples
from tests.integration.test_faults import usage_totals
from variants import zoo

pytestmark = [pytest.mark.ray, pytest.mark.slow]

OVERLOAD = 2.0
"""Offered load ÷ what the service answered back to back just before (the load is sized on the
machine at hand: a fixed 2 000/s was 1.6× what an AVX-512 EPYC answers and ~2.5× what an AVX2
EPYC does, where the front end, unable even to refuse that fast, answered 5 queries/s)."""
MAX_RATE_PER_S = 6000.0
"""The load generator shares the 2 cores (`BareOpenLoopLoad`: ~0.3 core at 4 000/s)."""
SECONDS = 8.0
LATENCY_MS = 50.0


def test_overload_is_refused_early_and_admitted_queries_meet_their_slo(
    small_zoo: Settings, tmp_path: Path
) -> None:
    variant = tensorflow_variant(small_zoo)
    row = [float(v) for v in zoo.load_split(zoo.DIGITS).x_test[0]]
    body = {"task": zoo.DIGITS, "inputs": [row] * 8, "latency_ms": LATENCY_MS, "variant": variant}
    with serve_process(small_zoo, tmp_path) as served:
        key = served.new_tenant("acme")
        with served.client(key) as http:  # load it first: this test is about queues, not cold loads
            assert http.post("/v1/query", json={**body, "latency_ms": 60_000}).status_code == 200
            # What it sustains: 64 clients back to back, with a target nothing misses.
            started_s = time.monotonic()
            capacity = closed_loop(f"{served.url}/v1/query", key, {**body, "latency_ms": 60_000}, 64, 2000)
            sustained_per_s = len(capacity.answered()) / (time.monotonic() - started_s)
        warm_up = 1 + len(capacity.answered())  # charged before the overload
        rate_per_s = min(MAX_RATE_PER_S, OVERLOAD * sustained_per_s)
        front_end = psutil.Process(served.pid)
        rss_before = front_end.memory_info().rss
        load = BareOpenLoopLoad(f"{served.url}/v1/query", key, body, rate_per_s).start()
        rss_peak = rss_before
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            rss_peak = max(rss_peak, front_end.memory_info().rss)
            time.sleep(0.2)
        result = load.stop()
        statuses = result.statuses()
        with served.client(served.admin_key) as admin:
            events = admin.get("/v1/admin/fleet", params={"events": 200}).json()["events"]
            deadline = time.monotonic() + 10.0
            while True:  # the last refusals may land one flush after the last answers
                totals = usage_totals(served, len(result.answered()) + warm_up)
                gauges = {
                    name: v for name, labels, v in metric_samples(admin.get("/metrics").text) if not labels
                }
                settled = gauges["infaas_queries_in_flight"] == 0
                if (settled and totals["refused"] >= statuses[429]) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    # Every admitted query gave its slot back, the 504s and the clients that left included: a slot
    # kept would shrink the front end for good.
    assert gauges["infaas_queries_in_flight"] == 0, gauges
    assert gauges["infaas_queries_in_flight_limit"] >= small_zoo.min_queries_in_flight, gauges
    assert set(statuses) <= {200, 429, 504}, statuses
    assert statuses[429] > 0 and statuses[200] > 0, statuses  # it was overloaded, and it served
    answered = result.answered()
    in_slo = sum(1 for b in answered if b["slo_met"])
    # The issue asks 99 %. Measured at 2 000/s with the worker stream on an AVX-512 EPYC: 98.1,
    # 98.1, 98.3, 99.3 % (4 runs, alone); the late answers come in clusters, whole batches
    # predicted at 9-20 ms answered in 50-100 ms. On an AVX2 EPYC (2026-12-02) the service
    # sustains ~380-580 of these queries/s back to back, and at 2× that, before the door shed
    # refusals, it collapsed: 32-60 answered/s, 46-74 % in SLO (refusing took the event loop);
    # with the door: 188 and 253 answered/s, 92.4 and 98.1 %. On a Xeon (2026-12-02) aiohttp
    # could offer only ~2 000/s, about what the service sustained there (99.3 % in SLO: no real
    # overload); with `BareOpenLoopLoad` offering 2× (3 165-3 499/s, 8 runs of this code):
    # 526-1 206 answered/s, 89.5-94.4 % of them in SLO, 155-353 × 504. Since 2026-12-03 the
    # latency judged includes the wait for the usage journal (15 ms p50, 58 ms p99 in one run):
    # 74.8, 87.8 and 67.3 % in SLO at 401, 811 and 439 answered/s, 22-88 × 504 (AVX-512 EPYC,
    # 3 runs; the last one was 91.0 % in SLO by the latency before the wait). Later that day, with
    # the door counting only refusals with room (`DoorShedder.min_margin_ms`): 61-81 % over 16
    # runs alone, with the front end at 0.65 core (docs/benchmarks.md, "Where the overload's time goes").
    # With the door in the HTTP parser (2026-12-03, evening, another AVX-512 EPYC): 52.5-62.6 % at
    # 288-423 answered/s (3 runs; docs/benchmarks.md, "The door in the HTTP parser"). With the
    # journal's sync in a helper process and the limit on queries in flight (2026-12-04, an AMD
    # EPYC): 94.3 and 95.1 % at 765 and 787 answered/s, against 56.5-63.2 % at 145-192 answered/s
    # for the code before (docs/benchmarks.md, "The journal's sync in a process"). That evening,
    # with the limit grown only when full and cut also by answers well after their prediction:
    # 99.3, 99.8 % at 1 367 and 1 170 answered/s (the test), 99.6-99.97 % (3 diag runs), 97.5 %
    # beside another overload run (docs/benchmarks.md, "The limit's verdict and growth"). With
    # the limit's refusals at the door and the generator's heap frozen (its full collections had
    # paused it ~300 ms, then it sent what it owed at once): 99.4-100 %, 0-11 x 504 (4 runs).
    # The p99 and the 504 count printed below are the sharper signals.
    actions = [(e["kind"], e["variant"], e["reason"]) for e in events if e["kind"] != "route"]
    p99 = float(np.percentile([b["latency_ms"] for b in answered], 99))
    print(
        f"\noverload: {rate_per_s:.0f}/s offered (sustained {sustained_per_s:.0f}/s back to back), "
        f"{len(answered) / SECONDS:.0f} answered/s, p99 {p99:.0f} ms, in SLO {in_slo}/{len(answered)}, "
        f"{dict(statuses)}"
    )
    # A guard against a collapse (17 % in SLO at 48 answered/s when the door stayed open), not the
    # goal, with room for a slower machine: 49-81 % before the limit (2026-12-03), 97.5 % with the
    # limit beside another overload run, 99.3-99.97 % alone.
    assert in_slo >= 0.8 * len(answered), (in_slo, len(answered), statuses, actions)
    refusals = [o.body for o in result.outcomes if o.status == 429]
    for b in refusals[:: max(1, len(refusals) // 4)]:
        print(f"  refused: {b and b['detail']}")
    assert all(b is not None and b["error"] == "overloaded" for b in refusals)
    # bounded: queues are bounded and refusals are cheap
    assert rss_peak - rss_before < 200 * 1024 * 1024, (rss_before, rss_peak)
    # only the 200s are charged (plus the warm-up queries); refusals and drops are counted apart,
    # and SLO attainment is over all of them
    assert totals["queries"] == len(answered) + warm_up
    assert (totals["refused"], totals["failed"]) == (statuses[429], statuses[504])
    assert totals["slo_attainment"] < (in_slo + warm_up) / (len(answered) + warm_up) or not statuses[429]
    print(f"\noverload: {dict(statuses)}; admitted in SLO {in_slo}/{len(answered)}")
