"""Prometheus metrics: own registry, bounded labels, exact cost, fleet gauges (no server)."""

from __future__ import annotations

import asyncio

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from infaas.batching import AsyncBatcher, ManualTimer
from infaas.metering import MeterRecord
from infaas.metrics import OTHER, LabelBounds, Metrics, bounded_label
from infaas.policy.admission import ConcurrencyLimit
from infaas.store import MemoryStore
from infaas.types import (
    Architecture,
    InputSpec,
    LatencyPoint,
    MachineInfo,
    Parity,
    Profile,
    Task,
    Tenant,
    Variant,
    VariantSpec,
    pusd_to_usd,
)
from infaas.workers.inprocess import EchoModel, InProcessPool, RecordingPool


class ManualClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def seeded_store() -> MemoryStore:
    store = MemoryStore()
    store.put_task(Task(name="digits", input_spec=InputSpec(shape=(64,)), num_classes=10,
                        validation_artifact="v.npz", validation_size=10))  # fmt: skip
    arch = Architecture(
        name="digits-lr", task="digits", kind="onnx", source_sha256="0" * 64, artifact="m.onnx"
    )
    store.register_architecture(arch, variants=[digits_variant()], skipped=[])
    store.create_tenant(Tenant(name="acme"), "key-acme")
    return store


def test_bounded_label_admits_known_values_up_to_the_cap() -> None:
    seen: set[str] = set()
    known = frozenset({"a", "b", "c"})
    assert bounded_label("a", known, seen, max_values=2) == "a"
    assert bounded_label("zzz", known, seen, max_values=2) == OTHER
    assert bounded_label("b", known, seen, max_values=2) == "b"
    assert bounded_label("c", known, seen, max_values=2) == OTHER  # cap reached
    assert bounded_label("a", known, seen, max_values=2) == "a"
    assert seen == {"a", "b"}


def test_label_bounds_rereads_the_source_at_most_every_refresh_interval() -> None:
    names = ["a"]
    reads = []
    clock = ManualClock()

    def source() -> list[str]:
        reads.append(clock.now_s)
        return list(names)

    bounds = LabelBounds(source, clock, refresh_s=5.0)
    assert bounds("a") == "a"
    names.append("new")
    for _ in range(100):
        assert bounds("new") == OTHER  # a flood of misses within the interval: no extra reads
    assert reads == [0.0]
    clock.now_s = 5.0
    assert bounds("new") == "new"  # registered meanwhile: admitted after one more read
    assert reads == [0.0, 5.0]


def test_unknown_names_from_user_input_do_not_create_labels() -> None:
    metrics = Metrics(seeded_store(), ManualClock())
    for i in range(50):
        metrics.observe_query(
            tenant="acme", task=f"typo-{i}", variant=f"nope/{i}", outcome=f"weird-{i}", latency_ms=1.0
        )
    metrics.observe_query(
        tenant="acme", task="digits", variant="digits-lr/onnx-cpu-fp32-t1", outcome="ok", latency_ms=2.0
    )
    metrics.observe_query(
        tenant="acme", task="digits", variant=None, outcome="no_feasible_variant", latency_ms=1
    )
    s = samples(metrics)
    requests = {labels: v for (name, labels), v in s.items() if name == "infaas_requests_total"}
    assert requests == {
        (("outcome", OTHER), ("task", OTHER), ("tenant", "acme"), ("variant", OTHER)): 50.0,
        (
            ("outcome", "ok"),
            ("task", "digits"),
            ("tenant", "acme"),
            ("variant", "digits-lr/onnx-cpu-fp32-t1"),
        ): 1.0,
        (
            ("outcome", "no_feasible_variant"),
            ("task", "digits"),
            ("tenant", "acme"),
            ("variant", "none"),
        ): 1.0,
    }


def test_cost_is_summed_exactly_and_exported_in_usd() -> None:
    metrics = Metrics(seeded_store(), ManualClock())
    costs = [137, 1, 10**12 + 3, 999_999]
    for c in costs:
        metrics.observe_query(
            tenant="acme", task="digits", variant=None, outcome="ok", latency_ms=1, cost_pusd=c
        )
    s = samples(metrics)
    assert s[("infaas_cost_usd_total", (("tenant", "acme"),))] == pusd_to_usd(sum(costs))


def test_latency_histogram_and_batch_rows() -> None:
    metrics = Metrics(seeded_store(), ManualClock())
    v = "digits-lr/onnx-cpu-fp32-t1"
    for lat, rows in [(0.4, 8), (4.0, 8), (40.0, 32)]:
        metrics.observe_query(
            tenant="acme", task="digits", variant=v, outcome="ok", latency_ms=lat, batch_rows=rows
        )
    s = samples(metrics)
    labels = (("outcome", "ok"), ("task", "digits"), ("tenant", "acme"), ("variant", v))
    assert s[("infaas_request_latency_seconds_count", labels)] == 3
    assert s[("infaas_request_latency_seconds_bucket", (("le", "0.0005"), *labels))] == 1
    assert s[("infaas_request_latency_seconds_bucket", (("le", "0.005"), *labels))] == 2
    assert s[("infaas_batch_size_rows_bucket", (("le", "8.0"), ("variant", v)))] == 2
    assert s[("infaas_batch_size_rows_count", (("variant", v),))] == 3


