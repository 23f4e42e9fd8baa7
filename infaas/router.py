"""The router: the I/O shell around `infaas.policy.selection`.

It keeps three things current and hands them to the pure policy on every query:

- a *snapshot* of tasks, architectures, variants and profiles from the store (`Snapshot`, in
  `infaas.snapshot`, which says what is left out and why); rebuilt in the background when the
  store's registrations or profiles change, and at once (rate-limited) when a query names
  something the snapshot does not know yet;
- *live state*: which variants are loaded (the worker pool) and each one's queueing delay (the
  batcher);
- the *path's overhead*: what the service adds on top of the profiled run time, measured on every
  answered query and kept per path as a high quantile over a sliding window (`OverheadTracker`,
  in `infaas.overhead`).

Here: `Router` (the decision, admission, load hints, warm-up, quarantine and canary split around
it) and `Routed`, a decision with what the query path needs to carry it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from infaas.errors import (
    ArchitectureNotFound,
    DeadlineExceeded,
    InvalidInput,
    NoFeasibleVariant,
    NotFound,
    Overloaded,
    StoreError,
    TaskNotFound,
    Unavailable,
    VariantNotFound,
)
from infaas.overhead import DEFAULT_OVERHEAD_MS, OverheadTracker
from infaas.periodic import Periodic
from infaas.policy.selection import Choice, Infeasible, LiveState, VariantTable
from infaas.policy.verdict import Query, Room, View, admit, room_for
from infaas.policy.versions import CanarySplit
from infaas.quarantine import Quarantine
from infaas.snapshot import Machines, Snapshot, cheapest_variants
from infaas.store import MetadataStore
from infaas.types import (
    SLO,
    FleetEvent,
    MachineInfo,
    Profile,
    Task,
    Variant,
    version_name,
)
from infaas.workers.base import Batcher, WorkerPool
from infaas.workers.placement import Placement
from profiler.machine import local_machine

__all__ = [
    "PROBE_INTERVAL_S",
    "Routed",
    "Router",
]

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.02
"""While queries are refused as overloaded and the variant is idle, one per this interval is
served anyway (a probe): its answer is what lets the overhead estimate see a stall is over."""


@dataclass(frozen=True)
class Routed:
    """A decision with what the query path needs to carry it out and to learn from it."""

    decision: Choice  # a `Decision`'s fields (`decision.to_decision()` for the model)
    task: Task
    variant: Variant
    profile: Profile
    cold: bool  # not loaded when decided: its first run includes the load
    expected_ms: float  # profile p99 at the query's rows + the batcher's predicted queueing
    queued_ms: float  # of which the batcher's predicted queueing


@dataclass
class _LoadedCache:
    at_s: float
    names: frozenset[str] = field(default_factory=frozenset)


class Router:
    """Decides where each query runs. `now_s` (monotonic seconds) always comes from the caller."""

    def __init__(
        self,
        store: MetadataStore,
        pool: WorkerPool,
        batcher: Batcher,
        *,
        overhead_factory: Callable[[], OverheadTracker] = OverheadTracker,
        refresh_interval_s: float = 2.0,
        miss_refresh_interval_s: float = 0.5,
        loaded_ttl_s: float = 0.02,
        machine: MachineInfo | None = None,
        machines: Callable[[], Machines] | None = None,
        quarantine: Quarantine | None = None,
        on_event: Callable[[FleetEvent], None] | None = None,
        replica_cores: float | None = None,
    ) -> None:
        self._store = store
        # Where the replicas share this host's cores (a local Ray): how many of them the front
        # end leaves to replicas (`policy.verdict.room_for`); None: they run elsewhere, not counted.
        self._replica_cores = replica_cores
        # Variants that keep failing are left out of the tables for a while (`infaas.quarantine`);
        # `_snapshot` is the store's snapshot (`_base`) minus them.
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self._quarantine_seen = (-1, float("inf"))
        self._on_event = on_event
        self._machine = machine if machine is not None else local_machine()
        # On a cluster: its nodes' classes and where replicas sit (else this machine alone).
        self._machines = machines or (lambda: Machines(self._machine))
        # Share the batcher's `Placement` (pass the same one to both) to see its local path too.
        self._pool = Placement.wrap(pool)
        self._batcher = batcher
        # One estimate per path (`Placement.overhead_key`: the front end's, or a Ray runtime
        # family's): one global figure would price every variant at the worst path's.
        self._overhead_factory = overhead_factory
        self.overheads: dict[str, OverheadTracker] = {}
        self._miss_refresh_interval_s = miss_refresh_interval_s
        self._loaded_ttl_s = loaded_ttl_s
        self._snapshot = self._base = Snapshot.empty()
        self._last_miss_refresh_s = float("-inf")
        self._loaded: dict[int, _LoadedCache] = {}
        self._hinted: dict[str, asyncio.Task[None]] = {}  # loads under way, by variant
        self._warm_up: list[asyncio.Task[None]] = []
        self._warm_up_done = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._refresher = Periodic("router-refresh", refresh_interval_s, self._refresh_round)
        self.on_refresh: list[Callable[[Snapshot], None]] = []
        self.canary_split = CanarySplit()
        self.load_gate: Callable[[Variant], bool] | None = None
        """Admits an optional load (a load hint) when the cluster has room; None: always."""

    # ---- snapshot -----------------------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def refresh(self) -> bool:
        """Reload the snapshot from the store; True when it changed."""
        return self._adopt_if_new(Snapshot.load(self._store, self._machines()))

    async def refresh_async(self) -> bool:
        """`refresh` for the event loop: the store is read in a thread, the snapshot adopted on
        the loop (adopting may start warm-up loads, which need the loop)."""
        return self._adopt_if_new(await asyncio.to_thread(Snapshot.load, self._store, self._machines()))

    def _adopt_if_new(self, fresh: Snapshot) -> bool:
        if fresh.fingerprint == self._base.fingerprint:
            return False
        self._adopt(fresh)
        return True

    def _adopt(self, fresh: Snapshot) -> None:
        if fresh.excluded != self._snapshot.excluded and fresh.excluded:
            log.warning(
                "router: %d variant(s) not served from their stored profile: %s",
                len(fresh.excluded),
                "; ".join(f"{name}: {why}" for name, why in sorted(fresh.excluded.items())),
            )
        # Only versions that take traffic: a new version is loaded when it is labelled.
        new_archs = (set(fresh.architectures) - set(self._base.architectures)) & fresh.serving
        self._base = fresh
        self._quarantine_seen = (-1, float("inf"))
        self._snapshot = fresh
        self._loaded.clear()
        if self._warm_up_done and new_archs:
            # A model registered while serving is warmed like those present at start: the burst
            # that often follows a registration then finds its cheapest variant loaded.
            for name in self._cheapest(new_archs).values():
                self._hint(name)
        for fn in self.on_refresh:
            fn(fresh)

    # ---- unhealthy variants -------------------------------------------------------------
    def report(self, variant: str, error: Exception | None, now_s: float) -> None:
        """A load or batch of `variant` finished: `error` None for success. Failures that say
        the variant (not the request) is broken count towards its quarantine."""
        if error is None:
            self.quarantine.success(variant)
            return
        if not isinstance(error, Unavailable) or isinstance(error, StoreError):
            return
        verdict = self.quarantine.failure(variant, error.message, now_s)
        if verdict is not None:
            log.warning("quarantined %s for %.0f s: %s", variant, verdict.backoff_s, verdict.reason)
            if self._on_event is not None:
                reason = (
                    f"quarantined for {verdict.backoff_s:.0f} s after {self.quarantine.after_failures} "
                    f"failures in a row; queries go to other variants (last: {verdict.reason})"
                )
                self._on_event(
                    FleetEvent(at_s=time.time(), kind="quarantine", variant=variant, reason=reason)
                )

    def _apply_quarantine(self, now_s: float) -> None:
        """Keep `_snapshot` = `_base` minus the quarantined variants (cheap when nothing changed)."""
        q = self.quarantine
        if (q.version, q.next_change_s) == self._quarantine_seen and now_s < q.next_change_s:
            return
        blocked = q.blocked(now_s)
        self._quarantine_seen = (q.version, q.next_change_s)
        base = self._base
        if not blocked:
            self._snapshot = base
        else:
            self._snapshot = Snapshot.build(
                base.fingerprint,
                base.tasks,
                base.architectures,
                {n: (v, None if n in blocked else p) for n, (v, p) in base.variants.items()},
                {**base.excluded, **blocked},
                base.labels,
            )
        self._loaded.clear()

    def start(self) -> None:
        """Start the background refresh (call from the running event loop)."""
        self._refresher.start()

    async def _refresh_round(self) -> None:
        # First, and even if the store fails below: an estimate whose answers have all aged out
        # (every query refused because of it) comes back to the prior.
        now_s = time.monotonic()
        for tracker in self.overheads.values():
            tracker.refresh(now_s)
        await self.refresh_async()

    def _refresh_on_miss(self, now_s: float) -> bool:
        # A name the snapshot lacks may have just been registered; look once, but not on every
        # request naming garbage.
        if now_s - self._last_miss_refresh_s < self._miss_refresh_interval_s:
            return False
        self._last_miss_refresh_s = now_s
        return self.refresh()

    async def _refresh_on_miss_async(self, now_s: float) -> bool:
        if now_s - self._last_miss_refresh_s < self._miss_refresh_interval_s:
            return False
        self._last_miss_refresh_s = now_s
        return await self.refresh_async()

    async def task_async(self, name: str, now_s: float) -> Task:
        """`task` for the event loop: a miss re-reads the store in a thread, never on the loop."""
        try:
            return self.task(name, now_s, refresh=False)
        except NotFound:
            if not await self._refresh_on_miss_async(now_s):
                raise
            return self.task(name, now_s, refresh=False)

    async def route_async(
        self,
        task_name: str,
        rows: int,
        slo: SLO,
        now_s: float,
        *,
        architecture: str | None = None,
        variant: str | None = None,
        elapsed_ms: float = 0.0,
        tenant: str = "",
    ) -> Routed:
        """`route` for the event loop: a name the snapshot lacks re-reads the store in a thread."""

        def attempt() -> Routed:
            return self.route(
                task_name,
                rows,
                slo,
                now_s,
                architecture=architecture,
                variant=variant,
                refresh=False,
                elapsed_ms=elapsed_ms,
                tenant=tenant,
            )

        try:
            return attempt()
        except NotFound:
            if not await self._refresh_on_miss_async(now_s):
                raise
            return attempt()

    def task(self, name: str, now_s: float, *, refresh: bool = True) -> Task:
        """The task, or `TaskNotFound`. A miss re-reads the store (blocking) unless not `refresh`."""
        task = self._snapshot.tasks.get(name)
        if task is None and refresh and self._refresh_on_miss(now_s):
            task = self._snapshot.tasks.get(name)
        if task is None:
            raise TaskNotFound(f"no task {name!r}; GET /v1/tasks lists them", task=name)
        return task

    # ---- live state ---------------------------------------------------------------------
    def _loaded_names(self, table: VariantTable, now_s: float) -> frozenset[str]:
        cached = self._loaded.get(id(table))
        if cached is None or now_s - cached.at_s > self._loaded_ttl_s:
            names = frozenset(n for n in table.variants if self._pool.is_loaded(n))
            cached = self._loaded[id(table)] = _LoadedCache(at_s=now_s, names=names)
        return cached.names

    def overhead_ms(self, key: str, now_s: float | None = None) -> float:
        """The measured overhead of one path (`Placement.overhead_key`; the prior until measured),
        refreshed first when stale if `now_s` is given."""
        tracker = self.overheads.get(key)
        if tracker is None:
            return DEFAULT_OVERHEAD_MS
        return tracker.current(now_s) if now_s is not None else tracker.value_ms

    def live_state(self, table: VariantTable, now_s: float, rows: int = 1, tenant: str = "") -> LiveState:
        """Loaded variants, and per live variant the delay a query of `rows` rows of `tenant`
        would see beyond its profile: its queueing delay (fair queuing: the rows ahead of this
        tenant's query), how much its path's overhead exceeds the smallest (the policy adds that
        smallest to every variant), and its own run's share of the slowdown measured on its
        batches."""
        return self._live(table, now_s, rows, tenant)[0]

    def _live(
        self, table: VariantTable, now_s: float, rows: int, tenant: str = "", probes: set[str] | None = None
    ) -> tuple[LiveState, dict[str, float]]:
        """`live_state`, and the batcher's queueing delays it read, by variant: `_routed` needs the
        chosen one's again, and asking the batcher twice per query showed in profiles. Adds to
        `probes` the live variants whose path is due a probe (`PROBE_INTERVAL_S`)."""
        loaded = self._loaded_names(table, now_s)
        base_ms = min((t.current(now_s) for t in self.overheads.values()), default=DEFAULT_OVERHEAD_MS)
        delays: dict[str, float] = {}
        queue_ms: dict[str, float] = {}
        variants = self._snapshot.variants
        for name in loaded.union(self._batcher.queue_depths()):
            if name in table:
                variant, profile = variants[name]
                key = self._pool.overhead_key(variant)
                extra_ms = self.overhead_ms(key, now_s) - base_ms
                queue_ms[name] = self._batcher.queue_delay_ms(name, tenant)
                delay = queue_ms[name] + extra_ms + self._slower_ms(name, profile, rows)
                if delay > 0.0:
                    delays[name] = delay
                if probes is not None:
                    tracker = self.overheads.get(key)
                    if tracker is not None and now_s - tracker.last_s >= PROBE_INTERVAL_S:
                        probes.add(name)
        return LiveState(loaded=loaded, queue_delay_ms=delays, overhead_ms=base_ms), queue_ms

    def _slower_ms(self, name: str, profile: Profile | None, rows: int) -> float:
        """How much longer than its profile a run of `rows` rows on `name` is predicted to take,
        by the slowdown its recent batches measured (0 until they measure one): the queue's
        prediction already counts it, and leaving it out of the query's own run admitted queries
        of a compute-bound model that a busy machine then answered late."""
        factor = self._batcher.slowdown(name)
        if factor <= 1.0 or profile is None:
            return 0.0
        return profile.latency_ms(rows, "p99") * (factor - 1.0)

    def _view(
        self, table: VariantTable, now_s: float, rows: int, tenant: str
    ) -> tuple[View, dict[str, float]]:
        """What `policy.verdict.admit` reads, gathered once per query, and the queueing delays."""
        probes: set[str] = set()
        live, queue_ms = self._live(table, now_s, rows, tenant, probes)
        running = self._batcher.in_flight()
        view = View(
            table=table,
            live=live,
            idle=self._idle(live),
            queued=frozenset(name for name, ms in queue_ms.items() if ms > 0.0),
            running=running,
            probe_ready=frozenset(probes),
            room=self._room(running, live.loaded),
        )
        return view, queue_ms

    def _room(self, running: Mapping[str, int], loaded: frozenset[str]) -> Room | None:
        """This host's cores left to replicas and what the replicas that matter hold: None where
        replicas run elsewhere, or nothing runs (there is nothing to slow down)."""
        if self._replica_cores is None or not running:
            return None
        variants = self._snapshot.variants
        names = [n for n in loaded.union(running) if n in variants]
        return Room(
            cores=self._replica_cores,
            holds={n: variants[n][0].spec.holds[0] for n in names},
            replicas={n: self._pool.replicas(n) for n in names},
            remote=frozenset(n for n in names if self._pool.path(n) == "remote"),
        )

    # ---- the decision -------------------------------------------------------------------
    def route(
        self,
        task_name: str,
        rows: int,
        slo: SLO,
        now_s: float,
        *,
        architecture: str | None = None,
        variant: str | None = None,
        refresh: bool = True,
        elapsed_ms: float = 0.0,
        tenant: str = "",
    ) -> Routed:
        """Pick the variant for a query of `rows` rows of `tenant`, or raise the error the API
        returns: the verdict is `policy.verdict.admit`'s, over a view gathered here. A name the
        snapshot lacks re-reads the store (blocking) unless not `refresh`. `elapsed_ms` is how
        long the request has already waited (past the target: 504)."""
        self._apply_quarantine(now_s)
        task = self.task(task_name, now_s, refresh=refresh)
        if variant is not None:
            table, split = self._pinned_table(task, rows, variant, now_s, refresh), False
        else:
            table, split = self._scope(task, architecture, now_s, refresh)
        view, queue_ms = self._view(table, now_s, rows, tenant)
        verdict = admit(Query(rows, slo, elapsed_ms, variant), view)
        choice = verdict.choice
        if verdict.kind == "infeasible" or choice is None:
            if verdict.infeasible is None:  # a pinned variant the checks above let through
                raise VariantNotFound(f"no variant {variant!r}", variant=variant)
            raise self._infeasible_error(verdict.infeasible, task, slo, architecture)
        if verdict.kind in ("busy", "deadline"):
            raise self._busy(task, slo, choice, queue_ms.get(choice.variant, 0.0), elapsed_ms)
        if verdict.kind == "cold":
            raise self._cold(task, slo, choice)
        if verdict.kind == "probe":
            self.overheads[self._pool.overhead_key(self._snapshot.variants[choice.variant][0])].last_s = now_s
        elif choice.load_hint is not None:
            self._hint(choice.load_hint, optional=True)
        live = view.live
        if split:
            left = slo if elapsed_ms < slo.latency_ms else slo.model_copy(update={"latency_ms": 1e-6})
            canary = self._canary(choice, rows, left, now_s, tenant)
            if canary is not None:
                choice, live, queue_ms = canary
        return self._routed(choice, task, live, queue_ms, rows, tenant)

    def _scope(
        self, task: Task, architecture: str | None, now_s: float, refresh: bool
    ) -> tuple[VariantTable, bool]:
        """The table a query chooses in (its task's, or a named architecture's or version's), and
        whether the architecture's canary takes its share (not when a version is named)."""
        if architecture is None:
            return self._snapshot.by_task.get(task.name) or VariantTable(()), True
        snap = self._snapshot
        arch = snap.resolve(architecture)
        if arch is None and refresh and self._refresh_on_miss(now_s):
            snap = self._snapshot
            arch = snap.resolve(architecture)
        if arch is None:
            raise ArchitectureNotFound(
                f"no architecture or version {architecture!r}", architecture=architecture
            )
        if arch.task != task.name:
            raise InvalidInput(
                f"architecture {architecture!r} serves task {arch.task!r}, not {task.name!r}",
                architecture=architecture,
            )
        return snap.by_architecture[arch.name], "@" not in architecture

    def _pinned_table(self, task: Task, rows: int, name: str, now_s: float, refresh: bool) -> VariantTable:
        """The table of a pinned variant's architecture, once the variant is known to serve."""
        snap = self._snapshot
        entry = snap.variants.get(name)
        if entry is None and refresh and self._refresh_on_miss(now_s):
            snap = self._snapshot
            entry = snap.variants.get(name)
        if entry is None:
            raise VariantNotFound(f"no variant {name!r}", variant=name)
        found, profile = entry
        arch = snap.architectures[found.architecture]
        if arch.task != task.name:
            raise InvalidInput(f"variant {name!r} serves task {arch.task!r}, not {task.name!r}", variant=name)
        table = snap.by_architecture[arch.name]
        if profile is None or name not in table:
            why = snap.excluded.get(name, "it has no usable profile yet; retry once it is profiled")
            raise Unavailable(f"variant {name!r} is not served: {why}", variant=name)
        if rows > found.spec.max_batch:
            raise InvalidInput(
                f"{rows} rows is more than variant {name!r} accepts (at most {found.spec.max_batch})",
                rows=rows,
                max_rows=found.spec.max_batch,
            )
        return table

    def _canary(
        self, chosen: Choice, rows: int, left: SLO, now_s: float, tenant: str
    ) -> tuple[Choice, LiveState, dict[str, float]] | None:
        """When `chosen`'s architecture has a canary and this query is in its share, the canary
        version's pick for the same targets. A canary that cannot take the query (infeasible, or
        not loaded) leaves it with stable, and the miss is not counted as canary traffic."""
        snap = self._snapshot
        line = snap.architectures[snap.variants[chosen.variant][0].architecture].line
        labels = snap.labels[line]
        if labels.canary is None or not self.canary_split.take(line, labels.canary, labels.canary_share):
            return None
        table = snap.by_architecture.get(version_name(line, labels.canary))
        if table is not None:
            live, queue_ms = self._live(table, now_s, rows, tenant)
            result = table.select(rows, left, live)
            if isinstance(result, Choice) and result.variant in live.loaded:
                return result, live, queue_ms
        self.canary_split.missed(line, labels.canary)
        return None

    @staticmethod
    def _idle(live: LiveState) -> LiveState:
        """`live` on an idle fleet: no queues, and the path's overhead at its prior (the hop alone).
        The measured overhead is not used: under overload it holds the waits beyond prediction
        that overload causes, and judged with it every target would look impossible (422, or, for
        a pinned variant, served regardless: a queue that grows until requests expire)."""
        return LiveState(loaded=live.loaded, overhead_ms=min(live.overhead_ms, DEFAULT_OVERHEAD_MS))

    def _busy(
        self, task: Task, slo: SLO, idle: Choice, queued_ms: float, elapsed_ms: float
    ) -> Overloaded | DeadlineExceeded:
        """Feasible on an idle fleet, not now: 429, or 504 if the deadline already passed."""
        if elapsed_ms >= slo.latency_ms:
            return DeadlineExceeded(
                f"the {slo.latency_ms:g} ms deadline passed after {elapsed_ms:.1f} ms, before the "
                "request was routed; it was not charged",
                waited_ms=round(elapsed_ms, 3),
            )
        # The path's measured overhead is the other half of "busy": after a stall it alone may
        # refuse a query whose queue is empty, and a message naming only the queue hid that.
        path_ms = self.overhead_ms(self._pool.overhead_key(self._snapshot.variants[idle.variant][0]))
        slowdown = self._batcher.slowdown(idle.variant)
        compute = f", and its batches run {slowdown:.1f}x their profile" if slowdown >= 1.05 else ""
        return Overloaded(
            f"{task.name}: the variants that meet the targets are busy: {idle.variant} would answer "
            f"in {idle.predicted_latency_ms:.1f} ms idle, but its queue adds ~{queued_ms:.0f} ms and "
            f"its path ~{path_ms:.0f} ms beyond its profile{compute} (target {slo.latency_ms:g} ms); retry",
            task=task.name,
            variant=idle.variant,
            predicted_idle_ms=round(idle.predicted_latency_ms, 4),
            path_overhead_ms=round(path_ms, 3),
            slowdown=round(slowdown, 3),
            retry_after_s=round(max(queued_ms, 1.0) / 1000.0, 3),
        )

    def _cold(self, task: Task, slo: SLO, choice: Choice) -> Overloaded:
        self._hint(choice.variant)
        entry = self._snapshot.variants.get(choice.variant)
        load_s = entry[1].load_time_s if entry is not None and entry[1] is not None else 1.0
        return Overloaded(
            f"{task.name}: {choice.variant} meets the targets but is not loaded, and loading it "
            f"(~{load_s * 1000:.0f} ms) would outlast the {slo.latency_ms:g} ms target; it is "
            "loading now: retry",
            task=task.name,
            variant=choice.variant,
            retry_after_s=round(max(load_s, 0.001), 3),
        )

    def _routed(
        self,
        decision: Choice,
        task: Task,
        live: LiveState,
        queue_ms: dict[str, float],
        rows: int,
        tenant: str,
    ) -> Routed:
        variant, profile = self._snapshot.variants[decision.variant]
        assert profile is not None
        queued_ms = queue_ms.get(decision.variant)
        if queued_ms is None:  # neither loaded nor queued when the state was read
            queued_ms = self._batcher.queue_delay_ms(decision.variant, tenant)
        return Routed(
            decision=decision,
            task=task,
            variant=variant,
            profile=profile,
            cold=decision.variant not in live.loaded,
            expected_ms=(
                profile.latency_ms(rows, "p99") + self._slower_ms(decision.variant, profile, rows) + queued_ms
            ),
            queued_ms=queued_ms,
        )

    def _infeasible_error(
        self, result: Infeasible, task: Task, slo: SLO, architecture: str | None
    ) -> InvalidInput | NoFeasibleVariant:
        scope = {"task": task.name} | ({"architecture": architecture} if architecture else {})
        if result.too_many_rows:
            if result.max_rows == 0:
                return NoFeasibleVariant(
                    f"no profiled variant serves {task.name!r} yet; register or profile one", **scope
                )
            return InvalidInput(result.reason, rows=result.rows, max_rows=result.max_rows, **scope)
        alternatives = {
            "fastest_meeting_accuracy": result.fastest_at_accuracy,
            "most_accurate_meeting_latency": result.most_accurate_at_latency,
            "cheapest_meeting_latency_and_accuracy": result.cheapest_within_targets,
        }
        return NoFeasibleVariant(
            result.reason,
            targets={
                "latency_ms": slo.latency_ms,
                "min_accuracy": slo.min_accuracy,
                "max_cost_usd_per_1k": slo.max_cost_usd_per_1k,
            },
            alternatives={k: (a.as_dict() if a else None) for k, a in alternatives.items()},
            **scope,
        )

    # ---- feedback -----------------------------------------------------------------------
    def observe(self, routed: Routed, latency_ms: float, now_s: float) -> None:
        """Learn from an answered query: how far the measured latency was above the profile's
        run time plus the predicted queueing. Cold loads are one-off and left out."""
        if not routed.cold:
            key = self._pool.overhead_key(routed.variant)
            tracker = self.overheads.get(key)
            if tracker is None:
                tracker = self.overheads[key] = self._overhead_factory()
            tracker.observe(latency_ms - routed.expected_ms, now_s)

    def warm_up(self) -> list[str]:
        """Load the cheapest profiled variant of every architecture in the background (TF Serving's
        warm-up, by measured cost): the first query to a task then finds a warm variant instead of
        waiting for a cold load. Returns the variants asked for (call from the running loop)."""
        names = sorted(self._cheapest(set(self._snapshot.serving)).values())
        self._warm_up = [t for t in (self._hint(name) for name in names) if t is not None]
        self._warm_up_done = True
        return names

    def _cheapest(self, architectures: set[str]) -> dict[str, str]:
        return cheapest_variants(self._snapshot.variants, architectures)

    @property
    def warming_up(self) -> int:
        """Warm-up loads still running (readiness waits for 0)."""
        return sum(1 for t in self._warm_up if not t.done())

    async def warm_architecture(
        self, architecture: str, like: Collection[str] = (), timeout_s: float = 120.0
    ) -> list[str]:
        """Re-read the store and load `architecture`'s cheapest variant where its batches will
        run, and its counterparts of the variants in `like` (same runtime, precision, threads: the
        ones another version of it has loaded), waiting for them: registration, a canary and a
        promote answer once the version is warm, as TF Serving loads and warms a version before
        serving it. Returns the variants loaded; a failed load is logged and counted towards
        quarantine, not raised."""
        await self.refresh_async()
        names = set(self._cheapest({architecture}).values())
        for other in like:
            twin = f"{architecture}/{other.partition('/')[2]}"
            entry = self._snapshot.variants.get(twin)
            if entry is not None and entry[1] is not None:
                names.add(twin)
        tasks = [t for t in (self._hint(name) for name in sorted(names)) if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        self._loaded.clear()
        return sorted(n for n in names if self._pool.is_loaded(n))

    def _hint(self, name: str, *, optional: bool = False) -> asyncio.Task[None] | None:
        """Load `name` in the background; its task (the running one if a load is under way). An
        `optional` load (a cheaper variant than the one serving) happens only if `load_gate` (the
        autoscaler's view of free resources) admits it, the cluster's room being the autoscaler's
        to spend, and if this host has room for it beside the busy replicas."""
        running = self._hinted.get(name)
        if running is not None:
            return running
        entry = self._snapshot.variants.get(name)
        if entry is None or entry[1] is None:
            return None
        if optional and self.load_gate is not None and not self.load_gate(entry[0]):
            return None
        # Nor a new worker process on cores the busy replicas need: adding there is the
        # autoscaler's call (in the load step a hint started one 1.6 s after the step).
        busy_now = self._batcher.in_flight()
        if optional and not room_for(name, self._room(busy_now, frozenset({name})), busy_now):
            return None
        task = asyncio.get_running_loop().create_task(self._load(*entry), name=f"load-hint:{name}")
        self._hinted[name] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load(self, variant: Variant, profile: Profile | None) -> None:
        assert profile is not None  # _hint only loads profiled variants
        try:
            # Through the batcher: a sub-hop variant is warmed on the front end's fast path,
            # where its batches will run, not on a Ray worker.
            await self._batcher.warm(variant, profile)
        except Exception as exc:
            log.exception("loading %s on the router's hint failed", variant.name)
            self.report(variant.name, exc, time.monotonic())
        else:
            self.report(variant.name, None, time.monotonic())
        finally:
            self._hinted.pop(variant.name, None)
            self._loaded.clear()

    async def close(self) -> None:
        await self._refresher.close()
        pending = list(self._tasks)
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
