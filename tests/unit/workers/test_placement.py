"""The placement layer: one decision per variant (front end or Ray), one load path, a visible
demotion when the front end cannot load a variant, one overhead key per path."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from infaas.api.routes.fleet import fleet_view
from infaas.errors import Unavailable
from infaas.types import Variant
from infaas.workers.inprocess import EchoModel, InProcessPool, RecordingPool
from infaas.workers.placement import LONE_FAMILY, Placement
from tests.unit.test_batching import make_variant, point, tiny_profile


def test_sub_hop_variants_are_local_with_their_batches_capped_the_rest_remote() -> None:
    placement = Placement(RecordingPool(), RecordingPool(), inline_max_ms=0.25)
    tiny, slow, fat = make_variant("tiny"), make_variant("slow"), make_variant("fat")
    curve = tiny_profile(tiny, 0.01).model_copy(
        update={"points": (point(1, 0.05), point(4, 0.1), point(8, 0.2), point(16, 0.4))}
    )
    assert placement.place(tiny, curve).path == "local"
    assert placement.place(tiny, curve).max_rows == 8  # the largest measured batch under 0.25 ms
    # Sub-hop at one row, but only 2 rows fit under the cap: it would run unbatched in the loop.
    heavy = make_variant("heavy")
    unbatchable = tiny_profile(heavy, 0.01).model_copy(
        update={"points": (point(1, 0.13), point(2, 0.24), point(4, 0.5))}
    )
    assert placement.place(heavy, unbatchable).path == "remote"
    assert placement.place(slow, tiny_profile(slow, 5.0)).path == "remote"
    assert placement.place(fat, tiny_profile(fat, 0.01, memory_mb=500.0)).path == "remote"
    tf = tiny.model_copy(update={"spec": tiny.spec.model_copy(update={"runtime": "tensorflow"})})
    assert placement.place(tf, tiny_profile(tf, 0.01)).path == "remote"
    assert placement.place(tiny, None).path == "remote"  # no profile: nothing says it is tiny
    assert Placement(RecordingPool()).place(tiny, curve).path == "remote"  # no local pool
    assert placement.path("never-placed") == "remote"


def test_paths_have_their_own_overhead_keys_and_a_local_variant_is_not_replicated() -> None:
    async def scenario() -> None:
        placement = Placement(RecordingPool(workers=2), RecordingPool())
        tiny, slow = make_variant("tiny"), make_variant("slow")
        placement.place(tiny, tiny_profile(tiny, 0.01))
        placement.place(slow, tiny_profile(slow, 5.0))
        assert placement.overhead_key(tiny) == "local" and placement.overhead_key(slow) == "onnxruntime"
        with pytest.raises(Unavailable, match="runs in the front end"):
            await placement.replicate(tiny)
        await placement.run(slow, np.zeros((1, 4), dtype=np.float32))
        assert await placement.replicate(slow) == "fake-1"
        assert placement.replicas(slow.name) == 2 and placement.replicas(tiny.name) == 0
        await placement.ensure_loaded(tiny)
        assert placement.is_loaded(tiny.name) and placement.replicas(tiny.name) == 1
        await placement.unload(tiny.name)
        assert not placement.is_loaded(tiny.name)

    asyncio.run(scenario())


def test_a_variant_the_front_end_cannot_load_moves_to_the_workers_with_an_event() -> None:
    async def scenario() -> None:
        def loader(variant: Variant) -> EchoModel:
            raise OSError("artifact not readable here")

        remote = RecordingPool()
        placement = Placement(remote, InProcessPool(loader=loader))
        tiny = make_variant("tiny")
        profile = tiny_profile(tiny, 0.01)
        assert placement.place(tiny, profile).path == "local"
        out = await placement.run(tiny, np.ones((1, 4), dtype=np.float32))
        assert out.shape[0] == 1 and [name for name, _ in remote.batches] == [tiny.name]
        assert placement.place(tiny, profile).path == "remote"
        assert placement.place(tiny, profile.model_copy(update={"measured_at_s": 5.0})).path == "remote"
        (event,) = [e for e in placement.events() if e.kind == "place"]
        assert event.variant == tiny.name and "artifact not readable here" in event.reason
        await placement.close()

    asyncio.run(scenario())


def test_a_lone_copy_loads_on_the_first_lone_query_and_answers_the_next_without_the_workers() -> None:
    async def scenario() -> None:
        remote, lone = (
            RecordingPool(),
            InProcessPool(loader=lambda v: EchoModel(v.name), worker_id="lone", family=LONE_FAMILY),
        )
        placement = Placement(remote, None, lone=lone, lone_max_ms=5.0)
        heavy, slower, fat = make_variant("heavy"), make_variant("slower"), make_variant("fat")
        assert placement.place(heavy, tiny_profile(heavy, 1.5)).path == "remote"
        placement.place(slower, tiny_profile(slower, 8.0))  # its single row holds the loop too long
        placement.place(fat, tiny_profile(fat, 1.5, memory_mb=900.0))  # over the lone budget
        rows = np.ones((1, 4), dtype=np.float32)
        assert placement.run_now(heavy, rows) is None  # not loaded on the workers: nothing to copy
        await placement.ensure_loaded(heavy)
        assert placement.run_now(heavy, rows) is None  # its copy starts loading, in the background
        await until(lambda: lone.is_loaded(heavy.name))
        out = placement.run_now(heavy, rows)
        assert out is not None and out.shape[0] == 1 and remote.batches == []
        assert [w.worker_id for w in placement.fleet() if heavy.name in w.loaded] == ["inprocess-0", "lone"]
        # The copy is not a replica: neither the autoscaler nor the fleet view counts it as one.
        assert placement.replicas(heavy.name) == 1
        assert fleet_view(placement.fleet(), {}, []).replicas == {heavy.name: 1}
        for other in (slower, fat):
            await placement.ensure_loaded(other)
            assert placement.run_now(other, rows) is None
        await asyncio.sleep(0.05)
        assert not lone.is_loaded(slower.name) and not lone.is_loaded(fat.name)
        # Its last Ray replica unloaded: the copy goes with it.
        await placement.unload(heavy.name)
        assert not lone.is_loaded(heavy.name) and placement.run_now(heavy, rows) is None
        await placement.close()

    asyncio.run(scenario())


def test_a_lone_copy_that_cannot_load_is_dropped_with_an_event_and_ray_serves_on() -> None:
    async def scenario() -> None:
        def loader(variant: Variant) -> EchoModel:
            raise OSError("artifact not on this node")

        placement = Placement(RecordingPool(), None, lone=InProcessPool(loader=loader), lone_max_ms=5.0)
        heavy = make_variant("heavy")
        placement.place(heavy, tiny_profile(heavy, 1.5))
        await placement.ensure_loaded(heavy)
        rows = np.ones((1, 4), dtype=np.float32)
        assert placement.run_now(heavy, rows) is None
        await until(lambda: any(e.kind == "place" for e in placement.events()))
        (event,) = [e for e in placement.events() if e.kind == "place"]
        assert "no lone copy" in event.reason and "artifact not on this node" in event.reason
        assert placement.run_now(heavy, rows) is None and (await placement.run(heavy, rows)).shape[0] == 1
        await placement.close()

    asyncio.run(scenario())


def test_a_lone_copy_that_finishes_loading_after_its_last_ray_replica_went_is_dropped() -> None:
    async def scenario() -> None:
        go = threading.Event()

        def loader(variant: Variant) -> EchoModel:
            go.wait(10.0)
            return EchoModel(variant.name)

        lone = InProcessPool(loader=loader, worker_id="lone", family=LONE_FAMILY)
        placement = Placement(RecordingPool(), None, lone=lone, lone_max_ms=5.0)
        heavy = make_variant("heavy")
        placement.place(heavy, tiny_profile(heavy, 1.5))
        await placement.ensure_loaded(heavy)
        assert placement.run_now(heavy, np.ones((1, 4), dtype=np.float32)) is None  # the load starts
        await placement.unload(heavy.name)  # the last Ray replica goes while the copy loads
        go.set()
        await until(lambda: any(e.kind == "unload" and e.worker_id == "lone" for e in placement.events()))
        assert not lone.is_loaded(heavy.name)
        await placement.close()

    asyncio.run(scenario())


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for a background load to show, without a fixed sleep a busy CI machine would outrun."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
