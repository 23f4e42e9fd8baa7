"""Variant selection: which variant serves a query (DESIGN.md, "Selection").

Pure: plain data in (a `VariantTable` snapshot of variants and profiles, the query's rows and SLO,
and a `LiveState` of loaded variants, queueing delays and the path's measured overhead), a
`Choice` (a `Decision`'s fields) or an `Infeasible` out. No I/O and no clock; the router owns those.

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
fast and accurate, so it can only be the answer when it ties on cost (loaded ones win ties) or
when its dominator is pushed out by its queue. So a decision walks a short frontier, looks at the
run of equal costs, and at the loaded variants only when the cheapest is cold; only when a frontier
variant is shut out by its own queue does it fall back to the full cost-ordered scan (exact).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from infaas.types import SLO, Decision, Profile, Variant

__all__ = [
    "Alternative",
    "Choice",
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


class Choice(NamedTuple):
    """The policy's answer: a `Decision`'s fields as a tuple, because building the pydantic model
    costs ~4 µs, as much as the decision itself (`to_decision` builds it when wanted)."""

    variant: str
    architecture: str
    predicted_latency_ms: float
    cost_usd_per_1k: float
    accuracy: float
    reason: str
    load_hint: str | None

    def to_decision(self) -> Decision:
        return Decision(**self._asdict())


class Alternative(NamedTuple):
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


class Infeasible(NamedTuple):
    """No variant meets the targets. `max_rows` is the largest batch any variant in scope accepts
    (0 when the scope has no servable variant), so a caller can tell "too many rows" apart.
    (Tuples, not dataclasses: an infeasible answer must be as cheap to make as a feasible one.)"""

    rows: int
    max_rows: int
    slo: SLO
    fastest_at_accuracy: Alternative | None = None
    most_accurate_at_latency: Alternative | None = None
    cheapest_within_targets: Alternative | None = None

    @property
    def too_many_rows(self) -> bool:
        return self.rows > self.max_rows

    @property
    def reason(self) -> str:
        if self.rows < 1 or self.rows > self.max_rows:
            if self.max_rows == 0:
                return f"{self.rows} rows: no variant in scope is servable"
            return f"{self.rows} rows is more than any variant accepts (at most {self.max_rows})"
        slo = self.slo
        text = f"no variant meets latency <= {slo.latency_ms:g} ms and accuracy >= {slo.min_accuracy:g}"
        if slo.max_cost_usd_per_1k is not None:
            text += f" at cost <= {slo.max_cost_usd_per_1k:g} USD per 1k"
        return text


class _View:
    """The variants that accept `rows` rows, with their numbers at that row count, sorted by
    (cost, latency, -accuracy, name), and the positions of the Pareto frontier in that order."""

    __slots__ = (
        "_alt_index",
        "_loaded_key",
        "_loaded_order",
        "accs",
        "archs",
        "costs",
        "frontier",
        "lats",
        "load_ms",
        "names",
        "pos",
    )

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
        self._alt_index: _AltIndex | None = None
        self._loaded_key: frozenset[str] | None = None
        self._loaded_order: list[int] = []

    def loaded_by_cost(self, loaded: frozenset[str]) -> list[int]:
        """Positions of the loaded variants in cost order; remembered for the last loaded set
        (the router reuses one set object while the fleet does not change)."""
        if loaded is not self._loaded_key:
            pos = self.pos
            self._loaded_order = sorted(pos[n] for n in loaded if n in pos)
            self._loaded_key = loaded
        return self._loaded_order

    @property
    def alt_index(self) -> _AltIndex:
        """Built on the first infeasible query at this row count."""
        if self._alt_index is None:
            self._alt_index = _AltIndex(self)
        return self._alt_index

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


class _AltIndex:
    """Prefix indexes for the alternatives of an infeasible query, in O(log n) at zero queueing:

    - by accuracy (descending): the fastest (then cheapest) variant among the k most accurate;
    - by latency (ascending): the most accurate (then cheapest, fastest) among the k fastest."""

    __slots__ = ("by_acc_fastest", "by_lat_accurate", "lats_sorted", "neg_accs_sorted")

    def __init__(self, v: _View) -> None:
        n = len(v.names)
        by_acc = sorted(range(n), key=lambda i: -v.accs[i])
        self.neg_accs_sorted = [-v.accs[i] for i in by_acc]
        self.by_acc_fastest: list[int] = []
        best = -1
        for i in by_acc:
            if best < 0 or (v.lats[i], v.costs[i]) < (v.lats[best], v.costs[best]):
                best = i
            self.by_acc_fastest.append(best)
        by_lat = sorted(range(n), key=lambda i: v.lats[i])
        self.lats_sorted = [v.lats[i] for i in by_lat]
        self.by_lat_accurate: list[int] = []
        best = -1
        for i in by_lat:
            if best < 0 or (-v.accs[i], v.costs[i], v.lats[i]) < (-v.accs[best], v.costs[best], v.lats[best]):
                best = i
            self.by_lat_accurate.append(best)

    def fastest_at_accuracy(self, min_acc: float) -> int:
        k = bisect_right(self.neg_accs_sorted, -min_acc)
        return self.by_acc_fastest[k - 1] if k else -1

    def most_accurate_at_latency(self, lat_budget_ms: float) -> int:
        k = bisect_right(self.lats_sorted, lat_budget_ms)
        return self.by_lat_accurate[k - 1] if k else -1


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

    def prepare(self, row_counts: Iterable[int]) -> None:
        """Build the views (and their alternative indexes) for these row counts now, not on the
        first query that needs them (~10 ms per row count per 4 000 variants)."""
        for rows in row_counts:
            if 1 <= rows <= self.max_rows:
                _ = self._view(rows).alt_index

    # ---- the decision -------------------------------------------------------------------
    def select(self, rows: int, slo: SLO, live: LiveState) -> Choice | Infeasible:
        """The cheapest feasible variant for `rows` rows under `slo`, per the module's rule."""
        if rows < 1 or rows > self.max_rows:
            return self._infeasible(rows, slo, live)
        v = self._view(rows)
        max_cost = _INF if slo.max_cost_usd_per_1k is None else slo.max_cost_usd_per_1k
        best, loaded_best = self._search(
            v, slo.latency_ms - live.overhead_ms, slo.min_accuracy, max_cost, live
        )
        if best < 0:
            return self._infeasible(rows, slo, live)

        names = v.names
        hint: str | None = None
        chosen = best
        if names[best] not in live.loaded and loaded_best >= 0:
            chosen, hint = loaded_best, names[best]
        return self._decision(v, chosen, live, hint)

    def _search(
        self, v: _View, lat_budget: float, min_acc: float, max_cost: float, live: LiveState
    ) -> tuple[int, int]:
        """(cheapest feasible, cheapest loaded feasible), positions in `v` or -1."""
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

        if shadowed:
            best = self._full_scan(v, lat_budget, min_acc, max_cost, live)
        elif best >= 0:
            # Unless a queue shut a frontier variant out, nothing is cheaper than the frontier's
            # answer (every variant is dominated by a frontier one at least as cheap); only its
            # equally cheap peers, which may be loaded or less queued, can win the tie-break.
            lo, hi = bisect_left(costs, best_cost), bisect_right(costs, best_cost)
            if hi - lo > 1:
                for i in range(lo, hi):
                    fits = accs[i] >= min_acc and lats[i] + qd.get(names[i], 0.0) <= lat_budget
                    if fits and self._better(v, i, best, live):
                        best = i

        loaded_best = -1
        if best >= 0 and names[best] not in live.loaded:
            # The cheapest is cold: the cheapest loaded feasible variant serves instead, if any
            # (ties on cost to the lowest predicted latency).
            for i in v.loaded_by_cost(live.loaded):
                c = costs[i]
                if c > max_cost or (loaded_best >= 0 and c > costs[loaded_best]):
                    break
                if accs[i] < min_acc or lats[i] + qd.get(names[i], 0.0) > lat_budget:
                    continue
                if loaded_best < 0 or self._cheaper(v, i, loaded_best, live):
                    loaded_best = i
        return best, loaded_best

    def predict(self, variant: str, rows: int, live: LiveState) -> Choice | None:
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

    def _decision(self, v: _View, i: int, live: LiveState, hint: str | None, pinned: bool = False) -> Choice:
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
        return Choice(name, v.archs[i], predicted, v.costs[i], v.accs[i], reason, hint)

    def _infeasible(self, rows: int, slo: SLO, live: LiveState) -> Infeasible:
        if rows < 1 or rows > self.max_rows:
            return Infeasible(rows, self.max_rows, slo)
        v = self._view(rows)
        qd = live.queue_delay_ms
        index = v.alt_index
        fast_i = index.fastest_at_accuracy(slo.min_accuracy)
        # Every latency test is ``profile + queue <= target - overhead``, one expression, so that
        # the decision and its alternatives agree to the last bit at the boundary.
        lat_budget = slo.latency_ms - live.overhead_ms
        acc_i = index.most_accurate_at_latency(lat_budget)
        # The indexes assume no queueing; a queue only slows a variant down, so an answer without
        # a queue of its own is exact. Otherwise scan.
        if (fast_i >= 0 and qd.get(v.names[fast_i], 0.0) > 0.0) or (
            acc_i >= 0 and qd.get(v.names[acc_i], 0.0) > 0.0
        ):
            fast_i, acc_i = self._alternatives_scan(v, slo, live)
        cheap_i = -1
        if slo.max_cost_usd_per_1k is not None:
            cheap_i = self._search(v, lat_budget, slo.min_accuracy, _INF, live)[0]

        def alt(i: int) -> Alternative | None:
            if i < 0:
                return None
            name = v.names[i]
            predicted = v.lats[i] + qd.get(name, 0.0) + live.overhead_ms
            return Alternative(name, v.archs[i], v.accs[i], predicted, v.costs[i])

        return Infeasible(rows, self.max_rows, slo, alt(fast_i), alt(acc_i), alt(cheap_i))

    @staticmethod
    def _alternatives_scan(v: _View, slo: SLO, live: LiveState) -> tuple[int, int]:
        qd = live.queue_delay_ms
        fastest: tuple[float, float, int] | None = None
        accurate: tuple[float, float, float, int] | None = None
        lat_budget = slo.latency_ms - live.overhead_ms
        for i in range(len(v.names)):
            lat = v.lats[i] + qd.get(v.names[i], 0.0)
            meets_acc = v.accs[i] >= slo.min_accuracy
            meets_lat = lat <= lat_budget
            if meets_acc and (fastest is None or (lat, v.costs[i]) < fastest[:2]):
                fastest = (lat, v.costs[i], i)
            if meets_lat and (accurate is None or (-v.accs[i], v.costs[i], lat) < accurate[:3]):
                accurate = (-v.accs[i], v.costs[i], lat, i)
        return (fastest[2] if fastest else -1), (accurate[3] if accurate else -1)
