"""The simulator: its event loop in virtual time, admission, the autoscaler, the baselines, and
that the policies it runs are the service's own."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import infaas.autoscaler
import infaas.batching
import infaas.dataplane
import infaas.metering
import infaas.policy.autoscaling
import infaas.policy.batching
import infaas.policy.demand
import infaas.policy.selection
import infaas.policy.shedding
import infaas.policy.verdict
import infaas.router
import infaas.warmup
import infaas.workers.placement
from infaas.policy.autoscaling import AutoscalingConfig
from infaas.sim import engine
from infaas.sim.engine import SimConfig, Simulation, simulate
from infaas.sim.traces import Query, TenantSpec, Trace, poisson
from infaas.sim.zoo import Zoo, mixed_tenants, synthetic_zoo
from infaas.types import Hardware, LatencyPoint, MachineInfo, Parity, Profile, Variant, VariantSpec

MACHINE = MachineInfo(cpu_model="test", cores=8)


def entry(
    arch: str,
    threads: int = 1,
    *,
    base_ms: float = 4.0,
    per_row_ms: float = 0.5,
    accuracy: float = 0.9,
    price_usd_per_s: float = 1e-5,
    load_time_s: float = 1.0,
    hardware: Hardware = "cpu",
) -> tuple[Variant, Profile]:
    spec = VariantSpec(
        architecture=arch, runtime="onnxruntime", hardware=hardware, threads=threads, max_batch=32
    )
    variant = Variant(
        spec=spec, artifact="a", sha256="0", parity=Parity(top1_agreement=1, max_abs_diff=0, samples=1)
    )
    points = tuple(
        LatencyPoint(
            batch=b,
            p50_ms=base_ms + per_row_ms * b,
            p95_ms=1.1 * (base_ms + per_row_ms * b),
            p99_ms=1.2 * (base_ms + per_row_ms * b),
            mean_ms=base_ms + per_row_ms * b,
            throughput_qps=1000 * b / (base_ms + per_row_ms * b),
            samples=100,
            stable=True,
            stop_reason="stable",
            cost_usd_per_1k=0.0,
        )
        for b in (1, 8, 32)
    )
    profile = Profile(
        variant=variant.name,
        machine=MACHINE,
        measured_at_s=0.0,
        points=points,
        fit_slope_ms=per_row_ms,
        accuracy=accuracy,
        price_usd_per_s=price_usd_per_s,
        load_time_s=load_time_s,
    )
    return variant, profile


def zoo_of(*entries: tuple[Variant, Profile], task: str = "t") -> Zoo:
    return Zoo(
        variants={v.name: (v, p) for v, p in entries}, tasks={v.architecture: task for v, _ in entries}
    )


def trace_of(*queries: Query) -> Trace:
    return Trace.from_queries(list(queries))


def q(at_s: float, latency_ms: float = 50.0, *, rows: int = 1, acc: float = 0.0, tenant: str = "a") -> Query:
    return Query(at_s, tenant, "t", rows, latency_ms, acc)


# ---- the policies are the service's ------------------------------------------------------------


def test_the_simulator_runs_the_very_policy_functions_the_service_imports() -> None:
    assert engine.select_policy is infaas.policy.selection.VariantTable.select
    assert engine.predict_policy is infaas.policy.selection.VariantTable.predict
    assert engine.batch_policy is infaas.policy.batching.decide is infaas.batching.decide
    assert (
        engine.queue_delay_policy
        is infaas.policy.batching.predicted_queue_delay_ms
        is infaas.batching.predicted_queue_delay_ms
    )
    assert engine.autoscale_policy is infaas.policy.autoscaling.decide is infaas.autoscaler.decide
    assert engine.cost_share_pusd is infaas.metering.cost_share_pusd
    assert engine.VariantTable is infaas.router.VariantTable
    assert engine.DemandWindow is infaas.policy.demand.DemandWindow
    assert (
        engine.capacity_rows_per_s
        is infaas.policy.demand.capacity_rows_per_s
        is infaas.autoscaler.capacity_rows_per_s
    )
    assert engine.cheapest_variants is infaas.autoscaler.cheapest_variants is infaas.warmup.cheapest_variants
    assert engine.decide_where is infaas.workers.placement.decide_where
    assert engine.DoorShedder is infaas.policy.shedding.DoorShedder is infaas.dataplane.DoorShedder
    assert engine.LoopWatch is infaas.policy.shedding.LoopWatch is infaas.dataplane.LoopWatch
    # one verdict: the router's admission is the simulator's
    assert engine.admit_policy is infaas.policy.verdict.admit is infaas.router.admit
    assert set(engine.POLICIES.values()) >= {
        infaas.policy.selection.VariantTable.select,
        infaas.policy.batching.decide,
        infaas.policy.autoscaling.decide,
    }


def test_every_decision_goes_through_the_named_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"batch": 0, "scale": 0}
    real_batch, real_scale = engine.batch_policy, engine.autoscale_policy

    def batch(*a, **k):  # type: ignore[no-untyped-def]
        calls["batch"] += 1
        return real_batch(*a, **k)

    def scale(*a, **k):  # type: ignore[no-untyped-def]
        calls["scale"] += 1
        return real_scale(*a, **k)

    monkeypatch.setattr(engine, "batch_policy", batch)
    monkeypatch.setattr(engine, "autoscale_policy", scale)
    simulate(zoo_of(entry("m")), trace_of(q(0.1), q(2.5)), "modelless")
    assert calls["batch"] >= 2 and calls["scale"] >= 2


# ---- the event loop in virtual time ------------------------------------------------------------


def test_a_batch_completes_at_its_start_plus_the_profiles_latency_plus_the_hop() -> None:
    variant, profile = entry("m")
    cfg = SimConfig(hop_ms=0.8, frontend_ms=0.1, noise=0.0)
    sim = Simulation(zoo_of((variant, profile)), trace_of(q(0.5)), "modelless", cfg)
    result = sim.run()
    done_s, latency_ms = sim.answers()
    assert done_s[0] == pytest.approx(0.5 + (profile.latency_ms(1, "p50") + 0.8) / 1000.0)
    assert latency_ms[0] == pytest.approx(profile.latency_ms(1, "p50") + 0.8 + 0.1)
    assert result.total.in_slo == 1


def test_a_sub_hop_variant_runs_in_the_front_end_one_copy_no_hop_no_worker_cores() -> None:
    variant, profile = entry("m", base_ms=0.02, per_row_ms=0.001)
    profile = profile.model_copy(update={"memory_mb": 5.0})  # small: the service runs it inline
    cfg = SimConfig(hop_ms=0.8, frontend_ms=0.1, workers=1, cores=2, noise=0.0)
    burst = [q(0.5 + i / 20_000) for i in range(4000)]  # 20 000 queries/s for 0.2 s
    sim = Simulation(zoo_of((variant, profile)), trace_of(*burst), "modelless", cfg)
    result = sim.run()
    _, latency_ms = sim.answers()
    assert latency_ms.min() == pytest.approx(profile.latency_ms(1, "p50") + 0.1)  # no hop
    assert sim._free == [2]  # the front end's copy holds no worker core
    assert len(sim._vqs[variant.name].replicas) == 1  # never replicated
    assert result.total.in_slo > 0
    off = Simulation(
        zoo_of((variant, profile)), trace_of(q(0.5)), "modelless", SimConfig(fast_path_max_ms=0, noise=0.0)
    )
    off.run()
    assert off.answers()[1][0] == pytest.approx(profile.latency_ms(1, "p50") + 0.8 + 0.1)


def test_a_saturated_front_end_makes_queries_wait_and_the_router_refuse() -> None:
    zoo = zoo_of(entry("m", base_ms=1.0, per_row_ms=0.01))
    flood = trace_of(*(q(0.1 + i / 3000, latency_ms=30.0) for i in range(3000)))  # 3 000/s for 1 s
    slow = simulate(zoo, flood, "modelless", SimConfig(workers=1, cores=8, frontend_ms=1.0))
    fast = simulate(zoo, flood, "modelless", SimConfig(workers=1, cores=8, frontend_ms=0.01))
    assert slow.total.refused > 1000  # 1 000 queries/s of front end for 3 000/s of arrivals
    assert fast.total.refused == 0 and fast.total.in_slo == 3000
    # Four such front ends behind a load balancer hold 4 000/s: what one refused, they answer.
    four = simulate(zoo, flood, "modelless", SimConfig(workers=1, cores=8, frontend_ms=1.0, front_ends=4))
    assert four.total.refused == 0 and four.total.in_slo == 3000


def test_the_door_refuses_a_flood_at_its_own_cost_and_leaves_the_front_end_for_answers() -> None:
    """The data plane's door in the simulator (`SimConfig.door_ms`): each tenant's `DoorShedder`
    learns from admission's busy refusals while the front end is behind, as the service's does,
    and what it refuses costs `door_ms` of the front end, not `frontend_ms`."""
    zoo = zoo_of(entry("m", base_ms=1.0, per_row_ms=0.01))
    flood = trace_of(*(q(0.1 + i / 3000, latency_ms=30.0) for i in range(6000)))  # 3 000/s for 2 s
    cfg = SimConfig(workers=1, cores=8, frontend_ms=1.0)
    without = simulate(zoo, flood, "modelless", cfg).total
    cheap = simulate(zoo, flood, "modelless", dataclasses.replace(cfg, door_ms=0.1)).total
    dear = simulate(zoo, flood, "modelless", dataclasses.replace(cfg, door_ms=0.3)).total
    # Judged by admission at 1 ms each, the backlog outgrows every target: ~all refused.
    assert without.in_slo < 100 and without.refused > 5800
    # Refused at 0.1 ms, most of the flood leaves the front end the time to answer the rest.
    assert cheap.in_slo > 10 * without.in_slo and cheap.late == 0
    assert cheap.refused + cheap.in_slo == 6000
    # At 0.3 ms the door's refusals alone (95 % of 3 000/s at most) and the 5 % it lets in still
    # take a whole core: no better than without it.
    assert dear.in_slo < 2 * without.in_slo
    # A front end that keeps up is never behind: the door sheds nothing.
    quick = dataclasses.replace(cfg, frontend_ms=0.01, door_ms=0.005)
    assert simulate(zoo, flood, "modelless", quick).total.in_slo == 6000


def test_a_refusal_by_admission_takes_the_front_end_its_own_time() -> None:
    """`SimConfig.refusal_ms`: a query the verdict refuses costs the front end that, not an
    answer's `frontend_ms` (unset: the same as an answer, as before)."""
    zoo = zoo_of(entry("m", base_ms=1.0, per_row_ms=0.01))
    flood = trace_of(*(q(0.1 + i / 3000, latency_ms=30.0) for i in range(6000)))  # 3 000/s for 2 s
    cfg = SimConfig(workers=1, cores=8, frontend_ms=1.0)
    alike = simulate(zoo, flood, "modelless", cfg).total
    assert simulate(zoo, flood, "modelless", dataclasses.replace(cfg, refusal_ms=1.0)).total == alike
    # At 0.2 ms a refusal, refusing most of 3 000/s leaves the front end time to answer the rest.
    cheap = simulate(zoo, flood, "modelless", dataclasses.replace(cfg, refusal_ms=0.2)).total
    assert alike.in_slo < 100 and cheap.in_slo > 10 * alike.in_slo
    assert cheap.in_slo + cheap.late + cheap.refused == 6000


