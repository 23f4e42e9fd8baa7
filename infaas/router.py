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
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from infaas import refusals
from infaas.errors import (
    ArchitectureNotFound,
    InvalidInput,
    NoFeasibleVariant,
    NotFound,
    StoreError,
    TaskNotFound,
    Unavailable,
    VariantNotFound,
)
from infaas.liveview import LiveView
from infaas.overhead import OverheadTracker
from infaas.periodic import Periodic
from infaas.policy.selection import Choice, LiveState, VariantTable
from infaas.policy.verdict import Query, admit
from infaas.policy.versions import CanarySplit
from infaas.quarantine import Quarantine
from infaas.snapshot import Machines, Snapshot
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
from infaas.warmup import Warmer
from infaas.workers.base import Batcher, WorkerPool
from infaas.workers.placement import Placement
from profiler.machine import local_machine

__all__ = [
    "Routed",
    "Router",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Routed:
    """A decision with what the query path needs to carry it out and to learn from it."""

    decision: Choice  # a `Decision`'s fields (`decision.to_decision()` for the model)
    task: Task
    variant: Variant
    profile: Profile
    cold: bool  # not loaded when decided: its first run includes the load
    expected_ms: float  # profile p99 at the query's rows + its measured slowdown + predicted queueing
    queued_ms: float  # of which the batcher's predicted queueing
    profiled_ms: float  # of which the profile's p99 at the query's rows
    at_head: bool  # none of its tenant's rows waited for the variant (`liveview.head_tracker`)


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
        # Loaded variants, queues, the path's overhead: what the verdict reads besides the snapshot.
        self.live = LiveView(
            self._pool,
            batcher,
            overhead_factory=overhead_factory,
            loaded_ttl_s=loaded_ttl_s,
            replica_cores=replica_cores,
        )
        self._miss_refresh_interval_s = miss_refresh_interval_s
        self._snapshot = self._base = Snapshot.empty()
        self._last_miss_refresh_s = float("-inf")
        self.warmer = Warmer(lambda: self._snapshot, self._pool, batcher, self.live, self.report)
        self._refresher = Periodic("router-refresh", refresh_interval_s, self._refresh_round)
        self.on_refresh: list[Callable[[Snapshot], None]] = []
        self.canary_split = CanarySplit()

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
        self.live.forget_loaded()
        if self.warmer.started and new_archs:
            # A model registered while serving is warmed like those present at start: the burst
            # that often follows a registration then finds its cheapest variant loaded.
            for name in self.warmer.cheapest(new_archs).values():
                self.warmer.hint(name)
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
        self.live.forget_loaded()

    def start(self) -> None:
        """Start the background refresh (call from the running event loop)."""
        self._refresher.start()

    async def _refresh_round(self) -> None:
        # First, and even if the store fails below: an estimate whose answers have all aged out
        # (every query refused because of it) comes back to the prior.
        now_s = time.monotonic()
        self.live.refresh(now_s)
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
        """`route` for the event loop: a name the snapshot lacks, or targets none of its variants
        meets, re-reads the store in a thread."""

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
        except (NotFound, NoFeasibleVariant):
            # Read-your-writes: a model registered through another front end a moment ago is
            # not in this snapshot yet; look once (rate-limited) before answering 404 or 422.
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
        view, queue_ms = self.live.view(table, self._snapshot.variants, now_s, rows, tenant)
        verdict = admit(Query(rows, slo, elapsed_ms, variant), view)
        if verdict.kind == "infeasible":
            if verdict.infeasible is None:  # a pinned variant the checks above let through
                raise VariantNotFound(f"no variant {variant!r}", variant=variant)
            raise refusals.infeasible(verdict.infeasible, task.name, slo, architecture)
        # Every other verdict names a variant: the view has no standing (the data plane asks
        # the share rule, `policy.verdict.over_share`, before the live state is read).
        choice = verdict.choice
        assert choice is not None, verdict
        if verdict.kind in ("busy", "deadline"):
            variant_of = self._snapshot.variants[choice.variant][0]
            head_ms = None
            if self._batcher.waiting_rows(choice.variant, tenant) == 0:
                head_ms = self.live.head_ms(self._pool.overhead_key(variant_of), now_s)
            raise refusals.busy(
                task.name,
                slo,
                choice,
                queue_ms.get(choice.variant, 0.0),
                self.live.path_ms(variant_of),
                self._batcher.slowdown(choice.variant),
                elapsed_ms,
                head_ms,
            )
        if verdict.kind == "cold":
            self.warmer.hint(choice.variant)
            entry = self._snapshot.variants[choice.variant]
            raise refusals.cold(task.name, slo, choice, entry[1].load_time_s if entry[1] is not None else 1.0)
        if verdict.kind == "probe":
            self.live.probed(self._snapshot.variants[choice.variant][0], now_s)
        elif choice.load_hint is not None:
            self.warmer.hint(choice.load_hint, optional=True)
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
            live, queue_ms = self.live.live(table, snap.variants, now_s, rows, tenant)
            result = table.select(rows, left, live)
            if isinstance(result, Choice) and result.variant in live.loaded:
                return result, live, queue_ms
        self.canary_split.missed(line, labels.canary)
        return None

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
        profiled_ms = profile.latency_ms(rows, "p99")
        return Routed(
            decision=decision,
            task=task,
            variant=variant,
            profile=profile,
            cold=decision.variant not in live.loaded,
            expected_ms=profiled_ms + self.live.slower_ms(decision.variant, profile, rows) + queued_ms,
            queued_ms=queued_ms,
            profiled_ms=profiled_ms,
            at_head=self._batcher.waiting_rows(decision.variant, tenant) == 0,
        )

    # ---- feedback -----------------------------------------------------------------------
    def observe(self, routed: Routed, latency_ms: float, now_s: float) -> None:
        """Learn from an answered query: how far the measured latency was above the profile's run
        time plus the predicted queueing, and, for a query at the head of the fair queue, above
        the run time alone (`liveview.head_tracker`). Cold loads are one-off and left out."""
        if not routed.cold:
            head_ms = latency_ms - routed.profiled_ms if routed.at_head else None
            self.live.observe(routed.variant, latency_ms - routed.expected_ms, now_s, head_ms)

    def observe_floor(self, routed: Routed, latency_ms: float, now_s: float) -> None:
        """Learn the host's floor from an answer admitted into a quiet front end, measured to the
        moment it left (`LiveView.observe_floor`)."""
        if not routed.cold:
            self.live.observe_floor(routed.variant, latency_ms - routed.expected_ms, now_s)

    async def warm_architecture(
        self, architecture: str, like: Collection[str] = (), timeout_s: float = 120.0
    ) -> list[str]:
        """Re-read the store, then `Warmer.warm_architecture`: registration, a canary and a
        promote answer once the version is warm, as TF Serving loads and warms a version before
        serving it."""
        await self.refresh_async()
        return await self.warmer.warm_architecture(architecture, like, timeout_s)

    async def close(self) -> None:
        await self._refresher.close()
        await self.warmer.close()
