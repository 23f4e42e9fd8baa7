"""One contract suite for every MetadataStore backend: the in-memory fake, SQLite and Redis."""

from __future__ import annotations

import multiprocessing as mp
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infaas.errors import Conflict, TenantNotFound
from infaas.store import MemoryStore, SQLiteStore
from infaas.store.base import DocumentStore, hash_key
from infaas.store.redis import RedisStore
from infaas.types import (
    Architecture,
    FrontEndInfo,
    InputSpec,
    Labels,
    LatencyPoint,
    MachineInfo,
    Parity,
    Profile,
    Share,
    SkippedVariant,
    Task,
    Tenant,
    UsageDelta,
    UsageKey,
    Variant,
    VariantSpec,
    usd_to_pusd,
)


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(kind, location): location is a SQLite path or a Redis URL + namespace."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        ns = f"test-{uuid.uuid4().hex[:8]}"
        yield "redis", f"{url}#{ns}"
        RedisStore(url, ns).flush_namespace()
    else:
        yield request.param, str(tmp_path / "store.db")


def open_backend(kind: str, location: str) -> DocumentStore:
    if kind == "sqlite":
        return SQLiteStore(Path(location))
    if kind == "redis":
        url, ns = location.split("#")
        return RedisStore(url, ns)
    return MemoryStore()


@pytest.fixture
def store(backend: tuple[str, str]) -> Iterator[DocumentStore]:
    s = open_backend(*backend)
    yield s
    s.close()


def make_task(name: str = "digits-classification") -> Task:
    return Task(
        name=name,
        input_spec=InputSpec(shape=(64,)),
        num_classes=10,
        validation_artifact="validation/abc.npz",
        validation_size=100,
    )


def make_variant(arch: str, precision: str = "fp32", threads: int = 1) -> Variant:
    spec = VariantSpec(architecture=arch, runtime="onnxruntime", precision=precision, threads=threads)  # type: ignore[arg-type]
    return Variant(
        spec=spec,
        artifact=f"variants/{arch}-{precision}.onnx",
        sha256="f" * 64,
        parity=Parity(top1_agreement=1.0, max_abs_diff=1e-6, samples=100),
    )


def make_arch(name: str, task: str = "digits-classification") -> Architecture:
    return Architecture(
        name=name, task=task, kind="onnx", source_sha256="a" * 64, artifact=f"src/{name}.onnx"
    )


def make_profile(variant: str) -> Profile:
    point = LatencyPoint(
        batch=1,
        p50_ms=0.1,
        p95_ms=0.2,
        p99_ms=0.3,
        mean_ms=0.12,
        throughput_qps=8000.0,
        samples=500,
        stable=True,
        stop_reason="stable",
        cost_usd_per_1k=1e-6,
    )
    return Profile(
        variant=variant,
        machine=MachineInfo(cpu_model="test cpu", cores=2),
        measured_at_s=1.0,
        points=(point,),
        accuracy=0.97,
        price_usd_per_s=1e-5,
    )


def test_tasks_roundtrip(store: DocumentStore) -> None:
    assert store.get_task("digits-classification") is None
    store.put_task(make_task())
    assert store.get_task("digits-classification") == make_task()
    store.put_task(make_task("breast-cancer"))
    assert [t.name for t in store.list_tasks()] == ["breast-cancer", "digits-classification"]


def test_register_architecture_writes_everything_at_once(store: DocumentStore) -> None:
    variants = [make_variant("digits-mlp"), make_variant("digits-mlp", "int8")]
    skipped = [SkippedVariant(architecture="digits-mlp", name="digits-mlp/onnx-gpu-fp16-t1", reason="no GPU")]
    store.register_architecture(make_arch("digits-mlp"), variants, skipped, task=make_task())
    store.register_architecture(make_arch("digits-mlp2"), [make_variant("digits-mlp2")], [])
    assert store.get_task("digits-classification") is not None
    assert store.get_architecture("digits-mlp") == make_arch("digits-mlp")
    assert {v.name for v in store.list_variants("digits-mlp")} == {v.name for v in variants}
    assert len(store.list_variants()) == 3
    assert store.list_skipped("digits-mlp") == skipped
    assert store.get_variant("digits-mlp/onnx-cpu-int8-t1") == variants[1]
    assert [a.name for a in store.list_architectures("digits-classification")] == [
        "digits-mlp",
        "digits-mlp2",
    ]
    assert store.list_architectures("other") == []


