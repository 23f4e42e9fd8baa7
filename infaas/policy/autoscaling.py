"""Autoscaling policy (pure): INFaaS's actions over one snapshot of the fleet.

The caller (`infaas.autoscaler`) owns the clock and the I/O. Every round it measures a
`FleetSnapshot` — per variant its arrival rate in rows/s, queue age, one replica's capacity at the
batch sizes really run, SLO misses and refusals, replicas, what it costs and holds; the free
vCPUs / GPUs the cluster reports; when each architecture last had traffic — and `decide` returns
the actions to take, each with its reason, plus the memory to pass next time.

Actions, per task (its loaded variants serve its traffic; the router sends each query to the
cheapest one that meets its targets, so traffic spills to pricier variants as cheap ones fill):

- **replicate**: a remote variant needs ``ceil(rows/s ÷ (target utilisation × capacity))``
  replicas, or shows pressure (SLO misses or refusals, or a queue older than half its deadline)
  at the replicas it has, and the cluster has the vCPUs for more.
- **upgrade**: the replicas the cluster can give would not hold the load (or a faster variant
  holds it for less than the extra copies cost): load the cheapest faster variant that meets the
  accuracy its traffic asks for; the router moves the overflow there. A variant that runs in the
  front end is moved only for its own capacity: its misses while its rows stay within its
  capacity at the target are the front end's own CPU (HTTP, routing), which another variant in
  the same front end would share (measured: such upgrades loaded three more front-end variants
  during a burst, one of them a 1.1 s load, in a replay that refused 704 of 7 204 queries).
- **remove**: fewer replicas hold the load at the target, after the hold-down.
- **downgrade**: the cheaper loaded variants hold the whole task's load (and meet the accuracy its
  traffic asked of the pricier one), after the hold-down: unload the pricier one.
- **unload** (scale to zero): no traffic for the hold-down, unless it is its architecture's
  *warm floor* — the cheapest variant of an architecture that had traffic within `warm_ttl_s`,
  which stays loaded (and is loaded again if it was evicted: **keep_warm**).

Hysteresis: a wish must hold `upscale_delay_s` (up) or `downscale_delay_s` (down) before it is
acted on; nothing in a task goes down within `downscale_delay_s` of it going up; a scale-up
forced by pressure (beyond what the arrival rate asks) is kept until that rate falls below
`release_ratio` of what it was; a variant taken to zero replicas and loaded again by the router
waits a fresh hold-down; and a task gets one action per round. Removal only goes to the
count the rate asks for, never below, so at a constant load the fleet settles instead of flapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Action",
    "ActionKind",
    "AutoscalingConfig",
    "FleetSnapshot",
    "ScalingState",
    "VariantState",
    "decide",
    "needed_replicas",
]

ActionKind = Literal["replicate", "remove", "upgrade", "downgrade", "unload", "keep_warm"]


@dataclass(frozen=True)
class AutoscalingConfig:
    target_utilization: float = 0.7
    max_replicas: int | None = None  # per variant; None: as many as free resources allow
    upscale_delay_s: float = 2.0
    downscale_delay_s: float = 30.0
    warm_ttl_s: float = 3600.0
    # Pressure adds replicas up to this multiple of what the rate needs, no further: beyond it the
    # misses are not for want of replicas (tail latency, a target at the edge of the profile), and
    # adding one per round ratcheted a variant at 6 rows/s to 150 replicas in the simulator.
    pressure_headroom: float = 2.0
    release_ratio: float = 0.5
    gpu_share: float = 1.0  # of a GPU, what each GPU worker holds (`INFAAS_GPU_PER_WORKER`)
    # The kinds it may take: fewer make the baselines (replicate + remove: a replica autoscaler),
    # and the policy then chooses among what is allowed rather than having its choice dropped.
    actions: frozenset[str] = frozenset(
        ("replicate", "remove", "upgrade", "downgrade", "unload", "keep_warm")
    )

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must be in (0, 1]")
        if self.max_replicas is not None and self.max_replicas < 1:
            raise ValueError("max_replicas must be at least 1")
        if not 0 < self.release_ratio < 1:
            raise ValueError("release_ratio must be in (0, 1)")
        if not 0 < self.gpu_share <= 1:
            raise ValueError("gpu_share must be in (0, 1]")
        if self.pressure_headroom < 1:
            raise ValueError("pressure_headroom must be at least 1")


@dataclass(frozen=True)
class VariantState:
    """One variant of a task as measured over the look-back window (zeros when it had no traffic)."""

    name: str
    task: str
    architecture: str
    replicas: int
    capacity_rows_per_s: float  # one replica, at the batch sizes really run (the profile's if none)
    accuracy: float
    price_usd_per_s: float  # what one replica's resources cost
    cpus: float = 1.0  # vCPUs one replica holds
    gpus: float = 0.0
    remote: bool = True  # False: it runs in the front end (one copy; not replicated)
    arrival_rows_per_s: float = 0.0
    pressure_rows_per_s: float = 0.0  # rows answered late or refused (429) per second
    queue_age_ms: float = 0.0  # the oldest waiting request's age now
    latency_target_ms: float = math.inf  # the tightest latency target of its traffic
    required_accuracy: float = 0.0  # the highest accuracy target of its traffic
    floor: bool = False  # its architecture's cheapest: the warm floor while the architecture is active
    active: bool = True  # its architecture had traffic (or was registered) within warm_ttl_s

    @property
    def usd_per_row(self) -> float:
        """What a row costs on it at capacity: the order the router fills variants in."""
        return self.price_usd_per_s / max(self.capacity_rows_per_s, 1e-9)

    @property
    def pressured(self) -> bool:
        return self.queue_age_ms > self.latency_target_ms / 2.0 or (
            self.arrival_rows_per_s > 0 and self.pressure_rows_per_s > 0
        )


@dataclass(frozen=True)
class FleetSnapshot:
    variants: tuple[VariantState, ...]
    free_cpus: float
    free_gpus: float = 0.0


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    variant: str
    task: str
    before: int  # its replicas when decided
    replicas: int  # its replicas once done
    reason: str


@dataclass(frozen=True)
class ScalingState:
    """What `decide` remembers between rounds."""

    wanting_since_s: dict[tuple[str, str], float] = field(default_factory=dict)  # (variant, wish) → since
    last_up_s: dict[str, float] = field(default_factory=dict)  # task → its last scale-up
    pressure_hold: dict[str, tuple[int, float]] = field(default_factory=dict)  # variant → (replicas, rows/s)


def needed_replicas(v: VariantState, config: AutoscalingConfig) -> int:
    """Replicas that keep `v`'s arrival rate at the target utilisation (0 with no traffic)."""
    if v.arrival_rows_per_s <= 0:
        return 0
    if v.capacity_rows_per_s <= 0:
        return max(v.replicas, 1)
    return max(1, math.ceil(v.arrival_rows_per_s / (config.target_utilization * v.capacity_rows_per_s)))


