"""Variant selection: which variant serves a query (DESIGN.md, "Selection").

Pure: plain data in (a `VariantTable` snapshot of variants and profiles, the query's rows and SLO,
and a `LiveState` of loaded variants, queueing delays and the path's measured overhead), a
`Decision` or an `Infeasible` out. No I/O and no clock; the router owns those.

The rule, for a query of `rows` rows:

1. feasible = accuracy >= target, ``rows <= max_batch``, predicted latency
   (profiled p99 at `rows` + the variant's queueing delay + the path's overhead) <= target, and
   cost per 1 000 rows at `rows` <= the cap;
2. among the feasible, the cheapest; ties go to a loaded variant, then to the lowest latency;
3. if the cheapest is cold but a loaded variant is feasible, serve on the cheapest loaded one and
   name the cheaper one in ``load_hint`` (a query never waits for a cold load it can avoid);
4. nothing feasible: an `Infeasible` naming the nearest alternatives.

Cost is evaluated at the query's own row count: the batcher may merge it into a larger batch, which
costs no more per row, so this is what the tenant will be charged at most.

Speed: a `VariantTable` is built once per scope (a task, or a pinned architecture) and caches, per
row count, the variants sorted by cost together with their Pareto frontier over (cost, latency,
accuracy). A variant off the frontier is dominated by a frontier variant that is at least as cheap,
fast and accurate, so it can only be the answer when its dominator is pushed out by live state
(its queue), and variants with live state are examined individually. So a decision walks a short
frontier plus the few live variants; only when a frontier variant is shut out by its own queue does
it fall back to the full cost-ordered scan, which is exact.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from infaas.types import SLO, Decision, Profile, Variant

__all__ = [
    "Alternative",
    "Infeasible",
    "LiveState",
    "VariantTable",
]

_INF = float("inf")


@dataclass(frozen=True, slots=True)
class LiveState:
    """What changes between queries: loaded variants, queueing delays, the path's overhead."""

    loaded: frozenset[str] = frozenset()
    queue_delay_ms: Mapping[str, float] = field(default_factory=dict)
    overhead_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Alternative:
    """A variant offered when nothing meets the targets, with the numbers that rule it out."""

    variant: str
    architecture: str
    accuracy: float
    predicted_latency_ms: float
    cost_usd_per_1k: float

    def as_dict(self) -> dict[str, float | str]:
        return {
            "variant": self.variant,
            "architecture": self.architecture,
            "accuracy": self.accuracy,
            "predicted_latency_ms": round(self.predicted_latency_ms, 4),
            "cost_usd_per_1k": self.cost_usd_per_1k,
        }


@dataclass(frozen=True, slots=True)
class Infeasible:
    """No variant meets the targets. `max_rows` is the largest batch any variant in scope accepts
    (0 when the scope has no servable variant), so a caller can tell "too many rows" apart."""

    reason: str
    rows: int
    max_rows: int
    fastest_at_accuracy: Alternative | None = None
    most_accurate_at_latency: Alternative | None = None
    cheapest_within_targets: Alternative | None = None

    @property
    def too_many_rows(self) -> bool:
        return self.rows > self.max_rows


class _View:
    """The variants that accept `rows` rows, with their numbers at that row count, sorted by
    (cost, latency, -accuracy, name), and the positions of the Pareto frontier in that order."""

    __slots__ = ("accs", "archs", "costs", "frontier", "lats", "load_ms", "names", "pos")

    def __init__(self, entries: Sequence[tuple[Variant, Profile]], rows: int) -> None:
        rowsets: list[tuple[float, float, float, str, str, float]] = []
        for variant, profile in entries:
            if variant.spec.max_batch < rows:
                continue
            rowsets.append(
                (
                    profile.cost_usd_per_1k(rows),
                    profile.latency_ms(rows, "p99"),
                    -profile.accuracy,
                    variant.name,
                    variant.architecture,
                    (profile.load_time_s + profile.warmup_s) * 1000.0,
                )
            )
        rowsets.sort()
        self.costs = [r[0] for r in rowsets]
        self.lats = [r[1] for r in rowsets]
        self.accs = [-r[2] for r in rowsets]
        self.names = [r[3] for r in rowsets]
        self.archs = [r[4] for r in rowsets]
        self.load_ms = [r[5] for r in rowsets]
        self.pos = {name: i for i, name in enumerate(self.names)}
        self.frontier = self._pareto()

    def _pareto(self) -> list[int]:
        # In cost order, a variant is dominated iff an earlier kept one is at least as accurate and
        # at least as fast. Kept variants are stored by accuracy so the check is one staircase
        # lookup: the fastest kept variant among those at least as accurate.
        kept: list[int] = []
        stair_acc: list[float] = []  # accuracies of kept variants, descending
        stair_lat: list[float] = []  # running minimum latency over that prefix
        for i in range(len(self.names)):
            acc, lat = self.accs[i], self.lats[i]
            # prefix of kept variants with accuracy >= acc
            lo, hi = 0, len(stair_acc)
            while lo < hi:
                mid = (lo + hi) // 2
                if stair_acc[mid] >= acc:
                    lo = mid + 1
                else:
                    hi = mid
            if lo > 0 and stair_lat[lo - 1] <= lat:
                continue
            kept.append(i)
            stair_acc.insert(lo, acc)
            stair_lat.insert(lo, lat if lo == 0 else min(lat, stair_lat[lo - 1]))
            for j in range(lo + 1, len(stair_lat)):
                if stair_lat[j] <= lat:
                    break
                stair_lat[j] = lat
        return kept