def test_delete_architecture_removes_only_its_records(store: DocumentStore) -> None:
    store.register_architecture(make_arch("digits-mlp"), [make_variant("digits-mlp")], [], task=make_task())
    store.register_architecture(make_arch("digits-mlp2"), [make_variant("digits-mlp2")], [])
    store.put_profile(make_profile("digits-mlp/onnx-cpu-fp32-t1"))
    store.put_profile(make_profile("digits-mlp2/onnx-cpu-fp32-t1"))
    store.delete_architecture("digits-mlp")
    assert store.get_architecture("digits-mlp") is None
    assert store.list_variants("digits-mlp") == []
    assert store.get_profile("digits-mlp/onnx-cpu-fp32-t1") is None
    # "digits-mlp2" starts with "digits-mlp" but is a different architecture.
    assert store.get_architecture("digits-mlp2") is not None
    assert len(store.list_variants("digits-mlp2")) == 1
    assert store.get_profile("digits-mlp2/onnx-cpu-fp32-t1") is not None


def test_versions_and_labels_are_separate_records(store: DocumentStore) -> None:
    labels = Labels(architecture="digits-mlp", stable=2, canary=3, canary_share=0.1, previous=(1,))
    labels = labels.model_copy(update={"states": {1: "retired", 4: "failed"}, "errors": {4: "no variant"}})
    store.register_architecture(make_arch("digits-mlp"), [make_variant("digits-mlp")], [], task=make_task())
    v2 = make_arch("digits-mlp@2").model_copy(update={"version": 2})
    store.register_architecture(v2, [make_variant("digits-mlp@2")], [], labels=labels)
    assert store.get_labels("digits-mlp") == labels  # integer version keys survive JSON
    assert [lab.architecture for lab in store.list_labels()] == ["digits-mlp"]
    store.delete_architecture("digits-mlp")  # version 1 only: its prefix is not version 2's
    assert [v.name for v in store.list_variants()] == ["digits-mlp@2/onnx-cpu-fp32-t1"]
    store.delete_labels("digits-mlp")
    assert store.get_labels("digits-mlp") is None


def test_profiles_roundtrip_and_overwrite(store: DocumentStore) -> None:
    p = make_profile("a/onnx-cpu-fp32-t1")
    store.put_profile(p)
    assert store.get_profile(p.variant) == p
    newer = p.model_copy(update={"accuracy": 0.5})
    store.put_profile(newer)
    assert store.get_profile(p.variant) == newer
    assert store.list_profiles("a") == [newer]
    assert store.list_profiles("b") == []


def test_special_characters_in_keys_are_not_wildcards(store: DocumentStore) -> None:
    store.register_architecture(make_arch("a_b"), [make_variant("a_b")], [], task=make_task())
    store.register_architecture(make_arch("aXb"), [make_variant("aXb")], [])
    assert [v.architecture for v in store.list_variants("a_b")] == ["a_b"]
    store.register_architecture(make_arch("p%"), [make_variant("p%")], [])
    assert [v.architecture for v in store.list_variants("p%")] == ["p%"]


def test_tenants_keys_hashed_and_revocable(store: DocumentStore) -> None:
    store.create_tenant(Tenant(name="acme"), "secret-key-1")
    assert store.tenant_for_key("secret-key-1") == Tenant(name="acme")
    assert store.tenant_for_key("wrong") is None
    with pytest.raises(Conflict):
        store.create_tenant(Tenant(name="acme"), "another")
    # The clear key is nowhere in the store; only its hash is.
    assert store.get_doc("key", "secret-key-1") is None
    assert store.get_doc("key", hash_key("secret-key-1")) == "acme"
    store.revoke_tenant("acme")
    assert store.tenant_for_key("secret-key-1") is None
    with pytest.raises(TenantNotFound):
        store.revoke_tenant("acme")
    # Re-creating the name gives a new key and does not revive the old one.
    store.create_tenant(Tenant(name="acme"), "secret-key-2")
    assert store.tenant_for_key("secret-key-1") is None
    assert store.tenant_for_key("secret-key-2") is not None
    assert [t.name for t in store.list_tenants()] == ["acme"]


