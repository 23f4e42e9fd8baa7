"""The router: the I/O shell around `infaas.policy.selection`.

It keeps three things current and hands them to the pure policy on every query:

- a *snapshot* of tasks, architectures, variants and profiles from the store, as one
  `VariantTable` per task and per architecture; rebuilt in the background when the store's
  registrations or profiles change, and at once (rate-limited) when a query names something the
  snapshot does not know yet. Profiles measured on another machine (a different fingerprint:
  CPU model, cores, GPU) and failed profiles are left out, with a log line, so latencies measured
  elsewhere are never mixed in silently; their variants serve again once profiled here;
- *live state*: which variants are loaded (the worker pool) and each one's queueing delay (the
  batcher);
- the *path's overhead*: what the service adds on top of the profiled run time (parsing, the
  batching wait beyond prediction, the Ray hop, the reply), measured on every answered query as
  ``latency_ms - (profile p99 + predicted queueing)`` and kept, per path (the front end, or a Ray
  runtime family), as a high quantile over a sliding window (`OverheadTracker`). Adding that
  quantile to every prediction is what makes ``slo_met`` hold for the great majority of answers,
  not just the model's own p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

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
from infaas.periodic import Periodic
from infaas.policy.selection import Choice, Infeasible, LiveState, VariantTable
from infaas.policy.versions import CanarySplit
from infaas.quarantine import Quarantine
from infaas.store import MetadataStore
from infaas.types import (
    SLO,
    Architecture,
    FleetEvent,
    Labels,
    MachineInfo,
    Profile,
    Task,
    Variant,
    split_version,
    version_name,
)
from infaas.workers.base import Batcher, WorkerPool
from infaas.workers.placement import Placement
from profiler.machine import local_machine

__all__ = [
    "Catalog",
    "Machines",
    "OverheadTracker",
    "Routed",
    "Router",
    "Snapshot",
    "cheapest_variants",
    "choose_profile",
]

log = logging.getLogger(__name__)

DEFAULT_OVERHEAD_MS = 1.0
"""Overhead assumed until enough answers are measured: the Ray hop is ~0.7 ms here (DESIGN.md)."""

PROBE_INTERVAL_S = 0.02
"""While queries are refused as overloaded and the variant is idle, one per this interval is
served anyway (a probe): its answer is what lets the overhead estimate see a stall is over."""


class OverheadTracker:
    """A high quantile of the prediction's residual over the last `window` answers of the last
    `short_age_s` seconds when they hold `short_min_samples` answers (a busy path, or probes
    after a stall), else of the last `max_age_s` (pure: residuals and times come in as numbers).

    With fewer than `min_samples` answers in `max_age_s` — every query refused because of the estimate,
    or no traffic — the estimate decays towards `prior_ms` with time constant `decay_s` instead of
    dropping to it: dropping at once admitted a whole burst again, whose late answers sent the
    estimate back up, refusing everything for the next `max_age_s` (a bang-bang cycle measured at
    ~2 s under 10× overload). Decaying, admission opens gradually and settles where the answers
    admitted meet the estimate. `current` refreshes a stale estimate on read, so it moves even
    when nothing is answered."""

    def __init__(
        self,
        prior_ms: float = DEFAULT_OVERHEAD_MS,
        *,
        quantile: float = 0.99,
        window: int = 2048,
        max_age_s: float = 1.0,
        short_age_s: float = 0.25,
        short_min_samples: int = 8,
        min_samples: int = 32,
        refresh_every: int = 16,
        decay_s: float = 0.5,
        stale_s: float = 0.05,
    ) -> None:
        if not 0.0 < quantile <= 1.0:
            raise ValueError("quantile must be in (0, 1]")
        if window < 1:
            raise ValueError("window must hold at least one answer")
        self._prior_ms = prior_ms
        self._quantile = quantile
        self._max_age_s = max_age_s
        self._short_age_s = min(short_age_s, max_age_s)
        self._short_min_samples = short_min_samples
        self._min_samples = min_samples
        self._refresh_every = refresh_every
        self._decay_s = decay_s
        self._stale_s = stale_s
        self._refreshed_s = float("-inf")
        # A ring buffer in two arrays, not a deque of tuples: `refresh` then filters and takes
        # the quantile without a Python loop over the window (~1 ms for 2 048 tuples, paid every
        # `refresh_every` answers, cost tens of µs per answer on the query path).
        self._at_s = np.zeros(window, dtype=np.float64)
        self._residual_ms = np.zeros(window, dtype=np.float64)
        self._held = 0  # slots filled so far (≤ window)
        self._next = 0  # slot the next answer goes to
        self._since_refresh = 0
        self._value_ms = prior_ms
        self.last_s = float("-inf")
        """When the last answer was recorded."""

    @property
    def value_ms(self) -> float:
        return self._value_ms

    @property
    def samples(self) -> int:
        """Answers held in the window (recent or not: age is applied when the estimate is made)."""
        return self._held

    def observe(self, residual_ms: float, now_s: float) -> None:
        """Record one answer's ``latency_ms - (profiled run time + predicted queueing)``."""
        i = self._next
        self.last_s = now_s
        self._at_s[i] = now_s
        self._residual_ms[i] = residual_ms
        self._next = (i + 1) % self._at_s.shape[0]
        self._held = max(self._held, i + 1)
        self._since_refresh += 1
        if self._since_refresh >= self._refresh_every:
            self.refresh(now_s)

    def refresh(self, now_s: float) -> None:
        """Recompute the estimate (every `refresh_every` answers, not on each: a quantile over
        2 048 floats costs ~30 µs)."""
        self._since_refresh = 0
        elapsed_s, self._refreshed_s = now_s - self._refreshed_s, now_s
        held = self._held
        at_s = self._at_s[:held]
        # The freshest `short_age_s` when it holds enough answers (a busy path), else `max_age_s`.
        # One stall of a few ms puts a handful of answers in the tail: judged over a whole second,
        # at 500 queries/s that p99 refused every query for the second after it (558 of one
        # burst's queries in bench_adaptive, a replay the service now answers in full).
        recent = self._residual_ms[:held][at_s >= now_s - self._short_age_s]
        if recent.shape[0] < self._short_min_samples:
            recent = self._residual_ms[:held][at_s >= now_s - self._max_age_s]
            if recent.shape[0] < self._min_samples:
                weight = math.exp(-max(0.0, elapsed_s) / self._decay_s) if self._decay_s > 0 else 0.0
                self._value_ms = self._prior_ms + (self._value_ms - self._prior_ms) * weight
                return
        self._value_ms = max(0.0, _quantile(recent, self._quantile))

    def current(self, now_s: float) -> float:
        """The estimate, refreshed first when older than `stale_s`."""
        if now_s - self._refreshed_s >= self._stale_s:
            self.refresh(now_s)
        return self._value_ms