class VariantTable:
    """A selection snapshot over one scope (a task's variants, or one architecture's).

    Built from (variant, profile) pairs; pairs whose profile failed or has no points are left
    out, as they cannot be predicted. Immutable apart from its per-row-count cache."""

    def __init__(self, entries: Iterable[tuple[Variant, Profile]], cache_size: int = 64) -> None:
        self._entries: list[tuple[Variant, Profile]] = [
            (v, p) for v, p in entries if p.status == "ok" and p.points and v.name == p.variant
        ]
        self._by_name = {v.name: (v, p) for v, p in self._entries}
        self.max_rows = max((v.spec.max_batch for v, _ in self._entries), default=0)
        self._cache: OrderedDict[int, _View] = OrderedDict()
        self._cache_size = cache_size

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, variant: str) -> bool:
        return variant in self._by_name

    @property
    def variants(self) -> list[str]:
        return [v.name for v, _ in self._entries]

    def entry(self, variant: str) -> tuple[Variant, Profile] | None:
        return self._by_name.get(variant)

    def _view(self, rows: int) -> _View:
        view = self._cache.get(rows)
        if view is None:
            view = _View(self._entries, rows)
            self._cache[rows] = view
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return view

    # ---- the decision -------------------------------------------------------------------
    def select(self, rows: int, slo: SLO, live: LiveState) -> Decision | Infeasible:
        """The cheapest feasible variant for `rows` rows under `slo`, per the module's rule."""
        if rows < 1 or rows > self.max_rows:
            return self._infeasible(rows, slo, live)
        v = self._view(rows)
        lat_budget = slo.latency_ms - live.overhead_ms
        min_acc = slo.min_accuracy
        max_cost = _INF if slo.max_cost_usd_per_1k is None else slo.max_cost_usd_per_1k
        qd = live.queue_delay_ms
        costs, lats, accs, names = v.costs, v.lats, v.accs, v.names

        best = -1
        best_cost = _INF
        shadowed = False
        for i in v.frontier:
            c = costs[i]
            if c > max_cost or c > best_cost:
                break
            if accs[i] < min_acc:
                continue
            lat = lats[i]
            if lat > lat_budget:
                continue
            q = qd.get(names[i], 0.0) if qd else 0.0
            if lat + q > lat_budget:
                shadowed = True  # its queue, not its profile, rules it out
                continue
            if best < 0 or self._better(v, i, best, live):
                best, best_cost = i, c

        loaded_best = -1
        # Variants with live state are judged one by one: they may be off the frontier.
        for name in _live_names(live):
            i = v.pos.get(name, -1)
            if i < 0:
                continue
            c = costs[i]
            if c > max_cost or accs[i] < min_acc:
                continue
            if lats[i] + qd.get(name, 0.0) > lat_budget:
                continue
            if best < 0 or self._better(v, i, best, live):
                best, best_cost = i, c
            if name in live.loaded and (loaded_best < 0 or self._cheaper(v, i, loaded_best, live)):
                loaded_best = i

        if shadowed:
            best = self._full_scan(v, lat_budget, min_acc, max_cost, live)
        elif best >= 0 and qd.get(names[best], 0.0) > 0.0:
            # A queued frontier variant can lose the latency tie-break to an equally cheap variant
            # it dominates statically; those share its cost, so look only at that run of costs.
            lo, hi = bisect_left(costs, best_cost), bisect_right(costs, best_cost)
            for i in range(lo, hi):
                fits = accs[i] >= min_acc and lats[i] + qd.get(names[i], 0.0) <= lat_budget
                if fits and self._better(v, i, best, live):
                    best = i
        if best < 0:
            return self._infeasible(rows, slo, live)

        hint: str | None = None
        chosen = best
        if names[best] not in live.loaded and loaded_best >= 0:
            chosen, hint = loaded_best, names[best]
        return self._decision(v, chosen, live, hint)

    def predict(self, variant: str, rows: int, live: LiveState) -> Decision | None:
        """The decision for a pinned exact variant (no choice; its numbers), or None when it is
        not in this table or does not accept `rows` rows."""
        entry = self._by_name.get(variant)
        if entry is None or not 1 <= rows <= entry[0].spec.max_batch:
            return None
        v = self._view(rows)
        return self._decision(v, v.pos[variant], live, None, pinned=True)

    # ---- helpers ------------------------------------------------------------------------
    @staticmethod
    def _better(v: _View, i: int, j: int, live: LiveState) -> bool:
        """Is i preferred to j: cheaper; at equal cost loaded; then faster (queue included)."""
        if v.costs[i] != v.costs[j]:
            return v.costs[i] < v.costs[j]
        li, lj = v.names[i] in live.loaded, v.names[j] in live.loaded
        if li != lj:
            return li
        qd = live.queue_delay_ms
        return v.lats[i] + qd.get(v.names[i], 0.0) < v.lats[j] + qd.get(v.names[j], 0.0)

    @staticmethod
    def _cheaper(v: _View, i: int, j: int, live: LiveState) -> bool:
        """Among loaded variants: cheaper, then faster."""
        if v.costs[i] != v.costs[j]:
            return v.costs[i] < v.costs[j]
        qd = live.queue_delay_ms
        return v.lats[i] + qd.get(v.names[i], 0.0) < v.lats[j] + qd.get(v.names[j], 0.0)

    def _full_scan(
        self, v: _View, lat_budget: float, min_acc: float, max_cost: float, live: LiveState
    ) -> int:
        qd = live.queue_delay_ms
        best = -1
        for i in range(len(v.names)):
            c = v.costs[i]
            if c > max_cost or (best >= 0 and c > v.costs[best]):
                break
            if v.accs[i] < min_acc or v.lats[i] + qd.get(v.names[i], 0.0) > lat_budget:
                continue
            if best < 0 or self._better(v, i, best, live):
                best = i
        return best

    def _decision(
        self, v: _View, i: int, live: LiveState, hint: str | None, pinned: bool = False
    ) -> Decision:
        name = v.names[i]
        steady_ms = v.lats[i] + live.queue_delay_ms.get(name, 0.0) + live.overhead_ms
        cold = name not in live.loaded
        # Feasibility is judged at steady state; a cold variant's first query also waits for the
        # load, and the prediction says so rather than promise what it cannot keep.
        predicted = steady_ms + (v.load_ms[i] if cold else 0.0)
        if pinned:
            reason = "pinned variant"
        elif hint is not None:
            reason = f"cheapest loaded feasible variant; the cheaper {hint} is cold and will be loaded"
        else:
            reason = "cheapest feasible variant" + (" (cold: loads first)" if cold else "")
        return Decision.model_construct(
            variant=name,
            architecture=v.archs[i],
            predicted_latency_ms=predicted,
            cost_usd_per_1k=v.costs[i],
            accuracy=v.accs[i],
            reason=reason,
            load_hint=hint,
        )

    def _infeasible(self, rows: int, slo: SLO, live: LiveState) -> Infeasible:
        if rows < 1 or rows > self.max_rows:
            reason = (
                f"{rows} rows: no variant in scope is servable"
                if self.max_rows == 0
                else f"{rows} rows is more than any variant accepts (at most {self.max_rows})"
            )
            return Infeasible(reason=reason, rows=rows, max_rows=self.max_rows)
        v = self._view(rows)
        qd = live.queue_delay_ms
        fastest: tuple[float, float, int] | None = None
        accurate: tuple[float, float, float, int] | None = None
        cheapest: tuple[float, float, int] | None = None
        for i in range(len(v.names)):
            lat = v.lats[i] + qd.get(v.names[i], 0.0) + live.overhead_ms
            meets_acc = v.accs[i] >= slo.min_accuracy
            meets_lat = lat <= slo.latency_ms
            if meets_acc and (fastest is None or (lat, v.costs[i]) < fastest[:2]):
                fastest = (lat, v.costs[i], i)
            if meets_lat and (accurate is None or (-v.accs[i], v.costs[i], lat) < accurate[:3]):
                accurate = (-v.accs[i], v.costs[i], lat, i)
            if meets_acc and meets_lat and (cheapest is None or (v.costs[i], lat) < cheapest[:2]):
                cheapest = (v.costs[i], lat, i)

        def alt(i: int | None) -> Alternative | None:
            if i is None:
                return None
            return Alternative(
                variant=v.names[i],
                architecture=v.archs[i],
                accuracy=v.accs[i],
                predicted_latency_ms=v.lats[i] + qd.get(v.names[i], 0.0) + live.overhead_ms,
                cost_usd_per_1k=v.costs[i],
            )

        parts = [f"no variant meets latency <= {slo.latency_ms:g} ms and accuracy >= {slo.min_accuracy:g}"]
        if slo.max_cost_usd_per_1k is not None:
            parts.append(f"at cost <= {slo.max_cost_usd_per_1k:g} USD per 1k")
        return Infeasible(
            reason=" ".join(parts),
            rows=rows,
            max_rows=self.max_rows,
            fastest_at_accuracy=alt(fastest[2] if fastest else None),
            most_accurate_at_latency=alt(accurate[3] if accurate else None),
            cheapest_within_targets=alt(cheapest[2] if cheapest else None),
        )


def _live_names(live: LiveState) -> Iterable[str]:
    if not live.queue_delay_ms:
        return live.loaded
    return live.loaded.union(live.queue_delay_ms)