def test_events_fire_in_time_order_and_a_busy_replica_delays_the_next_batch() -> None:
    cheap, dear = entry("m", base_ms=4.0), entry("n", base_ms=1.0, price_usd_per_s=1e-3)
    # Queries a microsecond apart on one replica: the second batch waits for the first.
    queries = [q(1.0 + i * 1e-6, 100.0) for i in range(3)] + [q(1.5, 100.0), q(0.2, 100.0)]
    sim = Simulation(zoo_of(cheap, dear), trace_of(*queries), "modelless", SimConfig(hop_ms=0.5, noise=0.0))
    sim.run()
    done_s, _ = sim.answers()
    assert list(done_s) == sorted(done_s)
    p50 = cheap[1].latency_ms(1, "p50")
    first = 1.0 + (p50 + 0.5) / 1000.0
    assert done_s[1] == pytest.approx(first)
    # The others were batched behind it (rule *wait*: it was in flight) and ran after it.
    assert done_s[2] > first


# ---- admission ---------------------------------------------------------------------------------


def test_queries_no_variant_meets_even_idle_are_422_not_refused() -> None:
    result = simulate(zoo_of(entry("m")), trace_of(q(0.1, 1.0), q(0.2, 1.0)), "modelless")
    t = result.total
    assert (t.infeasible, t.refused, t.answered) == (2, 0, 0)


