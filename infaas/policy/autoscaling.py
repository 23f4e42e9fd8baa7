"""Autoscaling policy (pure): how many replicas each variant should have.

Shaped like Ray Serve's policies: a plain function of plain data. The caller (`infaas.autoscaler`)
owns the clock and the I/O; it passes `now_s` and the state this function returned last time.

Capacity of one replica is what the profiler measured: the throughput at the variant's largest
measured batch. A variant is scaled so that its recent arrival rate stays below
`target_utilization` × capacity; the decision must hold for `upscale_delay_s` (up) or
`downscale_delay_s` (down) before it is taken, so that a burst does not thrash loads and evictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["AutoscalingConfig", "ScaleDecision", "ScalingState", "VariantLoad", "decide"]


@dataclass(frozen=True)
class AutoscalingConfig:
    target_utilization: float = 0.7
    min_replicas: int = 0
    max_replicas: int = 4
    upscale_delay_s: float = 2.0
    downscale_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must be in (0, 1]")
        if self.max_replicas < max(1, self.min_replicas):
            raise ValueError("max_replicas must be >= min_replicas and >= 1")


@dataclass(frozen=True)
class VariantLoad:
    """What the front end observed for one variant over the look-back window."""

    variant: str
    arrival_rows_per_s: float
    capacity_rows_per_s: float  # one replica, from the profile
    replicas: int


@dataclass(frozen=True)
class ScaleDecision:
    variant: str
    replicas: int
    reason: str


@dataclass
class ScalingState:
    """Since when each variant has wanted a different replica count (the delay logic's memory)."""

    wanting_since_s: dict[str, tuple[int, float]] = field(default_factory=dict)


def _desired(load: VariantLoad, config: AutoscalingConfig) -> int:
    if load.capacity_rows_per_s <= 0:
        return max(load.replicas, config.min_replicas)
    needed = math.ceil(load.arrival_rows_per_s / (config.target_utilization * load.capacity_rows_per_s))
    return min(config.max_replicas, max(config.min_replicas, needed, 1 if load.arrival_rows_per_s > 0 else 0))


def decide(
    loads: list[VariantLoad], config: AutoscalingConfig, state: ScalingState, now_s: float
) -> tuple[list[ScaleDecision], ScalingState]:
    """Replica changes to make now, and the state to pass next time."""
    decisions: list[ScaleDecision] = []
    wanting: dict[str, tuple[int, float]] = {}
    for load in loads:
        want = _desired(load, config)
        if want == load.replicas:
            continue
        previous = state.wanting_since_s.get(load.variant)
        # The clock restarts when the direction of the wish changes.
        same_direction = previous is not None and (previous[0] > load.replicas) == (want > load.replicas)
        since = previous[1] if previous is not None and same_direction else now_s
        delay = config.upscale_delay_s if want > load.replicas else config.downscale_delay_s
        if now_s - since >= delay:
            util = load.arrival_rows_per_s / max(load.capacity_rows_per_s * max(load.replicas, 1), 1e-9)
            decisions.append(
                ScaleDecision(
                    variant=load.variant,
                    replicas=want,
                    reason=(
                        f"{load.arrival_rows_per_s:.0f} rows/s on {load.replicas} replica(s) of "
                        f"{load.capacity_rows_per_s:.0f} rows/s is {util:.0%} utilisation; target "
                        f"{config.target_utilization:.0%} for {now_s - since:.1f} s"
                    ),
                )
            )
        else:
            wanting[load.variant] = (want, since)
    return decisions, ScalingState(wanting_since_s=wanting)
