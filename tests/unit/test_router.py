"""The router's overhead estimate, and its snapshot following the store."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from infaas.batching import AsyncBatcher, ManualTimer
from infaas.errors import (
    ArchitectureNotFound,
    InvalidInput,
    NoFeasibleVariant,
    Overloaded,
    TaskNotFound,
    Unavailable,
)
from infaas.liveview import PROBE_INTERVAL_S
from infaas.overhead import DEFAULT_OVERHEAD_MS, OverheadTracker, _quantile
from infaas.router import Router
from infaas.snapshot import Machines, Snapshot, choose_profile
from infaas.store import MemoryStore
from infaas.types import SLO, Labels, MachineInfo, Profile, Variant
from infaas.workers.inprocess import EchoModel, InProcessPool, RecordingPool
from infaas.workers.placement import Placement
from tests.factories import make_arch, make_task
from tests.unit.policy.test_selection import MACHINE, make_entry


def test_overhead_is_the_prior_until_measured_then_a_high_quantile() -> None:
    tracker = OverheadTracker(quantile=0.99, window=200, max_age_s=30.0, min_samples=32, refresh_every=8)
    now_s = 100.0
    for _ in range(7):  # fewer than 8 answers in 0.25 s (and than 32 in 1 s): not measured yet
        tracker.observe(0.2, now_s)
    tracker.refresh(now_s)
    assert tracker.value_ms == DEFAULT_OVERHEAD_MS
    for i in range(193):
        tracker.observe(0.2 if i % 50 else 3.0, now_s)  # a few slow answers set the margin
    assert 2.0 < tracker.value_ms <= 3.0
    for _ in range(400):  # the window forgets them
        tracker.observe(0.3, now_s)
    assert tracker.value_ms == pytest.approx(0.3)
    for _ in range(16):
        tracker.observe(-5.0, now_s)  # faster than profiled never makes the overhead negative
    assert tracker.value_ms >= 0.0


def test_overhead_forgets_a_burst_once_it_is_old() -> None:
    tracker = OverheadTracker(quantile=0.99, window=2048, max_age_s=30.0, min_samples=32, refresh_every=8)
    for i in range(200):
        tracker.observe(40.0, 10.0 + i * 0.01)  # a burst of load: 40 ms over the profile
    assert tracker.value_ms == pytest.approx(40.0)
    for i in range(40):
        tracker.observe(0.5, 45.0 + i * 0.01)  # 35 s later: only the calm answers count
    assert tracker.value_ms == pytest.approx(0.5)
    tracker.refresh(200.0)  # nothing recent: back to the prior
    assert tracker.value_ms == DEFAULT_OVERHEAD_MS


def test_a_busy_path_forgets_one_stall_within_a_quarter_second() -> None:
    # The old rule alone (no episode is let go): the stall holds for the short window's 0.25 s.
    tracker = OverheadTracker(clear_run=0)  # else the service's: p99 over 0.25 s with 8 answers, else 1 s
    at_s = 10.0
    for i in range(500):  # 500 answers/s; one stall puts 6 answers 12 ms late
        at_s += 0.002
        tracker.observe(12.0 if 200 <= i < 206 else 0.4, at_s)
        if i == 230:
            assert tracker.current(at_s) == pytest.approx(12.0)  # right after it: the stall counts
    # 0.6 s later, still inside the 1 s window: the busy path judges by its last 0.25 s.
    assert tracker.current(at_s) == pytest.approx(0.4)
    # Refusing (no answers since the stall): its last second still counts, until probes
    # bring 8 fresh answers into the last 0.25 s.
    refusing = OverheadTracker()
    for i in range(106):
        refusing.observe(12.0 if i >= 100 else 0.4, 10.0 + i * 0.002)
    assert refusing.current(10.5) == pytest.approx(12.0)
    for i in range(8):
        refusing.observe(0.4, 10.5 + i * 0.02)
    assert refusing.current(10.5 + 7 * 0.02) == pytest.approx(0.4)


def test_a_stall_is_let_go_once_the_answers_after_it_come_in_clear() -> None:
    tracker = OverheadTracker()  # the service's: clear_run 8, stall_ms 2
    at_s = 10.0

    def answer(residual_ms: float) -> float:
        nonlocal at_s
        at_s += 0.002
        tracker.observe(residual_ms, at_s)
        tracker.refresh(at_s)  # as the next query's view would, however soon it comes
        return tracker.value_ms

    for _ in range(200):
        answer(0.4)
    for _ in range(6):  # one episode: every answer in flight 12 ms late
        held = answer(12.0)
    assert held > 5.0
    for _ in range(7):  # seven clean answers are not yet a clear run
        held = answer(0.4)
    assert held == pytest.approx(12.0)
    assert answer(0.4) == pytest.approx(0.4)  # the eighth is: the episode is over
    # Two episodes in the window are a pattern, not an event: they set the quantile.
    for _ in range(3):
        answer(12.0)
    for _ in range(10):
        answer(0.4)
    for _ in range(3):
        answer(12.0)
    for _ in range(20):
        held = answer(0.4)
    assert held == pytest.approx(12.0)


def test_late_answers_spread_over_the_window_are_a_tail_not_an_episode() -> None:
    tracker = OverheadTracker()
    for i in range(400):  # every 40th answer 5 ms late: what the next query risks
        tracker.observe(5.0 if i % 40 == 0 else 0.3, 10.0 + i * 0.0005)
    tracker.refresh(10.0 + 399 * 0.0005)
    assert tracker.value_ms > 3.0
    # A tail as high as its level is not a stall: late means past max(stall_ms, level) above it.
    level = OverheadTracker()
    for i in range(100):
        level.observe(4.0 + (i % 10) * 0.1, 10.0 + i * 0.002)
    level.observe(7.0, 10.2)
    for i in range(8):
        level.observe(4.0, 10.2 + (i + 1) * 0.002)
    level.refresh(10.22)
    assert level.value_ms > 4.5  # the window's p99, not the last eight answers' 4.0


def store_with_one_task() -> MemoryStore:
    store = MemoryStore()
    store.put_task(make_task())
    return store


def register(store: MemoryStore, arch: str, task: str = "t") -> str:
    variant, profile = make_entry(
        arch, "onnxruntime", 1, accuracy=0.9, base_ms=1.0, per_row_ms=0.0, price_usd_per_s=1e-5
    )
    store.register_architecture(make_arch(arch, task), [variant], [])
    store.put_profile(profile)
    return variant.name


def test_router_sees_registrations_and_learns_from_answers() -> None:
    async def scenario() -> None:
        store = store_with_one_task()
        pool = InProcessPool(loader=lambda v: EchoModel(v.name))
        router = Router(store, pool, AsyncBatcher(pool), miss_refresh_interval_s=0.0, machine=MACHINE)
        router.refresh()
        slo = SLO(latency_ms=100)
        with pytest.raises(NoFeasibleVariant):  # a task without profiled variants yet
            router.route("t", 1, slo, now_s=0.0)
        name = register(store, "m")
        # a pinned name the snapshot has not seen triggers a reload
        routed = router.route("t", 1, slo, now_s=1.0, architecture="m")
        assert routed.variant.name == name and routed.cold
        with pytest.raises(TaskNotFound):
            router.route("nope", 1, slo, now_s=2.0)
        with pytest.raises(ArchitectureNotFound):
            router.route("t", 1, slo, now_s=3.0, architecture="nope")
        with pytest.raises(InvalidInput):
            router.route("t", 33, slo, now_s=4.0)
        store.put_task(make_task("u"))
        with pytest.raises(InvalidInput):  # m serves t, not u
            router.route("u", 1, slo, now_s=5.0, architecture="m")
        await pool.ensure_loaded(routed.variant)
        warm = router.route("t", 1, slo, now_s=6.0)
        assert not warm.cold and warm.expected_ms == pytest.approx(1.5)
        assert router.live.overhead_ms("onnxruntime") == DEFAULT_OVERHEAD_MS
        router.observe(warm, latency_ms=2.0, now_s=7.0)
        router.observe(routed, latency_ms=500.0, now_s=7.0)  # a cold answer says nothing about the path
        assert router.live.overheads["onnxruntime"].samples == 1
        await router.close()
        await pool.close()

    asyncio.run(scenario())


def stored_profile(store: MemoryStore, variant: str) -> Profile:
    profile = store.get_profile(variant)
    assert profile is not None
    return profile


def test_profiles_from_another_machine_and_failed_ones_are_left_out_and_said_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        store = store_with_one_task()
        here = register(store, "here")
        foreign, failed = register(store, "foreign"), register(store, "failed")
        elsewhere = MachineInfo(cpu_model="Intel Xeon Platinum 8480", cores=64, gpu="NVIDIA H100")
        # the foreign one would win on cost if it were mixed in; it is the only profile of its variant
        measured_here = stored_profile(store, foreign)
        store.delete_docs("profile", f"{foreign}@")
        store.put_profile(measured_here.model_copy(update={"machine": elsewhere, "price_usd_per_s": 0.0}))
        store.put_profile(
            stored_profile(store, failed).model_copy(update={"status": "failed", "error": "hung"})
        )
        pool = InProcessPool(loader=lambda v: EchoModel(v.name))
        router = Router(store, pool, AsyncBatcher(pool), machine=MACHINE)
        with caplog.at_level("WARNING", logger="infaas.router"):
            router.refresh()
        assert set(router.snapshot.excluded) == {foreign, failed}
        assert f"{foreign}: it was profiled on another machine ({elsewhere.fingerprint}" in caplog.text
        assert "infaas profile foreign" in caplog.text and "profiling failed (hung)" in caplog.text
        slo = SLO(latency_ms=100)
        for _ in range(3):
            assert router.route("t", 1, slo, now_s=0.0).variant.name == here
        with pytest.raises(Unavailable, match="profiled on another machine"):
            router.route("t", 1, slo, now_s=0.0, variant=foreign)
        # profiled here again: served again, and no longer reported
        store.put_profile(stored_profile(store, foreign).model_copy(update={"machine": MACHINE}))
        caplog.clear()
        assert router.refresh()
        assert set(router.snapshot.excluded) == {failed}
        assert router.route("t", 1, slo, now_s=1.0).variant.name == foreign
        assert router.route("t", 1, slo, now_s=1.0, variant=foreign).variant.name == foreign
        await router.close()
        await pool.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("n", [1, 2, 3, 33, 2047, 2048])
@pytest.mark.parametrize("q", [0.0, 0.5, 0.99, 1.0])
def test_the_tracker_quantile_is_numpys(n: int, q: float) -> None:
    values = np.random.default_rng(n).normal(1.0, 2.0, n)
    assert _quantile(values, q) == pytest.approx(float(np.quantile(values, q)), abs=1e-12)


def test_warm_up_loads_the_cheapest_variant_of_each_architecture_where_it_will_run() -> None:
    """Sub-hop variants warm on the front end's fast path, the others on the worker pool."""

    async def scenario() -> None:
        store = store_with_one_task()
        entries = [
            # fast and cheap: runs inline on the front end
            make_entry(
                "fast", "onnxruntime", 1, accuracy=0.9, base_ms=0.01, per_row_ms=0.0, price_usd_per_s=1e-5
            ),
            make_entry(
                "fast", "onnxruntime", 2, accuracy=0.9, base_ms=0.01, per_row_ms=0.0, price_usd_per_s=2e-5
            ),
            # slow: its batches take the Ray hop, so it warms on the pool
            make_entry(
                "slow", "onnxruntime", 1, accuracy=0.95, base_ms=5.0, per_row_ms=0.1, price_usd_per_s=1e-5
            ),
            make_entry(
                "slow", "onnxruntime", 2, accuracy=0.95, base_ms=4.0, per_row_ms=0.1, price_usd_per_s=2e-5
            ),
        ]
        for arch in ("fast", "slow"):
            variants = [v for v, _ in entries if v.architecture == arch]
            store.register_architecture(make_arch(arch), variants, [])
        for _, profile in entries:
            store.put_profile(profile.model_copy(update={"memory_mb": 1.0}))
        pool = InProcessPool(loader=lambda v: EchoModel(v.name))
        local = InProcessPool(loader=lambda v: EchoModel(v.name))
        placement = Placement(pool, local)
        router = Router(store, placement, AsyncBatcher(placement), machine=MACHINE)
        router.refresh()
        asked = router.warmer.warm_up()
        assert asked == ["fast/onnx-cpu-fp32-t1", "slow/onnx-cpu-fp32-t1"]
        await asyncio.gather(*router.warmer._tasks)
        assert local.is_loaded("fast/onnx-cpu-fp32-t1") and not pool.is_loaded("fast/onnx-cpu-fp32-t1")
        assert pool.is_loaded("slow/onnx-cpu-fp32-t1") and not local.is_loaded("slow/onnx-cpu-fp32-t1")
        assert not pool.is_loaded("slow/onnx-cpu-fp32-t2") and not local.is_loaded("fast/onnx-cpu-fp32-t2")
        await router.close()

    asyncio.run(scenario())


