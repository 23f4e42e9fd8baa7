"""The what-if advice: a tenant's recent queries replayed at other targets (issue 36)."""

from __future__ import annotations

import math

from infaas.advice import ACCURACY_STEP, LATENCY_FACTORS, RecentTraffic, advise, scaled
from infaas.metering import MeterRecord
from infaas.sim.engine import SimConfig, simulate
from infaas.sim.traces import Query
from infaas.sim.zoo import synthetic_zoo


def record(tenant: str, at_s: float, outcome: str = "ok", target_ms: float = 20.0) -> MeterRecord:
    return MeterRecord(
        tenant=tenant,
        task="task-0",
        variant="v",
        outcome=outcome,
        latency_ms=1.0,
        cost_pusd=1,
        rows=1,
        batch_rows=1,
        slo_met=outcome == "ok",
        at_s=at_s,
        error=None if outcome in ("ok", "slo_missed") else outcome,
        latency_target_ms=target_ms,
        min_accuracy=0.8,
    )


def test_recent_traffic_keeps_what_a_target_could_change_within_its_window() -> None:
    recent = RecentTraffic(window_s=60.0, max_queries=3)
    recent.listener(record("acme", 100.0))
    recent.listener(record("acme", 150.0, outcome="overloaded"))  # refused: it was sent
    recent.listener(record("acme", 151.0, outcome="invalid_input"))  # a bad request: not traffic
    recent.listener(record("acme", 152.0, target_ms=math.inf))  # no target to scale
    recent.listener(record("beta", 152.0))
    recent.listener(record("acme", 170.0, outcome="slo_missed"))
    sample = recent.sample("acme", now_s=200.0)
    assert [q.time_s for q in sample] == [0.0, 20.0]  # 100 s is out of the window; times from 0
    assert recent.sample("nobody", now_s=200.0) == []


def test_each_point_is_a_direct_simulation_of_its_targets() -> None:
    zoo = synthetic_zoo(2, 6, seed=1)
    task = sorted(set(zoo.tasks.values()))[0]
    fastest = min(
        p.latency_ms(1, "p99") for v, p in zoo.variants.values() if zoo.tasks[v.architecture] == task
    )
    queries = [Query(i * 0.01, "acme", task, 1, 3.0 * fastest + 1.0, 0.8) for i in range(400)]
    config = SimConfig(workers=1, cores=8)
    points = advise(zoo, queries, config)
    assert [(p.latency_factor, p.accuracy_delta) for p in points] == [
        (f, d) for d in (0.0, -ACCURACY_STEP) for f in LATENCY_FACTORS
    ]
    for p in points:
        direct = simulate(zoo, scaled(queries, p.latency_factor, p.accuracy_delta), "modelless", config).total
        assert p.charged_pusd == direct.charged_pusd
        assert p.in_slo_share == direct.in_slo / direct.queries
        assert p.variants == direct.by_variant and sum(p.variants.values()) == direct.answered
    cost = {(p.latency_factor, p.accuracy_delta): p.charged_pusd for p in points}
    assert cost[(4.0, 0.0)] <= cost[(1.0, 0.0)]  # a looser target never costs more here
