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
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal

import numpy as np

from infaas.errors import Unavailable
from infaas.types import FleetEvent, Profile, Variant, WorkerInfo
from infaas.workers.base import WorkerPool
from infaas.workers.residency import EventLog

__all__ = ["MIN_LOCAL_BATCH", "Path", "Placement", "Where", "decide_where"]

Path = Literal["local", "remote"]
_INLINE_RUNTIMES = frozenset({"onnxruntime", "sklearn"})
MIN_LOCAL_BATCH = 8


@dataclass(frozen=True)
class Where:
    path: Path
    max_rows: int | None = None  # the largest batch this path takes (local only), None: the variant's


_REMOTE = Where("remote")


def decide_where(
    variant: Variant, profile: Profile, inline_max_ms: float = 0.25, inline_max_memory_mb: float = 64.0
) -> Where:
    """The placement rule (module docstring), pure: the simulator applies it too."""
    if (
        variant.spec.runtime not in _INLINE_RUNTIMES
        or variant.spec.hardware != "cpu"
        or profile.status != "ok"
        or not 0.0 < profile.memory_mb <= inline_max_memory_mb
        or profile.latency_ms(1, "p99") > inline_max_ms
    ):
        return _REMOTE
    fits = [p.batch for p in profile.points if p.p99_ms <= inline_max_ms]
    max_rows = min(variant.spec.max_batch, max(fits, default=1))
    if max_rows < min(MIN_LOCAL_BATCH, variant.spec.max_batch):
        return _REMOTE
    return Where("local", max_rows=max_rows)


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
    ) -> None:
        self.remote = remote
        self.local = local
        self._inline_max_ms = inline_max_ms
        self._inline_max_memory_mb = inline_max_memory_mb
        self._where: dict[str, tuple[float, Where]] = {}  # variant → (profile measured_at_s, where)
        self._demoted: set[str] = set()
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
        """Run `batch` on this thread at once when `variant` runs in the front end and is loaded
        (None otherwise: `run` it)."""
        run_now = getattr(self.local, "run_now", None)  # the in-process pool's; a test pool may lack it
        if run_now is None or self.path(variant.name) != "local":
            return None
        outputs: np.ndarray | None = run_now(variant, batch)
        return outputs

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

    def is_loaded(self, variant: str) -> bool:
        return self._pool(variant).is_loaded(variant)

    def replicas(self, variant: str) -> int:
        return self._pool(variant).replicas(variant)

    def fleet(self) -> list[WorkerInfo]:
        local = self.local.fleet() if self.local is not None else []
        return self.remote.fleet() + local

    def events(self, limit: int = 50) -> list[FleetEvent]:
        streams = [self.remote.events(limit), self._events.recent(limit)]
        if self.local is not None:
            streams.append(self.local.events(limit))
        merged = list(heapq.merge(*streams, key=lambda e: e.at_s))
        return merged[-limit:] if limit > 0 else []

    async def close(self) -> None:
        """Close the local pool; the remote one belongs to whoever passed it in."""
        if self.local is not None:
            await self.local.close()
