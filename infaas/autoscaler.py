"""The autoscaler: the control loop around `infaas.policy.autoscaling` (DESIGN.md, "control").

Every `interval_s` it measures a `FleetSnapshot` and applies what the pure `decide` returns:

- demand per variant over the look-back window (`DemandWindow`, in `infaas.policy.demand`, fed
  by the meter with every answered, refused or failed query): rows/s, rows answered late or
  refused, the tightest latency and highest accuracy target its traffic asked for, the batch sizes
  it really ran at;
- one replica's capacity at those batch sizes: the profile's latency curve there, times the
  slowdown the variant's batches measure now (the batcher's; other processes share its cores);
- the oldest queued request's age (the batcher), replicas and path (the `Placement`);
- the free vCPUs / GPUs: what Ray reports available, less what the workers hold (worker actors
  reserve no logical CPU, since their variants' threads are explicit, so Ray cannot count them; a
  worker runs one batch at a time, so it holds its widest variant's threads) and less the front
  end's own `reserved_cpus`;
- per architecture, when it last had traffic (or was first seen), for the warm floor.

Actions go through the placement layer (replicate, load, unload), and each is recorded as a fleet
event of its own kind with the policy's reason. `FleetCost` integrates what the loaded replicas
cost (replicas × the price of the resources each holds × time): what the operator pays, beside
what tenants are charged for busy time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from infaas.errors import InfaasError
from infaas.periodic import Periodic
from infaas.policy.attribution import ReservedCost
from infaas.policy.autoscaling import (
    Action,
    AutoscalingConfig,
    FleetSnapshot,
    ScalingState,
    VariantState,
    decide,
)
from infaas.policy.demand import Demand, capacity_rows_per_s
from infaas.snapshot import Catalog, cheapest_variants
from infaas.types import FleetEvent, Profile, Variant, usd_to_pusd
from infaas.workers.placement import Placement
from infaas.workers.residency import EventLog

__all__ = [
    "Autoscaler",
    "DemandSource",
    "FleetCost",
    "Resources",
]

log = logging.getLogger(__name__)

Resources = tuple[tuple[float, float], tuple[float, float]]
"""((total vCPUs, GPUs), (available vCPUs, GPUs)) of the cluster."""


class DemandSource(Protocol):
    """What the autoscaler reads demand from: a `DemandWindow`, or `infaas.peers.Peers` merging
    every front end's."""

    @property
    def last_seen_s(self) -> Mapping[str, float]: ...

    def demand(self, variant: str, now_s: float) -> Demand: ...


class FleetCost:
    """What the loaded replicas cost: Σ replicas × price of the resources each holds × seconds.
    Also in integer pico-dollars (`pusd`): each variant's running total rounded, so the intervals'
    parts add up to it exactly (what reserved cost is attributed from, `policy.attribution`)."""

    def __init__(self) -> None:
        self.usd: dict[str, float] = {}  # variant → USD so far
        self.usd_per_s: dict[str, float] = {}  # variant → USD/s now
        self.pusd: dict[str, int] = {}  # variant → pico-dollars so far
        self._last_s: float | None = None

    def tick(self, usd_per_s: dict[str, float], now_s: float) -> dict[str, int]:
        """Charge the rates of the last interval, then take `usd_per_s` as the current ones.
        Returns what each variant cost in the interval, in pico-dollars."""
        interval: dict[str, int] = {}
        if self._last_s is not None:
            dt = max(0.0, now_s - self._last_s)
            for name, rate in self.usd_per_s.items():
                self.usd[name] = self.usd.get(name, 0.0) + rate * dt
                total = usd_to_pusd(self.usd[name])
                interval[name] = total - self.pusd.get(name, 0)
                self.pusd[name] = total
        self._last_s = now_s
        self.usd_per_s = {name: rate for name, rate in usd_per_s.items() if rate > 0}
        return {name: pusd for name, pusd in interval.items() if pusd}

    @property
    def total_usd(self) -> float:
        return sum(self.usd.values())

    @property
    def total_usd_per_hour(self) -> float:
        return sum(self.usd_per_s.values()) * 3600.0