def test_queries_feasible_idle_but_not_now_are_refused_with_429() -> None:
    # One one-thread replica on a one-core worker (the front end's core aside: none to add), and a
    # burst of queries far beyond what it answers within the target.
    cfg = SimConfig(workers=1, cores=1, reserved_cores=0, noise=0.0)
    burst = [q(1.0 + i * 1e-5, 12.0) for i in range(400)]
    result = simulate(zoo_of(entry("m")), trace_of(*burst), "modelless", cfg)
    t = result.total
    assert t.refused > 0 and t.infeasible == 0 and t.in_slo > 0
    assert t.queries == t.in_slo + t.late + t.refused + t.dropped


# ---- the autoscaler ----------------------------------------------------------------------------


def step_trace(low: float, high: float, seconds: tuple[float, float, float], seed: int = 0) -> Trace:
    mix = [TenantSpec("a", "t", latency_ms=40.0, min_accuracy=0.0, rows=1)]
    schedule = [(seconds[0], low), (seconds[1], high), (seconds[2], low)]
    return poisson(schedule, mix, np.random.default_rng(seed))


def test_the_autoscaler_replicates_under_a_step_and_removes_after_the_hold_down() -> None:
    cfg = SimConfig(
        workers=1,
        cores=16,
        autoscaling=AutoscalingConfig(upscale_delay_s=1.0, downscale_delay_s=8.0),
    )
    result = simulate(
        zoo_of(entry("m", load_time_s=0.5)), step_trace(20, 1500, (5, 10, 25)), "modelless", cfg
    )
    replicas = [(p.t_s, sum(p.replicas.values())) for p in result.timeline]
    peak = max(n for _, n in replicas)
    assert peak >= 3
    assert replicas[-1][1] < peak
    assert result.actions.get("replicate", 0) >= 1 and result.actions.get("remove", 0) >= 1
    last_up = max(t for (t, n), (_, before) in zip(replicas[1:], replicas, strict=False) if n > before)
    first_down = min(t for (t, n), (_, before) in zip(replicas[1:], replicas, strict=False) if n < before)
    assert first_down - last_up >= 8.0  # the hold-down, in virtual time
    # Fleet cost is replicas × price × time: above one replica's for the whole run.
    assert result.fleet_usd > 1e-5 * result.duration_s