def test_a_variant_that_keeps_failing_is_quarantined_and_queries_go_elsewhere() -> None:
    async def scenario() -> None:
        store = store_with_one_task()
        cheap, good = register(store, "broken"), register(store, "sound")
        # the broken one is the cheaper: the router prefers it until it is set aside
        store.put_profile(stored_profile(store, good).model_copy(update={"price_usd_per_s": 1e-3}))

        def loader(v: object) -> EchoModel:
            name = getattr(v, "name", "")
            if name == cheap:
                raise RuntimeError("INVALID_PROTOBUF: corrupt artifact")
            return EchoModel(name)

        pool = InProcessPool(loader=loader)
        batcher = AsyncBatcher(pool)
        events: list[object] = []
        router = Router(store, pool, batcher, machine=MACHINE, on_event=events.append)
        router.quarantine.after_failures = 2
        batcher.on_outcome = lambda v, e: router.report(v, e, 10.0)
        router.refresh()
        slo = SLO(latency_ms=100)
        rows = np.zeros((1, 4), dtype=np.float32)
        for _ in range(2):
            routed = router.route("t", 1, slo, now_s=10.0)
            assert routed.variant.name == cheap
            with pytest.raises(Unavailable, match="corrupt artifact"):
                await batcher.submit(routed.variant, routed.profile, rows, deadline_s=1e9)
        assert router.route("t", 1, slo, now_s=11.0).variant.name == good
        assert "quarantined" in router.snapshot.excluded[cheap]
        with pytest.raises(Unavailable, match="quarantined"):  # pinned: says why
            router.route("t", 1, slo, now_s=11.0, variant=cheap)
        assert len(events) == 1 and "quarantined for 30 s" in getattr(events[0], "reason", "")
        # after the backoff it is tried again
        assert router.route("t", 1, slo, now_s=40.0).variant.name == cheap
        await router.close()
        await batcher.close()
        await pool.close()

    asyncio.run(scenario())


