"""Placement: where a variant's batches run — in the front end's own process, or on Ray replicas.

One layer answers it (DESIGN.md, "Placement"). The batcher runs batches through it, the router asks
it what is loaded and which overhead estimate applies, the autoscaler asks it for replicas and
loads / unloads through it; none of them re-decides where a variant lives.

The rule, per variant and decided once (again when its profile changes): a CPU ONNX Runtime or
scikit-learn variant whose profiled single-row p99 is below `inline_max_ms` and which holds at most
`inline_max_memory_mb` is *local*: a Ray actor call costs ~0.8–1 ms of latency and ~0.3 ms of CPU
here, while a 64-feature MLP answers in ~10 µs. Its batches are capped at the largest measured size
whose p99 stays below `inline_max_ms`, so a batch never blocks the event loop for longer than
that, and that cap must reach `MIN_LOCAL_BATCH` rows: a variant only a row or two of which fit
under it (a row ≥ 31 µs of the loop's time) would run unbatched in the loop the HTTP handling
needs. Measured (docs/benchmarks.md, "A load generator that leaves the cores to the service"): a
3×2048 int8 MLP at 0.13 ms a row, placed locally at 1-row batches, served 1 379–1 745 req/s at
c=64 against 2 888–3 604 through a worker. Everything else is *remote* (the Ray pool). A variant
placed locally whose load fails in the front end (its artifact unreadable there, say) is moved to
the remote pool once, with a fleet event saying why: never a silent fallback per batch.

A local variant has exactly one replica (the front end); the autoscaler adds capacity to it by
upgrading its traffic to a remote variant, not by replicating it.

*Lone copies*: a remote variant that could run in the front end (a CPU ONNX Runtime or
scikit-learn variant) whose single-row p99 is below `lone_max_ms` also gets a copy in the front
end's `lone` pool, loaded in the background the first time a query for it arrives alone (no other
query in flight in the front end). Such a query then runs on that copy at once (`run_now`): nothing
could have joined its batch, the worker is idle, and the Ray hop is most of the difference from a
hand-written server (0.6-1.1 ms of a compute-bound MLP's answer at c=1, docs/benchmarks.md). The loop
is held for at most `lone_max_ms`, and only while no other query is in flight; any concurrency
sends batches to the Ray replicas as before. The lone pool has a memory budget of its own, so a
lone copy never evicts a local variant; a lone copy that cannot load is dropped with a fleet
event, and its variant goes on through Ray.
"""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass
from typing import Literal

import numpy as np

from infaas.errors import Unavailable
from infaas.types import FleetEvent, Profile, Variant, WorkerInfo
from infaas.workers.base import WorkerPool
from infaas.workers.residency import EventLog

__all__ = ["LONE_FAMILY", "MIN_LOCAL_BATCH", "Path", "Placement", "Where", "decide_where", "lone_eligible"]

Path = Literal["local", "remote"]
_INLINE_RUNTIMES = frozenset({"onnxruntime", "sklearn"})
MIN_LOCAL_BATCH = 8
LONE_FAMILY = "lone"
"""The fleet view's family of the front end's lone pool: its copies are not replicas."""


@dataclass(frozen=True)
class Where:
    path: Path
    max_rows: int | None = None  # the largest batch this path takes (local only), None: the variant's


_REMOTE = Where("remote")


def decide_where(
    variant: Variant, profile: Profile, inline_max_ms: float = 0.25, inline_max_memory_mb: float = 64.0
) -> Where:
    """The placement rule (module docstring), pure: the simulator applies it too."""
    if not _inline_capable(variant, profile, inline_max_ms, inline_max_memory_mb):
        return _REMOTE
    fits = [p.batch for p in profile.points if p.p99_ms <= inline_max_ms]
    max_rows = min(variant.spec.max_batch, max(fits, default=1))
    if max_rows < min(MIN_LOCAL_BATCH, variant.spec.max_batch):
        return _REMOTE
    return Where("local", max_rows=max_rows)


