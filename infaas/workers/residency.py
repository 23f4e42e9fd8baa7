"""Which variants a worker keeps loaded: a memory budget with least-recently-used eviction.

Shared by the Ray worker actor and the in-process pool so both evict the same way. Eviction runs
after a load (its real size is known only then) and before one (with the caller's estimate), and
never evicts the variant just loaded: one variant alone over the budget still serves.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from infaas.types import FleetEvent

__all__ = ["EventLog", "Loaded", "Residency", "load_into", "load_into_async", "rss_mb"]

M = TypeVar("M")
_MB = 1024.0 * 1024.0


def rss_mb() -> float:
    """This process's resident memory."""
    import psutil

    return float(psutil.Process().memory_info().rss) / _MB


class Residency(Generic[M]):
    """Loaded models by variant name, least recently used first, under `budget_mb`.

    `baseline_mb` is what the worker process costs before any variant (its runtime's import:
    ~530 MB for TensorFlow), counted against the budget but never evictable."""

    def __init__(self, budget_mb: float, baseline_mb: float = 0.0) -> None:
        self.budget_mb = budget_mb
        self.baseline_mb = baseline_mb
        self._models: OrderedDict[str, tuple[M, float]] = OrderedDict()

    def get(self, name: str) -> M | None:
        """The model, marked most recently used; None when not loaded."""
        entry = self._models.get(name)
        if entry is None:
            return None
        self._models.move_to_end(name)
        return entry[0]

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def __len__(self) -> int:
        return len(self._models)

    @property
    def names(self) -> list[str]:
        """Least recently used first."""
        return list(self._models)

    @property
    def used_mb(self) -> float:
        return self.baseline_mb + sum(mb for _, mb in self._models.values())

    def memory_mb(self, name: str) -> float:
        entry = self._models.get(name)
        return entry[1] if entry is not None else 0.0

    def make_room(self, expected_mb: float) -> list[tuple[str, M]]:
        """Evict least recently used variants until `expected_mb` more would fit (or none is left)."""
        evicted: list[tuple[str, M]] = []
        while self._models and self.used_mb + expected_mb > self.budget_mb:
            name, (model, _) = self._models.popitem(last=False)
            evicted.append((name, model))
        return evicted

    def add(self, name: str, model: M, memory_mb: float) -> list[tuple[str, M]]:
        """Keep `model` as the most recently used; returns the variants evicted to fit the budget."""
        self._models[name] = (model, max(0.0, memory_mb))
        self._models.move_to_end(name)
        evicted: list[tuple[str, M]] = []
        while self.used_mb > self.budget_mb and len(self._models) > 1:
            victim, (victim_model, _) = self._models.popitem(last=False)
            evicted.append((victim, victim_model))
        return evicted

    def pop(self, name: str) -> M | None:
        entry = self._models.pop(name, None)
        return entry[0] if entry is not None else None

    def clear(self) -> list[M]:
        models = [m for m, _ in self._models.values()]
        self._models.clear()
        return models


@dataclass(frozen=True)
class Loaded(Generic[M]):
    model: M
    load_s: float
    memory_mb: float
    evicted: list[tuple[str, M]]  # to close, by the caller that knows how


def load_into(
    residency: Residency[M], name: str, load: Callable[[], M], expected_mb: float, min_mb: float = 0.0
) -> Loaded[M]:
    """The one load path of the front end's pool and of every Ray worker: make room for
    `expected_mb`, load, measure (RSS growth while loading, at least `min_mb` or what the model
    declares as `memory_mb`), keep it under the budget. Raises what `load` raises, evicting
    nothing more."""
    evicted = residency.make_room(expected_mb)
    before_mb, started_s = rss_mb(), time.perf_counter()
    return _keep(residency, name, load(), before_mb, started_s, min_mb, evicted)


async def load_into_async(
    residency: Residency[M], name: str, load: Callable[[], M], expected_mb: float, min_mb: float = 0.0
) -> Loaded[M]:
    """`load_into` on an event loop: `load` runs in a thread, the bookkeeping on the loop. The
    front end's pool loads this way: a scikit-learn variant's load (1.1 s measured here) on the
    loop stalled every query behind it."""
    evicted = residency.make_room(expected_mb)
    before_mb, started_s = rss_mb(), time.perf_counter()
    model = await asyncio.to_thread(load)
    return _keep(residency, name, model, before_mb, started_s, min_mb, evicted)


def _keep(
    residency: Residency[M],
    name: str,
    model: M,
    before_mb: float,
    started_s: float,
    min_mb: float,
    evicted: list[tuple[str, M]],
) -> Loaded[M]:
    load_s = time.perf_counter() - started_s
    memory_mb = max(rss_mb() - before_mb, min_mb, float(getattr(model, "memory_mb", 0.0)), 0.0)
    evicted += residency.add(name, model, memory_mb)
    return Loaded(model, load_s, memory_mb, evicted)


class EventLog:
    """The most recent fleet events (load, evict, replicate, unload, crash, retry), bounded."""

    def __init__(self, maxlen: int = 500) -> None:
        self._events: deque[FleetEvent] = deque(maxlen=maxlen)

    def add(self, kind: str, variant: str, worker_id: str | None, reason: str) -> FleetEvent:
        event = FleetEvent.model_validate(
            {"at_s": time.time(), "kind": kind, "variant": variant, "worker_id": worker_id, "reason": reason}
        )
        self._events.append(event)
        return event

    def recent(self, limit: int = 50) -> list[FleetEvent]:
        """Newest last."""
        return list(self._events)[-limit:] if limit > 0 else []
