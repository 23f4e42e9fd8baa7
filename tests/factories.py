"""Small builders for domain values that many tests need; each argument a test cares about is
explicit, the rest have plain defaults."""

from __future__ import annotations

from typing import Any

from infaas.types import Architecture, InputSpec, LatencyPoint, MachineInfo, Profile, Task


def make_task(
    name: str = "t", shape: tuple[int, ...] = (2,), num_classes: int = 3, validation_size: int = 1
) -> Task:
    return Task(
        name=name,
        input_spec=InputSpec(shape=shape),
        num_classes=num_classes,
        validation_artifact="v",
        validation_size=validation_size,
    )


def make_arch(name: str, task: str = "t") -> Architecture:
    return Architecture(name=name, task=task, kind="onnx", source_sha256="0", artifact="a")


def make_point(
    *, p50_ms: float, p95_ms: float, p99_ms: float, mean_ms: float, throughput_qps: float, samples: int = 100,
    cost_usd_per_1k: float = 1e-6, batch: int = 1,
) -> LatencyPoint:  # fmt: skip
    return LatencyPoint(
        batch=batch, p50_ms=p50_ms, p95_ms=p95_ms, p99_ms=p99_ms, mean_ms=mean_ms,
        throughput_qps=throughput_qps, samples=samples, stable=True, stop_reason="stable",
        cost_usd_per_1k=cost_usd_per_1k,
    )  # fmt: skip


def make_profile(variant: str, machine: MachineInfo, point: LatencyPoint, **fields: Any) -> Profile:
    """A one-point profile; `fields` sets any other Profile field (accuracy, memory_mb, ...)."""
    return Profile(variant=variant, machine=machine, points=(point,), **{"measured_at_s": 0.0, **fields})
