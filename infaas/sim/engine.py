"""A discrete-event simulation of the service, in virtual time, over the service's own policies.

What is the service's, imported and called as it calls them (`POLICIES` names them, and a unit
test checks they are the very objects the service imports):

- admission and selection: `policy.verdict.admit` (the router's verdict: served, 429 busy or
  cold, 422) over a `View` of the simulated state, with `VariantTable.select` / `.predict` inside
  it; a cold refusal loads the variant, and a load hint loads the cheaper cold variant when the
  cluster has room, as the router does;
- batching: `policy.batching.decide` on every arrival, completion and timer, with the in-flight
  cap of the batcher (replicas × batches in flight per replica), the predicted finish of each
  batch sent and the wait at a busy replica (the batcher's own `InFlight`), requests whose
  deadline passed dropped (504), those at the head that could no longer meet it refused (429, the
  policy's doomed rule), and `predicted_queue_delay_ms` as the queueing delay the router
  reads;
- autoscaling: `policy.autoscaling.decide` every second on a `FleetSnapshot` built as
  `Autoscaler.snapshot` builds it (the service's `DemandWindow` over the last 5 s, fed the same
  `MeterRecord`s; `capacity_rows_per_s`; warm floors from `cheapest_variants`);
- money: `metering.cost_share_pusd` for what a query is charged; fleet cost is replicas × the
  profile's price × time, as `FleetCost` integrates it;
- placement: `workers.placement.decide_where`, the rule that runs a sub-hop variant in the front
  end (one copy on the front end's core, no hop, its batches capped; the autoscaler upgrades its
  traffic instead of replicating it) and every other on worker replicas.

What is simulated (the worker model), and how it departs from the service:

- `workers` machines of `cores` cores, the last `gpu_workers` of them with `gpus` GPUs each (a
  GPU machine class); a replica holds what `VariantSpec.holds` says it holds, as the service's
  autoscaler and worker caps count it: a CPU variant `threads` cores, a GPU variant
  `autoscaling.gpu_share` of a GPU and no core (first fit, CPU-only machines first), runs one
  batch at a time, and is ready `load_time_s` after it is placed. GPU replicas sharing a GPU
  (a share below 1) do not slow each other here: not modelled. Every mode starts with
  the warm-up's floors loaded (the cheapest variant of each architecture), as the service does.
  The free cores the autoscaler sees are the cluster's free cores less one reserved for the front
  end; a placement that fragmentation defeats is skipped, as the service skips an action that
  fails.
- A batch runs for a draw of the profile's own spread at its rows: a log-normal factor whose
  median is the profile's p50 and whose 99th percentile is its p99 (`noise=None`, the default:
  sigma = ln(p99 / p50) / 2.326 per batch size), or of a fixed sigma around p50 (`noise` a
  number; 0: always the p50), then the Ray hop (`hop_ms`, all of it after the run; none in the front end); an
  answer's latency adds the front end's own `frontend_ms`. The router's overhead estimate (a
  measured p99 in the service) is the constant ``hop_ms + frontend_ms`` here, and the batcher's
  learned overhead is the variant's hop; there is no slowdown from machines shared by other
  processes.
- `front_ends` front ends (`frontend_ms` of CPU per query each, a query to the one free first)
  share one set of batcher queues and one router view; the service's front ends keep their own
  queues, fast-path copies and overhead estimates. With `door_ms` set, each tenant's door
  (`policy.shedding.DoorShedder`, taught by admission's verdicts while the front end is behind,
  `policy.shedding.LoopWatch`) refuses its share on arrival at `door_ms` of the front end's time;
  the door's pacing of what it refuses (`RefusalPacer`) is not modelled. With `refusal_ms` set, a
  query admission refuses takes that much of the front end, not `frontend_ms`.
- Not modelled: memory budgets and LRU eviction, quarantine, the router's probes while refusing
  (the view's `probe_ready` is empty), the host's room for a spill (`room` None), the front end's
  limit and tenants' shares (`standing` None), retries by clients. A removed replica's running
  batches still finish.

Modes: ``modelless`` (the above), ``static`` (each task's most accurate variant, pinned, with a
fixed number of replicas, no autoscaler) and ``replicate-only`` (each tenant pinned to the
cheapest variant meeting its targets at low load, chosen once; the autoscaler's actions are
restricted to replicate and remove through the policy's config, as the service's
`INFAAS_AUTOSCALE_ACTIONS` restricts them).

The engine does no I/O: a trace and a zoo in, a `ModeResult` out.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

import infaas.policy.autoscaling as autoscaling_policy
import infaas.policy.batching as batching_policy
import infaas.policy.selection as selection_policy
import infaas.policy.verdict as verdict_policy
from infaas.metering import MeterRecord, cost_share_pusd
from infaas.overhead import DEFAULT_OVERHEAD_MS
from infaas.policy.autoscaling import Action, AutoscalingConfig, FleetSnapshot, ScalingState, VariantState
from infaas.policy.batching import BatchParams
from infaas.policy.demand import DemandWindow, capacity_rows_per_s
from infaas.policy.selection import Infeasible, LiveState, VariantTable
from infaas.policy.shedding import DoorShedder, LoopWatch
from infaas.policy.verdict import Query, View
from infaas.sim.traces import Trace
from infaas.sim.zoo import Zoo
from infaas.snapshot import cheapest_variants
from infaas.types import SLO, Profile, Variant
from infaas.workers.placement import decide_where

__all__ = [
    "MODES",
    "POLICIES",
    "Mode",
    "ModeResult",
    "SimConfig",
    "Simulation",
    "TenantResult",
    "TimelinePoint",
    "simulate",
]

Mode = Literal["modelless", "static", "replicate-only"]
MODES: tuple[Mode, ...] = ("modelless", "static", "replicate-only")

# The decisions the engine takes, by the service's names. The engine calls them only through these
# module objects (never copies), so "the simulator runs the service's policies" is checkable.
select_policy = selection_policy.VariantTable.select
predict_policy = selection_policy.VariantTable.predict
batch_policy = batching_policy.decide
queue_delay_policy = batching_policy.predicted_queue_delay_ms
admit_policy = verdict_policy.admit
autoscale_policy = autoscaling_policy.decide
POLICIES: dict[str, object] = {
    "selection.VariantTable.select": select_policy,
    "selection.VariantTable.predict": predict_policy,
    "verdict.admit": admit_policy,
    "batching.decide": batch_policy,
    "batching.predicted_queue_delay_ms": queue_delay_policy,
    "autoscaling.decide": autoscale_policy,
    "metering.cost_share_pusd": cost_share_pusd,
    "placement.decide_where": decide_where,
}

_ALLOWED: dict[Mode, frozenset[str] | None] = {
    "modelless": None,
    "static": frozenset(),
    "replicate-only": frozenset({"replicate", "remove"}),
}

_DONE, _TIMER, _READY, _TICK = 0, 1, 2, 3  # event kinds; at equal times, completions go first
_FRONT_END = -1  # the "worker" of a variant that runs in the front end


@dataclass(frozen=True)
class SimConfig:
    """The worker model and the service's settings the simulation uses."""

    workers: int = 4
    cores: int = 8
    hop_ms: float = 0.8  # the Ray hop per batch (DESIGN.md measures ~0.7 ms)
    # Variants under this single-row p99 run in the front end, as the service places them
    # (`workers.placement.decide_where`, INFAAS_FAST_PATH_MAX_MS): one copy, no hop; 0: none.
    fast_path_max_ms: float = 0.25
    # The front end's own CPU per query (parse, route, reply), on its one core: queries wait for
    # it under load, and the router's measured overhead grows by that wait.
    frontend_ms: float = 0.1
    # Front ends behind a load balancer that gives each query to the one free first (`infaas
    # serve --workers N`, or hosts of their own): a 100-worker fleet behind one Python front end
    # would measure the front end. Each runs the fast path's batches of the queries it took.
    front_ends: int = 1
    # The door (`policy.shedding.DoorShedder`, one per tenant, as the data plane keeps): a query
    # it refuses costs the front end `door_ms`, not `frontend_ms` (the service refuses it in its
    # HTTP parser, its body unread: ~0.08 ms against ~0.25-0.7 for a query judged by admission).
    # None: no door, every query judged by admission at `frontend_ms`.
    door_ms: float | None = None
    # The front end's time for a query admission refuses (429, 422): parsed and judged, but no
    # batch, charge or answer to render (`scripts/bench_query_cpu --target-ms 0.001`: about half
    # an answer's CPU). None: `frontend_ms`, as an answer.
    refusal_ms: float | None = None
    # The GPU machine class: the last `gpu_workers` of the `workers` machines have `gpus` GPUs
    # each (and `cores` cores, which CPU replicas may use too). A GPU replica's share of a GPU is
    # `autoscaling.gpu_share`, as the service's is `INFAAS_GPU_PER_WORKER`.
    gpu_workers: int = 0
    gpus: int = 1
    reserved_cores: int = 1  # the (first) front end's, on the cluster's cores
    max_in_flight: int = 2  # batches in flight per replica (the batcher's default)
    max_queue_rows: int = 4096  # the batcher's bound (INFAAS_MAX_QUEUE_ROWS)
    interval_s: float = 1.0  # the autoscaler's round
    window_s: float = 5.0  # its demand look-back
    autoscaling: AutoscalingConfig = field(default_factory=AutoscalingConfig)
    # Sigma of the log-normal factor on a batch's run time: None, each profile's measured spread
    # (p50 -> p99 at each batch size); a number, that sigma everywhere (0: no noise).
    noise: float | None = None
    static_replicas: int | None = None  # per pinned variant; None: sized for the trace's peak
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1 or self.cores < 1 or self.front_ends < 1:
            raise ValueError("workers, cores and front ends must be at least 1")
        if min(self.door_ms or 0.0, self.refusal_ms or 0.0) < 0.0:
            raise ValueError("door_ms and refusal_ms must be at least 0 (or None)")
        if not 0 <= self.gpu_workers <= self.workers or self.gpus < 1:
            raise ValueError("gpu_workers must be in [0, workers] and gpus at least 1")


