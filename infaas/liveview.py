"""The live half of admission's view (`policy.verdict.View`), gathered once per query from the
worker pool and the batcher: which variants are loaded, each one's queueing delay for this
tenant's query, the path's measured overhead (`infaas.overhead`), the slowdown its batches
measure, which variants are due a probe, and the host's room for a spill. The router owns the
snapshot of variants and profiles and passes it in; this module owns the overhead estimates."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from infaas.overhead import DEFAULT_OVERHEAD_MS, OverheadTracker
from infaas.policy.selection import LiveState, VariantTable
from infaas.policy.verdict import Room, View
from infaas.snapshot import Catalog
from infaas.types import Profile, Variant
from infaas.workers.base import Batcher
from infaas.workers.placement import Placement

__all__ = ["PROBE_INTERVAL_S", "LiveView", "floor_tracker", "head_tracker"]

PROBE_INTERVAL_S = 0.02
"""While queries are refused as overloaded and the variant is idle, one per this interval is
served anyway (a probe): its answer is what lets the overhead estimate see a stall is over."""


def floor_tracker() -> OverheadTracker:
    """The host's floor of one path (`LiveView.observe_floor`): the p99 over the last 512 answers
    admitted into a quiet front end (its event loop on time, less than half its limit in use,
    nothing ahead of the query, nothing merged into its batch), within two minutes, once 64 are
    there; held, not decayed, while none come (an overload admits no quiet answers, and the floor
    is what an idle fleet would do). Under a flood a query with nothing ahead of it still waits
    for the event loop: learned then, the floor rose to 84 ms and every 60 ms target was a 422.
    A stall is not let go here (`clear_run` 0): the floor is the host's tail over minutes, stalls
    included, which is what it can promise."""
    return OverheadTracker(
        window=512,
        max_age_s=120.0,
        short_age_s=120.0,
        short_min_samples=64,
        min_samples=64,
        decay_s=3600.0,
        clear_run=0,
    )


def head_tracker() -> OverheadTracker:
    """What answers to queries that found none of their tenant's rows waiting for the variant took
    beyond their profiled run, queue and slowdown included (`LiveView.observe`): the p99 over the
    last 256 of the last second, once 20 are there (a tenant at 20 q/s has them). Such a query lands
    near the head of the fair queue whatever the others have queued, and waits for the batches
    running then; a query that finds none of its tenant's rows waiting is priced by this where
    it is below the usual prediction (the predicted queue plus the path's overhead).

    Why: under a 10x flood (bench_fairness, 2026-12-07) the predicted wait of a quiet tenant's
    query swung between 0 and ~30 ms with where the running batch was, while the wait it got was
    steady; each answer's residual over its prediction held the swing once, and the prediction
    added the residual's p99 (the path's, nearly all the flood's answers) to a predicted queue
    again: its queries were refused as busy at 59-63 ms predicted while its admitted answers had a
    p99 of 51 ms (max 57) against the 60 ms target. A query behind rows of its own tenant waits
    for them too, which this does not measure: it gets the usual prediction. Per path, not per
    tenant: where a query lands in the fair queue depends on its tenant's backlog, not on who it
    is, so a tenant's first queries beside a flood are priced as well as its later ones. Over a
    second, not two: a flood's first answers (70-100 ms beyond their profile while its onset
    stalled the host) then no longer refuse a tenant arriving a second later; bench_fairness
    passed 8 of 12 runs against 6 of 12 (docs/benchmarks.md)."""
    return OverheadTracker(window=256, max_age_s=1.0, short_age_s=1.0, short_min_samples=20, min_samples=20)


@dataclass
class _LoadedCache:
    at_s: float
    names: frozenset[str] = field(default_factory=frozenset)


class LiveView:
    """See the module docstring. `replica_cores`: where the replicas share this host's cores (a
    local Ray), how many of them the front end leaves to replicas (`policy.verdict.room_for`);
    None: they run elsewhere, not counted."""

    def __init__(
        self,
        pool: Placement,
        batcher: Batcher,
        *,
        overhead_factory: Callable[[], OverheadTracker] = OverheadTracker,
        loaded_ttl_s: float = 0.02,
        replica_cores: float | None = None,
    ) -> None:
        self._pool = pool
        self._batcher = batcher
        # One estimate per path (`Placement.overhead_key`: the front end's, or a Ray runtime
        # family's): one global figure would price every variant at the worst path's.
        self._overhead_factory = overhead_factory
        self.overheads: dict[str, OverheadTracker] = {}
        # The same residual, the journal's wait included, of answers admitted into a quiet front
        # end (nothing ahead of them, the limit less than half used): what this host can promise.
        self.floors: dict[str, OverheadTracker] = {}
        # Per path, answers at the head of the fair queue, beyond their profile (`head_tracker`).
        self.heads: dict[str, OverheadTracker] = {}
        self._loaded_ttl_s = loaded_ttl_s
        self._loaded: dict[int, _LoadedCache] = {}
        self._replica_cores = replica_cores

    # ---- the path's overhead ----------------------------------------------------------------
    def overhead_ms(self, key: str, now_s: float | None = None) -> float:
        """The measured overhead of one path (`Placement.overhead_key`; the prior until measured),
        refreshed first when stale if `now_s` is given."""
        tracker = self.overheads.get(key)
        if tracker is None:
            return DEFAULT_OVERHEAD_MS
        return tracker.current(now_s) if now_s is not None else tracker.value_ms

    def floor_ms(self, key: str, now_s: float | None = None) -> float:
        """The host's floor of one path (the prior until measured)."""
        tracker = self.floors.get(key)
        if tracker is None:
            return DEFAULT_OVERHEAD_MS
        return tracker.current(now_s) if now_s is not None else tracker.value_ms

    def path_ms(self, variant: Variant) -> float:
        """What admission added for `variant`'s path, as of the last refresh."""
        key = self._pool.overhead_key(variant)
        return max(self.overhead_ms(key), self.floor_ms(key))

    def _path_ms(self, key: str, now_s: float) -> float:
        """What admission adds for a path now: its measured overhead, never below its floor."""
        return max(self.overhead_ms(key, now_s), self.floor_ms(key, now_s))

    def head_ms(self, key: str, now_s: float) -> float | None:
        """What answers at the head of the fair queue took beyond their profile on a path
        (`head_tracker`), never below its floor; None until it has enough of them."""
        head = self.heads.get(key)
        if head is None:
            return None
        head_ms = head.current(now_s)
        return max(head_ms, self.floor_ms(key, now_s)) if head.measured else None

    def observe(
        self, variant: Variant, residual_ms: float, now_s: float, head_ms: float | None = None
    ) -> None:
        """An answer of `variant` came `residual_ms` after its prediction; `head_ms`: it found none
        of its tenant's rows waiting, and came that long after its profiled run time."""
        key = self._pool.overhead_key(variant)
        tracker = self.overheads.get(key)
        if tracker is None:
            tracker = self.overheads[key] = self._overhead_factory()
        tracker.observe(residual_ms, now_s)
        if head_ms is not None:
            head = self.heads.get(key)
            if head is None:
                head = self.heads[key] = head_tracker()
            head.observe(head_ms, now_s)

    def observe_floor(self, variant: Variant, residual_ms: float, now_s: float) -> None:
        """An answer admitted into a quiet front end came `residual_ms` after its prediction,
        counted to the moment it left (the journal's wait included)."""
        key = self._pool.overhead_key(variant)
        tracker = self.floors.get(key)
        if tracker is None:
            tracker = self.floors[key] = floor_tracker()
        tracker.observe(residual_ms, now_s)

    def refresh(self, now_s: float) -> None:
        """Refresh every estimate: one whose answers all aged out comes back towards its prior."""
        for tracker in self.overheads.values():
            tracker.refresh(now_s)

    def probed(self, variant: Variant, now_s: float) -> None:
        """A probe of `variant`'s path was admitted now: the next is `PROBE_INTERVAL_S` away."""
        self.overheads[self._pool.overhead_key(variant)].last_s = now_s

    # ---- loaded variants ----------------------------------------------------------------------
    def loaded(self, table: VariantTable, now_s: float) -> frozenset[str]:
        cached = self._loaded.get(id(table))
        if cached is None or now_s - cached.at_s > self._loaded_ttl_s:
            names = frozenset(n for n in table.variants if self._pool.is_loaded(n))
            cached = self._loaded[id(table)] = _LoadedCache(at_s=now_s, names=names)
        return cached.names

    def forget_loaded(self) -> None:
        """A load, an unload or a new snapshot: read what is loaded again on the next query."""
        self._loaded.clear()

    # ---- the view -----------------------------------------------------------------------------
    def live(
        self,
        table: VariantTable,
        variants: Catalog,
        now_s: float,
        rows: int,
        tenant: str = "",
        probes: set[str] | None = None,
    ) -> tuple[LiveState, dict[str, float]]:
        """Loaded variants, and per live variant the delay a query of `rows` rows of `tenant`
        would see beyond its profile: its queueing delay (fair queuing: the rows ahead of this
        tenant's query), its path's overhead and its own run's share of the slowdown measured on
        its batches, or, where lower and none of the tenant's rows wait for the variant, what
        answers at the head of the fair queue took beyond their profile (`head_tracker`); and the
        batcher's queueing delays by variant (asking the batcher twice per query showed in
        profiles). Adds to `probes` the live variants whose path is due a probe."""
        loaded = self.loaded(table, now_s)
        paths = {k: self._path_ms(k, now_s) for k in self.overheads.keys() | self.floors.keys()}
        heads = {k: ms for k in self.heads if (ms := self.head_ms(k, now_s)) is not None}
        beyond: dict[str, float] = {}  # per live variant, all it would take beyond its profile
        queue_ms: dict[str, float] = {}
        for name in loaded.union(self._batcher.queue_depths()):
            if name in table:
                variant, profile = variants[name]
                key = self._pool.overhead_key(variant)
                queue_ms[name] = self._batcher.queue_delay_ms(name, tenant)
                ms = (
                    queue_ms[name] + paths.get(key, DEFAULT_OVERHEAD_MS) + self.slower_ms(name, profile, rows)
                )
                head_ms = heads.get(key)
                if head_ms is not None and self._batcher.waiting_rows(name, tenant) == 0:
                    ms = min(ms, head_ms)
                beyond[name] = ms
                if probes is not None:
                    tracker = self.overheads.get(key)
                    if tracker is not None and now_s - tracker.last_s >= PROBE_INTERVAL_S:
                        probes.add(name)
        # The policy adds the smallest to every variant (the rest as each one's delay): selection
        # reads a delay as a queue, which only ever slows a variant down.
        base_ms = min(
            min(paths.values(), default=DEFAULT_OVERHEAD_MS), min(beyond.values(), default=math.inf)
        )
        delays = {name: ms - base_ms for name, ms in beyond.items() if ms > base_ms}
        return LiveState(loaded=loaded, queue_delay_ms=delays, overhead_ms=base_ms), queue_ms

    def slower_ms(self, name: str, profile: Profile | None, rows: int) -> float:
        """How much longer than its profile a run of `rows` rows on `name` is predicted to take,
        by the slowdown its recent batches measured (0 until they measure one): the queue's
        prediction already counts it, and leaving it out of the query's own run admitted queries
        of a compute-bound model that a busy machine then answered late."""
        factor = self._batcher.slowdown(name)
        if factor <= 1.0 or profile is None:
            return 0.0
        return profile.latency_ms(rows, "p99") * (factor - 1.0)

    def view(
        self, table: VariantTable, variants: Catalog, now_s: float, rows: int, tenant: str
    ) -> tuple[View, dict[str, float]]:
        """What `policy.verdict.admit` reads, gathered once per query, and the queueing delays."""
        probes: set[str] = set()
        live, queue_ms = self.live(table, variants, now_s, rows, tenant, probes)
        running = self._batcher.in_flight()
        view = View(
            table=table,
            live=live,
            idle=self.idle(table, variants, live.loaded, now_s),
            queued=frozenset(name for name, ms in queue_ms.items() if ms > 0.0),
            running=running,
            probe_ready=frozenset(probes),
            room=self.room(variants, running, live.loaded),
        )
        return view, queue_ms

    def idle(self, table: VariantTable, variants: Catalog, loaded: frozenset[str], now_s: float) -> LiveState:
        """The fleet as idle: no queues, and each path's overhead at the host's floor (what answers
        admitted into a quiet front end took). Not the measured overhead: under overload it holds
        the waits that overload causes, and judged with it every target would look impossible
        (422, or, for a pinned variant, served regardless). Not the hop alone either: a target
        within the front end's own tail of a profile (2 ms on this host) was then feasible idle,
        and refused as busy or answered late on a quiet machine; it is a 422 now (issue 32)."""
        floors = {k: self.floor_ms(k, now_s) for k in self.floors}
        base_ms = min(floors.values(), default=DEFAULT_OVERHEAD_MS)
        extra: dict[str, float] = {}
        if floors:
            for name in loaded:
                if name in table:
                    ms = floors.get(self._pool.overhead_key(variants[name][0]), DEFAULT_OVERHEAD_MS) - base_ms
                    if ms > 0.0:
                        extra[name] = ms
        return LiveState(loaded=loaded, queue_delay_ms=extra, overhead_ms=base_ms)

    def room(self, variants: Catalog, running: Mapping[str, int], loaded: frozenset[str]) -> Room | None:
        """This host's cores left to replicas and what the replicas that matter hold: None where
        replicas run elsewhere, or nothing runs (there is nothing to slow down)."""
        if self._replica_cores is None or not running:
            return None
        names = [n for n in loaded.union(running) if n in variants]
        return Room(
            cores=self._replica_cores,
            holds={n: variants[n][0].spec.holds()[0] for n in names},
            replicas={n: self._pool.replicas(n) for n in names},
            remote=frozenset(n for n in names if self._pool.path(n) == "remote"),
        )