def test_busy_is_429_impossible_is_422_and_a_cold_load_past_the_deadline_is_429() -> None:
    async def scenario() -> None:
        store = store_with_one_task()
        variant, profile = make_entry(
            "m", "onnxruntime", 1, accuracy=0.9, base_ms=1.0, per_row_ms=1.0, price_usd_per_s=1e-5,
            load_time_s=0.05,
        )  # fmt: skip
        store.register_architecture(make_arch("m", "t"), [variant], [])
        store.put_profile(profile)
        pool = RecordingPool(gated=True)
        batcher = AsyncBatcher(pool, max_in_flight=1, initial_overhead_ms=0.0)
        router = Router(store, pool, batcher, machine=MACHINE)
        router.refresh()
        slo = SLO(latency_ms=10)
        # cold: the 50 ms load would outlast the 10 ms target; the answer says retry, and loads it
        with pytest.raises(Overloaded, match="not loaded") as cold:
            router.route("t", 1, slo, now_s=0.0)
        assert cold.value.fields["retry_after_s"] == pytest.approx(0.05)
        for _ in range(10):
            await asyncio.sleep(0)
        assert pool.is_loaded(variant.name)
        assert router.route("t", 1, slo, now_s=1.0).variant.name == variant.name
        # busy: a running batch of 32 rows and 32 more queued put ~50 ms ahead of a new query
        rows = np.zeros((32, 4), dtype=np.float32)
        waiting = [asyncio.create_task(batcher.submit(variant, profile, rows, 1e12)) for _ in range(2)]
        for _ in range(10):
            await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="busy") as busy:
            router.route("t", 1, slo, now_s=2.0)
        assert busy.value.fields["retry_after_s"] > 0.01
        # no probe while work is queued or running: its answers will teach the estimate
        router.live.overheads["onnxruntime"] = OverheadTracker(min_samples=1, refresh_every=1, prior_ms=0.0)
        router.live.overheads["onnxruntime"].observe(100.0, now_s=2.0)  # answers 100 ms late
        with pytest.raises(Overloaded):
            router.route("t", 1, slo, now_s=2.0 + PROBE_INTERVAL_S)
        pool.release(2)
        await asyncio.gather(*waiting)
        # idle, but refused on the estimate: one refused query per interval goes through as a
        # probe, so an estimate that refuses everything can still learn its cause is gone
        with pytest.raises(Overloaded):
            router.route("t", 1, slo, now_s=2.0 + PROBE_INTERVAL_S / 2)
        assert router.route("t", 1, slo, now_s=2.0 + PROBE_INTERVAL_S).variant.name == variant.name
        with pytest.raises(Overloaded):
            router.route("t", 1, slo, now_s=2.0 + PROBE_INTERVAL_S)
        # impossible even idle: 422, not 429
        with pytest.raises(NoFeasibleVariant):
            router.route("t", 1, SLO(latency_ms=1), now_s=2.0)
        await router.close()
        await batcher.close()

    asyncio.run(scenario())


