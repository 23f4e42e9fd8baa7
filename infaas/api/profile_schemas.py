"""Wire schema of a variant's profile, as `GET /v1/models/{arch}/variants` and registration return it.

Separate from the domain `infaas.types.Profile` so the stored form can evolve without breaking
clients; `foreign` tells a client the profile was measured on another machine than this server's.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from infaas.types import MachineInfo, Profile
from profiler.machine import is_foreign, local_machine

__all__ = ["LatencyPointOut", "MachineOut", "ProfileOut", "profile_out"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MachineOut(_Wire):
    cpu_model: str
    cores: int
    gpu: str | None


class LatencyPointOut(_Wire):
    batch: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput_qps: float
    samples: int
    stable: bool
    stop_reason: str
    cost_usd_per_1k: float


class ProfileOut(_Wire):
    status: str
    error: str | None
    measured_at_s: float
    machine: MachineOut
    foreign: bool
    points: list[LatencyPointOut]
    fit_intercept_ms: float
    fit_slope_ms: float
    fit_error: float
    load_time_s: float
    warmup_s: float
    memory_mb: float
    accuracy: float
    price_usd_per_s: float


def profile_out(profile: Profile, local: MachineInfo | None = None) -> ProfileOut:
    """The wire form; `foreign` compares with `local` (default: this machine)."""
    here = local if local is not None else local_machine()
    return ProfileOut(
        status=profile.status,
        error=profile.error,
        measured_at_s=profile.measured_at_s,
        machine=MachineOut(
            cpu_model=profile.machine.cpu_model, cores=profile.machine.cores, gpu=profile.machine.gpu
        ),
        foreign=is_foreign(profile, here),
        points=[LatencyPointOut.model_validate(p.model_dump()) for p in profile.points],
        fit_intercept_ms=profile.fit_intercept_ms,
        fit_slope_ms=profile.fit_slope_ms,
        fit_error=profile.fit_error,
        load_time_s=profile.load_time_s,
        warmup_s=profile.warmup_s,
        memory_mb=profile.memory_mb,
        accuracy=profile.accuracy,
        price_usd_per_s=profile.price_usd_per_s,
    )
