"""Fakes for testing the profiler: a manual clock, a simulated model, and a fault-injecting loader.

`ManualClock` and `SimulatedModel` let unit tests drive the measuring loop with exact, known
latencies (no timing noise, no sleeping). `load_with_faults` is a loader for the worker process
(``ProcessProfiler(loader="profiler.fakes:load_with_faults")``): it delegates to the real
`variants.runtimes.load_variant` unless the variant's architecture name asks for a fault, so an
integration test can profile real variants next to ones that crash, hang or raise.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from infaas.types import Variant
from variants.runtimes.base import LoadedModel

__all__ = [
    "FAULT_CRASH",
    "FAULT_HANG",
    "FAULT_RAISE",
    "FaultyModel",
    "ManualClock",
    "SimulatedModel",
    "load_with_faults",
]

FAULT_CRASH = "fault-crash"
"""Architecture name prefix: the worker process aborts (like a segfault in a runtime) on predict."""
FAULT_HANG = "fault-hang"
"""Architecture name prefix: predict never returns."""
FAULT_RAISE = "fault-raise"
"""Architecture name prefix: loading raises an exception."""


class ManualClock:
    """Monotonic seconds that move only when told to."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self.now_s += seconds


class SimulatedModel:
    """A model whose every call takes `latency_ms(batch, call_index)` on a `ManualClock`.

    It predicts class ``int(row[0]) % num_classes`` with probability 1, so its accuracy on a
    labelled set is known exactly.
    """

    def __init__(
        self,
        clock: ManualClock,
        latency_ms: Callable[[int, int], float],
        num_classes: int = 10,
        name: str = "simulated",
    ) -> None:
        self.clock = clock
        self.latency_ms = latency_ms
        self.num_classes = num_classes
        self.calls = 0
        self._name = name

    @property
    def variant(self) -> str:
        return self._name

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.clock.advance(self.latency_ms(len(x), self.calls) / 1000.0)
        self.calls += 1
        rows = np.asarray(x).reshape(len(x), -1)
        labels = rows[:, 0].astype(np.int64) % self.num_classes
        out = np.zeros((len(x), self.num_classes), dtype=np.float32)
        out[np.arange(len(x)), labels] = 1.0
        return out

    def close(self) -> None:
        self.calls = 0


class FaultyModel:
    """Wraps a loaded model and misbehaves on the first predict."""

    def __init__(self, inner: LoadedModel, fault: str) -> None:
        self.inner = inner
        self.fault = fault

    @property
    def variant(self) -> str:
        return self.inner.variant

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.fault == FAULT_CRASH:
            os.abort()
        if self.fault == FAULT_HANG:
            while True:
                time.sleep(3600)
        return self.inner.predict(x)

    def close(self) -> None:
        self.inner.close()


def load_with_faults(variant: Variant, artifacts_dir: Path) -> LoadedModel:
    """`load_variant`, plus the fault the variant's architecture name asks for."""
    from variants.runtimes import load_variant

    arch = variant.architecture
    if arch.startswith(FAULT_RAISE):
        raise RuntimeError(f"injected load failure for {variant.name}")
    model = load_variant(variant, artifacts_dir)
    for fault in (FAULT_CRASH, FAULT_HANG):
        if arch.startswith(fault):
            return FaultyModel(model, fault)
    return model