def test_a_slowdown_measured_on_its_batches_prices_the_querys_own_run() -> None:
    """A busy machine runs a compute-bound variant's batches 3x slower than profiled: admission
    counts that for the query's own run too, not only for the batches queued ahead of it (left
    out, the load step's queries predicted at 230-249 ms were answered in 330-520 ms)."""

    async def scenario() -> None:
        store = store_with_one_task()
        variant, profile = make_entry(
            "m", "onnxruntime", 1, accuracy=0.9, base_ms=9.0, per_row_ms=1.0, price_usd_per_s=1e-5
        )  # p50 10 ms, p99 15 ms for one row
        store.register_architecture(make_arch("m", "t"), [variant], [])
        store.put_profile(profile)
        pool = RecordingPool(gated=True)
        timer = ManualTimer()
        batcher = AsyncBatcher(pool, timer=timer, max_in_flight=1, initial_overhead_ms=0.0)
        router = Router(store, pool, batcher, machine=MACHINE)
        router.refresh()
        await pool.ensure_loaded(variant)
        slo = SLO(latency_ms=30)
        idle = router.route("t", 1, slo, now_s=0.0)
        assert idle.decision.predicted_latency_ms <= 16.0 and idle.expected_ms == pytest.approx(15.0)
        for _ in range(4):  # each batch takes 30 ms: 3x its 10 ms profile
            task = asyncio.create_task(batcher.submit(variant, profile, np.zeros((1, 4), np.float32), 1e12))
            for _ in range(3):
                await asyncio.sleep(0)
            timer.advance(0.030)
            pool.release()
            await task
        assert batcher.slowdown(variant.name) > 2.5
        with pytest.raises(Overloaded, match=r"run 2\.\dx their profile|run 3\.0x their profile") as busy:
            router.route("t", 1, slo, now_s=1.0)  # 15 ms x ~3 no longer fits 30 ms
        assert busy.value.fields["slowdown"] > 2.5
        roomy = router.route("t", 1, SLO(latency_ms=100), now_s=1.0)
        assert roomy.expected_ms == pytest.approx(15.0 * batcher.slowdown(variant.name))
        assert roomy.decision.predicted_latency_ms >= roomy.expected_ms
        await router.close()
        await batcher.close()

    asyncio.run(scenario())


