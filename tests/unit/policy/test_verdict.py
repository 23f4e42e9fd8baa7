"""Admission's one verdict (`infaas.policy.verdict`): hypothesis properties over random tables,
live states and standings, and the rule's examples."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from infaas.policy.selection import Choice, LiveState, VariantTable
from infaas.policy.verdict import Query, Room, Standing, View, admit, over_share, room_for
from infaas.types import SLO
from tests.unit.policy.test_selection import make_entry

RUNTIMES = ("onnxruntime", "tensorflow")


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Query, View]:
    n = draw(st.integers(1, 5))
    entries = [
        make_entry(
            f"arch{i}",
            RUNTIMES[i % 2],
            1 + i % 2,
            accuracy=draw(st.floats(0.5, 1.0)),
            base_ms=draw(st.floats(0.1, 20.0)),
            per_row_ms=draw(st.floats(0.01, 2.0)),
            price_usd_per_s=draw(st.floats(1e-6, 1e-3)),
        )
        for i in range(n)
    ]
    table = VariantTable(entries)
    names = [v.name for v, _ in entries]
    loaded = frozenset(draw(st.sets(st.sampled_from(names))))
    delays = {name: draw(st.floats(0.0, 200.0)) for name in draw(st.sets(st.sampled_from(names)))}
    live = LiveState(loaded=loaded, queue_delay_ms=delays, overhead_ms=draw(st.floats(0.0, 30.0)))
    idle = LiveState(loaded=loaded, overhead_ms=min(live.overhead_ms, 1.0))
    query = Query(
        rows=draw(st.sampled_from([1, 8, 32])),
        slo=SLO(latency_ms=draw(st.floats(0.5, 300.0)), min_accuracy=draw(st.floats(0.0, 1.0))),
        elapsed_ms=draw(st.sampled_from([0.0, 0.0, 1.0, 500.0])),
        pinned=draw(st.sampled_from([None, None, *names])),
    )
    held = draw(st.integers(0, 10))
    standing = Standing(
        held, draw(st.integers(1, 10)), draw(st.booleans()), draw(st.sampled_from([0.0, 0.0, 0.2]))
    )
    return query, View(table, live, idle, standing=standing)


@settings(max_examples=300)
@given(scenes())
def test_no_query_is_admitted_with_a_predicted_tail_past_its_target(scene: tuple[Query, View]) -> None:
    query, view = scene
    verdict = admit(query, view)
    if verdict.kind == "admit" and query.pinned is None:
        assert verdict.choice is not None
        assert verdict.choice.predicted_latency_ms <= query.slo.latency_ms
        assert query.elapsed_ms < query.slo.latency_ms
    if verdict.admitted:
        assert view.standing is not None and not over_share(view.standing)


@settings(max_examples=300)
@given(scenes())
def test_a_query_within_its_share_and_its_deadline_that_a_loaded_variant_meets_is_admitted(
    scene: tuple[Query, View],
) -> None:
    query, view = scene
    if query.pinned is not None or query.elapsed_ms >= query.slo.latency_ms:
        return
    choice = view.table.select(query.rows, query.slo, view.live)
    verdict = admit(query, view)
    assert view.standing is not None
    if over_share(view.standing):
        assert verdict.kind == "over_share"
    elif not isinstance(choice, Choice):
        assert verdict.kind in ("infeasible", "busy", "cold")
    elif choice.variant in view.live.loaded:
        assert verdict.kind == "admit" and verdict.choice == choice


@given(scenes())
def test_a_query_no_idle_fleet_could_serve_is_a_422_never_a_429(scene: tuple[Query, View]) -> None:
    query, view = scene
    if query.pinned is not None or view.standing is None or over_share(view.standing):
        return
    idle = view.table.select(query.rows, query.slo, view.idle)
    verdict = admit(query, view)
    if not isinstance(idle, Choice):
        assert verdict.kind == "infeasible" and verdict.infeasible is not None
    else:
        assert verdict.kind != "infeasible"


def _table() -> tuple[VariantTable, str, str]:
    cheap = make_entry("a", "onnxruntime", 1, accuracy=0.9, base_ms=5.0, per_row_ms=0.1, price_usd_per_s=1e-5)
    dear = make_entry("b", "onnxruntime", 2, accuracy=0.9, base_ms=5.0, per_row_ms=0.1, price_usd_per_s=1e-3)
    return VariantTable([cheap, dear]), cheap[0].name, dear[0].name


def test_over_its_share_or_its_quota_a_tenant_is_refused_before_anything_else() -> None:
    table, cheap, _ = _table()
    live = LiveState(loaded=frozenset({cheap}))
    query = Query(1, SLO(latency_ms=100.0))
    assert admit(query, View(table, live, live, standing=Standing(4, 4, True))).kind == "over_share"
    assert admit(query, View(table, live, live, standing=Standing(3, 4, True))).kind == "admit"
    assert admit(query, View(table, live, live, standing=Standing(9, 4, False))).kind == "admit"
    assert admit(query, View(table, live, live, standing=Standing(0, 4, False, 0.1))).kind == "over_share"


def test_busy_is_a_429_unless_a_probe_is_due_and_past_the_deadline_a_504() -> None:
    table, cheap, _ = _table()
    live = LiveState(loaded=frozenset({cheap}), queue_delay_ms={cheap: 500.0})
    idle = LiveState(loaded=frozenset({cheap}))
    query = Query(1, SLO(latency_ms=100.0))
    assert admit(query, View(table, live, idle)).kind == "busy"
    assert admit(query, View(table, live, idle, probe_ready=frozenset({cheap}))).kind == "probe"
    queued = View(table, live, idle, queued=frozenset({cheap}), probe_ready=frozenset({cheap}))
    assert admit(query, queued).kind == "busy"  # its answers are on their way: no probe
    assert admit(query._replace(elapsed_ms=100.0), View(table, live, idle)).kind == "deadline"


def test_a_cold_variant_whose_load_outlasts_the_target_is_cold_and_a_busy_loaded_one_is_not_spilled() -> None:
    table, cheap, dear = _table()
    nothing = LiveState()
    assert admit(Query(1, SLO(latency_ms=10.0)), View(table, nothing, nothing)).kind == "cold"
    # `dear` idle and loaded beside a busy `cheap`, on a host whose one core `cheap` holds
    live = LiveState(loaded=frozenset({cheap, dear}), queue_delay_ms={cheap: 500.0})
    idle = LiveState(loaded=live.loaded)
    room = Room(
        cores=1.0,
        holds={cheap: 1.0, dear: 2.0},
        replicas={cheap: 1, dear: 1},
        remote=frozenset({cheap, dear}),
    )
    spill = View(table, live, idle, queued=frozenset({cheap}), running={cheap: 1}, room=room)
    assert admit(Query(1, SLO(latency_ms=100.0)), spill).kind == "busy"
    roomy = View(
        table,
        live,
        idle,
        queued=frozenset({cheap}),
        running={cheap: 1},
        room=Room(4.0, room.holds, room.replicas, room.remote),
    )
    assert admit(Query(1, SLO(latency_ms=100.0)), roomy).choice.variant == dear  # type: ignore[union-attr]
    assert room_for(dear, None, {cheap: 1}) and not room_for(dear, room, {cheap: 1})


def test_a_pinned_variant_is_served_beyond_its_target_unless_only_its_queue_is_in_the_way() -> None:
    table, cheap, _ = _table()
    live = LiveState(loaded=frozenset({cheap}), queue_delay_ms={cheap: 500.0})
    idle = LiveState(loaded=live.loaded)
    assert admit(Query(1, SLO(latency_ms=100.0), pinned=cheap), View(table, live, idle)).kind == "busy"
    assert admit(Query(1, SLO(latency_ms=1.0), pinned=cheap), View(table, live, idle)).kind == "admit"
    assert admit(Query(1, SLO(latency_ms=100.0), pinned="nope"), View(table, live, idle)).kind == "infeasible"
