"""Overload through the real service (issue 10): open-loop arrivals at 10× what the service
sustains, for 10 s. Admitted queries meet their SLO, the rest are refused at once with 429 and
Retry-After, nothing is a 5xx (a 504 is an admitted query that missed: admission let in what
it could not serve), the front end's memory stays bounded, and usage is exactly what the 200
answers charged.

The model is compute-bound, registered through `POST /v1/models` right before: a 12-layer,
128-channel convolution net (int8: ~0.5 ms a row on an AVX-512 EPYC), in queries of 8 rows, so
what the service sustains is the worker's compute (~220-230 queries/s there), not the front end's per-query
Python, and 10× of it is an arrival rate a load generator on the same 2 cores can offer. (Until
2026-12-05 this test sent 8-row queries to a digits MLP that sustains ~1 200-1 900 queries/s,
bound by the front end: 10× of that cannot be generated here, so it offered 2×;
docs/benchmarks.md has those runs.) The query is not pinned: the router and the autoscaler
choose among the model's variants, as for any tenant.

The target, 500 ms, leaves room for a few of the largest batches (128 rows, ~65 ms on an
AVX-512 EPYC). At 200 ms (three of them) admission fills the queue to the edge of the target,
and some answers came late (98.2-99.5 % in SLO over 5 runs, 2026-12-05): whole batches
delayed 10-50 ms while the 2 shared cores also ran the front end refusing ~2 000 queries/s and
the load generator (docs/benchmarks.md, "Overload at 10x")."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from infaas.settings import Settings
from tests import tiny_models
from tests.integration.conftest import serve_process
from tests.integration.load import BareOpenLoopLoad, closed_loop
from tests.integration.test_admin_views import metric_samples
from tests.integration.test_faults import usage_totals

pytestmark = [pytest.mark.ray, pytest.mark.slow]

OVERLOAD = 10.0
"""Offered load ÷ what the service answered back to back just before."""
MAX_RATE_PER_S = 5000.0
"""The load generator shares the 2 cores (`BareOpenLoopLoad`: ~0.3 core at 4 000/s)."""
SECONDS = 10.0
TARGET_MS = 500.0
ROWS = 8


def test_ten_times_the_sustained_load_is_refused_early_and_admitted_queries_meet_their_slo(
    tmp_path: Path,
) -> None:
    empty = Settings(data_dir=tmp_path / "empty")
    empty.data_dir.mkdir()
    x, _ = tiny_models.digits(200)
    body = {"task": "digits", "inputs": [row.tolist() for row in x[:ROWS]], "latency_ms": TARGET_MS}
    lenient = {**body, "latency_ms": 60_000}
    env = {"INFAAS_PROFILE_QUICK": "1"}
    with serve_process(empty, tmp_path / "run", env=env) as served:
        key = served.new_tenant("acme", role="owner")
        served.register_onnx(key, tiny_models.deep_conv_onnx(channels=128, layers=12), "conv")
        url = f"{served.url}/v1/query"
        # What it sustains: 64 clients back to back, with a target nothing misses (the
        # autoscaler sees this demand too, and adds what it adds).
        closed_loop(url, key, lenient, 64, 300)
        started_s = time.monotonic()
        capacity = closed_loop(url, key, lenient, 64, 1000)
        sustained_per_s = len(capacity.answered()) / (time.monotonic() - started_s)
        warm_up = 300 + len(capacity.answered())  # charged before the overload
        rate_per_s = min(MAX_RATE_PER_S, OVERLOAD * sustained_per_s)
        front_end = psutil.Process(served.pid)
        rss_before = front_end.memory_info().rss
        load = BareOpenLoopLoad(url, key, body, rate_per_s).start()
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
    answered = result.answered()
    in_slo = sum(1 for b in answered if b["slo_met"])
    actions = [(e["kind"], e["variant"], e["reason"][:120]) for e in events if e["kind"] != "route"]
    p99 = float(np.percentile([b["latency_ms"] for b in answered], 99)) if answered else float("nan")
    print(
        f"\noverload: {rate_per_s:.0f}/s offered ({rate_per_s / sustained_per_s:.1f}x the "
        f"{sustained_per_s:.0f}/s answered back to back), {len(answered) / SECONDS:.0f} answered/s, "
        f"p99 {p99:.0f} ms, in SLO {in_slo}/{len(answered)}, {dict(statuses)}, "
        f"front end RSS +{(rss_peak - rss_before) >> 20} MiB"
    )
    assert rate_per_s >= 0.99 * OVERLOAD * sustained_per_s, "the generator's cap made it less than 10x"
    # Every admitted query gave its slot back, the clients that left included: a slot kept would
    # shrink the front end for good.
    assert gauges["infaas_queries_in_flight"] == 0, gauges
    assert gauges["infaas_queries_in_flight_limit"] >= empty.min_queries_in_flight, gauges
    # It was overloaded and it served: answers and refusals, no 5xx, and few 504s (queries
    # admitted in time and dropped before running when a stall of the shared cores made them
    # late). 0 x 504 and >= 99 % in SLO held on this machine type in earlier runs; on 2026-12-06,
    # ~30 % slower (72-105/s sustained against ~130/s), the same code measured 0-17 x 504 of
    # 700-1 050 answers (up to 2.4 %) and 94.8-99.3 % in SLO in ten runs. Before admission judged
    # by the path's measured overhead, 52-68 % were in SLO; the strict figures are
    # `scripts/bench_fairness --quiet-rate 0`'s.
    assert set(statuses) <= {200, 429, 504}, (statuses, actions)
    assert statuses[504] <= 0.05 * len(answered), (statuses, actions)
    assert statuses[429] > 0 and statuses[200] > 0, statuses
    assert in_slo >= 0.90 * len(answered), (in_slo, len(answered), statuses, actions)
    refusals = [o for o in result.outcomes if o.status == 429]
    assert all(o.body is not None and o.body["error"] == "overloaded" for o in refusals)
    assert all(o.retry_after_s is not None and o.retry_after_s > 0 for o in refusals)
    for o in refusals[:: max(1, len(refusals) // 3)]:
        print(f"  refused: {o.body and o.body['detail']}")
    # bounded: queues are bounded and refusals are cheap
    assert rss_peak - rss_before < 200 * 1024 * 1024, (rss_before, rss_peak)
    # only the 200s are charged (plus the warm-up queries); refusals are counted apart, and SLO
    # attainment is over all of them
    assert totals["queries"] == len(answered) + warm_up
    assert (totals["refused"], totals["failed"]) == (statuses[429], statuses[504]), (totals, statuses)
    assert totals["slo_attainment"] < (in_slo + warm_up) / (len(answered) + warm_up)