def cheap_and_pricey(store: MemoryStore) -> list[tuple[Variant, Profile]]:
    """Two variants of architecture "m" of task "t", 1 and 2 threads, the second twice the price."""
    entries = [
        make_entry("m", "onnxruntime", t, accuracy=0.9, base_ms=1.0, per_row_ms=1.0, price_usd_per_s=t * 1e-5)
        for t in (1, 2)
    ]
    store.register_architecture(make_arch("m", "t"), [v for v, _ in entries], [])
    for _, profile in entries:
        store.put_profile(profile)
    return entries


def test_a_busy_loaded_variant_is_refused_not_swapped_for_a_cold_one() -> None:
    """Adding capacity is the autoscaler's call: a cold variant that is feasible only because the
    loaded one is busy is not loaded by the query path (it filled the cluster with copies that
    shared its cores); the query gets 429, and optional loads pass the resource gate."""

    async def scenario() -> None:
        store = store_with_one_task()
        (cheap, cheap_profile), (pricey, _) = cheap_and_pricey(store)
        pool = RecordingPool(gated=True)
        batcher = AsyncBatcher(pool, max_in_flight=1, initial_overhead_ms=0.0)
        router = Router(store, pool, batcher, machine=MACHINE)
        router.refresh()
        await pool.ensure_loaded(cheap)
        slo = SLO(latency_ms=100)
        assert router.route("t", 1, slo, now_s=0.0).variant.name == cheap.name
        rows = np.zeros((32, 4), dtype=np.float32)
        waiting = [asyncio.create_task(batcher.submit(cheap, cheap_profile, rows, 1e12)) for _ in range(4)]
        for _ in range(10):
            await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="busy") as busy:
            router.route("t", 1, slo, now_s=1.0)
        assert busy.value.fields["variant"] == cheap.name
        for _ in range(10):
            await asyncio.sleep(0)
        assert not pool.is_loaded(pricey.name)
        # the gate: a cheaper variant hinted while a pricier one serves loads only if it admits it
        asked: list[str] = []
        router.warmer.load_gate = lambda v: asked.append(v.name) is not None  # refuses, and records
        assert router.warmer.hint(pricey.name, optional=True) is None and asked == [pricey.name]
        pool.release(4)
        await asyncio.gather(*waiting)
        await router.close()
        await batcher.close()

    asyncio.run(scenario())