def test_the_change_log_names_what_others_must_reread(store: DocumentStore) -> None:
    start = store.change_cursor()
    store.put_task(make_task())
    store.create_tenant(Tenant(name="acme"), "k1")  # a new key needs no change: it is never cached
    store.set_share("acme", Share(weight=2.0))
    store.revoke_tenant("acme")
    changes = store.changes_since(start)
    assert [(c.kind, c.name) for c in changes] == [
        ("model", "digits-classification"),
        ("tenant", "acme"),
        ("tenant", "acme"),
    ]
    assert [c.seq for c in changes] == sorted({c.seq for c in changes})
    assert store.change_cursor() == changes[-1].seq
    assert store.changes_since(changes[0].seq, limit=1) == changes[1:2]
    assert store.changes_since(store.change_cursor()) == []


def test_an_expired_key_resolves_to_nothing_and_last_use_is_kept(store: DocumentStore) -> None:
    store.create_tenant(Tenant(name="old", expires_at_s=time.time() - 1), "k-old")
    store.create_tenant(Tenant(name="new", expires_at_s=time.time() + 3600), "k-new")
    assert store.tenant_for_key("k-old") is None
    assert store.tenant_for_key("k-new") is not None
    assert store.last_used() == {}
    store.touch_tenant("new", 1234.5)
    assert store.last_used() == {"new": 1234.5}


def test_usage_counters_add_and_filter(store: DocumentStore) -> None:
    def delta(tenant: str, minute: int, cost: int) -> UsageDelta:
        key = UsageKey(tenant=tenant, task="t", variant="a/onnx-cpu-fp32-t1", minute=minute)
        return UsageDelta(key=key, counters={"queries": 1, "cost_pusd": cost, "slo_met": 1})

    store.add_usage([delta("acme", 10, 5), delta("acme", 10, 7), delta("beta", 11, 3)])
    store.add_usage([delta("acme", 12, 1)])
    rows = store.usage()
    assert [(r.key.tenant, r.key.minute) for r in rows] == [("acme", 10), ("acme", 12), ("beta", 11)]
    assert rows[0].counters == {"queries": 2, "cost_pusd": 12, "slo_met": 2}
    assert [r.key.minute for r in store.usage(tenant="acme")] == [10, 12]
    assert [r.key.minute for r in store.usage(from_minute=11, to_minute=11)] == [11]
    assert store.usage(tenant="nobody") == []


def test_marked_usage_adds_once_per_source_and_sequence(store: DocumentStore) -> None:
    key = UsageKey(tenant="acme", task="t", variant="a/onnx-cpu-fp32-t1", minute=10)
    batch = [UsageDelta(key=key, counters={"queries": 2, "cost_pusd": 9})]
    assert store.usage_mark("journal-a") == 0
    assert store.add_usage(batch, mark=("journal-a", 5)) is True
    assert store.add_usage(batch, mark=("journal-a", 5)) is False  # a replay: skipped
    assert store.add_usage(batch, mark=("journal-a", 3)) is False  # older than the mark
    assert store.add_usage(batch, mark=("journal-b", 1)) is True  # another journal, its own mark
    assert store.add_usage(batch, mark=("journal-a", 6)) is True
    assert (store.usage_mark("journal-a"), store.usage_mark("journal-b")) == (6, 1)
    [row] = store.usage()
    assert row.counters == {"queries": 6, "cost_pusd": 27}


def _increment_worker(kind: str, location: str, seed: int, n: int) -> None:
    store = open_backend(kind, location)
    rng = random.Random(seed)
    key = UsageKey(tenant="acme", task="t", variant="v", minute=1)
    for _ in range(n):
        cost = usd_to_pusd(rng.uniform(0, 1e-6))
        store.add_usage([UsageDelta(key=key, counters={"queries": 1, "cost_pusd": cost})])
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)], indirect=True)
def test_usage_increments_are_atomic_across_processes(backend: tuple[str, str]) -> None:
    """4 processes × 2 000 increments of random float costs, converted to integer pico-dollars
    (exact: integer addition never rounds), must sum exactly."""
    processes, n = 4, 2000
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_increment_worker, args=(*backend, seed, n)) for seed in range(processes)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    expected_cost = 0
    for seed in range(processes):
        rng = random.Random(seed)
        expected_cost += sum(usd_to_pusd(rng.uniform(0, 1e-6)) for _ in range(n))
    store = open_backend(*backend)
    (row,) = store.usage()
    assert row.counters == {"queries": processes * n, "cost_pusd": expected_cost}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)], indirect=True)
