"""Memory budget and least-recently-used eviction, shared by the Ray worker and the in-process pool."""

from __future__ import annotations

import numpy as np
import pytest

from infaas.types import Parity, Variant, VariantSpec
from infaas.workers.inprocess import EchoModel, InProcessPool, echo_outputs
from infaas.workers.residency import EventLog, Residency

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_least_recently_used_goes_first() -> None:
    r: Residency[str] = Residency(budget_mb=25.0, baseline_mb=5.0)
    assert r.add("a", "A", 8.0) == []
    assert r.add("b", "B", 8.0) == []
    assert r.get("a") == "A"  # a is now the most recently used
    assert r.add("c", "C", 8.0) == [("b", "B")]
    assert r.names == ["a", "c"] and r.used_mb == 21.0


def test_the_variant_just_loaded_stays_even_alone_over_budget() -> None:
    r: Residency[str] = Residency(budget_mb=10.0)
    r.add("a", "A", 4.0)
    assert r.add("big", "BIG", 50.0) == [("a", "A")]
    assert r.names == ["big"]


def test_make_room_before_a_load() -> None:
    r: Residency[str] = Residency(budget_mb=20.0)
    r.add("a", "A", 8.0)
    r.add("b", "B", 8.0)
    assert [n for n, _ in r.make_room(6.0)] == ["a"]
    assert r.make_room(0.0) == [] and r.names == ["b"]


def test_event_log_keeps_the_newest() -> None:
    log = EventLog(maxlen=3)
    for i in range(5):
        log.add("load", f"v{i}", "w", "because")
    assert [e.variant for e in log.recent(2)] == ["v3", "v4"]
    assert len(log.recent()) == 3 and log.recent(0) == []


def variant(name: str) -> Variant:
    return Variant(
        spec=VariantSpec(architecture=name, runtime="onnxruntime"),
        artifact=f"{name}.onnx",
        sha256="0" * 64,
        parity=Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1),
    )


async def test_inprocess_pool_loads_on_demand_and_evicts_lru() -> None:
    models: dict[str, EchoModel] = {}

    def loader(v: Variant) -> EchoModel:
        models[v.name] = EchoModel(v.name, memory_mb=10.0)
        return models[v.name]

    pool = InProcessPool(memory_budget_mb=25.0, loader=loader)
    a, b, c = variant("a"), variant("b"), variant("c")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(await pool.run(a, x), echo_outputs(x, 3))
    await pool.run(b, x)
    await pool.run(a, x)
    await pool.run(c, x)  # over budget: b is the least recently used
    assert pool.fleet()[0].loaded == (a.name, c.name)
    assert models[b.name].closed and not pool.is_loaded(b.name)
    kinds = [(e.kind, e.variant) for e in pool.events()]
    assert kinds == [("load", a.name), ("load", b.name), ("load", c.name), ("evict", b.name)]
    await pool.unload(a.name)
    assert pool.replicas(a.name) == 0 and pool.replicas(c.name) == 1
    await pool.close()
    assert models[c.name].closed
