"""Measuring variants: latency, throughput, memory, load time, accuracy and cost.

    stats.py     percentiles, the stability rule, the latency-vs-batch fit (pure)
    cost.py      price table × resources × time → USD per 1 000 queries (pure)
    accuracy.py  top-1 accuracy of a variant on the task's validation set
    machine.py   the machine a profile was measured on; foreign profiles are flagged
    harness.py   the measuring loop (clock passed in) and the stored profile it becomes
    process.py   `ProcessProfiler`: one worker process per variant, timeouts, failures
    worker.py    the worker's entry point (``python -m profiler.worker``)
    fakes.py     manual clock, simulated model, fault-injecting loader (tests)

The names below are resolved lazily: ``python -m profiler.worker`` imports this package before it
pins the native thread pools, so importing it must not import numpy or a framework.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["MeasureConfig", "ProcessProfiler", "ProfileProgress"]

_LAZY = {
    "MeasureConfig": "profiler.harness",
    "ProcessProfiler": "profiler.process",
    "ProfileProgress": "profiler.process",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'profiler' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