def test_an_idle_variant_takes_a_busy_ones_spill_only_where_a_core_is_free_for_each_thread() -> None:
    """Two loaded variants, the cheap one (1 thread) busy: its spill goes to the idle pricier one
    (2 threads) while the host's cores left to replicas, less the busy replica's thread, hold 2
    threads, and is refused as busy (naming the cheap one) otherwise: there the pricier
    one adds no capacity and slows the busy one down. An optional load of it (a load hint)
    follows the same rule: a worker starting on the busy cores slows them down too."""

    async def scenario(spare_cores: float) -> tuple[str, bool, str, str]:
        store = store_with_one_task()
        (cheap, cheap_profile), (pricey, _) = cheap_and_pricey(store)
        pool = RecordingPool(gated=True)
        batcher = AsyncBatcher(pool, max_in_flight=1, initial_overhead_ms=0.0)
        router = Router(store, pool, batcher, machine=MACHINE, replica_cores=spare_cores)
        router.refresh()
        await pool.ensure_loaded(cheap)
        slo = SLO(latency_ms=100)
        rows = np.zeros((32, 4), dtype=np.float32)
        waiting = [asyncio.create_task(batcher.submit(cheap, cheap_profile, rows, 1e12)) for _ in range(4)]
        for _ in range(10):
            await asyncio.sleep(0)
        hinted = router.warmer.hint(pricey.name, optional=True)
        await (hinted if hinted is not None else pool.ensure_loaded(pricey))
        try:
            chosen = router.route("t", 1, slo, now_s=1.0).variant.name
        except Overloaded as busy:
            assert "busy" in str(busy)
            chosen = f"429 {busy.fields['variant']}"
        finally:
            pool.release(4)
            await asyncio.gather(*waiting)
            await router.close()
            await batcher.close()
        return chosen, hinted is not None, cheap.name, pricey.name

    chosen, hint_loaded, cheap, pricey = asyncio.run(scenario(spare_cores=3.0))  # 3 - 1 busy: room for 2
    assert chosen == pricey and hint_loaded
    for spare_cores in (2.9, 1.75):
        chosen, hint_loaded, cheap, pricey = asyncio.run(scenario(spare_cores))
        assert chosen == f"429 {cheap}" and not hint_loaded, spare_cores


