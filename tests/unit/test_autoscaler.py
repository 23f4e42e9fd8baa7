"""The autoscaler loop against the shipped fake pool, with a manual clock: arrivals → decisions →
replicate / unload through the pool, recorded as fleet events with the policy's reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from infaas.api import create_app
from infaas.autoscaler import ArrivalWindow, Autoscaler, capacity_rows_per_s
from infaas.batching import ManualTimer
from infaas.metering import MeterRecord
from infaas.policy.autoscaling import AutoscalingConfig
from infaas.settings import Settings
from infaas.store import MemoryStore
from infaas.types import Profile, Variant
from infaas.workers.inprocess import EchoModel, InProcessPool, RecordingPool
from tests.factories import make_arch, make_task
from tests.unit.policy.test_selection import MACHINE, make_entry

CONFIG = AutoscalingConfig(
    target_utilization=0.5, max_replicas=4, upscale_delay_s=2.0, downscale_delay_s=10.0
)


def entry(arch: str) -> tuple[Variant, Profile]:
    # 10 ms per batch whatever its size: capacity 1000 × 32 / 10 = 3 200 rows/s at b=32
    return make_entry(arch, "tensorflow", 1, accuracy=0.9, base_ms=10.0, per_row_ms=0.0, price_usd_per_s=1e-5)


def record(variant: str, rows: int, at_s: float) -> MeterRecord:
    return MeterRecord(
        tenant="t",
        task="task",
        variant=variant,
        outcome="ok",
        latency_ms=1.0,
        cost_pusd=1,
        rows=rows,
        batch_rows=rows,
        slo_met=True,
        at_s=at_s,
    )


def test_capacity_is_the_best_measured_throughput() -> None:
    _, profile = entry("a")
    assert capacity_rows_per_s(profile) == pytest.approx(3200.0)
    assert capacity_rows_per_s(profile.model_copy(update={"points": ()})) == 0.0


def test_arrival_window_counts_rows_over_the_look_back_window() -> None:
    window = ArrivalWindow(window_s=10.0)
    for i in range(20):  # 100 rows/s for 20 s
        window.listener(record("v", 100, 1000.0 + i))
    window.listener(record("", 5, 1019.0))  # failed before routing: no variant to charge it to
    assert window.rows_per_s("v", 1019.5) == pytest.approx(100.0)
    assert window.rows_per_s("v", 1030.0) == 0.0
    assert window.rows_per_s("unknown", 1030.0) == 0.0
    with pytest.raises(ValueError):
        ArrivalWindow(window_s=0.5)


def test_a_hot_variant_gets_replicas_after_the_delay_and_loses_them_when_cold() -> None:
    async def scenario() -> None:
        timer = ManualTimer(start_s=1000.0)
        pool = RecordingPool(workers=4)
        hot, cold = entry("hot"), entry("cold")
        variants = {v.name: (v, p) for v, p in (hot, cold)}
        arrivals = ArrivalWindow(window_s=5.0)
        scaler = Autoscaler(pool, lambda: variants, arrivals, config=CONFIG, clock=timer.now_s)
        for variant, _ in (hot, cold):  # one replica each, loaded by their first batches
            await pool.run(variant, np.zeros((1, 2)))

        async def run_for(seconds: int, hot_rows_per_s: int) -> list[tuple[str, int]]:
            taken = []
            for _ in range(seconds):  # one round a second, as the service runs it
                arrivals.listener(record(hot[0].name, hot_rows_per_s, timer.now_s()))
                taken += [(d.variant, d.replicas) for d in await scaler.tick()]
                timer.advance(1.0)
            return taken

        # 4 000 rows/s on replicas of 3 200 rows/s at a 50 % target: 3 replicas, once the window
        # has filled (2 400 rows/s after 3 s wants 2) and the wish has held for 2 s
        assert await run_for(4, 4000) == []
        assert await run_for(1, 4000) == [(hot[0].name, 3)]
        assert pool.replicas(hot[0].name) == 3
        replicated = [e for e in pool.events() if e.kind == "replicate"]
        assert len(replicated) == 2 and all(e.variant == hot[0].name for e in replicated)
        assert all(e.reason.startswith("autoscaler: 1 → 3 replicas:") for e in replicated)
        assert "utilisation" in replicated[0].reason
        # the cold one has had no arrivals: unloaded to zero after the 10 s downscale delay
        assert await run_for(5, 4000) == []
        assert await run_for(1, 4000) == [(cold[0].name, 0)]
        assert pool.replicas(cold[0].name) == 0 and pool.replicas(hot[0].name) == 3
        unloads = [e for e in pool.events() if e.kind == "unload"]
        assert [e.variant for e in unloads] == [cold[0].name]
        assert unloads[0].reason.startswith("autoscaler: 1 → 0 replicas:")
        # the hot one goes idle as well: after the downscale delay, to zero
        assert await run_for(20, 0) == [(hot[0].name, 0)]
        assert pool.replicas(hot[0].name) == 0
        # nothing left with replicas: nothing to decide
        assert scaler.loads(timer.now_s()) == []

    asyncio.run(scenario())


def test_scaling_down_part_way_unloads_replicas_from_some_workers_only() -> None:
    async def scenario() -> None:
        timer = ManualTimer(start_s=0.0)
        pool = RecordingPool(workers=3)
        variant, profile = entry("a")
        arrivals = ArrivalWindow(window_s=10.0)
        scaler = Autoscaler(
            pool, lambda: {variant.name: (variant, profile)}, arrivals, config=CONFIG, clock=timer.now_s
        )
        await pool.run(variant, np.zeros((1, 2)))
        for _ in range(2):
            await pool.replicate(variant)
        for t in range(30):  # 1 000 rows/s: one replica is enough (31 % of 3 200 at 50 % target)
            arrivals.add(variant.name, 1000, float(t))
        timer.advance(20.0)
        await scaler.tick()
        timer.advance(10.0)
        decisions = await scaler.tick()
        assert [d.replicas for d in decisions] == [1]
        assert pool.replicas(variant.name) == 1
        assert [w.loaded for w in pool.fleet()].count((variant.name,)) == 1

    asyncio.run(scenario())


def test_what_is_not_scaled_and_a_full_pool_is_not_an_error() -> None:
    async def scenario() -> None:
        timer = ManualTimer(start_s=0.0)
        pool = RecordingPool(workers=2)
        local = InProcessPool(loader=lambda v: EchoModel(v.name))
        busy, never_loaded, fast_path, foreign = (entry(n) for n in ("busy", "never", "fast", "foreign"))
        variants: dict[str, tuple[Variant, Profile | None]] = {
            v.name: (v, p) for v, p in (busy, never_loaded, fast_path)
        }
        variants[foreign[0].name] = (foreign[0], None)  # the router left its profile out
        arrivals = ArrivalWindow(window_s=5.0)
        scaler = Autoscaler(pool, lambda: variants, arrivals, config=CONFIG, clock=timer.now_s, local=local)
        for v in (busy[0], fast_path[0], foreign[0]):
            await pool.run(v, np.zeros((1, 2)))
        await local.run(fast_path[0], np.zeros((1, 2)))
        for t in range(5):
            for v, _ in (busy, never_loaded, fast_path, foreign):
                arrivals.add(v.name, 20_000, float(t))
        timer.advance(5.0)
        assert [load.variant for load in scaler.loads(timer.now_s())] == [busy[0].name]
        await scaler.tick()
        timer.advance(2.0)
        # wants 4 replicas, the pool has 2 workers: it gets 2, and the round does not fail
        decisions = await scaler.tick()
        assert [(d.variant, d.replicas) for d in decisions] == [(busy[0].name, 4)]
        assert pool.replicas(busy[0].name) == 2
        assert pool.replicas(never_loaded[0].name) == 0
        assert pool.replicas(fast_path[0].name) == 1
        await local.close()

    asyncio.run(scenario())


def test_the_loop_runs_rounds_until_closed() -> None:
    async def scenario() -> None:
        pool = RecordingPool(workers=2)
        variant, profile = entry("a")
        await pool.run(variant, np.zeros((1, 2)))
        now = [0.0]
        config = AutoscalingConfig(downscale_delay_s=0.0)
        scaler = Autoscaler(
            pool,
            lambda: {variant.name: (variant, profile)},
            ArrivalWindow(),
            config=config,
            clock=lambda: now[0],
            interval_s=0.001,
        )
        scaler.start()
        for _ in range(1000):  # idle and no delay: the first round unloads it
            if pool.replicas(variant.name) == 0:
                break
            await asyncio.sleep(0.001)
        await scaler.close()
        assert pool.replicas(variant.name) == 0
        await scaler.close()  # closing twice is harmless

    asyncio.run(scenario())


def test_the_service_runs_it_and_the_fleet_view_shows_its_decisions(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        store.put_task(make_task())
        variant, profile = entry("a")
        store.register_architecture(make_arch("a"), [variant], [])
        store.put_profile(profile)
        settings = Settings(
            data_dir=tmp_path,
            admin_key="admin-key",
            autoscale_interval_s=0.01,
            autoscale_downscale_delay_s=0.0,
        )
        pool = RecordingPool(workers=2)
        app = create_app(settings, store=store, pool=pool, machine=MACHINE)
        admin = {"Authorization": "Bearer admin-key"}
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as http,
        ):
            await pool.run(variant, np.zeros((1, 2)))  # loaded, then idle: the autoscaler unloads it
            for _ in range(1000):
                if pool.replicas(variant.name) == 0:
                    break
                await asyncio.sleep(0.002)
            r = await http.get("/v1/admin/fleet", headers=admin)
        events = [e for e in r.json()["events"] if e["kind"] == "unload"]
        assert [e["variant"] for e in events] == [variant.name]
        assert events[0]["reason"].startswith("autoscaler: 1 → 0 replicas: 0 rows/s")

    asyncio.run(scenario())
