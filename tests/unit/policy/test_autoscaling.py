"""The autoscaling policy as a pure function: examples of each action, and properties over random
fleets (hypothesis): resources, accuracy targets, and no flapping at a constant load."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infaas.policy.autoscaling import (
    Action,
    AutoscalingConfig,
    FleetSnapshot,
    ScalingState,
    VariantState,
    decide,
    needed_replicas,
)

CONFIG = AutoscalingConfig(
    target_utilization=0.5, upscale_delay_s=2.0, downscale_delay_s=10.0, warm_ttl_s=100.0
)


def vs(name: str, **kw: object) -> VariantState:
    fields: dict[str, object] = {
        "task": "t",
        "architecture": "arch",
        "replicas": 1,
        "capacity_rows_per_s": 1000.0,
        "accuracy": 0.9,
        "price_usd_per_s": 1e-5,
    }
    fields.update(kw)
    return VariantState(name=name, **fields)  # type: ignore[arg-type]


def run(
    variants: list[VariantState], free_cpus: float, times: list[float], state: ScalingState | None = None
) -> tuple[list[list[Action]], ScalingState]:
    """`decide` at each time with the same snapshot; the actions of each round."""
    state = state or ScalingState()
    rounds = []
    for now in times:
        actions, state = decide(FleetSnapshot(tuple(variants), free_cpus), CONFIG, state, now)
        rounds.append(actions)
    return rounds, state


def test_replicates_only_after_the_wish_held_for_the_delay() -> None:
    hot = vs("a", arrival_rows_per_s=1500.0)
    rounds, _ = run([hot], free_cpus=8, times=[0.0, 1.0, 2.0])
    assert rounds[0] == [] and rounds[1] == []
    (action,) = rounds[2]
    assert (action.kind, action.before, action.replicas) == ("replicate", 1, 3)  # 1500 / (0.5 × 1000)
    assert "1500 rows/s needs 3 replica(s)" in action.reason


def test_a_burst_shorter_than_the_delay_changes_nothing() -> None:
    hot, calm = vs("a", arrival_rows_per_s=1500.0), vs("a", arrival_rows_per_s=400.0)
    _, state = run([hot], 8, [0.0])
    _, state = run([calm], 8, [1.0], state)
    assert state.wanting_since_s == {}
    rounds, _ = run([hot], 8, [2.5], state)  # the clock restarted at 2.5
    assert rounds == [[]]


def test_replicas_are_bounded_by_free_cpus_and_max_replicas() -> None:
    hot = vs("a", arrival_rows_per_s=5000.0, cpus=2.0)
    rounds, _ = run([hot], free_cpus=5, times=[0.0, 2.0])
    assert rounds[1][0].replicas == 3  # 2 more fit in 5 vCPUs at 2 each
    capped = replace(CONFIG, max_replicas=2)
    actions, _ = decide(FleetSnapshot((hot,), 5), capped, ScalingState({("a", "up"): -10.0}), 0.0)
    assert actions[0].replicas == 2


def test_pressure_adds_a_replica_even_when_the_rate_looks_fine() -> None:
    # The profile says one replica holds it, but queries are answered late: measured beats assumed.
    late = vs("a", arrival_rows_per_s=100.0, pressure_rows_per_s=20.0)
    rounds, state = run([late], 4, [0.0, 2.0])
    assert rounds[1][0].kind == "replicate" and rounds[1][0].replicas == 2
    assert "late or refused" in rounds[1][0].reason
    # The extra replica is kept while the rate stays, though the rate alone asks for one.
    calm = replace(late, replicas=2, pressure_rows_per_s=0.0)
    rounds, state = run([calm], 3, [30.0, 45.0, 60.0], state)
    assert all(r == [] for r in rounds)
    quiet = replace(calm, arrival_rows_per_s=40.0)  # below release_ratio × 100: the hold lapses
    rounds, _ = run([quiet], 3, [61.0, 62.0, 72.0], state)
    assert rounds[:2] == [[], []]  # the hold lapses at 61 s; the wish to remove starts at 62 s
    assert rounds[2][0].kind == "remove" and rounds[2][0].replicas == 1


def test_pressure_adds_replicas_only_up_to_its_headroom_over_the_rates_need() -> None:
    # 6 rows/s on replicas of 86 rows/s, late at the tail every round: more copies do not help
    # a miss that is not for want of them (the simulator ratcheted such a variant to 150).
    late = vs("a", capacity_rows_per_s=86.0, arrival_rows_per_s=6.0, pressure_rows_per_s=0.4)
    rounds, _ = run([late], 64, [0.0, 2.0])
    assert [(a.kind, a.replicas) for a in rounds[1]] == [("replicate", 2)]  # 2 × need (1)
    at_headroom = replace(late, replicas=2)
    rounds, _ = run([at_headroom], 64, [0.0, 2.0, 4.0])
    assert rounds == [[], [], []]
    # Where the rate needs 3 (120 rows/s at 50 % of 86), pressure may take it to 6, one at a time.
    busy = replace(late, arrival_rows_per_s=120.0, pressure_rows_per_s=5.0, replicas=5)
    rounds, _ = run([busy], 64, [0.0, 2.0])
    assert [(a.kind, a.replicas) for a in rounds[1]] == [("replicate", 6)]
    rounds, _ = run([replace(busy, replicas=6)], 64, [0.0, 2.0])
    assert rounds == [[], []]


def test_upgrades_when_the_cluster_cannot_give_enough_replicas() -> None:
    cheap = vs("a", capacity_rows_per_s=100.0, arrival_rows_per_s=600.0, price_usd_per_s=1e-6)
    fast = vs("b", replicas=0, capacity_rows_per_s=2000.0, cpus=2.0, price_usd_per_s=4e-6)
    rounds, _ = run([cheap, fast], free_cpus=2, times=[0.0, 2.0])
    (action,) = rounds[1]
    assert (action.kind, action.variant, action.replicas) == ("upgrade", "b", 1)
    assert "overflow goes to b" in action.reason


def test_upgrades_when_the_faster_variant_costs_less_than_the_copies() -> None:
    cheap = vs("a", capacity_rows_per_s=100.0, arrival_rows_per_s=1000.0, price_usd_per_s=1e-6)
    fast = vs("b", replicas=0, capacity_rows_per_s=5000.0, price_usd_per_s=2e-6)
    rounds, _ = run([cheap, fast], free_cpus=64, times=[0.0, 2.0])
    assert rounds[1][0].kind == "upgrade"  # 19 more copies at 1e-6 > one b at 2e-6
    pricey = replace(fast, price_usd_per_s=1e-4)
    rounds, _ = run([cheap, pricey], free_cpus=64, times=[0.0, 2.0])
    assert rounds[1][0].kind == "replicate"


def test_never_upgrades_to_a_variant_less_accurate_than_the_traffic_asks() -> None:
    cheap = vs(
        "a", capacity_rows_per_s=100.0, arrival_rows_per_s=600.0, required_accuracy=0.95, accuracy=0.96
    )
    sloppy = vs("b", replicas=0, capacity_rows_per_s=2000.0, accuracy=0.9)
    rounds, _ = run([cheap, sloppy], free_cpus=1, times=[0.0, 2.0])
    assert rounds[1][0].kind == "replicate"  # the one vCPU there is goes to a, not to b


def test_a_front_end_variant_is_upgraded_not_replicated() -> None:
    local = vs("a", remote=False, capacity_rows_per_s=100.0, arrival_rows_per_s=600.0)
    remote = vs("b", replicas=0, capacity_rows_per_s=2000.0)
    rounds, _ = run([local, remote], free_cpus=8, times=[0.0, 2.0])
    assert rounds[1][0].kind == "upgrade" and "front end" in rounds[1][0].reason
    rounds, _ = run([local], free_cpus=8, times=[0.0, 2.0])
    assert rounds[1] == []  # nowhere to go: nothing to do


def test_misses_on_a_front_end_variant_within_its_capacity_move_nothing() -> None:
    # 150 rows/s on a variant that holds 4 000 in the front end, answered late or refused: the
    # front end's own CPU is short, and a faster variant would run on the same front end.
    local = vs(
        "a", remote=False, capacity_rows_per_s=4000.0, arrival_rows_per_s=150.0, pressure_rows_per_s=150.0
    )
    faster = vs("b", replicas=0, capacity_rows_per_s=8000.0)
    rounds, _ = run([local, faster], free_cpus=8, times=[0.0, 2.0, 4.0])
    assert rounds == [[], [], []]
    # The same misses on a Ray replica still replicate it (a worker can be short at any rate).
    remote = vs("a", capacity_rows_per_s=4000.0, arrival_rows_per_s=150.0, pressure_rows_per_s=150.0)
    rounds, _ = run([remote, faster], free_cpus=8, times=[0.0, 2.0])
    assert [a.kind for a in rounds[1]] == ["replicate"]


def test_downgrades_after_the_hold_down_when_the_cheaper_variant_holds_the_load() -> None:
    cheap = vs("a", capacity_rows_per_s=1000.0, arrival_rows_per_s=300.0, price_usd_per_s=1e-6)
    fast = vs("b", capacity_rows_per_s=5000.0, arrival_rows_per_s=50.0, price_usd_per_s=5e-6)
    state = ScalingState(last_up_s={"t": 0.0})
    rounds, _ = run([cheap, fast], 0, [5.0, 11.0, 20.0, 21.0], state)
    assert rounds[0] == []  # within the hold-down after the scale-up
    assert rounds[1] == [] and rounds[2] == []  # the wish started at 11 s
    (action,) = rounds[3]
    assert (action.kind, action.variant, action.replicas) == ("downgrade", "b", 0)


def test_a_variant_taken_down_and_loaded_again_before_the_next_round_waits_a_fresh_hold_down() -> None:
    cheap = vs("a", capacity_rows_per_s=1000.0, arrival_rows_per_s=300.0, price_usd_per_s=1e-6)
    fast = vs("b", capacity_rows_per_s=5000.0, arrival_rows_per_s=50.0, price_usd_per_s=5e-6)
    # The router's load hint brings "b" back within the second: every snapshot shows it loaded.
    rounds, _ = run([cheap, fast], 0, [0.0, 10.0, 11.0, 15.0, 21.0])
    assert [[a.kind for a in actions] for actions in rounds] == [[], ["downgrade"], [], [], ["downgrade"]]


def test_no_downgrade_when_only_the_pricier_variant_meets_its_traffics_accuracy() -> None:
    cheap = vs("a", accuracy=0.9, arrival_rows_per_s=10.0, price_usd_per_s=1e-6)
    exact = vs("b", accuracy=0.99, arrival_rows_per_s=10.0, required_accuracy=0.98, price_usd_per_s=5e-6)
    rounds, _ = run([cheap, exact], 0, [0.0, 20.0])
    assert rounds == [[], []]


def test_scale_to_zero_keeps_the_warm_floor_while_its_architecture_is_active() -> None:
    idle = vs("pricey", price_usd_per_s=9e-6)
    floor = vs("cheap", floor=True, price_usd_per_s=1e-6)
    rounds, _ = run([idle, floor], 0, [0.0, 10.0])
    assert [(a.kind, a.variant) for a in rounds[1]] == [("unload", "pricey")]
    rounds, _ = run([floor], 0, [0.0, 10.0, 20.0])
    assert rounds == [[], [], []]
    stale = replace(floor, active=False)  # no traffic within warm_ttl_s
    rounds, _ = run([stale], 0, [0.0, 10.0])
    assert rounds[1][0].kind == "unload"


def test_an_evicted_floor_is_loaded_again() -> None:
    evicted = vs("cheap", floor=True, replicas=0)
    rounds, _ = run([evicted], 1, [0.0])
    assert rounds[0][0].kind == "keep_warm" and rounds[0][0].replicas == 1
    rounds, _ = run([evicted], 0, [0.0])  # no room: wait
    assert rounds == [[]]


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        AutoscalingConfig(target_utilization=0)
    with pytest.raises(ValueError):
        AutoscalingConfig(max_replicas=0)
    with pytest.raises(ValueError):
        AutoscalingConfig(release_ratio=1.0)
    assert needed_replicas(vs("a", arrival_rows_per_s=0.0), CONFIG) == 0


# ---- properties --------------------------------------------------------------------------------


@st.composite
def fleets(draw: st.DrawFn) -> FleetSnapshot:
    variants = []
    for i in range(draw(st.integers(1, 6))):
        arrival = draw(st.sampled_from([0.0, 10.0, 500.0, 5000.0]))
        variants.append(
            vs(
                f"v{i}",
                task=draw(st.sampled_from(["t1", "t2"])),
                architecture=draw(st.sampled_from(["a1", "a2"])),
                replicas=draw(st.integers(0, 3)),
                capacity_rows_per_s=draw(st.sampled_from([50.0, 400.0, 3000.0])),
                accuracy=draw(st.sampled_from([0.8, 0.9, 0.99])),
                price_usd_per_s=draw(st.sampled_from([1e-6, 4e-6, 2e-5])),
                cpus=draw(st.sampled_from([0.0, 1.0, 2.0])),
                gpus=draw(st.sampled_from([0.0, 0.0, 1.0])),
                remote=draw(st.booleans()),
                arrival_rows_per_s=arrival,
                pressure_rows_per_s=draw(st.sampled_from([0.0, arrival / 10])),
                required_accuracy=draw(st.sampled_from([0.0, 0.85, 0.95])) if arrival else 0.0,
                floor=draw(st.booleans()),
                active=draw(st.booleans()),
            )
        )
    return FleetSnapshot(
        tuple(variants), draw(st.sampled_from([0.0, 1.0, 3.0, 8.0])), draw(st.sampled_from([0.0, 1.0]))
    )


def _ripe(snap: FleetSnapshot) -> ScalingState:
    """Every wish has held for long: the policy acts on whatever it wants."""
    wishes = {(v.name, w): -1e6 for v in snap.variants for w in ("up", "down", "warm")}
    return ScalingState(wanting_since_s=wishes)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_never_an_action_that_exceeds_free_resources(snap: FleetSnapshot) -> None:
    actions, _ = decide(snap, CONFIG, _ripe(snap), 0.0)
    by_name = {v.name: v for v in snap.variants}
    added = [(by_name[a.variant], a.replicas - a.before) for a in actions if a.replicas > a.before]
    assert sum(v.cpus * n for v, n in added) <= snap.free_cpus + 1e-9
    assert sum(v.gpus * n for v, n in added) <= snap.free_gpus + 1e-9
    assert all(v.remote or (a.kind != "replicate") for a in actions for v in [by_name[a.variant]])
    assert len({a.task for a in actions}) == len(actions)  # one action per task and round


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_never_a_downgrade_below_the_accuracy_its_traffic_asks(snap: FleetSnapshot) -> None:
    actions, _ = decide(snap, CONFIG, _ripe(snap), 0.0)
    gone = {a.variant for a in actions if a.replicas == 0}
    for a in actions:
        if a.kind not in ("downgrade", "unload"):
            continue
        v = next(v for v in snap.variants if v.name == a.variant)
        left = [u for u in snap.variants if u.task == v.task and u.replicas > 0 and u.name not in gone]
        assert v.required_accuracy == 0.0 or any(u.accuracy >= v.required_accuracy for u in left)
        assert not (v.floor and v.active and v.arrival_rows_per_s > 0)


def _route(fleet: list[VariantState], rows_per_s: float) -> list[VariantState]:
    """A model of the router: the cheapest loaded variants fill up first; what none can take is
    refused, counted against the cheapest (the variant a refusal names)."""
    loaded = sorted((v for v in fleet if v.replicas > 0), key=lambda v: (v.usd_per_row, v.name))
    left, share = rows_per_s, {}
    for v in loaded:
        share[v.name] = min(left, v.capacity_rows_per_s * v.replicas)
        left -= share[v.name]
    out = []
    for v in fleet:
        arrival = share.get(v.name, 0.0)
        refused = left if loaded and v.name == loaded[0].name else 0.0
        out.append(replace(v, arrival_rows_per_s=arrival + refused, pressure_rows_per_s=refused))
    return out


@settings(max_examples=60, deadline=None)
@given(
    rows_per_s=st.sampled_from([0.0, 50.0, 300.0, 1200.0, 4000.0]),
    capacities=st.lists(st.sampled_from([80.0, 400.0, 2500.0]), min_size=1, max_size=3),
    total_cpus=st.sampled_from([2.0, 4.0, 16.0]),
)
def test_no_flapping_on_a_constant_load(
    rows_per_s: float, capacities: list[float], total_cpus: float
) -> None:
    fleet = [
        vs(
            f"v{i}",
            replicas=1 if i == 0 else 0,
            capacity_rows_per_s=c,
            price_usd_per_s=c * 1e-8 * (1 + i),
            floor=i == 0,
        )
        for i, c in enumerate(capacities)
    ]
    state, history = ScalingState(), {v.name: [v.replicas] for v in fleet}
    acted_at: list[float] = []
    for now in range(600):
        fleet = _route(fleet, rows_per_s)
        free = total_cpus - sum(v.replicas * v.cpus for v in fleet)
        actions, state = decide(FleetSnapshot(tuple(fleet), max(free, 0.0)), CONFIG, state, float(now))
        for a in actions:
            fleet = [replace(v, replicas=a.replicas) if v.name == a.variant else v for v in fleet]
            acted_at.append(now)
        for v in fleet:
            history[v.name].append(v.replicas)
    assert not acted_at or acted_at[-1] < 300, f"still acting at {acted_at[-1]} s: {acted_at}"
    for name, counts in history.items():
        steps = [b - a for a, b in itertools.pairwise(counts) if b != a]
        reversals = sum(1 for s, t in itertools.pairwise(steps) if (s > 0) != (t > 0))
        assert reversals <= 1, f"{name} flapped: {counts[:: max(1, len(counts) // 40)]}"
    assert math.isfinite(sum(v.replicas for v in fleet))


@settings(max_examples=200, deadline=None)
@given(
    fleets(), st.sets(st.sampled_from(["replicate", "remove", "upgrade", "downgrade", "unload", "keep_warm"]))
)
def test_never_an_action_of_a_kind_it_is_not_allowed(snap: FleetSnapshot, allowed: set[str]) -> None:
    config = replace(CONFIG, actions=frozenset(allowed))
    actions, _ = decide(snap, config, _ripe(snap), 0.0)
    assert {a.kind for a in actions} <= allowed