def _quantile(values: np.ndarray, q: float) -> float:
    """`np.quantile(values, q)` (its default, linear interpolation) by one partial sort: the same
    number at a fraction of the cost, which is mostly `np.quantile`'s own argument handling."""
    pos = q * (values.shape[0] - 1)
    lo = int(pos)
    hi = min(lo + 1, values.shape[0] - 1)
    part = np.partition(values, (lo, hi))
    return float(part[lo] + (part[hi] - part[lo]) * (pos - lo))


Catalog = dict[str, tuple[Variant, Profile | None]]
"""Variants by name with their usable profile (None: not usable here)."""


def cheapest_variants(variants: Catalog, architectures: set[str]) -> dict[str, str]:
    """Per architecture, its profiled variant with the lowest cost per query (the one warm-up
    loads and the warm floor keeps)."""
    cheapest: dict[str, tuple[float, str]] = {}
    for name, (variant, profile) in variants.items():
        if profile is None or variant.architecture not in architectures:
            continue
        cost = profile.cost_usd_per_1k(1)
        best = cheapest.get(variant.architecture)
        if best is None or (cost, name) < best:
            cheapest[variant.architecture] = (cost, name)
    return {arch: name for arch, (_, name) in cheapest.items()}


@dataclass(frozen=True)
class Machines:
    """Where a front end's variants run: its own machine, the classes of its Ray cluster's nodes,
    and the class of the node holding each loaded variant's replica (`RayPool.machines`)."""

    here: MachineInfo
    nodes: tuple[MachineInfo, ...] = ()
    replicas: Mapping[str, MachineInfo] = field(default_factory=dict)

    def fingerprints(self) -> set[str]:
        """The machine classes whose profiles may be used."""
        return {m.fingerprint for m in (self.here, *self.nodes, *self.replicas.values())}


