"""The autoscaler: the control loop around `infaas.policy.autoscaling` (DESIGN.md, "control").

Every `interval_s` it builds one `VariantLoad` per variant that has replicas in the worker pool —
arrival rows/s over the look-back window (`ArrivalWindow`, fed by the meter with every routed
query), one replica's capacity (the profile's best measured throughput), replicas now
(`WorkerPool.replicas`) —, asks the pure `decide`, and applies its decisions through the pool:
`replicate` a hot variant onto one more worker, `unload` replicas of a cold one (to zero once it
has been idle for the policy's downscale delay). The pool records each action as a `FleetEvent`
carrying the policy's reason, so the fleet view and the dashboard say why.

Loading a variant that has no replica yet (0 → 1) stays with the query path (on-demand loads and
the router's load hints), so the autoscaler never races a load in progress. Variants the front end
runs on its own fast path (`local`) never reach a worker and are not scaled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from infaas.errors import Unavailable
from infaas.metering import MeterRecord
from infaas.periodic import Periodic
from infaas.policy.autoscaling import AutoscalingConfig, ScaleDecision, ScalingState, VariantLoad, decide
from infaas.types import Profile, Variant
from infaas.workers.base import WorkerPool

__all__ = ["ArrivalWindow", "Autoscaler", "capacity_rows_per_s"]

log = logging.getLogger(__name__)


def capacity_rows_per_s(profile: Profile) -> float:
    """One replica's capacity: the best throughput the profiler measured (its largest batch, usually)."""
    return max((p.throughput_qps for p in profile.points), default=0.0)


class ArrivalWindow:
    """Rows that arrived per variant, in one-second buckets over the last `window_s` seconds.

    `listener` is a `Meter` listener (one dict update per query); times are the records' `at_s`,
    so the autoscaler's clock must be the same wall clock."""

    def __init__(self, window_s: float = 10.0) -> None:
        if window_s < 1.0:
            raise ValueError("window_s must be at least one second")
        self.window_s = window_s
        self._buckets: dict[str, dict[int, int]] = {}  # variant → second → rows

    def add(self, variant: str, rows: int, at_s: float) -> None:
        buckets = self._buckets.get(variant)
        if buckets is None:
            buckets = self._buckets[variant] = {}
        second = int(at_s)
        buckets[second] = buckets.get(second, 0) + rows

    def listener(self, record: MeterRecord) -> None:
        # Failed queries of a routed variant count too: they are demand the replicas did not meet.
        if record.variant:
            self.add(record.variant, record.rows, record.at_s)

    def rows_per_s(self, variant: str, now_s: float) -> float:
        """Mean arrival rate of `variant` over the window ending at `now_s`."""
        buckets = self._buckets.get(variant)
        if not buckets:
            return 0.0
        oldest = int(now_s - self.window_s) + 1
        for second in [s for s in buckets if s < oldest]:
            del buckets[second]
        return sum(buckets.values()) / self.window_s


class Autoscaler:
    """Scales the variants of `pool` to their load; see the module docstring.

    `variants` returns the variants the service knows with their usable profiles (the router's
    snapshot: profiles from other machines or failed ones come as None and are not scaled).
    `clock` is wall-clock seconds, the clock of the meter records `arrivals` counts."""

    def __init__(
        self,
        pool: WorkerPool,
        variants: Callable[[], Mapping[str, tuple[Variant, Profile | None]]],
        arrivals: ArrivalWindow,
        *,
        config: AutoscalingConfig | None = None,
        clock: Callable[[], float] = time.time,
        interval_s: float = 1.0,
        local: WorkerPool | None = None,
    ) -> None:
        self._pool = pool
        self._variants = variants
        self._arrivals = arrivals
        self._config = config or AutoscalingConfig()
        self._clock = clock
        self._local = local
        self._state = ScalingState()
        self._loop = Periodic("autoscaler", interval_s, self.tick)

    def loads(self, now_s: float) -> list[VariantLoad]:
        """What `decide` sees now: one load per variant with replicas in the pool."""
        loads = []
        for name, (_, profile) in self._variants().items():
            replicas = self._pool.replicas(name)
            if replicas == 0 or profile is None:
                continue
            if self._local is not None and self._local.is_loaded(name):
                continue
            loads.append(
                VariantLoad(
                    variant=name,
                    arrival_rows_per_s=self._arrivals.rows_per_s(name, now_s),
                    capacity_rows_per_s=capacity_rows_per_s(profile),
                    replicas=replicas,
                )
            )
        return loads

    async def tick(self) -> list[ScaleDecision]:
        """One round: observe, decide, apply. Returns the decisions taken."""
        now_s = self._clock()
        loads = {load.variant: load for load in self.loads(now_s)}
        decisions, self._state = decide(list(loads.values()), self._config, self._state, now_s)
        variants = self._variants()
        for decision in decisions:
            await self._apply(variants[decision.variant][0], loads[decision.variant].replicas, decision)
        return decisions

    async def _apply(self, variant: Variant, replicas: int, decision: ScaleDecision) -> None:
        reason = f"autoscaler: {replicas} → {decision.replicas} replicas: {decision.reason}"
        try:
            if decision.replicas > replicas:
                for _ in range(decision.replicas - replicas):
                    await self._pool.replicate(variant, reason=reason)
            elif decision.replicas == 0:
                await self._pool.unload(variant.name, reason=reason)
            else:
                holders = [w.worker_id for w in self._pool.fleet() if variant.name in w.loaded]
                for worker_id in holders[decision.replicas :]:
                    await self._pool.unload(variant.name, worker_id, reason=reason)
        except Unavailable as exc:
            # No room for another replica: the next round asks again with the replicas there are.
            log.info("autoscaler could not apply %s: %s", reason, exc)

    def start(self) -> None:
        """Run `tick` every `interval_s` (call from the running event loop)."""
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()
