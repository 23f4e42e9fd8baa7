"""Loading variants ahead of the queries that need them: TF Serving's warm-up by measured cost
(the cheapest variant of every architecture at start and of each one registered while
serving), a version's variants before it takes traffic, and the router's load hints (a cheaper
cold variant than the one serving, or the cold one a refused query asked for)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection

from infaas.liveview import LiveView
from infaas.policy.verdict import room_for
from infaas.snapshot import Snapshot, cheapest_variants
from infaas.types import Profile, Variant
from infaas.workers.base import Batcher
from infaas.workers.placement import Placement

__all__ = ["Warmer"]

log = logging.getLogger(__name__)


class Warmer:
    """Background loads (module docstring), each reported to `report` (the quarantine's count)."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        pool: Placement,
        batcher: Batcher,
        live: LiveView,
        report: Callable[[str, Exception | None, float], None],
    ) -> None:
        self._snapshot = snapshot
        self._pool = pool
        self._batcher = batcher
        self._live = live
        self._report = report
        self._hinted: dict[str, asyncio.Task[None]] = {}  # loads under way, by variant
        self._warm_up: list[asyncio.Task[None]] = []
        self.started = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.load_gate: Callable[[Variant], bool] | None = None
        """Admits an optional load (a load hint) when the cluster has room; None: always."""

    def cheapest(self, architectures: set[str]) -> dict[str, str]:
        return cheapest_variants(self._snapshot().variants, architectures)

    def warm_up(self) -> list[str]:
        """Load the cheapest profiled variant of every architecture in the background: the first
        query to a task then finds a warm variant instead of waiting for a cold load. Returns the
        variants asked for (call from the running loop)."""
        names = sorted(self.cheapest(set(self._snapshot().serving)).values())
        self._warm_up = [t for t in (self.hint(name) for name in names) if t is not None]
        self.started = True
        return names

    @property
    def warming_up(self) -> int:
        """Warm-up loads still running (readiness waits for 0)."""
        return sum(1 for t in self._warm_up if not t.done())

    async def warm_architecture(
        self, architecture: str, like: Collection[str] = (), timeout_s: float = 120.0
    ) -> list[str]:
        """Load `architecture`'s cheapest variant where its batches will run, and its
        counterparts of the variants in `like` (same runtime, precision, threads: the ones
        another version of it has loaded), waiting for them. Returns the variants loaded; a
        failed load is logged and counted towards quarantine, not raised."""
        names = set(self.cheapest({architecture}).values())
        for other in like:
            twin = f"{architecture}/{other.partition('/')[2]}"
            entry = self._snapshot().variants.get(twin)
            if entry is not None and entry[1] is not None:
                names.add(twin)
        tasks = [t for t in (self.hint(name) for name in sorted(names)) if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        self._live.forget_loaded()
        return sorted(n for n in names if self._pool.is_loaded(n))

    def hint(self, name: str, *, optional: bool = False) -> asyncio.Task[None] | None:
        """Load `name` in the background; its task (the running one if a load is under way). An
        `optional` load (a cheaper variant than the one serving) happens only if `load_gate` (the
        autoscaler's view of free resources) admits it, the cluster's room being the autoscaler's
        to spend, and if this host has room for it beside the busy replicas."""
        running = self._hinted.get(name)
        if running is not None:
            return running
        variants = self._snapshot().variants
        entry = variants.get(name)
        if entry is None or entry[1] is None:
            return None
        if optional and self.load_gate is not None and not self.load_gate(entry[0]):
            return None
        # Nor a new worker process on cores the busy replicas need: adding there is the
        # autoscaler's call (in the load step a hint started one 1.6 s after the step).
        busy = self._batcher.in_flight()
        if optional and not room_for(name, self._live.room(variants, busy, frozenset({name})), busy):
            return None
        task = asyncio.get_running_loop().create_task(self._load(*entry), name=f"load-hint:{name}")
        self._hinted[name] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load(self, variant: Variant, profile: Profile | None) -> None:
        assert profile is not None  # `hint` only loads profiled variants
        try:
            # Through the batcher: a sub-hop variant is warmed on the front end's fast path,
            # where its batches will run, not on a Ray worker.
            await self._batcher.warm(variant, profile)
        except Exception as exc:
            log.exception("loading %s on the router's hint failed", variant.name)
            self._report(variant.name, exc, time.monotonic())
        else:
            self._report(variant.name, None, time.monotonic())
        finally:
            self._hinted.pop(variant.name, None)
            self._live.forget_loaded()

    async def close(self) -> None:
        pending = list(self._tasks)
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