# ---- the baselines -----------------------------------------------------------------------------


def two_variant_zoo() -> Zoo:
    return zoo_of(
        entry("small", base_ms=1.0, accuracy=0.80, price_usd_per_s=1e-5),
        entry("large", base_ms=6.0, accuracy=0.95, price_usd_per_s=2e-5),
    )


def test_static_pins_the_most_accurate_variant_and_never_changes_its_replicas() -> None:
    cfg = SimConfig(workers=1, cores=16, static_replicas=2)
    result = simulate(two_variant_zoo(), step_trace(20, 1500, (3, 5, 3)), "static", cfg)
    assert result.actions == {}
    # The pinned variant at its 2 replicas, beside the warm-up's floor of the other architecture.
    fleets = {tuple(sorted(p.replicas.items())) for p in result.timeline}
    assert fleets == {(("large/onnx-cpu-fp32-t1", 2), ("small/onnx-cpu-fp32-t1", 1))}
    assert result.fleet_usd == pytest.approx((2 * 2e-5 + 1e-5) * result.duration_s)


def test_replicate_only_keeps_each_tenants_first_choice_and_only_replicates_or_removes() -> None:
    cfg = SimConfig(workers=1, cores=16, autoscaling=AutoscalingConfig(upscale_delay_s=1.0))
    result = simulate(two_variant_zoo(), step_trace(20, 3000, (3, 8, 3)), "replicate-only", cfg)
    assert set(result.actions) <= {"replicate", "remove"} and result.actions.get("replicate", 0) >= 1
    # The cheapest meeting its targets takes the load, and is never upgraded: the other variant
    # keeps the one copy the warm-up gave it.
    assert max(p.replicas["small/onnx-cpu-fp32-t1"] for p in result.timeline) >= 2
    assert {p.replicas.get("large/onnx-cpu-fp32-t1") for p in result.timeline} == {1}


