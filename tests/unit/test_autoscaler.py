"""The autoscaler loop against the shipped fake pool, with a manual clock: demand → actions →
replicate / load / unload through the placement layer, recorded as fleet events with the policy's
reason, and the fleet's cost integrated over time."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from infaas.api import create_app
from infaas.autoscaler import Autoscaler, FleetCost
from infaas.batching import ManualTimer
from infaas.metering import MeterRecord
from infaas.policy.autoscaling import AutoscalingConfig
from infaas.policy.demand import DemandWindow, capacity_rows_per_s
from infaas.settings import Settings
from infaas.store import MemoryStore
from infaas.types import Profile, Variant, VariantSpec
from infaas.workers.inprocess import RecordingPool
from infaas.workers.placement import Placement
from tests.factories import make_arch, make_task
from tests.unit.policy.test_selection import MACHINE, make_entry

CONFIG = AutoscalingConfig(target_utilization=0.5, upscale_delay_s=2.0, downscale_delay_s=10.0)


def entry(arch: str, *, base_ms: float = 10.0, price_usd_per_s: float = 1e-5) -> tuple[Variant, Profile]:
    # 10 ms per batch whatever its size: capacity 1000 × 32 / 10 = 3 200 rows/s at b=32
    return make_entry(
        arch, "tensorflow", 1, accuracy=0.9, base_ms=base_ms, per_row_ms=0.0, price_usd_per_s=price_usd_per_s
    )


def record(
    variant: str, rows: int, at_s: float, outcome: str = "ok", batch_rows: int | None = None
) -> MeterRecord:
    return MeterRecord(
        tenant="t",
        task="task",
        variant=variant,
        outcome=outcome,
        latency_ms=1.0,
        cost_pusd=1,
        rows=rows,
        batch_rows=rows if batch_rows is None else batch_rows,
        slo_met=outcome == "ok",
        at_s=at_s,
        latency_target_ms=50.0,
        min_accuracy=0.8,
    )


def resources(cpus: float) -> tuple[tuple[float, float], tuple[float, float]]:
    return (cpus, 0.0), (cpus, 0.0)


def scaler_for(
    pool: RecordingPool,
    variants: dict[str, tuple[Variant, Profile | None]],
    timer: ManualTimer,
    cpus: float = 8,
) -> tuple[Autoscaler, DemandWindow]:
    demand = DemandWindow(window_s=5.0)
    archs = {v.architecture: "t" for v, _ in variants.values()}
    scaler = Autoscaler(
        Placement(pool),
        lambda: variants,
        lambda: archs,
        demand,
        config=CONFIG,
        clock=timer.now_s,
        resources=lambda: resources(cpus),
    )
    return scaler, demand


def test_capacity_is_the_throughput_at_the_batches_really_run() -> None:
    _, profile = entry("a")
    assert capacity_rows_per_s(profile) == pytest.approx(3200.0)  # the best measured: b=32
    assert capacity_rows_per_s(profile, 4.2) == pytest.approx(400.0)  # batches of 4 rows: 4 per 10 ms
    assert capacity_rows_per_s(profile.model_copy(update={"points": ()})) == 0.0


def test_capacity_is_divided_by_the_slowdown_the_batches_measure() -> None:
    """A replica whose batches run 2.5x their profile serves 2.5x fewer rows: the policy sees
    that, not the idle profile (and a measured speed-up is not taken as more capacity)."""
    timer = ManualTimer()
    variants = {v.name: (v, p) for v, p in [entry("a")]}
    name = next(iter(variants))
    slowdowns = {name: 2.5}
    demand = DemandWindow(window_s=5.0)
    scaler = Autoscaler(
        Placement(RecordingPool()),
        lambda: variants,
        lambda: {"a": "t"},
        demand,
        config=CONFIG,
        clock=timer.now_s,
        resources=lambda: resources(8),
        slowdown=lambda v: slowdowns.get(v, 1.0),
    )
    for i in range(5):
        demand.listener(record(name, 32, timer.now_s() - i, batch_rows=32))
    [state] = scaler.snapshot(timer.now_s()).variants
    assert state.capacity_rows_per_s == pytest.approx(3200.0 / 2.5)
    slowdowns[name] = 0.6
    [state] = scaler.snapshot(timer.now_s()).variants
    assert state.capacity_rows_per_s == pytest.approx(3200.0)


def test_demand_window_counts_rows_pressure_targets_and_batches() -> None:
    window = DemandWindow(window_s=10.0)
    for i in range(20):  # 100 rows/s for 20 s, in batches of 8 rows
        window.listener(record("v", 100, 1000.0 + i, batch_rows=8))
    window.listener(record("v", 30, 1019.0, outcome="overloaded", batch_rows=0))
    window.listener(record("v", 20, 1019.0, outcome="slo_missed", batch_rows=8))
    window.listener(record("", 5, 1019.0))  # failed before routing: no variant to count it for
    d = window.demand("v", 1019.5)
    assert d.rows_per_s == pytest.approx(105.0)
    assert d.pressure_rows_per_s == pytest.approx(5.0)
    assert (d.latency_target_ms, d.required_accuracy, d.mean_batch_rows) == (50.0, 0.8, 8.0)
    assert window.last_seen_s["v"] == 1019.0
    assert window.demand("v", 1030.0).rows_per_s == 0.0
    assert window.demand("unknown", 1030.0).latency_target_ms == math.inf
    with pytest.raises(ValueError):
        DemandWindow(window_s=0.5)


def test_fleet_cost_integrates_replicas_times_price_over_time() -> None:
    cost = FleetCost()
    cost.tick({"a": 2e-5, "b": 0.0}, 100.0)
    cost.tick({"a": 4e-5}, 110.0)  # 10 s at 2e-5
    cost.tick({}, 115.0)  # 5 s at 4e-5
    assert cost.usd == pytest.approx({"a": 2e-4 + 2e-4})
    assert cost.total_usd == pytest.approx(4e-4) and cost.total_usd_per_hour == 0.0


def test_a_hot_variant_gets_replicas_after_the_delay_and_an_idle_one_goes_to_zero() -> None:
    async def scenario() -> None:
        timer = ManualTimer(start_s=1000.0)
        pool = RecordingPool(workers=4)
        hot, cold = entry("hot", price_usd_per_s=1e-6), entry("cold")
        variants: dict[str, tuple[Variant, Profile | None]] = {v.name: (v, p) for v, p in (hot, cold)}
        scaler, demand = scaler_for(pool, variants, timer)
        for variant, _ in (hot, cold):  # one replica each, loaded by their first batches
            await pool.run(variant, np.zeros((1, 2)))

        async def run_for(seconds: int, hot_rows_per_s: int) -> list[tuple[str, str, int]]:
            taken = []
            for _ in range(seconds):  # one round a second, as the service runs it
                if hot_rows_per_s:
                    demand.listener(record(hot[0].name, hot_rows_per_s, timer.now_s(), batch_rows=32))
                taken += [(a.kind, a.variant, a.replicas) for a in await scaler.tick()]
                timer.advance(1.0)
            return taken

        # 4 000 rows/s on replicas of 3 200 rows/s at a 50 % target: 3 replicas, once the window
        # has filled (2 400 rows/s after 3 s wants 2) and the wish has held for 2 s
        assert await run_for(4, 4000) == []
        assert await run_for(1, 4000) == [("replicate", hot[0].name, 3)]
        assert pool.replicas(hot[0].name) == 3
        (event,) = [e for e in scaler.events() if e.kind == "replicate"]
        assert event.reason.startswith("1 → 3 replica(s): 4000 rows/s needs 3 replica(s)")
        # the cold one is not its architecture's floor? It is (each architecture has one variant):
        # it stays loaded while its architecture is active (registered within the warm TTL).
        assert await run_for(15, 4000) == []
        assert pool.replicas(cold[0].name) == 1
        # the fleet cost grew by 3 replicas × 1e-6 + 1 × 1e-5 per second
        assert scaler.cost.usd_per_s == pytest.approx({hot[0].name: 3e-6, cold[0].name: 1e-5})
        # the hot one goes idle: after the hold-down, down to its warm floor of one replica
        taken = await run_for(20, 0)
        assert taken == [("remove", hot[0].name, 1)]
        assert pool.replicas(hot[0].name) == 1

    asyncio.run(scenario())


def test_a_saturated_variant_with_no_room_is_upgraded_to_a_faster_one() -> None:
    async def scenario() -> None:
        timer = ManualTimer(start_s=0.0)
        pool = RecordingPool(workers=4)
        slow = entry("m", base_ms=100.0, price_usd_per_s=1e-6)  # 320 rows/s at b=32
        fast = make_entry(
            "m", "onnxruntime", 1, accuracy=0.9, base_ms=2.0, per_row_ms=0.0, price_usd_per_s=1e-4
        )  # pricier per query than the slow one (so not the warm floor), 50× its capacity
        variants: dict[str, tuple[Variant, Profile | None]] = {v.name: (v, p) for v, p in (slow, fast)}
        scaler, demand = scaler_for(pool, variants, timer, cpus=2)  # room for one more 1-thread replica
        await pool.run(slow[0], np.zeros((1, 2)))
        taken = []
        for _ in range(6):
            demand.listener(record(slow[0].name, 2000, timer.now_s(), batch_rows=32))
            taken += [(a.kind, a.variant) for a in await scaler.tick()]
            timer.advance(1.0)
        assert taken[0] == ("upgrade", fast[0].name)  # then the fake pool co-hosts it: room for a copy
        assert pool.is_loaded(fast[0].name)
        (event,) = [e for e in scaler.events() if e.kind == "upgrade"]
        assert "overflow goes to" in event.reason and slow[0].name in event.reason

    asyncio.run(scenario())


def test_a_failed_action_is_an_event_and_the_round_goes_on() -> None:
    async def scenario() -> None:
        timer = ManualTimer(start_s=0.0)
        pool = RecordingPool(workers=1)  # every worker holds it already: replicate fails
        busy = entry("busy")
        variants: dict[str, tuple[Variant, Profile | None]] = {busy[0].name: busy}
        variants["foreign"] = (entry("foreign")[0], None)  # the router left its profile out
        scaler, demand = scaler_for(pool, variants, timer)
        await pool.run(busy[0], np.zeros((1, 2)))
        for _ in range(4):
            demand.listener(record(busy[0].name, 20_000, timer.now_s(), batch_rows=32))
            await scaler.tick()
            timer.advance(1.0)
        (event,) = scaler.events()
        assert event.kind == "replicate" and event.reason.startswith("failed: cannot replicate")
        assert pool.replicas(busy[0].name) == 1

    asyncio.run(scenario())


def test_the_loop_runs_rounds_until_closed() -> None:
    async def scenario() -> None:
        pool = RecordingPool(workers=2)
        floor, pricey = entry("a", price_usd_per_s=1e-6), entry("a", price_usd_per_s=1e-5)
        pricey = (
            pricey[0].model_copy(update={"spec": pricey[0].spec.model_copy(update={"threads": 2})}),
            pricey[1].model_copy(update={"variant": "x"}),
        )
        variants: dict[str, tuple[Variant, Profile | None]] = {v.name: (v, p) for v, p in (floor, pricey)}
        for v, _ in variants.values():
            await pool.run(v, np.zeros((1, 2)))
        scaler = Autoscaler(
            Placement(pool),
            lambda: variants,
            lambda: {"a": "t"},
            DemandWindow(),
            config=AutoscalingConfig(downscale_delay_s=0.0),
            clock=lambda: 0.0,
            interval_s=0.001,
        )
        scaler.start()
        for _ in range(1000):  # idle and no delay: the first rounds unload all but the floor
            if pool.replicas(pricey[0].name) == 0:
                break
            await asyncio.sleep(0.001)
        await scaler.close()
        assert pool.replicas(pricey[0].name) == 0 and pool.replicas(floor[0].name) == 1
        await scaler.close()  # closing twice is harmless

    asyncio.run(scenario())


def test_the_service_runs_it_and_shows_actions_and_cost(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        store.put_task(make_task())
        floor, pricey = entry("a", price_usd_per_s=1e-6), entry("b", price_usd_per_s=1e-5)
        for variant, profile in (floor, pricey):
            store.register_architecture(make_arch(variant.architecture), [variant], [])
            store.put_profile(profile)
        settings = Settings(
            data_dir=tmp_path,
            admin_key="admin-key",
            autoscale_interval_s=0.01,
            autoscale_downscale_delay_s=0.0,
            warm_ttl_s=0.0,  # no warm floor: idle variants go to zero
        )
        pool = RecordingPool(workers=2)
        app = create_app(settings, store=store, pool=pool, machine=MACHINE)
        admin = {"Authorization": "Bearer admin-key"}
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as http,
        ):
            for _ in range(1000):  # warm-up loads both, then idle: the autoscaler unloads them
                if len(pool.events()) >= 2 and not any(pool.is_loaded(v.name) for v in (floor[0], pricey[0])):
                    break
                await asyncio.sleep(0.002)
            r = await http.get("/v1/admin/fleet", headers=admin)
            metrics = (await http.get("/metrics", headers=admin)).text
        view = r.json()
        unloads = [e for e in view["events"] if e["kind"] == "unload" and e["worker_id"] is None]
        assert sorted(e["variant"] for e in unloads) == sorted([floor[0].name, pricey[0].name])
        assert all(e["reason"].startswith("1 → 0 replica(s): no traffic") for e in unloads), unloads
        assert view["replicas"] == {} and view["cost"]["usd_per_hour"] == 0.0
        assert set(view["cost"]["by_variant"]) <= {floor[0].name, pricey[0].name}
        assert "infaas_fleet_cost_usd_total" in metrics and "infaas_variant_replicas" in metrics

    asyncio.run(scenario())


def test_a_restricted_autoscaler_only_takes_the_actions_it_is_allowed() -> None:
    async def scenario() -> None:
        timer = ManualTimer(start_s=0.0)
        pool = RecordingPool(workers=4)
        slow = entry("m", base_ms=100.0, price_usd_per_s=1e-6)
        fast = make_entry(
            "m", "onnxruntime", 1, accuracy=0.9, base_ms=2.0, per_row_ms=0.0, price_usd_per_s=1e-4
        )
        variants: dict[str, tuple[Variant, Profile | None]] = {v.name: (v, p) for v, p in (slow, fast)}
        scaler, demand = scaler_for(pool, variants, timer, cpus=2)
        scaler.config = replace(scaler.config, actions=frozenset({"replicate", "remove"}))  # no upgrade
        await pool.run(slow[0], np.zeros((1, 2)))
        taken = []
        for _ in range(6):
            demand.listener(record(slow[0].name, 2000, timer.now_s(), batch_rows=32))
            taken += [a.kind for a in await scaler.tick()]
            timer.advance(1.0)
        assert taken == ["replicate"]  # where the full policy upgrades (the test above)
        assert not pool.is_loaded(fast[0].name)

    asyncio.run(scenario())


def test_a_replica_holds_and_pays_for_its_threads_as_vcpus_or_its_share_of_a_gpu() -> None:
    """What the autoscaler's free resources and the router's room beside busy replicas count."""
    cpu = VariantSpec(architecture="a", runtime="onnxruntime", threads=2)
    gpu = VariantSpec(architecture="a", runtime="onnxruntime", hardware="gpu", threads=2)
    assert cpu.holds() == (2.0, 0.0)
    assert gpu.holds() == (0.0, 1.0)
    assert gpu.holds(0.25) == (0.0, 0.25) and cpu.holds(0.25) == (2.0, 0.0)  # four workers a GPU
    # And pays for what it holds: a quarter of the GPU's price (the profile's is one GPU's).
    assert gpu.replica_price(1.0, 0.25) == 0.25 and cpu.replica_price(1.0, 0.25) == 1.0


def test_charged_plus_reserved_is_the_fleets_cost_exactly_through_scale_ups_and_downs() -> None:
    """Two tenants' traffic scales a variant up to 3 replicas and back to 1; every round the
    fleet's cost beyond the charges is attributed. Over the run, in pico-dollars and exactly:
    Σ tenants (charged + reserved) = Σ variants what their replicas cost."""

    async def scenario() -> None:
        timer = ManualTimer(start_s=1000.0)
        pool = RecordingPool(workers=4)
        hot, cold = entry("hot", price_usd_per_s=1.3e-6), entry("cold", price_usd_per_s=7e-6)
        variants: dict[str, tuple[Variant, Profile | None]] = {v.name: (v, p) for v, p in (hot, cold)}
        reserved: dict[str, int] = {}

        def reserve(tenant: str, variant: str, pusd: int, now_s: float) -> None:
            reserved[tenant] = reserved.get(tenant, 0) + pusd

        demand = DemandWindow(window_s=5.0)
        scaler = Autoscaler(
            Placement(pool),
            lambda: variants,
            lambda: {"hot": "t", "cold": "t"},
            demand,
            config=CONFIG,
            clock=timer.now_s,
            resources=lambda: resources(8),
            reserve=reserve,
        )
        for variant, _ in (hot, cold):
            await pool.run(variant, np.zeros((1, 2)))
        charged = {"acme": 0, "beta": 0}
        rng = np.random.default_rng(3)
        for second in range(60):
            rows = 4000 if second < 30 else 0
            if rows:
                demand.listener(record(hot[0].name, rows, timer.now_s(), batch_rows=32))
                for tenant, share in (("acme", 0.75), ("beta", 0.25)):
                    cost = int(rng.integers(1_000, 90_000))
                    charged[tenant] += cost
                    scaler.reserved.charged(tenant, hot[0].name, int(rows * share), cost, timer.now_s())
            await scaler.tick()
            timer.advance(0.7 + 0.6 * float(rng.random()))  # rounds are not exactly a second apart
        await scaler.tick()
        assert any(e.kind == "replicate" for e in scaler.events())
        assert any(e.kind == "remove" for e in scaler.events())
        fleet = sum(scaler.cost.pusd.values())
        assert fleet > 0 and set(reserved) == {"acme", "beta", "admin"}  # cold: nobody's traffic
        assert sum(charged.values()) + sum(reserved.values()) == fleet
        assert reserved["acme"] > reserved["beta"] > 0  # 3:1 by their rows

    asyncio.run(scenario())