def lone_eligible(variant: Variant, profile: Profile, lone_max_ms: float, lone_max_memory_mb: float) -> bool:
    """May a remote variant keep a lone copy in the front end (module docstring), pure."""
    return lone_max_ms > 0 and _inline_capable(variant, profile, lone_max_ms, lone_max_memory_mb)


def _inline_capable(variant: Variant, profile: Profile, max_ms: float, max_memory_mb: float) -> bool:
    """A measured CPU variant of a runtime the front end loads, within the memory and the single
    row's p99 it may hold the loop for."""
    return (
        variant.spec.runtime in _INLINE_RUNTIMES
        and variant.spec.hardware == "cpu"
        and profile.status == "ok"
        and 0.0 < profile.memory_mb <= max_memory_mb
        and profile.latency_ms(1, "p99") <= max_ms
    )


class Placement:
    """The `WorkerPool` the rest of the service sees: `remote` (Ray) plus an optional `local`
    in-process pool, with the placement rule above. `place` decides; every other method follows
    the decision (a variant never placed is remote)."""

    def __init__(
        self,
        remote: WorkerPool,
        local: WorkerPool | None = None,
        *,
        inline_max_ms: float = 0.25,
        inline_max_memory_mb: float = 64.0,
        lone: WorkerPool | None = None,
        lone_max_ms: float = 0.0,
        lone_max_memory_mb: float = 512.0,
    ) -> None:
        self.remote = remote
        self.local = local
        self.lone = lone
        self._inline_max_ms = inline_max_ms
        self._inline_max_memory_mb = inline_max_memory_mb
        self._lone_max_ms = lone_max_ms
        self._lone_max_memory_mb = lone_max_memory_mb
        self._where: dict[str, tuple[float, Where]] = {}  # variant → (profile measured_at_s, where)
        self._demoted: set[str] = set()
        self._lone_ok: set[str] = set()  # remote variants that may keep a lone copy
        self._lone_loads: dict[str, asyncio.Task[None]] = {}
        self._events = EventLog()

    @classmethod
    def wrap(cls, pool: WorkerPool) -> Placement:
        """`pool` itself when it is a `Placement`, else a placement with only a remote pool."""
        return pool if isinstance(pool, Placement) else cls(pool)

    # ---- the decision -----------------------------------------------------------------------

    def place(self, variant: Variant, profile: Profile | None) -> Where:
        """Where `variant`'s batches run; remembered until its profile changes."""
        measured_s = profile.measured_at_s if profile is not None else -1.0
        known = self._where.get(variant.name)
        if known is not None and known[0] == measured_s:
            return known[1]
        where = self._decide(variant, profile)
        self._where[variant.name] = (measured_s, where)
        self._lone_ok.discard(variant.name)
        if (
            where.path == "remote"
            and self.lone is not None
            and profile is not None
            and lone_eligible(variant, profile, self._lone_max_ms, self._lone_max_memory_mb)
        ):
            self._lone_ok.add(variant.name)
        return where

    def _decide(self, variant: Variant, profile: Profile | None) -> Where:
        if self.local is None or profile is None or variant.name in self._demoted:
            return _REMOTE
        return decide_where(variant, profile, self._inline_max_ms, self._inline_max_memory_mb)

    def path(self, variant: str) -> Path:
        known = self._where.get(variant)
        return known[1].path if known is not None else "remote"

    def overhead_key(self, variant: Variant) -> str:
        """Which overhead estimate applies: the local path's, or the remote runtime family's (a
        TensorFlow worker under load adds far more than an ONNX Runtime one)."""
        return "local" if self.path(variant.name) == "local" else variant.spec.runtime

    def _pool(self, variant: str) -> WorkerPool:
        if self.local is not None and self.path(variant) == "local":
            return self.local
        return self.remote

    # ---- the WorkerPool protocol, following the decision -----------------------------------

    def run_now(self, variant: Variant, batch: np.ndarray) -> np.ndarray | None:
        """Run `batch` on this thread at once when `variant` runs in the front end, or has a lone
        copy there, and is loaded (None otherwise: `run` it). The caller has no other query in
        flight (the batcher's `alone`); a lone-eligible variant's first such query starts its
        copy's load in the background."""
        if self.path(variant.name) == "local":
            pool = self.local
        elif variant.name in self._lone_ok and self.remote.is_loaded(variant.name):
            pool = self.lone
        else:
            return None
        run_now = getattr(pool, "run_now", None)  # the in-process pool's; a test pool may lack it
        if run_now is None:
            return None
        outputs: np.ndarray | None = run_now(variant, batch)
        if outputs is None and pool is self.lone:
            self._load_lone(variant)
        return outputs

    def _load_lone(self, variant: Variant) -> None:
        name = variant.name
        if self.lone is None or name in self._lone_loads:
            return
        lone = self.lone

        async def load() -> None:
            try:
                await lone.ensure_loaded(variant)
                if not self.remote.is_loaded(name):  # its last Ray replica went while it loaded
                    await lone.unload(name, None, "its last Ray replica was unloaded")
            except Unavailable as exc:
                self._lone_ok.discard(name)
                self._events.add("place", name, None, f"no lone copy in the front end: {exc.message}")
            finally:
                self._lone_loads.pop(name, None)

        self._lone_loads[name] = asyncio.get_running_loop().create_task(load())

    async def run(self, variant: Variant, batch: np.ndarray) -> np.ndarray:
        pool = self._pool(variant.name)
        if pool is self.local and not pool.is_loaded(variant.name):
            await self.ensure_loaded(variant)
            pool = self._pool(variant.name)
        return await pool.run(variant, batch)

    async def ensure_loaded(self, variant: Variant) -> None:
        if self.local is not None and self.path(variant.name) == "local":
            try:
                await self.local.ensure_loaded(variant)
                return
            except Unavailable as exc:
                self._demote(variant, exc)
        await self.remote.ensure_loaded(variant)

    def _demote(self, variant: Variant, exc: Unavailable) -> None:
        self._demoted.add(variant.name)
        self._where[variant.name] = (self._where.get(variant.name, (-1.0, _REMOTE))[0], _REMOTE)
        self._events.add(
            "place",
            variant.name,
            None,
            f"moved from the front end to the Ray workers: loading it there failed ({exc.message})",
        )

    async def replicate(self, variant: Variant, reason: str = "") -> str:
        if self.path(variant.name) == "local":
            raise Unavailable(
                f"{variant.name} runs in the front end, which holds one copy; add capacity with a "
                "remote variant instead",
                variant=variant.name,
            )
        return await self.remote.replicate(variant, reason)

    async def unload(self, variant: str, worker_id: str | None = None, reason: str = "") -> None:
        await self._pool(variant).unload(variant, worker_id, reason)
        if self.lone is not None and self.lone.is_loaded(variant) and not self.remote.is_loaded(variant):
            await self.lone.unload(variant, None, "its last Ray replica was unloaded")

    def is_loaded(self, variant: str) -> bool:
        return self._pool(variant).is_loaded(variant)

    def replicas(self, variant: str) -> int:
        return self._pool(variant).replicas(variant)

    def _front_end_pools(self) -> list[WorkerPool]:
        return [p for p in (self.local, self.lone) if p is not None]

    def fleet(self) -> list[WorkerInfo]:
        return self.remote.fleet() + [w for p in self._front_end_pools() for w in p.fleet()]

    def events(self, limit: int = 50) -> list[FleetEvent]:
        streams = [self.remote.events(limit), self._events.recent(limit)]
        streams += [p.events(limit) for p in self._front_end_pools()]
        merged = list(heapq.merge(*streams, key=lambda e: e.at_s))
        return merged[-limit:] if limit > 0 else []

    async def close(self) -> None:
        """Close the front end's pools; the remote one belongs to whoever passed it in."""
        for task in list(self._lone_loads.values()):
            task.cancel()
        for pool in self._front_end_pools():
            await pool.close()