def test_modelless_may_move_load_to_another_variant() -> None:
    cfg = SimConfig(workers=1, cores=4)
    result = simulate(two_variant_zoo(), step_trace(20, 3000, (3, 8, 3)), "modelless", cfg)
    assert result.total.in_slo > 0


# ---- determinism -------------------------------------------------------------------------------


def test_a_seed_gives_the_same_result_every_time() -> None:
    zoo = synthetic_zoo(2, 12, seed=3)
    trace = poisson([(3.0, 300.0), (3.0, 1200.0)], mixed_tenants(zoo), np.random.default_rng(5))
    cfg = SimConfig(workers=2, cores=8, noise=0.2, seed=7)
    a, b = simulate(zoo, trace, "modelless", cfg), simulate(zoo, trace, "modelless", cfg)
    assert a.total == b.total and a.fleet_usd == b.fleet_usd and a.actions == b.actions
    assert [p.p99_ms for p in a.timeline] == [p.p99_ms for p in b.timeline]
    c = simulate(zoo, trace, "modelless", SimConfig(workers=2, cores=8, noise=0.2, seed=8))
    assert [p.p99_ms for p in c.timeline] != [p.p99_ms for p in a.timeline]


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        Simulation(zoo_of(entry("m")), trace_of(q(0.1)), "fancy")  # type: ignore[arg-type]


def test_the_noise_is_each_profiles_own_spread() -> None:
    """By default a batch's run time is drawn so that its median is the profile's p50 and its
    99th percentile the profile's p99 at that batch size (not a fixed sigma, not none)."""
    import numpy as np

    from infaas.sim.engine import spread_sigma

    sigma = spread_sigma(2.0, 3.0)
    draws = 2.0 * np.exp(np.random.default_rng(0).normal(0.0, sigma, 200_000))
    assert np.percentile(draws, 50) == pytest.approx(2.0, rel=0.01)
    assert np.percentile(draws, 99) == pytest.approx(3.0, rel=0.02)
    assert spread_sigma(2.0, 2.0) == 0.0 and spread_sigma(0.0, 1.0) == 0.0
    assert SimConfig().noise is None


# ---- the GPU machine class ---------------------------------------------------------------------


