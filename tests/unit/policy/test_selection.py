"""Variant selection: hypothesis properties against a brute-force reading of the rule, and examples."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from infaas.policy.selection import Choice, Infeasible, LiveState, VariantTable
from infaas.types import SLO, LatencyPoint, MachineInfo, Parity, Profile, Variant, VariantSpec

MACHINE = MachineInfo(cpu_model="test", cores=2)
BATCHES = (1, 8, 32)


def make_entry(
    arch: str,
    runtime: str,
    threads: int,
    *,
    accuracy: float,
    base_ms: float,
    per_row_ms: float,
    price_usd_per_s: float,
    max_batch: int = 32,
    load_time_s: float = 0.05,
) -> tuple[Variant, Profile]:
    spec = VariantSpec(architecture=arch, runtime=runtime, threads=threads, max_batch=max_batch)  # type: ignore[arg-type]
    variant = Variant(
        spec=spec, artifact="a", sha256="0", parity=Parity(top1_agreement=1, max_abs_diff=0, samples=1)
    )
    points = tuple(
        LatencyPoint(
            batch=b,
            p50_ms=base_ms + per_row_ms * b,
            p95_ms=1.2 * (base_ms + per_row_ms * b),
            p99_ms=1.5 * (base_ms + per_row_ms * b),
            mean_ms=base_ms + per_row_ms * b,
            throughput_qps=1000 * b / (base_ms + per_row_ms * b),
            samples=100,
            stable=True,
            stop_reason="stable",
            cost_usd_per_1k=0.0,
        )
        for b in BATCHES
        if b <= max_batch
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


@dataclass(frozen=True)
class Numbers:
    name: str
    cost: float
    latency_ms: float  # predicted: profile p99 + queue + overhead
    budget_ms: float  # the latency target's room for profile p99 + queue: target - overhead
    run_ms: float  # profile p99 + queue
    accuracy: float
    supports: bool
    loaded: bool


def numbers(entries: list[tuple[Variant, Profile]], rows: int, live: LiveState, slo: SLO) -> list[Numbers]:
    """The rule's inputs per variant. Latency is tested as ``p99 + queue <= target - overhead``
    (one expression, so float rounding cannot split the decision from its alternatives)."""
    out = []
    for v, p in entries:
        supports = rows <= v.spec.max_batch
        run_ms = (
            p.latency_ms(rows, "p99") + live.queue_delay_ms.get(v.name, 0.0) if supports else float("inf")
        )
        out.append(
            Numbers(
                name=v.name,
                budget_ms=slo.latency_ms - live.overhead_ms,
                run_ms=run_ms,
                cost=p.cost_usd_per_1k(rows) if supports else float("inf"),
                latency_ms=(
                    p.latency_ms(rows, "p99") + live.queue_delay_ms.get(v.name, 0.0) + live.overhead_ms
                )
                if supports
                else float("inf"),
                accuracy=p.accuracy,
                supports=supports,
                loaded=v.name in live.loaded,
            )
        )
    return out


def feasible(n: Numbers, slo: SLO) -> bool:
    cap = float("inf") if slo.max_cost_usd_per_1k is None else slo.max_cost_usd_per_1k
    return n.supports and n.accuracy >= slo.min_accuracy and n.run_ms <= n.budget_ms and n.cost <= cap


RUNTIMES = ("onnxruntime", "tensorflow", "sklearn")


@st.composite
def zoo(draw: st.DrawFn) -> list[tuple[Variant, Profile]]:
    count = draw(st.integers(min_value=1, max_value=14))
    entries = []
    seen = set()
    for _ in range(count):
        arch = draw(st.sampled_from(["a", "b", "c"]))
        runtime = draw(st.sampled_from(RUNTIMES))
        threads = draw(st.integers(min_value=1, max_value=3))
        if (arch, runtime, threads) in seen:
            continue
        seen.add((arch, runtime, threads))
        entries.append(
            make_entry(
                arch,
                runtime,
                threads,
                accuracy=draw(st.sampled_from([0.8, 0.9, 0.95, 0.97, 0.99])),
                base_ms=draw(st.sampled_from([0.5, 1.0, 2.0, 4.0])),
                per_row_ms=draw(st.sampled_from([0.0, 0.05, 0.2])),
                price_usd_per_s=draw(st.sampled_from([1e-5, 2e-5, 4e-5])),
                max_batch=draw(st.sampled_from([1, 8, 32])),
            )
        )
    return entries


@st.composite
def live_state(draw: st.DrawFn, names: list[str]) -> LiveState:
    loaded = draw(st.frozensets(st.sampled_from(names))) if names else frozenset()
    queued = (
        draw(st.dictionaries(st.sampled_from(names), st.sampled_from([0.0, 0.5, 2.0, 6.0]))) if names else {}
    )
    return LiveState(loaded=loaded, queue_delay_ms=queued, overhead_ms=draw(st.sampled_from([0.0, 0.7, 1.0])))


slos = st.builds(
    SLO,
    latency_ms=st.sampled_from([0.5, 1.0, 2.0, 2.5, 3.0, 5.0, 8.0, 20.0]),
    min_accuracy=st.sampled_from([0.0, 0.85, 0.95, 0.97, 0.99, 1.0]),
    max_cost_usd_per_1k=st.one_of(st.none(), st.sampled_from([1e-5, 5e-5, 2e-4])),
)


@settings(max_examples=600, deadline=None)
@given(data=st.data(), entries=zoo(), slo=slos, rows=st.sampled_from([1, 2, 8, 20, 32, 33]))
def test_choice_is_feasible_and_none_feasible_is_cheaper(
    data: st.DataObject, entries: list[tuple[Variant, Profile]], slo: SLO, rows: int
) -> None:
    live = data.draw(live_state([v.name for v, _ in entries]))
    table = VariantTable(entries)
    # Ask twice with other row counts in between: the per-row-count cache must not leak.
    table.select(1, slo, live)
    result = table.select(rows, slo, live)
    nums = {n.name: n for n in numbers(entries, rows, live, slo)}
    feas = [n for n in nums.values() if feasible(n, slo)]
    if not feas:
        assert isinstance(result, Infeasible)
        return
    assert isinstance(result, Choice)
    chosen = nums[result.variant]
    assert feasible(chosen, slo)
    min_cost = min(n.cost for n in feas)
    loaded_feas = [n for n in feas if n.loaded]
    if result.load_hint is None:
        # cheapest feasible; ties: loaded first, then lowest latency
        assert chosen.cost == min_cost
        ties = [n for n in feas if n.cost == min_cost]
        if any(n.loaded for n in ties):
            assert chosen.loaded
        same = [n for n in ties if n.loaded == chosen.loaded]
        assert chosen.latency_ms == min(n.latency_ms for n in same)
        # never wait for a cold load when a loaded feasible variant exists
        assert chosen.loaded or not loaded_feas
    else:
        hint = nums[result.load_hint]
        assert feasible(hint, slo) and not hint.loaded and hint.cost == min_cost
        assert not any(n.loaded and n.cost == min_cost for n in feas)
        assert chosen.loaded
        assert chosen.cost == min(n.cost for n in loaded_feas)
        assert chosen.latency_ms == min(n.latency_ms for n in loaded_feas if n.cost == chosen.cost)
    assert abs(result.cost_usd_per_1k - chosen.cost) <= 1e-18
    assert result.accuracy == chosen.accuracy


@settings(max_examples=400, deadline=None)
@given(data=st.data(), entries=zoo(), slo=slos, rows=st.sampled_from([1, 8, 32, 33]))
def test_infeasible_names_the_nearest_alternatives(
    data: st.DataObject, entries: list[tuple[Variant, Profile]], slo: SLO, rows: int
) -> None:
    live = data.draw(live_state([v.name for v, _ in entries]))
    result = VariantTable(entries).select(rows, slo, live)
    nums = {n.name: n for n in numbers(entries, rows, live, slo)}
    if isinstance(result, Choice):
        return
    assert not any(feasible(n, slo) for n in nums.values())
    supported = [n for n in nums.values() if n.supports]
    assert result.max_rows == max(v.spec.max_batch for v, _ in entries)
    assert result.too_many_rows == (not supported)
    at_acc = [n for n in supported if n.accuracy >= slo.min_accuracy]
    at_lat = [n for n in supported if n.run_ms <= n.budget_ms]
    if at_acc:
        alt = result.fastest_at_accuracy
        assert alt is not None
        assert nums[alt.variant].accuracy >= slo.min_accuracy
        assert alt.predicted_latency_ms == min(n.latency_ms for n in at_acc) == nums[alt.variant].latency_ms
    else:
        assert result.fastest_at_accuracy is None
    if at_lat:
        alt = result.most_accurate_at_latency
        assert alt is not None
        assert nums[alt.variant].run_ms <= nums[alt.variant].budget_ms
        assert alt.accuracy == max(n.accuracy for n in at_lat)
    else:
        assert result.most_accurate_at_latency is None
    both = [n for n in at_acc if n.run_ms <= n.budget_ms]
    if both:
        # only the cost cap stood in the way: name the cheapest that meets the other targets
        alt = result.cheapest_within_targets
        assert alt is not None and alt.cost_usd_per_1k == min(n.cost for n in both)


def test_cheapest_wins_and_a_cold_one_is_hinted_not_waited_for() -> None:
    cheap = make_entry(
        "m", "onnxruntime", 1, accuracy=0.97, base_ms=1.0, per_row_ms=0.0, price_usd_per_s=1e-5
    )
    dear = make_entry("m", "tensorflow", 1, accuracy=0.97, base_ms=2.0, per_row_ms=0.0, price_usd_per_s=1e-5)
    table = VariantTable([cheap, dear])
    slo = SLO(latency_ms=10, min_accuracy=0.9)
    cold = table.select(1, slo, LiveState())
    assert isinstance(cold, Choice) and cold.variant == cheap[0].name and cold.load_hint is None
    # the prediction for a cold variant includes its load
    assert cold.predicted_latency_ms == 1.5 + 50.0
    warm_dear = table.select(1, slo, LiveState(loaded=frozenset({dear[0].name})))
    assert isinstance(warm_dear, Choice)
    assert warm_dear.variant == dear[0].name and warm_dear.load_hint == cheap[0].name
    assert warm_dear.predicted_latency_ms == 3.0


def test_queue_and_overhead_count_against_the_latency_target() -> None:
    cheap = make_entry(
        "m", "onnxruntime", 1, accuracy=0.97, base_ms=2.0, per_row_ms=0.0, price_usd_per_s=1e-5
    )
    fast = make_entry("m", "onnxruntime", 2, accuracy=0.97, base_ms=1.0, per_row_ms=0.0, price_usd_per_s=4e-5)
    table = VariantTable([cheap, fast])
    slo = SLO(latency_ms=4.0, min_accuracy=0.9)
    both = frozenset({cheap[0].name, fast[0].name})
    assert table.select(1, slo, LiveState(loaded=both)).variant == cheap[0].name  # type: ignore[union-attr]
    queued = LiveState(loaded=both, queue_delay_ms={cheap[0].name: 2.0})
    assert table.select(1, slo, queued).variant == fast[0].name  # type: ignore[union-attr]
    slow_path = LiveState(loaded=both, overhead_ms=1.5)
    assert table.select(1, slo, slow_path).variant == fast[0].name  # type: ignore[union-attr]


def test_too_many_rows_and_pinned_variant() -> None:
    small = make_entry(
        "m", "onnxruntime", 1, accuracy=0.9, base_ms=1.0, per_row_ms=0.1, price_usd_per_s=1e-5, max_batch=8
    )
    table = VariantTable([small])
    result = table.select(9, SLO(latency_ms=100), LiveState())
    assert isinstance(result, Infeasible) and result.too_many_rows and result.max_rows == 8
    pinned = table.predict(small[0].name, 8, LiveState(loaded=frozenset({small[0].name})))
    assert pinned is not None and pinned.reason == "pinned variant"
    assert table.predict(small[0].name, 9, LiveState()) is None
    assert table.predict("nope", 1, LiveState()) is None


def test_failed_profiles_are_not_candidates() -> None:
    v, p = make_entry("m", "onnxruntime", 1, accuracy=0.9, base_ms=1.0, per_row_ms=0.1, price_usd_per_s=1e-5)
    table = VariantTable([(v, p.model_copy(update={"status": "failed", "points": ()}))])
    assert len(table) == 0
    result = table.select(1, SLO(latency_ms=100), LiveState())
    assert isinstance(result, Infeasible) and result.max_rows == 0


def test_a_dominated_variant_serves_when_its_dominator_is_queued_out() -> None:
    # u dominates j statically (cheaper, faster, as accurate); k is the dear, fast frontier variant.
    u = make_entry("m", "onnxruntime", 1, accuracy=0.97, base_ms=1.0, per_row_ms=0.0, price_usd_per_s=1e-5)
    j = make_entry("m", "tensorflow", 1, accuracy=0.97, base_ms=1.5, per_row_ms=0.0, price_usd_per_s=1e-5)
    k = make_entry("m", "sklearn", 1, accuracy=0.97, base_ms=0.5, per_row_ms=0.0, price_usd_per_s=4e-5)
    table = VariantTable([u, j, k])
    slo = SLO(latency_ms=4.0, min_accuracy=0.9)
    assert table.select(1, slo, LiveState()).variant == u[0].name  # type: ignore[union-attr]
    queued = LiveState(queue_delay_ms={u[0].name: 5.0})
    assert table.select(1, slo, queued).variant == j[0].name  # type: ignore[union-attr]


def test_equal_cost_goes_to_the_lower_predicted_latency_queue_included() -> None:
    u = make_entry("m", "onnxruntime", 1, accuracy=0.99, base_ms=1.0, per_row_ms=0.0, price_usd_per_s=1e-5)
    j = make_entry("m", "tensorflow", 1, accuracy=0.97, base_ms=1.0, per_row_ms=0.0, price_usd_per_s=1e-5)
    table = VariantTable([u, j])
    slo = SLO(latency_ms=10.0, min_accuracy=0.9)
    assert table.select(1, slo, LiveState(queue_delay_ms={u[0].name: 1.0})).variant == j[0].name  # type: ignore[union-attr]
    # but a loaded variant wins a cost tie regardless of latency
    loaded_u = LiveState(loaded=frozenset({u[0].name}), queue_delay_ms={u[0].name: 1.0})
    assert table.select(1, slo, loaded_u).variant == u[0].name  # type: ignore[union-attr]