def test_versions_route_by_their_labels_and_the_canary_takes_its_exact_share() -> None:
    async def scenario() -> None:
        store = store_with_one_task()
        v1 = register(store, "net")
        variant, profile = make_entry(
            "net@2", "onnxruntime", 1, accuracy=0.9, base_ms=1.0, per_row_ms=0.0, price_usd_per_s=1e-5
        )
        store.register_architecture(
            make_arch("net@2").model_copy(update={"version": 2}),
            [variant],
            [],
            labels=Labels(architecture="net", states={2: "ready"}),
        )
        store.put_profile(profile)
        pool = InProcessPool(loader=lambda v: EchoModel(v.name))
        router = Router(store, pool, AsyncBatcher(pool), miss_refresh_interval_s=0.0, machine=MACHINE)
        router.refresh()
        for name in (v1, variant.name):
            await pool.ensure_loaded(store.get_variant(name))  # type: ignore[arg-type]
        slo = SLO(latency_ms=100)
        assert router.snapshot.serving == {"net"}  # a ready version takes no traffic
        assert {router.route("t", 1, slo, now_s=1.0).variant.name for _ in range(20)} == {v1}
        assert router.route("t", 1, slo, now_s=1.0, architecture="net@2").variant.name == variant.name
        with pytest.raises(ArchitectureNotFound):
            router.route("t", 1, slo, now_s=1.0, architecture="net@canary")  # there is none
        with pytest.raises(ArchitectureNotFound):
            router.route("t", 1, slo, now_s=1.0, architecture="net@9")

        store.put_labels(Labels(architecture="net", canary=2, canary_share=0.2))
        router.refresh()
        assert router.snapshot.serving == {"net", "net@2"}
        picks = [router.route("t", 1, slo, now_s=2.0).variant.name for _ in range(1000)]
        assert picks.count(variant.name) == 200  # exact, not about 200
        assert router.canary_split.observed("net", 2) == (1000, 200)
        pinned = {
            router.route("t", 1, slo, now_s=2.0, architecture="net@stable").variant.name for _ in range(10)
        }
        assert pinned == {v1}  # a pinned label is not split
        assert router.route("t", 1, slo, now_s=2.0, architecture="net@canary").variant.name == variant.name
        assert router.route("t", 1, slo, now_s=2.0, architecture="net@1").variant.name == v1
        await router.close()
        await pool.close()

    asyncio.run(scenario())


def test_each_variant_is_predicted_with_the_profile_of_the_class_it_runs_on() -> None:
    store = store_with_one_task()
    cpu, gpu_only = register(store, "cpu"), register(store, "gpu")
    measured_here = stored_profile(store, cpu)
    big = MachineInfo(cpu_model="big cpu", cores=64)
    gpu_node = MachineInfo(cpu_model="gpu host", cores=16, gpu="NVIDIA H200")
    on_big = measured_here.model_copy(update={"machine": big, "price_usd_per_s": 9e-5})
    store.put_profile(on_big)  # beside the one measured here
    on_gpu = stored_profile(store, gpu_only).model_copy(update={"machine": gpu_node})
    store.delete_docs("profile", f"{gpu_only}@")
    store.put_profile(on_gpu)  # measured only on the GPU node

    alone = Snapshot.load(store, MACHINE)  # one machine: its own profiles, the GPU one is foreign
    assert alone.variants[cpu][1] == measured_here and gpu_only in alone.excluded

    cluster = Machines(MACHINE, nodes=(MACHINE, big, gpu_node))
    snap = Snapshot.load(store, cluster)
    assert snap.variants[cpu][1] == measured_here  # not loaded anywhere: this machine's class
    assert snap.variants[gpu_only][1] == on_gpu and not snap.excluded  # a node class of the cluster

    on_the_big_node = Machines(MACHINE, nodes=(MACHINE, big, gpu_node), replicas={cpu: big})
    assert Snapshot.load(store, on_the_big_node).variants[cpu][1] == on_big
    assert choose_profile([measured_here, on_big], on_the_big_node, cpu) == on_big