@dataclass
class TenantResult:
    """What one tenant's queries came to. Violations are late + refused + dropped + failed
    answers; 422s (targets no variant meets even idle) are the tenant's to fix and kept apart."""

    tenant: str
    task: str
    queries: int = 0
    in_slo: int = 0
    late: int = 0
    refused: int = 0  # 429
    infeasible: int = 0  # 422
    dropped: int = 0  # 504: the deadline passed in the queue
    failed: int = 0  # no replica could be placed for it
    rows: int = 0  # rows answered
    charged_pusd: int = 0
    by_variant: dict[str, int] = field(default_factory=dict)  # answers per variant

    @property
    def answered(self) -> int:
        return self.in_slo + self.late

    @property
    def violations(self) -> int:
        return self.late + self.refused + self.dropped + self.failed

    @property
    def charged_usd(self) -> float:
        return self.charged_pusd / 1e12

    def add(self, other: TenantResult) -> None:
        for name in ("queries", "in_slo", "late", "refused", "infeasible", "dropped", "failed", "rows"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.charged_pusd += other.charged_pusd
        for variant, n in other.by_variant.items():
            self.by_variant[variant] = self.by_variant.get(variant, 0) + n


@dataclass(frozen=True)
class TimelinePoint:
    """One second of virtual time."""

    t_s: float
    replicas: dict[str, int]  # loaded or loading, by variant
    usd_per_s: float  # fleet cost rate at the end of the second
    answered: int
    in_slo: int
    p99_ms: float | None  # of the answers in this second


@dataclass
class ModeResult:
    mode: Mode
    duration_s: float
    tenants: list[TenantResult]
    fleet_usd: float
    timeline: list[TimelinePoint]
    actions: dict[str, int]  # autoscaler actions taken, by kind
    wall_s: float = 0.0
    events: int = 0

    @property
    def total(self) -> TenantResult:
        out = TenantResult("all", "")
        for t in self.tenants:
            out.add(t)
        return out

    @property
    def goodput(self) -> float:
        """In-SLO answers per second of the trace."""
        return self.total.in_slo / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def violation_rate(self) -> float:
        total = self.total
        return total.violations / max(1, total.queries - total.infeasible)


class _Item:
    """A queued request (the batching policy's `Queued`)."""

    __slots__ = ("arrival_s", "deadline_s", "rows", "slo", "target_ms", "tenant")

    def __init__(self, rows: int, arrival_s: float, slo: SLO, tenant: int) -> None:
        self.rows = rows
        self.arrival_s = arrival_s
        self.target_ms = target_ms = slo.latency_ms
        self.deadline_s = arrival_s + target_ms / 1000.0
        self.slo = slo
        self.tenant = tenant


class _Replica:
    __slots__ = ("free_at_s", "ready_at_s", "worker")

    def __init__(self, worker: int, ready_at_s: float) -> None:
        self.worker = worker
        self.ready_at_s = ready_at_s
        self.free_at_s = ready_at_s


def _plus(latency_ms: Callable[[int], float], wait_ms: float, rows: int) -> float:
    return latency_ms(rows) + wait_ms


_Z99 = 2.3263478740408408
"""The standard normal's 99th percentile."""


def spread_sigma(p50_ms: float, p99_ms: float) -> float:
    """Sigma of the log-normal whose median is `p50_ms` and whose 99th percentile is `p99_ms` (0
    when the profile measured no spread)."""
    if p50_ms <= 0.0 or p99_ms <= p50_ms:
        return 0.0
    return math.log(p99_ms / p50_ms) / _Z99


class _VQ:
    """One variant: its replicas and the batcher's queue for it."""

    def __init__(
        self,
        variant: Variant,
        profile: Profile,
        task: str,
        hop_ms: float,
        local_rows: int | None = None,
        gpu_share: float = 1.0,
    ) -> None:
        self.variant = variant
        self.profile = profile
        self.name = variant.name
        self.task = task
        self.cpus, self.gpus = variant.spec.holds(gpu_share)  # what one replica holds
        self.price_usd_per_s = variant.spec.replica_price(profile.price_usd_per_s, gpu_share)
        # In the front end (`local_rows`: its batch cap there): one copy, on the front end's own
        # core, and no hop.
        self.local = local_rows is not None
        self.hop_ms = 0.0 if self.local else hop_ms
        overhead_ms = self.hop_ms
        self.max_batch = min(variant.spec.max_batch, local_rows or variant.spec.max_batch)
        top = self.max_batch + 1
        # The profile's curves, read once: Profile.latency_ms interpolates on every call.
        self.p50 = [0.0] + [profile.latency_ms(b, "p50") for b in range(1, top)]
        p99 = [0.0] + [profile.latency_ms(b, "p99") for b in range(1, top)]
        self.spread = [0.0] + [spread_sigma(self.p50[b], p99[b]) for b in range(1, top)]
        predicted = [0.0] + [p99[b] + overhead_ms for b in range(1, top)]
        self.predicted = predicted
        self.latency_ms: Callable[[int], float] = predicted.__getitem__
        self.floor_ms: Callable[[int], float] = [p + overhead_ms for p in self.p50].__getitem__
        self.pending: deque[_Item] = deque()
        self.queued_rows = 0
        self.in_flight = batching_policy.InFlight()
        self.replicas: list[_Replica] = []
        self.ready = 0
        self.params = BatchParams(max_batch=self.max_batch)
        self.timer_at: float | None = None
        self.timer_seq = 0
        self.delay_step = -1
        self.delay_ms = 0.0
        self.shares: dict[int, int] = {}  # (batch rows << 20 | rows) → charged pusd


class _Delays(Mapping[str, float]):
    """The queueing delays a `LiveState` carries, computed when the policy asks for one: the
    policy reads a handful per query, and computing all of a task's up front cost a loop over
    hundreds of variants per query. As a mapping it holds every variant of the scope (0 when idle)."""

    def __init__(self, sim: Simulation, names: list[str]) -> None:
        self._sim = sim
        self._names = names

    def get(self, key: str, default: float | None = None) -> float:  # type: ignore[override]
        vq = self._sim._vqs.get(key)
        if vq is None:
            return 0.0 if default is None else default
        return self._sim._delay(vq)

    def __getitem__(self, key: str) -> float:
        if key not in self._sim._vqs:
            raise KeyError(key)
        return self._sim._delay(self._sim._vqs[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class Simulation:
    """One run of one mode over one trace; `run` returns its `ModeResult`."""

    def __init__(self, zoo: Zoo, trace: Trace, mode: Mode, config: SimConfig | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        self.trace = trace
        self.mode = mode
        self.config = cfg = config or SimConfig()
        if not cfg.gpu_workers:
            # As the router's snapshot does (`snapshot.choose_profile`): a variant whose machine
            # class the cluster lacks has no usable profile.
            zoo = zoo.cpu_only()
        self.zoo = zoo
        self.now_s = 0.0
        self._rng = np.random.default_rng(cfg.seed)
        self._overhead_ms = cfg.hop_ms + cfg.frontend_ms
        self._fe_free = [0.0] * cfg.front_ends  # a heap: when each front end's core is next free
        self._heap: list[tuple[float, int, int, Any]] = []  # (time, kind, sequence, payload)
        self._seq = 0
        self._step = 0
        self._batch_ids = 0
        self._free = [float(cfg.cores)] * cfg.workers
        self._free_gpu = [0.0] * (cfg.workers - cfg.gpu_workers) + [float(cfg.gpus)] * cfg.gpu_workers
        self._fleet_usd = 0.0
        self._fleet_rate = 0.0
        self._fleet_at_s = 0.0
        by_task = zoo.by_task()
        self._tables = {task: VariantTable(entries) for task, entries in by_task.items()}
        self._vqs: dict[str, _VQ] = {
            v.name: _VQ(
                v,
                p,
                zoo.tasks[v.architecture],
                cfg.hop_ms,
                self._local_rows(v, p),
                cfg.autoscaling.gpu_share,
            )
            for v, p in zoo.variants.values()
        }
        self._task_names = {task: [v.name for v, _ in entries] for task, entries in by_task.items()}
        self._delays = {task: _Delays(self, names) for task, names in self._task_names.items()}
        self._loaded: dict[str, frozenset[str]] = {task: frozenset() for task in by_task}
        self._idle: dict[str, LiveState] = {}
        self._floors = set(cheapest_variants(dict(zoo.variants.items()), set(zoo.tasks)).values())
        self._demand = DemandWindow(cfg.window_s)
        self._state = ScalingState()
        self._slos: dict[tuple[float, float], SLO] = {}
        self._tenants = [TenantResult(name, "") for name in trace.tenants]
        # The door's shedders, and the front end's loop as the door reads it: busy once a query
        # waited for the front end as long as the service's loop watch calls a tick late.
        self._doors = None if cfg.door_ms is None else [DoorShedder() for _ in trace.tenants]
        self._loop_watch = LoopWatch()
        who, first = np.unique(trace.tenant, return_index=True)
        for ti, i in zip(who.tolist(), first.tolist(), strict=True):  # a tenant's task: its first query's
            self._tenants[ti].task = trace.tasks[int(trace.task[i])]
        self._pinned: dict[int, str] = {}
        self._actions: dict[str, int] = {}
        self._timeline: list[TimelinePoint] = []
        self._ans_s = array("d")
        self._ans_ms = array("d")
        self._ans_ok = array("b")
        self._setup()

    # ---- the fleet --------------------------------------------------------------------------

    def _local_rows(self, variant: Variant, profile: Profile) -> int | None:
        """The batch cap of a variant the service would run in its front end, else None."""
        if self.config.fast_path_max_ms <= 0:
            return None
        where = decide_where(variant, profile, self.config.fast_path_max_ms)
        return where.max_rows if where.path == "local" else None

    def _place(self, vq: _VQ, ready_at_s: float) -> bool:
        """One more replica of `vq` on the first worker with room (first fit); a front-end
        variant has one copy, which takes no worker's cores."""
        if vq.local:
            if vq.replicas:
                return False
            where = _FRONT_END
        else:
            free, free_gpu = self._free, self._free_gpu
            room = [w for w in range(len(free)) if free[w] >= vq.cpus and free_gpu[w] + 1e-9 >= vq.gpus]
            if not room:
                return False
            where = room[0]
            free[where] -= vq.cpus
            free_gpu[where] -= vq.gpus
        vq.replicas.append(_Replica(where, ready_at_s))
        self._charge()
        self._fleet_rate += vq.price_usd_per_s
        if ready_at_s <= self.now_s:
            self._ready(vq)
        else:
            self._push(ready_at_s, _READY, vq)
        self._recap(vq)
        return True

    def _drop(self, vq: _VQ, keep: int) -> None:
        """Down to `keep` replicas: the still-loading ones go first, then the last placed."""
        was_loaded = vq.ready > 0
        vq.replicas.sort(key=lambda r: r.ready_at_s <= self.now_s, reverse=True)
        while len(vq.replicas) > keep:
            r = vq.replicas.pop()
            if r.worker != _FRONT_END:
                self._free[r.worker] += vq.cpus
                self._free_gpu[r.worker] += vq.gpus
            self._charge()
            self._fleet_rate -= vq.price_usd_per_s
        vq.ready = sum(1 for r in vq.replicas if r.ready_at_s <= self.now_s)
        if (vq.ready > 0) != was_loaded:
            self._loaded_changed(vq.task)
        self._recap(vq)
        self._pump(vq)

    def _ready(self, vq: _VQ) -> None:
        vq.ready = sum(1 for r in vq.replicas if r.ready_at_s <= self.now_s)
        if (vq.ready > 0) != (vq.name in self._loaded[vq.task]):
            self._loaded_changed(vq.task)

    def _loaded_changed(self, task: str) -> None:
        # A new frozenset only when the fleet changes: the selection policy keys a cache on its
        # identity, as the router reuses one set while its view of the pool is fresh.
        self._loaded[task] = frozenset(n for n in self._task_names[task] if self._vqs[n].ready > 0)
        self._idle.pop(task, None)

    def _recap(self, vq: _VQ) -> None:
        """The batcher's in-flight cap: replicas × batches in flight per replica."""
        cap = max(1, len(vq.replicas)) * self.config.max_in_flight
        if cap != vq.params.max_in_flight:
            vq.params = BatchParams(max_batch=vq.max_batch, max_in_flight=cap)

    def _charge(self) -> None:
        self._fleet_usd += self._fleet_rate * (self.now_s - self._fleet_at_s)
        self._fleet_at_s = self.now_s

    def _free_cpus(self) -> float:
        return float(max(0, sum(self._free) - self.config.reserved_cores))

    def _free_gpus(self) -> float:
        return sum(self._free_gpu)

    def _setup(self) -> None:
        """The fleet at time 0, ready: the warm-up's floors (the service warms them up in every
        mode), then the pinned baselines' variants."""
        trace = self.trace
        for name in sorted(self._floors):
            self._place(self._vqs[name], 0.0)
        if self.mode == "modelless":
            return
        for ti, tenant in enumerate(self._tenants):
            table = self._tables.get(tenant.task)
            if table is None:
                continue
            if self.mode == "static":
                best = max(
                    table.variants, key=lambda n: (self._vqs[n].profile.accuracy, -self._vqs[n].p50[1], n)
                )
                self._pinned[ti] = best
            else:
                mask = trace.tenant == ti
                slo = SLO(
                    latency_ms=float(trace.latency_ms[mask].min()),
                    min_accuracy=float(trace.min_accuracy[mask].max()),
                )
                rows = int(trace.rows[mask].max())
                idle = LiveState(overhead_ms=self._overhead_ms)
                choice = select_policy(table, rows, slo, idle)
                if isinstance(choice, Infeasible):
                    # No variant meets its targets: it takes the one nearest to them.
                    alt = choice.fastest_at_accuracy or choice.most_accurate_at_latency
                    self._pinned[ti] = alt.variant if alt is not None else table.variants[0]
                else:
                    self._pinned[ti] = choice.variant
        pinned = sorted(set(self._pinned.values()))
        replicas = {name: 1 for name in pinned}
        if self.mode == "static":
            replicas = self._static_replicas(pinned)
        for name in pinned:
            vq = self._vqs[name]
            for _ in range(replicas[name] - len(vq.replicas)):  # a floor may be pinned too
                if not self._place(vq, 0.0):
                    break

    @property
    def pins(self) -> dict[str, str]:
        """Tenant → the variant its queries are pinned to (the baselines; empty for modelless):
        what a client of the real service pins to run the same baseline."""
        return {self._tenants[ti].tenant: name for ti, name in sorted(self._pinned.items())}

    def _static_replicas(self, pinned: list[str]) -> dict[str, int]:
        """Replicas per pinned variant: the configured count, or enough for the trace's peak
        5-second rows/s at the autoscaler's target utilisation (scaled down to fit the cluster)."""
        cfg = self.config
        if cfg.static_replicas is not None:
            return {name: cfg.static_replicas for name in pinned}
        trace = self.trace
        need: dict[str, int] = {}
        for name in pinned:
            tenants = [ti for ti, n in self._pinned.items() if n == name]
            mask = np.isin(trace.tenant, tenants)
            seconds = max(1, math.ceil(trace.duration_s / 5.0))
            rows = np.bincount((trace.time_s[mask] // 5.0).astype(np.int64), trace.rows[mask], seconds + 1)
            peak = float(rows.max()) / 5.0 if rows.size else 0.0
            vq = self._vqs[name]
            cap = capacity_rows_per_s(vq.profile)
            need[name] = max(1, math.ceil(peak / (cfg.autoscaling.target_utilization * max(cap, 1e-9))))
        # Scaled down to fit the cluster, cores and GPUs each.
        for room, gpu in (
            (cfg.workers * cfg.cores - cfg.reserved_cores, False),
            (cfg.gpu_workers * cfg.gpus, True),
        ):
            holds = {n: self._vqs[n].gpus if gpu else self._vqs[n].cpus for n in pinned}
            held = sum(need[n] * holds[n] for n in pinned)
            if held > room:
                scale = room / held
                need = {n: max(1, int(c * scale)) if holds[n] else c for n, c in need.items()}
        return need

    # ---- events -----------------------------------------------------------------------------

    def _push(self, at_s: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_s, kind, self._seq, payload))

    def run(self, progress: Callable[[float], None] | None = None) -> ModeResult:
        """Replay the whole trace, then let the queues drain; the result."""
        started = time.perf_counter()
        trace = self.trace
        n = len(trace)
        times = trace.time_s.tolist()
        tenants = trace.tenant.tolist()
        tasks = trace.task.tolist()
        rows = trace.rows.tolist()
        lats = trace.latency_ms.tolist()
        accs = trace.min_accuracy.tolist()
        task_names = trace.tasks
        end_s = trace.duration_s
        self._push(self.config.interval_s, _TICK, None)
        heap = self._heap
        report_every = max(1, n // 200)
        i = 0
        while i < n or heap:
            if i < n and (not heap or times[i] < heap[0][0]):
                self.now_s = times[i]
                self._step += 1
                self._arrive(tenants[i], task_names[tasks[i]], rows[i], lats[i], accs[i])
                i += 1
                if progress is not None and i % report_every == 0:
                    progress(i / n)
                continue
            at_s, kind, _, payload = heapq.heappop(heap)
            self.now_s = at_s
            self._step += 1
            if kind == _DONE:
                self._done(*payload)
            elif kind == _TIMER:
                vq, seq = payload
                if seq == vq.timer_seq:
                    vq.timer_at = None
                    self._pump(vq)
            elif kind == _READY:
                self._ready(payload)
                self._pump(payload)
            elif at_s <= end_s + 1e-9:
                self._tick()
                self._push(at_s + self.config.interval_s, _TICK, None)
        self.now_s = max(self.now_s, end_s)
        self._charge()
        if progress is not None:
            progress(1.0)
        return ModeResult(
            mode=self.mode,
            duration_s=self.now_s,  # the trace and the drain of its last batches
            tenants=self._tenants,
            fleet_usd=self._fleet_usd,
            timeline=self._finish_timeline(),
            actions=dict(self._actions),
            wall_s=time.perf_counter() - started,
            events=self._step,
        )

    # ---- the request path (the router, then the batcher) -------------------------------------

    def _slo(self, latency_ms: float, min_accuracy: float) -> SLO:
        slo = self._slos.get((latency_ms, min_accuracy))
        if slo is None:
            slo = self._slos[(latency_ms, min_accuracy)] = SLO(
                latency_ms=latency_ms, min_accuracy=min_accuracy
            )
        return slo

    def _idle_live(self, task: str) -> LiveState:
        live = self._idle.get(task)
        if live is None:
            # As `liveview.idle`: no queues, the path's overhead at most its prior.
            live = LiveState(
                loaded=self._loaded[task], overhead_ms=min(self._overhead_ms, DEFAULT_OVERHEAD_MS)
            )
            self._idle[task] = live
        return live

    def _arrive(self, tenant: int, task: str, rows: int, latency_ms: float, min_accuracy: float) -> None:
        result = self._tenants[tenant]
        result.queries += 1
        table = self._tables.get(task)
        if table is None:
            result.infeasible += 1
            return
        slo = self._slo(latency_ms, min_accuracy)
        loaded = self._loaded[task]
        # The front end takes the query when its core is free: that wait is part of its latency,
        # and of the overhead the router measures and admits by.
        start_s = max(self.now_s, self._fe_free[0])
        waited_s = start_s - self.now_s
        door = None if self._doors is None else self._doors[tenant]
        if door is not None and not door.admit(self.now_s):
            # Refused at the door, at its own cost (`SimConfig.door_ms`).
            heapq.heapreplace(self._fe_free, start_s + (self.config.door_ms or 0.0) / 1000.0)
            self._refused(tenant, "", rows, slo)
            return
        if waited_s >= self._loop_watch.late_s:
            self._loop_watch.mark(self.now_s)
        live = LiveState(loaded, self._delays[task], self._overhead_ms + waited_s * 1000.0)
        name = self._route(table, task, tenant, rows, slo, live, self._pinned.get(tenant), door)
        # Its time on the front end: a refusal by the verdict its own (`SimConfig.refusal_ms`).
        cfg = self.config
        cost_ms = cfg.frontend_ms if name or cfg.refusal_ms is None else cfg.refusal_ms
        heapq.heapreplace(self._fe_free, start_s + cost_ms / 1000.0)
        if name is None:
            return
        if name == "":
            result.infeasible += 1
            return
        vq = self._vqs[name]
        if vq.queued_rows + rows > self.config.max_queue_rows:
            self._refused(tenant, name, rows, slo)
            return
        if not vq.replicas and not self._place(vq, self.now_s + vq.profile.load_time_s):
            result.failed += 1
            self._meter(tenant, name, "unavailable", rows, 0, slo)
            return
        item = _Item(rows, self.now_s - waited_s, slo, tenant)  # its clock started at the door
        vq.pending.append(item)
        vq.queued_rows += rows
        self._pump(vq)

    def _route(
        self,
        table: VariantTable,
        task: str,
        tenant: int,
        rows: int,
        slo: SLO,
        live: LiveState,
        pinned: str | None,
        door: DoorShedder | None = None,
    ) -> str | None:
        """`Router.route`: the variant to queue on, "" for 422, None when refused, by the
        service's own verdict (`policy.verdict.admit`) over the simulated view, which teaches the
        tenant's `door` as the data plane does. The view holds no probes (the router's probes
        while refusing are not modelled) and no host room (replicas here hold their cores
        alone)."""
        verdict = admit_policy(Query(rows, slo, 0.0, pinned), View(table, live, self._idle_live(task)))
        choice = verdict.choice
        if verdict.kind == "infeasible" or choice is None:
            return ""
        if verdict.kind == "cold":
            self._hint(choice.variant)
        busy = door is not None and self._loop_watch.busy(self.now_s)
        if not verdict.admitted:
            if door is not None:  # a cold refusal has no idle prediction: margin unknown (0)
                margin_ms = 0.0 if verdict.kind == "cold" else slo.latency_ms - choice.predicted_latency_ms
                door.observe(True, self.now_s, loop_busy=busy, margin_ms=margin_ms)
            self._refused(tenant, choice.variant, rows, slo)
            return None
        if door is not None:
            door.observe(False, self.now_s, loop_busy=busy)
        if choice.load_hint is not None:
            self._hint(choice.load_hint, optional=True)
        return choice.variant

    def _hint(self, name: str, optional: bool = False) -> None:
        """Load `name` unless it is loading or loaded; an optional load only when the free cores
        the autoscaler would see hold it (the router's `load_gate`)."""
        vq = self._vqs[name]
        if vq.replicas:
            return
        if optional and (vq.cpus > self._free_cpus() or vq.gpus > self._free_gpus() + 1e-9):
            return
        self._place(vq, self.now_s + vq.profile.load_time_s)

    def _pop(self, vq: _VQ) -> _Item | None:
        """The head of `vq`'s queue, or None: its deadline passed in the queue (dropped, a 504)."""
        item = vq.pending.popleft()
        vq.queued_rows -= item.rows
        if self.now_s < item.deadline_s:
            return item
        self._tenants[item.tenant].dropped += 1
        self._meter(item.tenant, vq.name, "deadline_exceeded", item.rows, 0, item.slo)
        return None

    def _refused(self, tenant: int, variant: str, rows: int, slo: SLO) -> None:
        self._tenants[tenant].refused += 1
        self._meter(tenant, variant, "overloaded", rows, 0, slo)

    def _meter(self, tenant: int, variant: str, outcome: str, rows: int, batch_rows: int, slo: SLO) -> None:
        self._demand.listener(
            MeterRecord(
                tenant="",
                task="",
                variant=variant,
                outcome=outcome,
                latency_ms=0.0,
                cost_pusd=0,
                rows=rows,
                batch_rows=batch_rows,
                slo_met=outcome == "ok",
                at_s=self.now_s,
                latency_target_ms=slo.latency_ms,
                min_accuracy=slo.min_accuracy,
            )
        )

    # ---- the batcher ------------------------------------------------------------------------

    def _delay(self, vq: _VQ) -> float:
        """`AsyncBatcher.queue_delay_ms`, once per event and variant."""
        if not vq.pending and not vq.in_flight:
            return 0.0
        if vq.delay_step != self._step:
            now_s = self.now_s
            remaining = vq.in_flight.remaining_ms(now_s)
            vq.delay_ms = queue_delay_policy(
                vq.queued_rows, remaining, vq.latency_ms, vq.params, servers=max(1, len(vq.replicas))
            )
            vq.delay_step = self._step
        return vq.delay_ms

    def _pump(self, vq: _VQ) -> None:
        """`AsyncBatcher._pump`: send batches while the policy says so, else arm its timer."""
        servers = max(1, len(vq.replicas))
        now_s = self.now_s
        while vq.pending:
            wait_ms, typical_ms, ahead = vq.in_flight.waits(now_s, servers)
            latency = vq.latency_ms if not wait_ms else functools.partial(_plus, vq.latency_ms, wait_ms)
            decision = batch_policy(
                vq.pending, latency, vq.params, len(vq.in_flight), now_s, vq.floor_ms, typical_ms
            )
            for _ in range(decision.shed_requests):  # doomed: 429, or 504 past the deadline
                item = self._pop(vq)
                if item is not None:
                    self._refused(item.tenant, vq.name, item.rows, item.slo)
            if decision.shed_requests:
                continue
            if not decision.send:
                self._arm(vq, decision.wait_until_s)
                return
            batch: list[_Item] = []
            rows = 0
            for _ in range(decision.send_requests):
                item = self._pop(vq)
                if item is not None:
                    batch.append(item)
                    rows += item.rows
            if not batch:
                continue
            self._send(vq, batch, rows, decision.send_rows, wait_ms, ahead)
        self._arm(vq, None)

    def _send(
        self, vq: _VQ, batch: list[_Item], rows: int, send_rows: int, wait_ms: float, ahead: int | None
    ) -> None:
        now_s = self.now_s
        self._batch_ids += 1
        batch_id = self._batch_ids
        vq.in_flight.sent(batch_id, now_s, wait_ms, vq.latency_ms(send_rows), ahead, vq.floor_ms(send_rows))
        if not vq.replicas:  # every replica was removed while it queued: the service fails it
            vq.in_flight.done(batch_id, now_s)
            for item in batch:
                self._tenants[item.tenant].failed += 1
            return
        replica = min(vq.replicas, key=lambda r: r.free_at_s)
        start_s = max(now_s, replica.free_at_s)
        run_ms = vq.p50[min(rows, vq.max_batch)] + vq.profile.fit_slope_ms * max(0, rows - vq.max_batch)
        sigma = self.config.noise
        if sigma is None:  # the profile's own spread: its p50 is the median draw, its p99 the 99th
            sigma = vq.spread[min(rows, vq.max_batch)]
            if sigma > 0:
                run_ms *= math.exp(self._rng.normal(0.0, sigma))
        elif sigma > 0:
            run_ms *= math.exp(self._rng.normal(-sigma * sigma / 2.0, sigma))
        replica.free_at_s = start_s + run_ms / 1000.0
        if vq.local:  # a front end's core runs it: the queries after it wait that much longer
            heapq.heapreplace(self._fe_free, max(self._fe_free[0], start_s) + run_ms / 1000.0)
        self._push(start_s + (run_ms + vq.hop_ms) / 1000.0, _DONE, (vq, batch_id, batch, rows))

    def _arm(self, vq: _VQ, when_s: float | None) -> None:
        if when_s == vq.timer_at:
            return
        vq.timer_seq += 1
        vq.timer_at = when_s
        if when_s is not None:
            self._push(when_s, _TIMER, (vq, vq.timer_seq))

    def _done(self, vq: _VQ, batch_id: int, batch: list[_Item], rows: int) -> None:
        now_s = self.now_s
        vq.in_flight.done(batch_id, now_s)
        fe_ms = self.config.frontend_ms
        shares = vq.shares
        for item in batch:
            latency_ms = (now_s - item.arrival_s) * 1000.0 + fe_ms
            ok = latency_ms <= item.target_ms
            t = self._tenants[item.tenant]
            if ok:
                t.in_slo += 1
            else:
                t.late += 1
            t.rows += item.rows
            key = rows << 20 | item.rows
            share = shares.get(key)
            if share is None:
                share = shares[key] = cost_share_pusd(vq.profile, rows, item.rows)
            t.charged_pusd += share
            t.by_variant[vq.name] = t.by_variant.get(vq.name, 0) + 1
            self._ans_s.append(now_s)
            self._ans_ms.append(latency_ms)
            self._ans_ok.append(ok)
            self._meter(
                item.tenant,
                vq.name,
                "ok" if ok else "slo_missed",
                item.rows,
                rows,
                item.slo,
            )
        self._pump(vq)

    # ---- the autoscaler ---------------------------------------------------------------------

    def snapshot(self) -> FleetSnapshot:
        """What `decide` sees now, built as `Autoscaler.snapshot` builds it."""
        now_s = self.now_s
        last_active: dict[str, float] = {}
        for name, seen in self._demand.last_seen_s.items():
            arch = self._vqs[name].variant.architecture
            last_active[arch] = max(last_active.get(arch, 0.0), seen)
        scope = self._scope()
        states: list[VariantState] = []
        ttl = self.config.autoscaling.warm_ttl_s
        for name in scope:
            vq = self._vqs[name]
            d = self._demand.demand(name, now_s)
            replicas = len(vq.replicas)
            arch = vq.variant.architecture
            states.append(
                VariantState(
                    name=name,
                    task=vq.task,
                    architecture=arch,
                    replicas=replicas,
                    capacity_rows_per_s=capacity_rows_per_s(vq.profile, d.mean_batch_rows),
                    accuracy=vq.profile.accuracy,
                    price_usd_per_s=vq.price_usd_per_s,
                    cpus=vq.cpus,
                    gpus=vq.gpus,
                    remote=not vq.local,
                    arrival_rows_per_s=d.rows_per_s,
                    pressure_rows_per_s=d.pressure_rows_per_s,
                    queue_age_ms=(now_s - vq.pending[0].arrival_s) * 1000.0
                    if replicas and vq.pending
                    else 0.0,
                    latency_target_ms=d.latency_target_ms,
                    required_accuracy=d.required_accuracy,
                    # The pinned baselines keep their variants: nothing else can serve them.
                    floor=name in self._floors or self.mode != "modelless",
                    active=now_s - last_active.get(arch, 0.0) <= ttl,
                )
            )
        return FleetSnapshot(variants=tuple(states), free_cpus=self._free_cpus(), free_gpus=self._free_gpus())

    def _scope(self) -> list[str]:
        if self.mode == "modelless":
            return list(self._vqs)
        return sorted(set(self._pinned.values()))

    def _tick(self) -> None:
        allowed = _ALLOWED[self.mode]
        if allowed is None or allowed:
            # A restricted mode restricts the policy's config, as `INFAAS_AUTOSCALE_ACTIONS` does
            # in the service: the policy then chooses among the allowed actions.
            config = self.config.autoscaling
            if allowed is not None:
                config = dataclasses.replace(config, actions=allowed)
            actions, self._state = autoscale_policy(self.snapshot(), config, self._state, self.now_s)
            for action in actions:
                self._apply(action)
        self._timeline_point()

    def _apply(self, action: Action) -> None:
        vq = self._vqs[action.variant]
        ready_at_s = self.now_s + vq.profile.load_time_s
        done = True
        if action.kind == "replicate":
            for _ in range(action.replicas - len(vq.replicas)):
                done = self._place(vq, ready_at_s) and done
        elif action.kind in ("upgrade", "keep_warm"):
            if not vq.replicas:
                done = self._place(vq, ready_at_s)
        elif action.kind == "remove":
            self._drop(vq, action.replicas)
        else:  # downgrade, unload
            self._drop(vq, 0)
        if done:
            self._actions[action.kind] = self._actions.get(action.kind, 0) + 1
        self._pump(vq)

    # ---- results ----------------------------------------------------------------------------

    def answers(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Every answer so far, in the order answered: (virtual time answered, latency in ms)."""
        return np.array(self._ans_s, dtype=np.float64), np.array(self._ans_ms, dtype=np.float64)

    def _timeline_point(self) -> None:
        self._charge()
        self._timeline.append(
            TimelinePoint(
                t_s=self.now_s,
                replicas={n: len(vq.replicas) for n, vq in self._vqs.items() if vq.replicas},
                usd_per_s=self._fleet_rate,
                answered=0,
                in_slo=0,
                p99_ms=None,
            )
        )

    def _finish_timeline(self) -> list[TimelinePoint]:
        """Each second's answers and p99 (from the answers recorded as they came back)."""
        if not self._timeline:
            return []
        seconds = np.floor(np.frombuffer(self._ans_s, dtype=np.float64)).astype(np.int64)
        latencies = np.frombuffer(self._ans_ms, dtype=np.float64)
        ok = np.frombuffer(self._ans_ok, dtype=np.int8)
        order = np.argsort(seconds, kind="stable")
        seconds, latencies, ok = seconds[order], latencies[order], ok[order]
        out: list[TimelinePoint] = []
        for point in self._timeline:
            s = int(point.t_s) - 1  # the tick at t closes the second [t-1, t)
            lo, hi = np.searchsorted(seconds, [s, s + 1])
            window = latencies[lo:hi]
            out.append(
                TimelinePoint(
                    t_s=point.t_s,
                    replicas=point.replicas,
                    usd_per_s=point.usd_per_s,
                    answered=int(hi - lo),
                    in_slo=int(ok[lo:hi].sum()),
                    p99_ms=float(np.quantile(window, 0.99)) if window.size else None,
                )
            )
        return out


def simulate(
    zoo: Zoo,
    trace: Trace,
    mode: Mode,
    config: SimConfig | None = None,
    progress: Callable[[float], None] | None = None,
) -> ModeResult:
    """Run one mode over `trace` and return what it came to."""
    return Simulation(zoo, trace, mode, config).run(progress)