def digits_variant() -> Variant:
    spec = VariantSpec(architecture="digits-lr", runtime="onnxruntime", max_batch=64)
    return Variant(
        spec=spec,
        artifact="a.onnx",
        sha256="0" * 64,
        parity=Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1),
    )


def flat_profile(variant: str) -> Profile:
    point = LatencyPoint(
        batch=1, p50_ms=1.0, p95_ms=1.0, p99_ms=1.0, mean_ms=1.0, throughput_qps=1000.0, samples=10,
        stable=True, stop_reason="stable", cost_usd_per_1k=1e-6,
    )  # fmt: skip
    return Profile(
        variant=variant, machine=MachineInfo(cpu_model="test", cores=2), measured_at_s=0.0, points=(point,)
    )


def test_fleet_gauges_are_read_at_scrape_time() -> None:
    variant = digits_variant()
    pool = InProcessPool(loader=lambda v: EchoModel(v.name, memory_mb=3.0), memory_budget_mb=1024.0)
    held = RecordingPool(gated=True)
    batcher = AsyncBatcher(held, timer=ManualTimer(), max_in_flight=1)
    metrics = Metrics(seeded_store(), ManualClock(), sources=lambda: (pool, batcher))

    async def scenario() -> tuple[dict[str, int], dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
        await pool.ensure_loaded(variant)
        rows = np.zeros((1, 64), dtype=np.float32)
        waiting = [
            asyncio.ensure_future(batcher.submit(variant, flat_profile(variant.name), rows, deadline_s=1e9))
            for _ in range(5)
        ]
        await asyncio.sleep(0)
        depths, scraped = batcher.queue_depths(), samples(metrics)
        held.release(5)  # before close(): it waits for running batches
        await batcher.close()
        await asyncio.gather(*waiting, return_exceptions=True)
        return depths, scraped

    depths, s = asyncio.run(scenario())
    assert depths[variant.name] > 0
    assert s[("infaas_queue_depth", (("variant", variant.name),))] == depths[variant.name]
    worker = pool.fleet()[0].worker_id
    assert s[("infaas_worker_loaded_variants", (("family", "inprocess"), ("worker", worker)))] == 1
    assert s[("infaas_worker_memory_used_bytes", (("worker", worker),))] >= 3 * 1024 * 1024
    assert s[("infaas_worker_memory_budget_bytes", (("worker", worker),))] == 1024 * 1024 * 1024
    assert s[("infaas_worker_up", (("worker", worker),))] == 1
    asyncio.run(pool.close())
    assert samples(metrics)[("infaas_worker_up", (("worker", worker),))] == 0


def test_each_app_has_its_own_registry() -> None:
    a = Metrics(seeded_store(), ManualClock())
    b = Metrics(seeded_store(), ManualClock())
    a.observe_query(tenant="acme", task="digits", variant=None, outcome="ok", latency_ms=1)
    assert any(name == "infaas_requests_total" for name, _ in samples(a))
    assert not any(name == "infaas_requests_total" for name, _ in samples(b))


def test_a_new_tenant_is_labelled_from_its_first_query_without_a_store_read() -> None:
    """A tenant created a moment ago is not in the label cache, but it authenticated: the meter's
    record is enough, and its spend must never be booked to `_other`."""
    store = seeded_store()
    clock = ManualClock()
    metrics = Metrics(store, clock)
    metrics.tenants("acme")  # loads the known tenants now; the next refresh is 5 s away
    store.create_tenant(Tenant(name="fresh"), "key-fresh")
    metrics.listener(
        MeterRecord(
            tenant="fresh",
            task="digits",
            variant="digits-lr/onnx-cpu-fp32-t1",
            outcome="ok",
            latency_ms=1.0,
            cost_pusd=42,
            rows=1,
            batch_rows=1,
            slo_met=True,
            at_s=0.0,
        )
    )
    cost = {labels: v for (name, labels), v in samples(metrics).items() if name == "infaas_cost_usd_total"}
    assert cost == {(("tenant", "fresh"),): pusd_to_usd(42)}


def test_label_names_can_come_from_a_catalog_instead_of_the_store() -> None:
    metrics = Metrics(MemoryStore(), ManualClock(), catalog=lambda: (["digits"], ["digits-lr/x"]))
    metrics.observe_query(tenant="admin", task="digits", variant="digits-lr/x", outcome="ok", latency_ms=1.0)
    [labels] = [labels for (name, labels), _ in samples(metrics).items() if name == "infaas_requests_total"]
    assert dict(labels) == {"tenant": "admin", "task": "digits", "variant": "digits-lr/x", "outcome": "ok"}


def test_admission_gauges_follow_the_limit() -> None:
    limit = ConcurrencyLimit(initial=16.0, min_limit=8.0)
    metrics = Metrics(seeded_store(), ManualClock(), admission=lambda: limit)
    assert limit.try_admit() and limit.try_admit()
    limit.release(True, now_s=1.0)  # a late answer: the limit falls by its backoff
    s = samples(metrics)
    assert s[("infaas_queries_in_flight", ())] == 1
    assert s[("infaas_queries_in_flight_limit", ())] == int(16.0 * 0.8)
    assert "infaas_queries_in_flight" not in Metrics(seeded_store(), ManualClock()).render().decode()