class Autoscaler:
    """Scales the fleet to its load; see the module docstring.

    `catalog` returns the variants the service knows with their usable profiles and `tasks` the
    task of each architecture (the router's snapshot); `queue_age_ms` the batcher's oldest waiting
    request per variant and `slowdown` how much slower than profiled its batches run now;
    `resources` (total, available) vCPUs and GPUs of the cluster, of which `reserved_cpus` are the
    front end's own. With `act` false it only accounts the fleet's cost
    (a static deployment, a baseline the benchmarks compare with; `config.actions` restricted to
    replicate and remove is the other). On a shared fleet `leader` says whether this front end
    holds the autoscaler lease: the others observe and account, and do not act."""

    def __init__(
        self,
        placement: Placement,
        catalog: Callable[[], Catalog],
        tasks: Callable[[], dict[str, str]],
        demand: DemandSource,
        *,
        config: AutoscalingConfig | None = None,
        queue_age_ms: Callable[[str], float] = lambda _: 0.0,
        slowdown: Callable[[str], float] = lambda _: 1.0,
        resources: Callable[[], Resources] | None = None,
        clock: Callable[[], float] = time.time,
        interval_s: float = 1.0,
        reserved_cpus: float = 0.0,
        act: bool = True,
        leader: Callable[[], bool] = lambda: True,
        reserve: Callable[[str, str, int, float], None] | None = None,
    ) -> None:
        self._placement = placement
        self._catalog = catalog
        self._tasks = tasks
        self._demand = demand
        self.config = config or AutoscalingConfig()
        self._queue_age_ms = queue_age_ms
        self._slowdown = slowdown
        self._resources = resources or _local_resources
        self._reserved_cpus = reserved_cpus
        self.act = act
        self._leader = leader  # on a shared fleet, only the lease holder acts
        self._free = (math.inf, math.inf)  # until the first round has measured them
        self._clock = clock
        self._state = ScalingState()
        self._first_seen_s: dict[str, float] = {}  # architecture → when this loop first saw it
        self.cost = FleetCost()
        # The fleet's cost beyond the charges, attributed each round to the tenants whose traffic
        # caused it (`policy.attribution`); `reserve(tenant, variant, pusd, now_s)` records it.
        self.reserved = ReservedCost(horizon_s=self.config.warm_ttl_s)
        self._reserve = reserve
        self._events = EventLog()
        self._failing: dict[tuple[str, str], str] = {}  # (action, variant) → its last failure
        self._loop = Periodic("autoscaler", interval_s, self.tick)

    def snapshot(self, now_s: float, resources: Resources | None = None) -> FleetSnapshot:
        """What `decide` sees now (`resources`: the cluster's, read by the caller; else read here)."""
        catalog = self._catalog()
        tasks = self._tasks()
        for arch in tasks:
            self._first_seen_s.setdefault(arch, now_s)
        last_active: dict[str, float] = dict(self._first_seen_s)
        for name, (variant, _) in catalog.items():
            seen = self._demand.last_seen_s.get(name)
            if seen is not None and seen > last_active.get(variant.architecture, -math.inf):
                last_active[variant.architecture] = seen
        floors = set(cheapest_variants(catalog, set(tasks)).values())
        held_cpus, held_gpus = self._held(catalog)
        states: list[VariantState] = []
        for name, (variant, profile) in catalog.items():
            if profile is None or variant.architecture not in tasks:
                continue
            replicas = self._placement.replicas(name)
            remote = self._placement.path(name) == "remote"
            cpus, gpus = variant.spec.holds(self.config.gpu_share)
            d = self._demand.demand(name, now_s)
            states.append(
                VariantState(
                    name=name,
                    task=tasks[variant.architecture],
                    architecture=variant.architecture,
                    replicas=replicas,
                    # Measured, not idle: a replica whose batches run 2x their profile (a busy
                    # machine) serves half the rows, and the policy scales on what it serves.
                    capacity_rows_per_s=capacity_rows_per_s(profile, d.mean_batch_rows)
                    / max(1.0, self._slowdown(name)),
                    accuracy=profile.accuracy,
                    price_usd_per_s=variant.spec.replica_price(
                        profile.price_usd_per_s, self.config.gpu_share
                    ),
                    cpus=cpus,
                    gpus=gpus,
                    remote=remote,
                    arrival_rows_per_s=d.rows_per_s,
                    pressure_rows_per_s=d.pressure_rows_per_s,
                    queue_age_ms=self._queue_age_ms(name) if replicas else 0.0,
                    latency_target_ms=d.latency_target_ms,
                    required_accuracy=d.required_accuracy,
                    floor=name in floors,
                    active=now_s - last_active.get(variant.architecture, -math.inf) <= self.config.warm_ttl_s,
                )
            )
        (total_cpus, total_gpus), (avail_cpus, avail_gpus) = resources or self._resources()
        self._free = (
            max(0.0, min(avail_cpus, total_cpus - held_cpus) - self._reserved_cpus),
            max(0.0, min(avail_gpus, total_gpus - held_gpus)),
        )
        return FleetSnapshot(variants=tuple(states), free_cpus=self._free[0], free_gpus=self._free[1])

    def admit_load(self, variant: Variant) -> bool:
        """Whether the free resources of the last round hold one more replica of `variant` (the
        router's optional loads ask); admitted ones are taken off until the next round."""
        cpus, gpus = variant.spec.holds(self.config.gpu_share)
        free_cpus, free_gpus = self._free
        if cpus > free_cpus or gpus > free_gpus:
            return False
        self._free = (free_cpus - cpus, free_gpus - gpus)
        return True

    def _held(self, catalog: Catalog) -> tuple[float, float]:
        """(vCPUs, GPUs) the remote workers hold. A worker process runs one batch at a time, so
        it holds the threads of its widest variant, however many variants it hosts (an empty
        one, none)."""
        cpus = gpus = 0.0
        for worker in self._placement.remote.fleet():
            if not worker.alive:
                continue
            held = [
                catalog[name][0].spec.holds(self.config.gpu_share)
                for name in worker.loaded
                if name in catalog
            ]
            cpus += max((c for c, _ in held), default=0.0)
            gpus += max((g for _, g in held), default=0.0)
        return cpus, gpus

    async def tick(self) -> list[Action]:
        """One round: observe, decide, apply, account. Returns the actions taken."""
        now_s = self._clock()
        actions: list[Action] = []
        if self.act:
            # Ray answers these from its GCS (0.7 ms for the pair on an idle Ray here, 1.6-33 ms
            # under overload): off the event loop, which would hold every query in flight meanwhile.
            resources = await asyncio.to_thread(self._resources)
            snapshot = self.snapshot(now_s, resources)  # also what the router's optional loads are gated on
            if self._leader():
                actions, self._state = decide(snapshot, self.config, self._state, now_s)
        catalog = self._catalog()
        for action in actions:
            variant, profile = catalog[action.variant]
            await self._apply(action, variant, profile)
        interval_pusd = self.cost.tick(
            {
                name: self._placement.replicas(name)
                * variant.spec.replica_price(profile.price_usd_per_s, self.config.gpu_share)
                for name, (variant, profile) in catalog.items()
                if profile is not None
            },
            now_s,
        )
        reserved = self.reserved.close(interval_pusd, now_s)
        # On a shared fleet every front end integrates the fleet's cost; one attributes it.
        if self._reserve is not None and self._leader():
            for (tenant, name), pusd in reserved.items():
                self._reserve(tenant, name, pusd, now_s)
        return actions

    async def _apply(self, action: Action, variant: Variant, profile: Profile | None) -> None:
        reason = f"{action.before} → {action.replicas} replica(s): {action.reason}"
        try:
            if action.kind == "replicate":
                for _ in range(action.replicas - action.before):
                    await self._placement.replicate(variant, reason=f"autoscaler {action.kind}")
            elif action.kind in ("upgrade", "keep_warm"):
                self._placement.place(variant, profile)
                await self._placement.ensure_loaded(variant)
            elif action.kind == "remove":
                holders = [w.worker_id for w in self._placement.remote.fleet() if variant.name in w.loaded]
                for worker_id in holders[action.replicas :]:
                    await self._placement.unload(variant.name, worker_id, reason=f"autoscaler {action.kind}")
            else:  # downgrade, unload
                await self._placement.unload(variant.name, reason=f"autoscaler {action.kind}")
        except InfaasError as exc:
            # No room after all (another front end took it, a load failed): the next round asks
            # again with the fleet as it is then; the same failure is reported once.
            key = (action.kind, variant.name)
            if self._failing.get(key) != exc.message:
                self._failing[key] = exc.message
                log.warning("autoscaler could not %s %s: %s", action.kind, variant.name, exc.message)
                self._events.add(action.kind, variant.name, None, f"failed: {exc.message}; wanted {reason}")
            return
        self._failing.pop((action.kind, variant.name), None)
        self._events.add(action.kind, variant.name, None, reason)

    def events(self, limit: int = 50) -> list[FleetEvent]:
        """The actions taken, newest last."""
        return self._events.recent(limit)

    def start(self) -> None:
        """Run `tick` every `interval_s` (call from the running event loop)."""
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()


def _local_resources() -> Resources:
    import os

    cpus = float(os.cpu_count() or 1)
    return (cpus, 0.0), (cpus, 0.0)
