"""Admission's one verdict: admit a query, or refuse it with the reason its status carries
(DESIGN.md, "One verdict"). Pure: a query and a `View` of the service in, a `Verdict` out; no
clock, no I/O. The router gathers the view (its snapshot, the batcher's live state, the tenant's
standing under the limit) and turns a refusal into its error; the simulator builds the same view
from its virtual state and asks the same function.

The rule, in order:

1. **over share** (429): the tenant is over its rate quota, or the front end's limit on queries
   in flight is full and the tenant already holds its share of it (`policy.admission`);
2. **deadline** (504): the query waited past its whole target before it was routed;
3. **pinned** variant: served, even when it cannot meet the latency target, unless only its queue
   (busy) or its cold load (cold) is in the way, which an idle fleet would not have;
4. the cheapest variant that meets the targets now (`VariantTable.select`) is the answer, except:
   - none meets them now: **infeasible** (422, with alternatives) if none would on an idle fleet,
     else **busy** (429);
   - it is cold while a loaded one would meet them on an idle fleet: the loaded ones are busy, and
     adding capacity is the autoscaler's call: **busy**;
   - it is a loaded replica with nothing to do, picked as the spill of a busy variant, on a host
     whose cores the busy replicas hold (`room`): it adds no capacity there: **busy**;
   - it is cold and its load outlasts the target: **cold** (429 while it loads);
5. a query refused as busy is admitted anyway as a **probe** when its variant's path is due one
   (`probe_ready`) and nothing of the variant is queued or running: refusals add no answers, and
   without answers the overhead estimate that refused them could not see a stall end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from infaas.policy.selection import Choice, Infeasible, LiveState, VariantTable
from infaas.types import SLO

__all__ = ["Query", "Room", "Standing", "Verdict", "VerdictKind", "View", "admit", "over_share", "room_for"]

VerdictKind = Literal["admit", "probe", "over_share", "deadline", "infeasible", "busy", "cold"]


class Query(NamedTuple):
    """What admission reads of a query: its rows, its targets, how long it has waited since
    receipt, and the variant it pins (None: the service chooses)."""

    rows: int
    slo: SLO
    elapsed_ms: float = 0.0
    pinned: str | None = None


class Standing(NamedTuple):
    """The tenant under the front end's limit: slots held, its share of the limit (rounded down,
    at least one), whether the limit is full, and the seconds until its rate quota has a token
    (0: it has one, or no quota)."""

    held: int
    share: int
    full: bool
    quota_wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Room:
    """The host's cores where replicas share them with the front end (a local Ray): cores left to
    replicas, and per variant the vCPUs one replica holds, its replicas, whether it runs there."""

    cores: float
    holds: Mapping[str, float]
    replicas: Mapping[str, int]
    remote: frozenset[str]


@dataclass(frozen=True, slots=True)
class View:
    """What admission sees: the scope's variants, the live state for this tenant's query, the
    same as an idle fleet would be (no queues, the path's prior overhead), which variants have
    work queued and batches running, which are due a probe, the host's room and the standing."""

    table: VariantTable
    live: LiveState
    idle: LiveState
    queued: frozenset[str] = frozenset()
    running: Mapping[str, int] = field(default_factory=dict)
    probe_ready: frozenset[str] = frozenset()
    room: Room | None = None
    standing: Standing | None = None


class Verdict(NamedTuple):
    """`kind`; `choice`: the variant admitted, or the one a busy/cold refusal names (as an idle
    fleet would answer); `infeasible`: why nothing meets the targets (422)."""

    kind: VerdictKind
    choice: Choice | None = None
    infeasible: Infeasible | None = None

    @property
    def admitted(self) -> bool:
        return self.kind in ("admit", "probe")


def room_for(variant: str, room: Room | None, running: Mapping[str, int]) -> bool:
    """Whether the host's cores left to replicas, less the vCPUs held by the replicas running
    batches, hold one more replica of `variant`. Always where nothing runs or replicas run
    elsewhere (`room` None)."""
    if room is None or not running:
        return True
    taken = sum(
        min(batches, max(1, room.replicas.get(name, 0))) * room.holds.get(name, 1.0)
        for name, batches in running.items()
        if name in room.remote
    )
    return room.cores - taken >= room.holds.get(variant, 1.0)


def _spill_without_cores(chosen: str, view: View) -> bool:
    """`chosen` is a loaded remote replica with nothing queued or running, picked while another
    variant runs batches, on a host without room for it (2026-12-05, 2 cores: the idle fp32
    replica taking the busy int8 one's spill made both run 1.2-3x their prediction)."""
    room, running = view.room, view.running
    if room is None or chosen in view.queued or chosen not in room.remote:
        return False
    if chosen in running or not any(name in view.table for name in running):
        return False
    return chosen in view.live.loaded and not room_for(chosen, room, running)


def _busy(query: Query, idle: Choice, view: View) -> Verdict:
    name = idle.variant
    if name in view.probe_ready and name not in view.queued and name not in view.running:
        return Verdict("probe", idle)
    return Verdict("busy", idle)


def _pinned(query: Query, name: str, view: View, left: SLO) -> Verdict:
    decision = view.table.predict(name, query.rows, view.live)
    if decision is None:
        return Verdict("infeasible")
    if decision.predicted_latency_ms <= left.latency_ms:
        return Verdict("admit", decision)
    idle_live = LiveState(view.idle.loaded | {name}, view.idle.queue_delay_ms, view.idle.overhead_ms)
    idle = view.table.predict(name, query.rows, idle_live)
    if idle is None or idle.predicted_latency_ms > query.slo.latency_ms:
        return Verdict("admit", decision)  # it cannot meet the target even idle: served as asked
    if name not in view.live.loaded:
        return Verdict("cold", decision)
    return Verdict("busy", idle)


def over_share(standing: Standing) -> bool:
    """Rule 1 alone: the front end asks it before it reads the live state (a refusal must cost
    less than an answer)."""
    return standing.quota_wait_s > 0.0 or (standing.full and standing.held >= standing.share)


def admit(query: Query, view: View) -> Verdict:
    """The verdict on `query` (module docstring)."""
    if view.standing is not None and over_share(view.standing):
        return Verdict("over_share")
    slo = query.slo
    late = query.elapsed_ms >= slo.latency_ms
    # Judged on the whole target: the path's overhead estimate (receipt to reply, p99) prices the
    # usual wait before routing; only a deadline already gone is final.
    left = slo.model_copy(update={"latency_ms": 1e-6}) if late else slo
    if query.pinned is not None:
        verdict = _pinned(query, query.pinned, view, left)
        return Verdict("deadline", verdict.choice) if late and verdict.kind == "busy" else verdict
    table, live = view.table, view.live
    result = table.select(query.rows, left, live)
    if isinstance(result, Infeasible):
        idle = table.select(query.rows, slo, view.idle)
        if isinstance(idle, Infeasible):
            return Verdict("infeasible", infeasible=idle)
        return Verdict("deadline", idle) if late else _busy(query, idle, view)
    if result.variant not in live.loaded and live.loaded:
        idle = table.select(query.rows, slo, view.idle)
        if isinstance(idle, Choice) and idle.variant in live.loaded:
            return Verdict("deadline", idle) if late else _busy(query, idle, view)
    if _spill_without_cores(result.variant, view):
        idle = table.select(query.rows, slo, view.idle)
        if isinstance(idle, Choice) and idle.variant in view.running:
            return Verdict("deadline", idle) if late else Verdict("busy", idle)
    if result.variant not in live.loaded and result.predicted_latency_ms > left.latency_ms:
        return Verdict("cold", result)
    return Verdict("admit", result)
