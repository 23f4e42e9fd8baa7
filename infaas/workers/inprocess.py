"""The `WorkerPool` protocol in the calling process: unit tests, tiny setups, and fakes.

`InProcessPool` loads variants with `variants.runtimes.load_variant` (or an injected loader), keeps
them under a memory budget with least-recently-used eviction like a Ray worker does, and runs a
batch inline in the event loop: right for tests and for models that answer in microseconds, wrong
for anything that would block the loop for long (use `RayPool`).

`EchoModel` and `RecordingPool` are shipped fakes: a model whose outputs are a known function of its
inputs (to check that batches are split back to the right request), and a pool that records every
batch and holds it until the test releases it (to drive the batcher deterministically).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np

from infaas.artifacts import ArtifactStore, LocalArtifacts
from infaas.errors import Unavailable
from infaas.types import FleetEvent, Variant, WorkerInfo
from infaas.workers.residency import EventLog, Residency, load_into_async
from variants.runtimes.base import LoadedModel

__all__ = ["EchoModel", "InProcessPool", "RecordingPool", "artifact_loader", "echo_outputs"]

WORKER_ID = "inprocess-0"


def echo_outputs(x: np.ndarray, num_classes: int) -> np.ndarray:
    """What `EchoModel` returns: row i's first feature in column 0, then the row's index-free sum,
    then zeros, so each output row identifies its input row."""
    flat = x.reshape(x.shape[0], -1).astype(np.float32)
    out = np.zeros((x.shape[0], num_classes), dtype=np.float32)
    out[:, 0] = flat[:, 0]
    if num_classes > 1:
        out[:, 1] = flat.sum(axis=1)
    return out


class EchoModel:
    """A fake `LoadedModel` whose outputs identify its inputs (`echo_outputs`)."""

    def __init__(self, variant: str, num_classes: int = 3, memory_mb: float = 1.0) -> None:
        self._variant = variant
        self.num_classes = num_classes
        self.memory_mb = memory_mb
        self.calls = 0
        self.closed = False

    @property
    def variant(self) -> str:
        return self._variant

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        return echo_outputs(x, self.num_classes)

    def close(self) -> None:
        self.closed = True


class InProcessPool:
    """One in-process "worker" holding variants under `memory_budget_mb`, LRU-evicted.

    A variant's memory is the larger of the process RSS growth while loading it and a
    `memory_mb` attribute the loaded model declares (fakes do); the last loaded variant always
    stays, even alone over the budget."""

    def __init__(
        self,
        artifacts_dir: Path | None = None,
        *,
        memory_budget_mb: float = 2048.0,
        loader: Callable[[Variant], LoadedModel] | None = None,
        worker_id: str = WORKER_ID,
        family: str = "inprocess",
    ) -> None:
        if loader is None:
            if artifacts_dir is None:
                raise ValueError("InProcessPool needs artifacts_dir or a loader")
            loader = _artifact_loader(artifacts_dir)
        self._loader = loader
        # As the fleet view names it: a front end holds two such pools (`workers.placement`).
        self.worker_id, self.family = worker_id, family
        self._budget_mb = memory_budget_mb
        self._models: Residency[LoadedModel] = Residency(memory_budget_mb)
        self._events = EventLog()
        self._locks: dict[str, asyncio.Lock] = {}
        self._running = 0
        self._closed = False

    async def run(self, variant: Variant, batch: np.ndarray) -> np.ndarray:
        outputs = self.run_now(variant, batch)
        if outputs is not None:
            return outputs
        return self._predict(await self._load(variant, reason="on demand: not loaded"), batch)

    def run_now(self, variant: Variant, batch: np.ndarray) -> np.ndarray | None:
        """`run` on this thread without a suspension point, when `variant` is loaded (None: it
        is not, and loading it needs `run`)."""
        if self._closed:
            raise Unavailable("the worker pool is closed")
        model = self._models.get(variant.name)
        return None if model is None else self._predict(model, batch)

    def _predict(self, model: LoadedModel, batch: np.ndarray) -> np.ndarray:
        self._running += 1
        try:
            return model.predict(batch)
        finally:
            self._running -= 1

    async def ensure_loaded(self, variant: Variant) -> None:
        await self._load(variant, reason="requested (router hint or autoscaler)")

    async def replicate(self, variant: Variant, reason: str = "") -> str:
        """One process holds one replica at most: loads it if absent, returns the worker id."""
        await self._load(variant, reason=reason or "replicate: in-process pool has one worker")
        return self.worker_id

    async def unload(self, variant: str, worker_id: str | None = None, reason: str = "") -> None:
        model = self._models.pop(variant)
        if model is not None:
            model.close()
            self._events.add("unload", variant, self.worker_id, reason or "unload requested")

    def replicas(self, variant: str) -> int:
        return 1 if variant in self._models else 0

    async def _load(self, variant: Variant, reason: str) -> LoadedModel:
        model = self._models.get(variant.name)
        if model is not None:
            return model
        lock = self._locks.setdefault(variant.name, asyncio.Lock())
        async with lock:
            model = self._models.get(variant.name)
            if model is not None:
                return model
            try:
                loaded = await load_into_async(self._models, variant.name, lambda: self._loader(variant), 0.0)
            except Exception as exc:
                raise Unavailable(f"could not load {variant.name}: {exc}", variant=variant.name) from exc
            model, load_s, memory_mb, evicted = loaded.model, loaded.load_s, loaded.memory_mb, loaded.evicted
            self._events.add(
                "load", variant.name, self.worker_id, f"{reason}; {load_s * 1000:.0f} ms, {memory_mb:.1f} MB"
            )
            for name, old in evicted:
                old.close()
                self._events.add(
                    "evict",
                    name,
                    self.worker_id,
                    f"least recently used; over the {self._budget_mb:.0f} MB budget "
                    f"after loading {variant.name}",
                )
            return model

    def is_loaded(self, variant: str) -> bool:
        return variant in self._models

    def fleet(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                worker_id=self.worker_id,
                family=self.family,
                alive=not self._closed,
                loaded=tuple(self._models.names),
                memory_used_mb=self._models.used_mb,
                memory_budget_mb=self._budget_mb,
                queue_depth=self._running,
                channel="inline",
            )
        ]

    def events(self, limit: int = 50) -> list[FleetEvent]:
        return self._events.recent(limit)

    async def close(self) -> None:
        self._closed = True
        for model in self._models.clear():
            model.close()


def _artifact_loader(artifacts_dir: Path) -> Callable[[Variant], LoadedModel]:
    return artifact_loader(LocalArtifacts(artifacts_dir))


def artifact_loader(artifacts: ArtifactStore) -> Callable[[Variant], LoadedModel]:
    """Load variants from `artifacts` (fetched into this node's cache when not local)."""

    def load(variant: Variant) -> LoadedModel:
        from variants.runtimes import load_variant

        return load_variant(variant, artifacts.root(variant))

    return load


class RecordingPool:
    """A fake `WorkerPool` for the batcher's and the autoscaler's tests: records each batch,
    answers with `echo_outputs`, and while `gated` holds every batch until `release()` lets one
    through. It has `workers` fake workers, so a variant can hold that many replicas; `replicate`
    and `unload` are recorded as fleet events like the real pools record them."""

    def __init__(self, num_classes: int = 3, *, gated: bool = False, workers: int = 1) -> None:
        self.num_classes = num_classes
        self.gated = gated
        self.batches: list[tuple[str, np.ndarray]] = []
        self.fail_next: Exception | None = None
        self._releases = asyncio.Semaphore(0)
        self._worker_ids = [WORKER_ID] + [f"fake-{i}" for i in range(1, workers)]
        self._placement: dict[str, list[str]] = {}  # variant → worker ids holding it
        self._events = EventLog()
        self.closed = False

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._releases.release()

    async def run(self, variant: Variant, batch: np.ndarray) -> np.ndarray:
        self.batches.append((variant.name, batch))
        self._placement.setdefault(variant.name, [WORKER_ID])
        if self.gated:
            await self._releases.acquire()
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        return echo_outputs(batch, self.num_classes)

    async def ensure_loaded(self, variant: Variant) -> None:
        self._placement.setdefault(variant.name, [WORKER_ID])

    async def replicate(self, variant: Variant, reason: str = "") -> str:
        holders = self._placement.setdefault(variant.name, [])
        free = [w for w in self._worker_ids if w not in holders]
        if not free:
            raise Unavailable(f"cannot replicate {variant.name}: every worker holds it", variant=variant.name)
        holders.append(free[0])
        self._events.add("replicate", variant.name, free[0], reason or f"replica #{len(holders)}")
        return free[0]

    async def unload(self, variant: str, worker_id: str | None = None, reason: str = "") -> None:
        holders = self._placement.get(variant, [])
        for w in [w for w in holders if worker_id is None or w == worker_id]:
            holders.remove(w)
            self._events.add("unload", variant, w, reason or "unload requested")
        if not holders:
            self._placement.pop(variant, None)

    def replicas(self, variant: str) -> int:
        return len(self._placement.get(variant, ()))

    def is_loaded(self, variant: str) -> bool:
        return variant in self._placement

    def fleet(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                worker_id=w,
                family="fake",
                alive=True,
                loaded=tuple(sorted(v for v, holders in self._placement.items() if w in holders)),
                memory_used_mb=0.0,
                memory_budget_mb=0.0,
            )
            for w in self._worker_ids
        ]

    def events(self, limit: int = 50) -> list[FleetEvent]:
        return self._events.recent(limit)

    async def close(self) -> None:
        self.closed = True