class _Round:
    """One call of `decide`: the wishes seen, the resources left, the actions taken."""

    def __init__(self, snap: FleetSnapshot, config: AutoscalingConfig, state: ScalingState, now_s: float):
        self.config = config
        self.state = state
        self.now_s = now_s
        self.free_cpus = snap.free_cpus
        self.free_gpus = snap.free_gpus
        self.wanting: dict[tuple[str, str], float] = {}
        self.last_up = dict(state.last_up_s)
        self.hold = dict(state.pressure_hold)
        self.actions: list[Action] = []

    def held(self, variant: str, wish: str, delay_s: float) -> tuple[bool, float]:
        """Record that `variant` wishes `wish` now; (has it for `delay_s`, for how long)."""
        since = self.state.wanting_since_s.get((variant, wish), self.now_s)
        self.wanting[(variant, wish)] = since
        return self.now_s - since >= delay_s, self.now_s - since

    def affordable(self, v: VariantState, copies: int) -> int:
        """How many of `copies` new replicas of `v` the free resources hold."""
        fits = copies
        if v.cpus > 0:
            fits = min(fits, int(self.free_cpus // v.cpus + 1e-9))
        if v.gpus > 0:
            fits = min(fits, int(self.free_gpus // v.gpus + 1e-9))
        return max(0, fits)

    def take(self, v: VariantState, copies: int) -> None:
        self.free_cpus -= copies * v.cpus
        self.free_gpus -= copies * v.gpus

    def act(self, kind: ActionKind, v: VariantState, replicas: int, reason: str) -> None:
        self.actions.append(Action(kind, v.name, v.task, v.replicas, replicas, reason))
        if replicas > v.replicas:
            self.take(v, replicas - v.replicas)
            self.last_up[v.task] = self.now_s


def decide(
    snap: FleetSnapshot, config: AutoscalingConfig, state: ScalingState, now_s: float
) -> tuple[list[Action], ScalingState]:
    """The actions to take now (at most one per task), and the state to pass next time."""
    r = _Round(snap, config, state, now_s)
    by_task: dict[str, list[VariantState]] = {}
    for v in snap.variants:
        by_task.setdefault(v.task, []).append(v)
    for task in sorted(by_task):
        variants = sorted(by_task[task], key=lambda v: (v.usd_per_row, v.name))
        # Up first: a task under pressure never scales anything down in the same round.
        _scale_up(r, variants) or _keep_warm(r, variants) or _scale_down(r, variants)
    # Holds whose variant has gone are dropped; others lapse when the rate falls below release_ratio.
    names = {v.name: v for v in snap.variants}
    hold = {
        n: h
        for n, h in r.hold.items()
        if n in names and names[n].replicas > 0 and names[n].arrival_rows_per_s >= config.release_ratio * h[1]
    }
    return r.actions, ScalingState(wanting_since_s=r.wanting, last_up_s=r.last_up, pressure_hold=hold)


def _scale_up(r: _Round, variants: list[VariantState]) -> bool:
    cfg = r.config
    loaded = [v for v in variants if v.replicas > 0]
    # The task is short when its loaded variants together cannot hold its rows at the target, or
    # show pressure. Only then is a new variant loaded: a cheap variant that is full while a
    # pricier loaded one takes its overflow is the router working, not a reason to upgrade.
    room = sum(cfg.target_utilization * v.capacity_rows_per_s * v.replicas for v in loaded)
    total = sum(v.arrival_rows_per_s for v in loaded)
    short = any(v.pressured for v in loaded) or total > room
    for v in loaded:
        need = needed_replicas(v, cfg)
        headroom = math.floor(max(need, 1) * cfg.pressure_headroom)
        pressured = v.pressured and need <= v.replicas < headroom
        if pressured and not v.remote:
            continue  # the front end is what is short, not this variant (docstring: upgrade)
        if pressured:
            need = v.replicas + 1
        if need <= v.replicas:
            continue
        ready, for_s = r.held(v.name, "up", cfg.upscale_delay_s)
        if not ready:
            continue
        why = (
            f"{v.pressure_rows_per_s:.0f} rows/s late or refused, oldest queued {v.queue_age_ms:.0f} ms"
            if pressured
            else f"{v.arrival_rows_per_s:.0f} rows/s needs {need} replica(s) of {v.capacity_rows_per_s:.0f} "
            f"rows/s at {cfg.target_utilization:.0%}"
        )
        why += f" (for {for_s:.1f} s)"
        cap = need if cfg.max_replicas is None else min(need, cfg.max_replicas)
        copies = r.affordable(v, cap - v.replicas) if v.remote else 0
        short_rows = total - room - cfg.target_utilization * v.capacity_rows_per_s * copies
        if "replicate" not in cfg.actions:
            copies = 0
        upgrade = (
            _upgrade_target(r, v, variants, need, copies, short_rows)
            if short and "upgrade" in cfg.actions
            else None
        )
        if upgrade is not None:
            r.act("upgrade", upgrade, 1, f"{v.name}: {why}; {_upgrade_why(v, upgrade, copies, need)}")
        elif copies > 0:
            r.act("replicate", v, v.replicas + copies, f"{why} on {v.replicas}")
        else:
            continue  # nothing the cluster can give: ask again next round
        if pressured:
            r.hold[v.name] = (v.replicas + (copies if upgrade is None else 0), v.arrival_rows_per_s)
        return True
    return False


def _upgrade_target(
    r: _Round, v: VariantState, variants: list[VariantState], need: int, copies: int, short_rows: float
) -> VariantState | None:
    """The variant to move the task's overflow to, if one should: among the idle variants of the
    task that are faster than `v`, meet the accuracy `v`'s traffic asks for and fit the free
    resources, the cheapest that holds the `short_rows` the replicas of `v` the cluster can give
    leave over (else the one with the most capacity) — unless those copies hold it for less."""
    target = r.config.target_utilization
    candidates = [
        c
        for c in variants
        if c.replicas == 0
        and c.accuracy >= v.required_accuracy
        and c.capacity_rows_per_s > v.capacity_rows_per_s
        and r.affordable(c, 1) >= 1
    ]
    if not candidates:
        return None
    holding = [c for c in candidates if target * c.capacity_rows_per_s >= short_rows]
    if holding:
        best = min(holding, key=lambda c: (c.price_usd_per_s, c.name))
    else:
        best = max(candidates, key=lambda c: (c.capacity_rows_per_s, c.name))
    if copies >= need - v.replicas and best.price_usd_per_s >= (need - v.replicas) * v.price_usd_per_s:
        return None  # more copies hold the load, and for less
    return best


def _upgrade_why(v: VariantState, c: VariantState, copies: int, need: int) -> str:
    if copies >= need - v.replicas:
        return (
            f"{c.name} ({c.capacity_rows_per_s:.0f} rows/s) holds it for less than "
            f"{need - v.replicas} more replica(s)"
        )
    room = "" if v.remote else " (it runs in the front end: one copy)"
    return (
        f"only {copies} more replica(s) fit{room}: overflow goes to {c.name} "
        f"({c.capacity_rows_per_s:.0f} rows/s)"
    )


def _keep_warm(r: _Round, variants: list[VariantState]) -> bool:
    if "keep_warm" not in r.config.actions:
        return False
    for v in variants:
        if v.floor and v.active and v.replicas == 0 and r.affordable(v, 1) >= 1:
            ready, _ = r.held(v.name, "warm", 0.0)
            if ready:
                r.act(
                    "keep_warm",
                    v,
                    1,
                    f"warm floor: the cheapest variant of {v.architecture}, active within the TTL",
                )
                return True
    return False


def _scale_down(r: _Round, variants: list[VariantState]) -> bool:
    cfg = r.config
    task = variants[0].task
    if r.now_s - r.last_up.get(task, -math.inf) < cfg.downscale_delay_s:
        return False
    loaded = [v for v in variants if v.replicas > 0]
    if any(v.pressured for v in loaded):
        return False
    total = sum(v.arrival_rows_per_s for v in loaded)
    room_all = sum(cfg.target_utilization * v.capacity_rows_per_s * v.replicas for v in loaded)
    # Every way down is a wish with its own clock, all recorded this round (so the hold-downs of
    # several run together); the first that has held long enough is taken.
    wishes: list[tuple[VariantState, ActionKind, int, str]] = []
    # Downgrade: the priciest loaded variant (never an active warm floor), when the cheaper loaded
    # ones hold the whole load and meet the accuracy its traffic asked for.
    movable = [v for v in loaded if not (v.floor and v.active)]
    top: VariantState | None = None
    if len(loaded) > 1 and movable:
        top = max(movable, key=lambda v: (v.usd_per_row, v.name))
        rest = [v for v in loaded if v is not top]
        room = sum(cfg.target_utilization * v.capacity_rows_per_s * v.replicas for v in rest)
        if total <= room and any(v.accuracy >= top.required_accuracy for v in rest):
            fits = (
                f"the task's {total:.0f} rows/s fit the cheaper loaded variant(s) "
                f"({room:.0f} rows/s at {cfg.target_utilization:.0%})"
            )
            if top.arrival_rows_per_s > 0:
                wishes.append((top, "downgrade", 0, fits))
            else:
                wishes.append((top, "unload", 0, f"no traffic; {fits}"))
        else:
            top = None
    for v in reversed(loaded):  # priciest per row first
        if v is top:
            continue
        need = needed_replicas(v, cfg)
        held = r.hold.get(v.name)
        if held is not None:
            need = max(need, held[0])
        if v.floor and v.active:
            need = max(need, 1)
        # Never below what the task as a whole needs: the router fills cheap variants first, so
        # an idle pricier one may be the headroom that keeps the task from being short.
        after = room_all - cfg.target_utilization * v.capacity_rows_per_s * (v.replicas - need)
        if need >= v.replicas or after < total:
            continue
        if need == 0:
            wishes.append((v, "unload", 0, "no traffic, and not a warm floor"))
        else:
            wishes.append(
                (
                    v,
                    "remove",
                    need,
                    f"{v.arrival_rows_per_s:.0f} rows/s needs {need} replica(s) of "
                    f"{v.capacity_rows_per_s:.0f} rows/s at {cfg.target_utilization:.0%}",
                )
            )
    wishes = [w for w in wishes if w[1] in cfg.actions]
    ready = [(wish, r.held(wish[0].name, "down", cfg.downscale_delay_s)) for wish in wishes]
    for (v, kind, replicas, why), (is_ready, for_s) in ready:
        if is_ready:
            r.act(kind, v, replicas, f"{why}, for {for_s:.0f} s")
            if replicas == 0:
                # Its clock ends with it: the router may load it again before the next round (a
                # load hint: cheaper at its queries' rows than at the rows the rest batch), and
                # the old clock then took it down again every round (bench_adaptive: ten
                # downgrades of one variant in ten seconds). Back, it waits a fresh hold-down.
                r.wanting.pop((v.name, "down"), None)
            return True
    return False