def test_a_gpu_replica_holds_its_share_of_a_gpu_on_a_gpu_machine_and_no_core() -> None:
    gpu, gpu_profile = entry("big", hardware="gpu", base_ms=0.5, per_row_ms=0.01)
    zoo = zoo_of(entry("small"), (gpu, gpu_profile))
    cfg = SimConfig(workers=3, cores=4, gpu_workers=1, gpus=1, autoscaling=AutoscalingConfig(gpu_share=0.5))
    sim = Simulation(zoo, trace_of(q(0.1)), "modelless", cfg)
    vq = sim._vqs[gpu.name]
    assert (vq.cpus, vq.gpus) == (0.0, 0.5)
    assert len(vq.replicas) == 1  # the architecture's warm floor (its only variant)
    assert sim._place(vq, 0.0)
    assert not sim._place(vq, 0.0)  # two halves of the one GPU are taken
    assert {r.worker for r in vq.replicas} == {2}  # the GPU machine, the last one
    assert sim._free[2] == 4.0 and sim._free_gpu == [0.0, 0.0, 0.0]
    assert sim.snapshot().free_gpus == 0.0
    state = next(v for v in sim.snapshot().variants if v.name == gpu.name)
    assert (state.cpus, state.gpus, state.replicas) == (0.0, 0.5, 2)
    # Each pays for the half it holds: the fleet's rate and the policy's price per replica.
    assert state.price_usd_per_s == pytest.approx(0.5 * gpu_profile.price_usd_per_s)
    (small,) = (v for name, v in sim._vqs.items() if name != gpu.name)
    assert sim._fleet_rate == pytest.approx(small.price_usd_per_s + gpu_profile.price_usd_per_s)
    sim._drop(vq, 1)
    assert sim._free_gpu[2] == 0.5


def test_without_a_gpu_machine_gpu_variants_are_never_chosen() -> None:
    """As the router's snapshot leaves out a profile of a machine class the cluster lacks."""
    cpu = entry("small", base_ms=4.0, accuracy=0.9)
    gpu = entry("fast", hardware="gpu", base_ms=0.2, accuracy=0.95, price_usd_per_s=1e-6)
    trace = trace_of(*(q(0.1 + i / 100) for i in range(50)))
    result = simulate(zoo_of(cpu, gpu), trace, "modelless", SimConfig(workers=1, cores=4))
    assert set(result.total.by_variant) == {cpu[0].name}
    mixed = simulate(zoo_of(cpu, gpu), trace, "modelless", SimConfig(workers=2, cores=4, gpu_workers=1))
    assert gpu[0].name in mixed.total.by_variant


def test_static_on_gpus_is_sized_to_the_gpus_there_are() -> None:
    gpu = entry("big", hardware="gpu", base_ms=6.0, accuracy=0.95, price_usd_per_s=2e-5)
    zoo = zoo_of(entry("small", base_ms=1.0, accuracy=0.8), gpu)
    cfg = SimConfig(workers=4, cores=16, gpu_workers=2, gpus=1)
    sim = Simulation(zoo, step_trace(20, 3000, (1, 3, 1)), "static", cfg)
    assert sim.pins == {"a": gpu[0].name}
    assert len(sim._vqs[gpu[0].name].replicas) == 2  # the peak wants more; there are 2 GPUs


def test_the_synthetic_gpu_class_has_the_measured_shape() -> None:
    """CPU variants identical with or without GPUs; two CUDA variants per architecture, on the
    GPU machine class, nearly flat in the batch size (H200: 0.065 ms at 1 row, 0.086 at 512)."""
    from infaas.sim.zoo import SYNTHETIC_GPU_MACHINE

    cpu_only, mixed = synthetic_zoo(2, 10, seed=1), synthetic_zoo(2, 10, seed=1, gpu=True)
    gpus = {n: vp for n, vp in mixed.variants.items() if vp[0].spec.hardware == "gpu"}
    assert {n: vp for n, vp in mixed.variants.items() if n not in gpus} == cpu_only.variants
    assert len(gpus) == 2 * len(cpu_only.tasks)
    for variant, profile in gpus.values():
        assert profile.machine == SYNTHETIC_GPU_MACHINE and variant.spec.max_batch == 128
        assert profile.latency_ms(128, "p50") < 3 * profile.latency_ms(1, "p50")
        cpu = (
            cpu_only.variants[f"{variant.architecture}/onnx-cpu-fp32-t1"][1]
            if (f"{variant.architecture}/onnx-cpu-fp32-t1" in cpu_only.variants)
            else None
        )
        if cpu is not None:
            assert profile.latency_ms(32, "p50") < cpu.latency_ms(32, "p50")