def choose_profile(found: Sequence[Profile], machines: Machines, variant: str) -> Profile:
    """Of a variant's profiles (one per machine class), the one measured on the class of the node
    holding its replica, else on this machine, else on a node class of the cluster (a GPU
    variant profiled on a GPU node), else the newest (foreign: the caller leaves it out)."""
    for machine in (machines.replicas.get(variant), machines.here, *machines.nodes):
        if machine is None:
            continue
        same = [p for p in found if p.machine.fingerprint == machine.fingerprint]
        if same:
            return max(same, key=lambda p: p.measured_at_s)
    return max(found, key=lambda p: p.measured_at_s)


@dataclass(frozen=True)
class Snapshot:
    """Everything selection needs from the store, immutable; swapped whole on change."""

    fingerprint: str
    tasks: dict[str, Task]
    architectures: dict[str, Architecture]  # every stored version, by stored name (``net@2``)
    variants: Catalog
    by_task: dict[str, VariantTable]  # the stable versions' variants: what model-less routing sees
    by_architecture: dict[str, VariantTable]  # per stored version
    excluded: dict[str, str] = field(default_factory=dict)  # variant → why its profile is not used
    labels: dict[str, Labels] = field(default_factory=dict)  # per architecture (every one has some)
    serving: frozenset[str] = frozenset()  # stored names of the versions that take traffic

    @classmethod
    def empty(cls) -> Snapshot:
        return cls("", {}, {}, {}, {}, {})

    def table(self, task: str, architecture: str | None = None) -> VariantTable | None:
        """What serves a query: the task's stable versions, or one architecture's (`resolve`d)
        version; None when the name designates nothing."""
        if architecture is None:
            return self.by_task.get(task)
        arch = self.resolve(architecture)
        return None if arch is None else self.by_architecture.get(arch.name)

    def versions_of(self, line: str) -> dict[int, Architecture]:
        """An architecture's stored versions, by number."""
        return {a.version: a for a in self.architectures.values() if a.line == line}

    def resolve(self, name: str) -> Architecture | None:
        """The stored version a name designates: ``net`` (its stable), ``net@2``, ``net@stable``,
        ``net@canary``; None when there is no such version."""
        line, ref = split_version(name)
        labels = self.labels.get(line)
        if labels is None:
            return None
        if ref is None or ref == "stable":
            version: int | None = labels.stable
        elif ref == "canary":
            version = labels.canary
        else:
            version = int(ref) if ref.isdigit() else None
        return None if version is None else self.architectures.get(version_name(line, version))

    @classmethod
    def load(cls, store: MetadataStore, local: MachineInfo | Machines | None = None) -> Snapshot:
        """The store's registrations with the profiles usable where their variants run (`local`:
        this front end's machine, and on a cluster its nodes' classes; default: this machine)."""
        machines = local if isinstance(local, Machines) else Machines(local or local_machine())
        here = machines.here
        usable = machines.fingerprints()
        tasks = {t.name: t for t in store.list_tasks()}
        archs = {a.name: a for a in store.list_architectures()}
        labels = {lab.architecture: lab for lab in store.list_labels()}
        stored = {v.name: v for v in store.list_variants() if v.architecture in archs}
        measured: dict[str, list[Profile]] = {}
        for p in store.list_all_profiles():
            if p.variant in stored:
                measured.setdefault(p.variant, []).append(p)
        profiles: dict[str, Profile] = {}
        excluded: dict[str, str] = {}
        for name, found in sorted(measured.items()):
            variant, p = stored[name], choose_profile(found, machines, name)
            if p.status != "ok":
                excluded[name] = f"its profiling failed ({p.error or 'no reason recorded'})"
            elif p.machine.fingerprint not in usable:
                excluded[name] = (
                    f"it was profiled on another machine ({p.machine.fingerprint}; here "
                    f"{here.fingerprint}): run `infaas profile {variant.architecture}` to measure it here"
                )
            else:
                profiles[name] = p
        variants = {name: (v, profiles.get(name)) for name, v in stored.items()}
        digest = hashlib.sha256()
        for name in sorted(tasks):
            digest.update(tasks[name].model_dump_json().encode())
        for name in sorted(archs):
            digest.update(archs[name].model_dump_json().encode())
        for name in sorted(labels):
            digest.update(labels[name].model_dump_json().encode())
        for name in sorted(variants):
            variant, profile = variants[name]
            digest.update(variant.sha256.encode() + name.encode())
            digest.update(profile.model_dump_json().encode() if profile else b"-")
            digest.update(excluded.get(name, "").encode())
        return cls.build(digest.hexdigest(), tasks, archs, variants, excluded, labels)

    @classmethod
    def build(
        cls,
        fingerprint: str,
        tasks: dict[str, Task],
        archs: dict[str, Architecture],
        variants: dict[str, tuple[Variant, Profile | None]],
        excluded: dict[str, str] | None = None,
        labels: dict[str, Labels] | None = None,
    ) -> Snapshot:
        # Every architecture has labels: without a document, its one version is stable.
        all_labels = {a.line: Labels(architecture=a.line) for a in archs.values()} | (labels or {})
        by_arch: dict[str, list[tuple[Variant, Profile]]] = {name: [] for name in archs}
        by_task: dict[str, list[tuple[Variant, Profile]]] = {name: [] for name in tasks}
        for variant, profile in variants.values():
            if profile is None:
                continue
            arch = archs[variant.architecture]
            by_arch[arch.name].append((variant, profile))
            if arch.version == all_labels[arch.line].stable:
                by_task.setdefault(arch.task, []).append((variant, profile))
        return cls(
            fingerprint=fingerprint,
            tasks=tasks,
            architectures=archs,
            variants=variants,
            by_task={name: VariantTable(entries) for name, entries in by_task.items()},
            by_architecture={name: VariantTable(entries) for name, entries in by_arch.items()},
            excluded=dict(excluded or {}),
            labels=all_labels,
            serving=frozenset(n for n, a in archs.items() if a.version in all_labels[a.line].serving),
        )


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
        # end leaves to replicas (`_room_beside_busy`); None: they run elsewhere, not counted.
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

    def live_state(self, table: VariantTable, now_s: float, rows: int = 1) -> LiveState:
        """Loaded variants, and per live variant the delay a query of `rows` rows would see beyond
        its profile: its queueing delay, how much its path's overhead exceeds the smallest (the
        policy adds that smallest to every variant), and its own run's share of the slowdown
        measured on its batches."""
        return self._live(table, now_s, rows)[0]

    def _live(self, table: VariantTable, now_s: float, rows: int) -> tuple[LiveState, dict[str, float]]:
        """`live_state`, and the batcher's queueing delays it read, by variant: `_routed` needs the
        chosen one's again, and asking the batcher twice per query showed in profiles."""
        loaded = self._loaded_names(table, now_s)
        base_ms = min((t.current(now_s) for t in self.overheads.values()), default=DEFAULT_OVERHEAD_MS)
        delays: dict[str, float] = {}
        queue_ms: dict[str, float] = {}
        variants = self._snapshot.variants
        for name in loaded.union(self._batcher.queue_depths()):
            if name in table:
                variant, profile = variants[name]
                extra_ms = self.overhead_ms(self._pool.overhead_key(variant), now_s) - base_ms
                queue_ms[name] = self._batcher.queue_delay_ms(name)
                delay = queue_ms[name] + extra_ms + self._slower_ms(name, profile, rows)
                if delay > 0.0:
                    delays[name] = delay
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
    ) -> Routed:
        """Pick the variant for a query of `rows` rows, or raise the error the API returns. A name
        the snapshot lacks re-reads the store (blocking) unless not `refresh`. `elapsed_ms` is how
        long the request has already waited: when that alone is past the latency target, the
        answer is 504 (the overhead estimate covers the usual wait before routing)."""
        self._apply_quarantine(now_s)
        task = self.task(task_name, now_s, refresh=refresh)
        snap = self._snapshot
        # Judged on the whole target: the path's overhead estimate (receipt to reply, p99) already
        # prices the usual wait before routing; only a deadline already gone is final.
        left = slo.model_copy(update={"latency_ms": 1e-6}) if elapsed_ms >= slo.latency_ms else slo
        if variant is not None:
            return self._route_pinned(task, rows, slo, left, variant, now_s, refresh, elapsed_ms)
        split = True  # the architecture's canary takes its share (not when a version is pinned)
        if architecture is not None:
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
            table = snap.by_architecture[arch.name]
            split = "@" not in architecture
        else:
            table = snap.by_task.get(task.name) or VariantTable(())
        live, queue_ms = self._live(table, now_s, rows)
        result = table.select(rows, left, live)
        if isinstance(result, Infeasible):
            # Admission: busy (429) or impossible (422)? Ask again as an idle fleet would answer.
            idle = table.select(rows, slo, self._idle(live))
            if isinstance(idle, Infeasible):
                raise self._infeasible_error(idle, task, slo, architecture)
            if elapsed_ms < slo.latency_ms and self._probe(idle.variant, now_s):
                return self._routed(idle, task, live, queue_ms, rows)
            raise self._busy(task, slo, idle, queue_ms.get(idle.variant, 0.0), elapsed_ms)
        if result.load_hint is not None:
            self._hint(result.load_hint, optional=True)
        if result.variant not in live.loaded and live.loaded:
            # A cold variant is the answer only because the loaded ones are busy? Then this is
            # overload, and adding capacity is the autoscaler's call (it checks the cluster has
            # room; loading here on every busy moment filled the cluster with variants that
            # shared its cores): refuse, as for any busy variant.
            idle = table.select(rows, slo, self._idle(live))
            if isinstance(idle, Choice) and idle.variant in live.loaded:
                if elapsed_ms < slo.latency_ms and self._probe(idle.variant, now_s):
                    return self._routed(idle, task, live, queue_ms, rows)
                raise self._busy(task, slo, idle, queue_ms.get(idle.variant, 0.0), elapsed_ms)
        if self._spill_without_cores(result, queue_ms):
            # The variant the targets call for is busy and this one is only the spill: on
            # cores already busy it adds no capacity (`_spill_without_cores`): refuse as busy.
            idle = table.select(rows, slo, self._idle(live))
            if isinstance(idle, Choice) and idle.variant in self._batcher.in_flight():
                raise self._busy(task, slo, idle, queue_ms.get(idle.variant, 0.0), elapsed_ms)
        if result.variant not in live.loaded and result.predicted_latency_ms > left.latency_ms:
            # Only a cold variant meets the targets, and its load would outlast the deadline:
            # load it, and ask the client to come back rather than answer late.
            raise self._cold(task, slo, result)
        if split:
            canary = self._canary(result, rows, left, now_s)
            if canary is not None:
                result, live, queue_ms = canary
        return self._routed(result, task, live, queue_ms, rows)

    def _spill_without_cores(self, chosen: Choice, queue_ms: Mapping[str, float]) -> bool:
        """Whether `chosen` is a loaded replica with nothing to do, chosen while another variant
        of the table is busy, on a host without room for its threads (`_room_beside_busy`).
        Sent work there, it adds no capacity and slows the busy ones down under the queries they
        already admitted. (2026-12-05, 2 cores: at the start of the overload test's 10x burst
        and of the load step, the idle fp32 replica took the busy int8 one's spill; both ran
        1.2-3x their prediction, and that was every late answer and 504 of the first overload
        runs.)"""
        # Cheapest tests first: this runs for every routed query.
        if self._replica_cores is None or queue_ms.get(chosen.variant, 0.0) > 0.0:
            return False
        if self._pool.path(chosen.variant) != "remote":
            return False
        busy = self._batcher.in_flight()
        if chosen.variant in busy or not any(name in queue_ms for name in busy):
            return False
        if not self._pool.is_loaded(chosen.variant):
            return False
        return not self._room_beside_busy(self._snapshot.variants[chosen.variant][0], busy)

    def _room_beside_busy(self, variant: Variant, busy: Mapping[str, int]) -> bool:
        """Whether this host's cores left to replicas, less the vCPUs held by the replicas running
        batches (`busy`: batches in flight by variant), hold the vCPUs of one more replica of
        `variant` (`VariantSpec.holds`). Always where nothing runs (there is nothing to slow
        down) or the replicas run on other hosts."""
        if self._replica_cores is None or not busy:
            return True
        variants = self._snapshot.variants
        taken = sum(
            min(batches, max(1, self._pool.replicas(name))) * variants[name][0].spec.holds[0]
            for name, batches in busy.items()
            if name in variants and self._pool.path(name) == "remote"
        )
        return self._replica_cores - taken >= variant.spec.holds[0]

    def _canary(
        self, chosen: Choice, rows: int, left: SLO, now_s: float
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
            live, queue_ms = self._live(table, now_s, rows)
            result = table.select(rows, left, live)
            if isinstance(result, Choice) and result.variant in live.loaded:
                return result, live, queue_ms
        self.canary_split.missed(line, labels.canary)
        return None

    @staticmethod
    def _idle(live: LiveState, also_loaded: str | None = None) -> LiveState:
        """`live` on an idle fleet: no queues, and the path's overhead at its prior (the hop alone).
        The measured overhead is not used: under overload it holds the waits beyond prediction
        that overload causes, and judged with it every target would look impossible (422, or, for
        a pinned variant, served regardless: a queue that grows until requests expire)."""
        loaded = live.loaded | {also_loaded} if also_loaded is not None else live.loaded
        return LiveState(loaded=loaded, overhead_ms=min(live.overhead_ms, DEFAULT_OVERHEAD_MS))

    def _probe(self, variant: str, now_s: float) -> bool:
        """Admit one refused query per `PROBE_INTERVAL_S` and path anyway: refusals add no
        answers, and without answers the overhead estimate that refuses them could not learn
        that the cause (a burst, a pause) is gone. Not while the variant has work queued or
        running: its answers are on their way and will teach the estimate, and a probe would only
        wait behind them, late (under a 30× overload, probes were most answers, at ~1.5 s)."""
        tracker = self.overheads.get(self._pool.overhead_key(self._snapshot.variants[variant][0]))
        if tracker is None or now_s - tracker.last_s < PROBE_INTERVAL_S:
            return False
        if self._batcher.queue_depths().get(variant) or self._batcher.in_flight().get(variant):
            return False
        tracker.last_s = now_s
        return True

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

    def _route_pinned(
        self,
        task: Task,
        rows: int,
        slo: SLO,
        left: SLO,
        name: str,
        now_s: float,
        refresh: bool,
        elapsed_ms: float,
    ) -> Routed:
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
        live, queue_ms = self._live(table, now_s, rows)
        decision = table.predict(name, rows, live)
        if decision is None:  # unreachable after the checks above; kept as a typed guard
            raise VariantNotFound(f"no variant {name!r}", variant=name)
        if decision.predicted_latency_ms > left.latency_ms:
            # A pinned variant is served even when it cannot meet the latency target, unless only
            # its queue or its cold load is in the way: then the client should come back.
            idle = table.predict(name, rows, self._idle(live, also_loaded=name))
            if idle is not None and idle.predicted_latency_ms <= slo.latency_ms:
                if name not in live.loaded:
                    raise self._cold(task, slo, decision)
                raise self._busy(task, slo, idle, queue_ms.get(name, 0.0), elapsed_ms)
        return self._routed(decision, task, live, queue_ms, rows)

    def _routed(
        self, decision: Choice, task: Task, live: LiveState, queue_ms: dict[str, float], rows: int
    ) -> Routed:
        variant, profile = self._snapshot.variants[decision.variant]
        assert profile is not None
        queued_ms = queue_ms.get(decision.variant)
        if queued_ms is None:  # neither loaded nor queued when the state was read
            queued_ms = self._batcher.queue_delay_ms(decision.variant)
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
        if optional and not self._room_beside_busy(entry[0], self._batcher.in_flight()):
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
