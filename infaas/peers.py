"""Front ends sharing one fleet: what they tell each other through the store.

On a Ray cluster several front ends use the same workers (`RayPool`, shared fleet). Two things are
still decided once for all of them: scaling (one autoscaler acts at a time) and the demand it
scales to (every front end's traffic, not the acting one's alone). Every round each front end
renews, or tries to take, the autoscaler lease in the store and publishes its demand window's
totals as a `FrontEndInfo`; `Peers` is the autoscaler's demand source, merging its own window with
the fresh reports of the others. A front end that stops releases the lease and removes its report;
one that dies loses the lease after `lease_ttl_s` and its report is ignored once stale, so another
front end takes over scaling within a few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping

from infaas.errors import StoreError
from infaas.policy.demand import Demand, DemandWindow, as_demand, merge_totals
from infaas.store import MetadataStore
from infaas.types import FrontEndInfo

__all__ = ["AUTOSCALER_LEASE", "Peers"]

log = logging.getLogger(__name__)

AUTOSCALER_LEASE = "autoscaler"
_NO_TARGET_MS = 1e12  # JSON has no infinity: "no latency target seen"


class Peers:
    """This front end among the others on one store; see the module docstring."""

    def __init__(
        self,
        store: MetadataStore,
        name: str,
        window: DemandWindow,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self._store = store
        self._window = window
        self._clock = clock
        self.lease_ttl_s = max(3.0 * interval_s, 3.0)
        self.stale_after_s = self.lease_ttl_s
        self.leader = False
        self.front_ends: list[FrontEndInfo] = []  # every fresh report, this one's included
        self._others: dict[str, dict[str, tuple[float, ...]]] = {}

    async def tick(self) -> None:
        """Renew the lease, publish this front end's demand, read the others'. A store that
        cannot be reached makes this front end give up acting (another may hold the lease now)."""
        now_s = self._clock()
        totals = {
            name: (t[0], t[1], min(t[2], _NO_TARGET_MS), *t[3:])
            for name, t in self._window.all_totals(now_s).items()
        }
        try:
            leader = await asyncio.to_thread(
                self._store.acquire_lease, AUTOSCALER_LEASE, self.name, self.lease_ttl_s
            )
            me = FrontEndInfo(name=self.name, at_s=now_s, leader=leader, demand=totals)
            await asyncio.to_thread(self._store.put_front_end, me)
            reports = await asyncio.to_thread(self._store.list_front_ends)
        except StoreError as exc:
            if self.leader:
                log.warning("front end %s stops scaling the fleet: %s", self.name, exc.message)
            self.leader = False
            return
        self.leader = leader
        fresh = [f for f in reports if now_s - f.at_s <= self.stale_after_s]
        self.front_ends = fresh
        self._others = {f.name: f.demand for f in fresh if f.name != self.name}

    def demand(self, variant: str, now_s: float) -> Demand:
        parts = [d[variant] for d in self._others.values() if variant in d]
        own = self._window.totals(variant, now_s)
        if own is not None:
            parts.append(own)
        if not parts:
            return Demand()
        merged = merge_totals(parts)
        target = merged[2] if merged[2] < _NO_TARGET_MS else math.inf
        return as_demand((merged[0], merged[1], target, *merged[3:]), self._window.window_s)

    @property
    def last_seen_s(self) -> Mapping[str, float]:
        """When each variant last had traffic on any front end (for the warm floor)."""
        seen = dict(self._window.last_seen_s)
        for report in self.front_ends:
            if report.name == self.name:
                continue
            for variant in report.demand:
                seen[variant] = max(seen.get(variant, 0.0), report.at_s)
        return seen

    async def close(self) -> None:
        """Leave: give the lease up and remove this front end's report."""
        try:
            await asyncio.to_thread(self._store.release_lease, AUTOSCALER_LEASE, self.name)
            await asyncio.to_thread(self._store.delete_front_end, self.name)
        except StoreError as exc:
            log.warning("front end %s left without telling the store: %s", self.name, exc.message)
        self.leader = False