def test_answers_at_the_head_of_the_fair_queue_price_a_query_with_none_of_its_rows_waiting() -> None:
    """Under a flood the path's p99 is the flood's, whose queries wait behind their own backlog;
    a query that finds none of its tenant's rows waiting lands near the head of the fair queue
    and is priced by what answers there took (admitted), one behind its own tenant's waiting rows
    by the path's. The head's estimate needs enough answers, and ages out like the path's."""

    async def scenario() -> None:
        store = store_with_one_task()
        variant, profile = make_entry(
            "m", "onnxruntime", 1, accuracy=0.9, base_ms=1.0, per_row_ms=1.0, price_usd_per_s=1e-5
        )
        store.register_architecture(make_arch("m", "t"), [variant], [])
        store.put_profile(profile)
        pool = InProcessPool(loader=lambda v: EchoModel(v.name))
        await pool.ensure_loaded(variant)
        batcher = AsyncBatcher(pool)
        router = Router(store, pool, batcher, machine=MACHINE)
        router.refresh()
        at_head = router.route("t", 1, SLO(latency_ms=100), now_s=1.0, tenant="quiet")
        behind = dataclasses.replace(at_head, at_head=False)  # a flood's query, behind its own rows
        assert at_head.at_head
        key = Placement.wrap(pool).overhead_key(variant)
        slo = SLO(latency_ms=30)
        at_s = 10.0
        for i in range(400):  # 200 answers/s of the flood, 40/s at the head in its last 0.5 s (19)
            at_s += 0.005
            router.observe(behind, behind.expected_ms + 40.0, at_s)
            if i >= 305 and i % 5 == 0:
                router.observe(at_head, at_head.expected_ms + 3.0, at_s)
        assert router.live.path_ms(variant) == pytest.approx(40.0)
        assert router.live.head_ms(key, at_s) is None  # 19 answers: not enough
        with pytest.raises(Overloaded, match="busy"):
            router.route("t", 1, slo, now_s=at_s, tenant="quiet")
        at_s += 0.06  # past the estimate's refresh interval (`OverheadTracker.stale_s`)
        router.observe(at_head, at_head.expected_ms + 3.0, at_s)
        waited_ms = at_head.expected_ms - at_head.profiled_ms  # its predicted queue and slowdown: none
        assert router.live.head_ms(key, at_s) == pytest.approx(waited_ms + 3.0)
        assert router.route("t", 1, slo, now_s=at_s, tenant="quiet").variant.name == variant.name
        assert router.route("t", 1, slo, now_s=at_s, tenant="newcomer").variant.name == variant.name
        # A query of the quiet tenant's waits for the variant (queued, its batch not yet sent):
        # the next one is behind it, which answers at the head do not measure.
        rows = np.zeros((1, 4), dtype=np.float32)
        waiting = asyncio.ensure_future(batcher.submit(variant, profile, rows, 1e12, "quiet"))
        await asyncio.sleep(0)
        assert batcher.waiting_rows(variant.name, "quiet") == 1
        assert router.route("t", 1, slo, now_s=at_s, tenant="newcomer").at_head
        with pytest.raises(Overloaded, match="head of its queue took ~3 ms"):  # what priced it
            router.route("t", 1, SLO(latency_ms=at_head.profiled_ms + 2.5), now_s=at_s, tenant="newcomer")
        with pytest.raises(Overloaded, match="busy") as refused:
            router.route("t", 1, slo, now_s=at_s, tenant="quiet")
        assert "head" not in str(refused.value)
        await waiting
        assert batcher.waiting_rows(variant.name, "quiet") == 0
        # 3 s on, the flood goes on and nothing was answered at the head: the path's again
        for i in range(600):
            router.observe(behind, behind.expected_ms + 40.0, at_s + 2.0 + i * 0.002)
        with pytest.raises(Overloaded, match="busy"):
            router.route("t", 1, slo, now_s=at_s + 3.2, tenant="quiet")
        await router.close()
        await batcher.close()
        await pool.close()

    asyncio.run(scenario())