def test_data_survives_a_process_restart(backend: tuple[str, str]) -> None:
    kind, location = backend
    code = (
        "import sys; from tests.contract.test_store import open_backend, make_task; "
        "from infaas.types import Tenant; "
        "s = open_backend(sys.argv[1], sys.argv[2]); s.put_task(make_task()); "
        "s.create_tenant(Tenant(name='acme'), 'k1'); s.close()"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code, kind, location], check=True, cwd=root)
    store = open_backend(kind, location)
    assert store.get_task("digits-classification") == make_task()
    assert store.tenant_for_key("k1") is not None


def test_a_lease_has_one_holder_until_it_expires_or_is_released(store: DocumentStore) -> None:
    assert store.acquire_lease("autoscaler", "fe-a", ttl_s=0.4)
    assert not store.acquire_lease("autoscaler", "fe-b", ttl_s=0.4)
    assert store.acquire_lease("autoscaler", "fe-a", ttl_s=0.4)  # a renewal
    assert store.acquire_lease("other", "fe-b", ttl_s=0.4)  # leases are independent
    time.sleep(0.6)
    assert store.acquire_lease("autoscaler", "fe-b", ttl_s=30)  # expired: taken over
    store.release_lease("autoscaler", "fe-a")  # not the holder: no effect
    assert not store.acquire_lease("autoscaler", "fe-a", ttl_s=30)
    store.release_lease("autoscaler", "fe-b")
    assert store.acquire_lease("autoscaler", "fe-a", ttl_s=30)


def test_front_ends_report_and_leave(store: DocumentStore) -> None:
    a = FrontEndInfo(name="fe-a", at_s=1.0, leader=True, demand={"v": (3.0, 0.0, 20.0, 0.9, 3.0, 3.0, 1.0)})
    store.put_front_end(a)
    store.put_front_end(FrontEndInfo(name="fe-b", at_s=2.0))
    store.put_front_end(a.model_copy(update={"at_s": 5.0}))
    assert [(f.name, f.at_s) for f in store.list_front_ends()] == [("fe-a", 5.0), ("fe-b", 2.0)]
    assert store.list_front_ends()[0].demand == a.demand
    store.delete_front_end("fe-a")
    assert [f.name for f in store.list_front_ends()] == ["fe-b"]


def test_profiles_are_kept_per_machine_class(store: DocumentStore) -> None:
    laptop = MachineInfo(cpu_model="test cpu", cores=2)
    server = MachineInfo(cpu_model="big cpu", cores=64, gpu="H200")
    here = make_profile("m/onnx-cpu-fp32-t1")
    there = here.model_copy(update={"machine": server, "measured_at_s": 5.0, "accuracy": 0.5})
    store.put_profile(here)
    store.put_profile(there)  # another class: kept beside, not over, the first
    store.put_profile(make_profile("m/onnx-cpu-fp32-t12"))  # a name the first one prefixes
    assert store.get_profile("m/onnx-cpu-fp32-t1", laptop) == here
    assert store.get_profile("m/onnx-cpu-fp32-t1", server) == there
    assert store.get_profile("m/onnx-cpu-fp32-t1") == there  # the newest, without a class
    other = MachineInfo(cpu_model="unseen", cores=4)
    assert store.get_profile("m/onnx-cpu-fp32-t1", other) == there  # the caller sees it is foreign
    assert [p.machine for p in store.list_profiles("m", laptop)] == [laptop, laptop]
    assert [p.machine for p in store.list_profiles("m", server)] == [server, laptop]
    remeasured = here.model_copy(update={"measured_at_s": 9.0})
    store.put_profile(remeasured)  # the same class again: replaces its own
    assert store.get_profile("m/onnx-cpu-fp32-t1", laptop) == remeasured
    store.delete_architecture("m")
    assert store.list_profiles("m") == []
