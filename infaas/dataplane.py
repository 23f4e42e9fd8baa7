"""The data plane: one query, whatever protocol carried it (MLServer's `DataPlane` is the model).

`DataPlane.infer` takes who asks and what (a task, or a model name; rows; targets, or none) and
returns the answer, owning every step between: the task and its input checks, the tenant's default
targets when the request carries none, routing, batching under the deadline, the charge, the SLO
verdict, what the router learns, metering, and the durability of the charge before the answer
leaves. `/v1/query`, the KServe V2 and TensorFlow Serving protocols and offline jobs are adapters:
they parse their wire format into an `InferenceRequest` and render the `Answer`.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from infaas.errors import (
    ArchitectureNotFound,
    DeadlineExceeded,
    InfaasError,
    InvalidInput,
    NotFound,
    Overloaded,
    TaskNotFound,
    Unavailable,
)
from infaas.metering import Meter, cost_share_pusd
from infaas.policy.admission import ConcurrencyLimit, RateQuota, late_for_load
from infaas.policy.shedding import DoorShedder, LoopWatch
from infaas.policy.verdict import over_share
from infaas.router import Router
from infaas.settings import Settings
from infaas.store import MetadataStore
from infaas.types import SLO, Architecture, Principal, Share, Task, pusd_to_usd
from infaas.workers.base import Batcher

__all__ = ["Answer", "DataPlane", "InferenceRequest", "ModelRef", "dataplane_of", "parse_inputs"]


@dataclass(frozen=True)
class InferenceRequest:
    task: str
    inputs: Sequence[Any] | np.ndarray  # rows of the task's input shape, or flattened rows
    received_s: float  # monotonic: when the request reached the service (the deadline counts from it)
    slo: SLO | None = None  # None: the tenant's default targets for the task
    architecture: str | None = None
    variant: str | None = None


@dataclass(frozen=True)
class Answer:
    task: str
    outputs: np.ndarray
    variant: str
    architecture: str
    accuracy: float
    predicted_latency_ms: float
    latency_ms: float
    cost_pusd: int
    slo_met: bool
    batch_rows: int
    reason: str
    load_hint: str | None
    slo: SLO

    def decision(self) -> dict[str, Any]:
        """What infaas decided and measured, as every protocol reports it beside the outputs."""
        return {
            "variant": self.variant,
            "architecture": self.architecture,
            "accuracy": self.accuracy,
            "predicted_latency_ms": round(self.predicted_latency_ms, 4),
            "latency_ms": round(self.latency_ms, 4),
            "cost_usd": pusd_to_usd(self.cost_pusd),
            "cost_pusd": self.cost_pusd,
            "slo_met": self.slo_met,
            "batch_rows": self.batch_rows,
            "reason": self.reason,
            "load_hint": self.load_hint,
        }


@dataclass(frozen=True)
class ModelRef:
    """What a protocol's model name designates: a task (model-less), or an architecture or a
    version of one (``net``, ``net@2``, ``net@canary``) and its task."""

    task: Task
    architecture: str | None  # the pin as named: ``net`` keeps the canary split, ``net@2`` does not
    version: Architecture | None  # the stored version it designates now


def parse_inputs(inputs: Sequence[Any] | np.ndarray, task: Task) -> np.ndarray:
    """Rows as an array of the task's input shape and dtype, or `InvalidInput` saying what is
    wrong. Rows may also come flattened (one list of ``prod(shape)`` numbers each)."""
    spec = task.input_spec
    dtype, limit, bounds = _dtype_limits(spec.dtype)
    if len(inputs) == 0:
        raise InvalidInput("inputs is empty: send at least one row", expected_shape=list(spec.shape))
    try:
        arr = np.asarray(inputs)
        # Strings and booleans are not numbers, though a float64 array would take "1" as 1.0.
        if arr.dtype.kind in "USb":
            raise TypeError(f"found {'booleans' if arr.dtype.kind == 'b' else 'strings'}, send JSON numbers")
        # Object arrays: integers past int64 or nulls among the numbers; float64 takes the first
        # and turns the second into NaN, refused below.
        if arr.dtype != dtype:
            arr = np.asarray(arr, dtype=np.float64)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(
            f"inputs must be rows of numbers of shape {list(spec.shape)} (ragged or non-numeric: {exc})",
            expected_shape=list(spec.shape),
        ) from None
    rows = arr.shape[0]
    if arr.shape[1:] != spec.shape:
        if arr.ndim == 2 and arr.shape[1] == spec.row_size:
            arr = arr.reshape((rows, *spec.shape))
        else:
            raise InvalidInput(
                f"each row must have shape {list(spec.shape)} (or {spec.row_size} numbers flattened); "
                f"got rows of shape {list(arr.shape[1:])}",
                expected_shape=list(spec.shape),
                got_shape=list(arr.shape[1:]),
            )
    # One pass for both checks: the largest magnitude is NaN or infinite exactly when some input is.
    peak = float(np.abs(arr).max())
    if not math.isfinite(peak):
        bad = int(np.argwhere(~np.isfinite(arr.reshape(rows, -1)))[0][0])
        raise InvalidInput(f"inputs hold NaN or infinity (first in row {bad})", row=bad)
    if bounds is not None:
        low, high = bounds
        if not (np.all(arr == np.round(arr)) and arr.min() >= low and arr.max() <= high):
            raise InvalidInput(f"inputs must be integers in [{low}, {high}] ({spec.dtype})")
    elif limit is not None and peak > limit:
        raise InvalidInput(f"inputs overflow {spec.dtype} (|x| > {limit:g})")
    return arr.astype(dtype, copy=False)


@functools.cache
def _dtype_limits(name: str) -> tuple[np.dtype[Any], float | None, tuple[int, int] | None]:
    """An input dtype, the largest magnitude it holds if a float, its bounds if an integer: asked
    per query, numpy's two `issubdtype` and its `finfo` took 1.3 µs of it (timeit), ~4 µs in the
    service's profile."""
    dtype = np.dtype(name)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return dtype, None, (int(info.min), int(info.max))
    if np.issubdtype(dtype, np.floating):
        return dtype, float(np.finfo(dtype).max), None
    return dtype, None, None


def _counted(exc: Exception) -> Literal["refused", "failed"] | None:
    """How a failed query counts in usage: refused as overloaded, failed on the service's side,
    or neither (a bad request says nothing about the service)."""
    if isinstance(exc, Overloaded):
        return "refused"
    if not isinstance(exc, InfaasError) or type(exc) is InfaasError:
        return "failed"
    return "failed" if isinstance(exc, (Unavailable, DeadlineExceeded)) else None


_DOOR_RETRY_AFTER_S = 0.1
"""Retry-After of a refusal at the full limit before admission refused anything as busy: a slot
frees within a target, and targets here are tens to hundreds of ms."""


@dataclass(slots=True)
class _Slot:
    """One query's place under the concurrency limit: whether it took one, and the verdict its
    release teaches the limit (None: nothing about the load, e.g. refused by the router)."""

    taken: bool = False
    late: bool | None = None
    crowded: bool = False  # admitted with half the limit in use, or a long queue ahead of it
    # Admitted alone in the front end (where it can tell), with less than half the limit in use,
    # nothing ahead of it, the loop idle: what the host's floor is learned from.
    quiet: bool = False


class DataPlane:
    """See the module docstring. Default targets are read from the store at most once per
    `targets_ttl_s` per tenant and task (in a thread: the loop never waits on the store)."""

    def __init__(
        self,
        settings: Settings,
        store: MetadataStore,
        router: Router,
        batcher: Batcher,
        meter: Meter,
        targets_ttl_s: float = 5.0,
        requests_in_flight: Callable[[], int] | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self.router = router
        self._batcher = batcher
        self._meter = meter
        self._targets_ttl_s = targets_ttl_s
        self._requests_in_flight = requests_in_flight
        """The HTTP server's requests in progress (uvicorn's request tasks), counted from the
        moment their headers were parsed: 1 means no other request could join this one's batch."""
        self._targets: dict[tuple[str, str], tuple[SLO, float]] = {}
        self._doors: dict[str, DoorShedder] = {}
        self._quotas: dict[str, tuple[Share, RateQuota]] = {}  # tenant → its share, its bucket
        self.limit = ConcurrencyLimit(
            min_limit=settings.min_queries_in_flight, initial=max(64.0, settings.min_queries_in_flight)
        )
        """Admitted queries in flight in this front end (`policy.admission`)."""
        self.loop_watch = LoopWatch()
        """Ticked every `loop_watch.tick_s` by the app (a `Periodic`): the door's sign that
        refusing is what keeps the front end busy."""

    # ---- names ----------------------------------------------------------------------------
    async def model(self, name: str, now_s: float, version: str | None = None) -> ModelRef:
        """Resolve a protocol's model name: a task first, else an architecture (``net``, or a
        version of it: ``net@2``, ``net@canary``, or `version` given apart, as the protocols'
        ``/versions/{v}`` and ``/labels/{l}`` do)."""
        if version is not None:
            base = await self.model(name, now_s)
            if base.architecture is None or "@" in name:
                raise NotFound(f"model {name!r} has no version {version!r}", model=name, version=version)
            name = f"{name}@{version}"
        snap = self.router.snapshot
        if name in snap.tasks:
            return ModelRef(snap.tasks[name], None, None)
        arch = snap.resolve(name)
        if arch is None:
            try:  # maybe registered since the snapshot: the router re-reads the store once
                return ModelRef(await self.router.task_async(name, now_s), None, None)
            except TaskNotFound:
                snap = self.router.snapshot
                arch = snap.resolve(name)
        if arch is None:
            raise ArchitectureNotFound(
                f"no task or architecture {name!r}; GET /v1/tasks and GET /v1/models list them", model=name
            )
        return ModelRef(snap.tasks[arch.task], name, arch)

    # ---- targets --------------------------------------------------------------------------
    async def default_targets(self, tenant: str, task: str, now_s: float) -> SLO:
        """The tenant's stored default targets for `task`, else the service's."""
        cached = self._targets.get((tenant, task))
        if cached is not None and now_s < cached[1]:
            return cached[0]
        stored = await asyncio.to_thread(self._store.get_targets, tenant, task)
        slo = (
            stored.slo
            if stored is not None
            else SLO(latency_ms=self._settings.default_latency_ms, min_accuracy=0.0)
        )
        self._targets[(tenant, task)] = (slo, now_s + self._targets_ttl_s)
        return slo

    def forget_targets(self, tenant: str, task: str) -> None:
        """Called when this front end changes them: the next query reads them again."""
        self._targets.pop((tenant, task), None)

    # ---- the query ------------------------------------------------------------------------
    def record_failure(
        self,
        principal: Principal,
        task: str,
        exc: Exception,
        received_s: float,
        *,
        rows: int = 0,
        variant: str = "",
        slo: SLO | None = None,
    ) -> None:
        """Meter a query that got no answer (adapters call it for requests they could not parse)."""
        self._meter.record_failure(
            tenant=principal.name,
            task=task,
            # A refusal names the variant it would have used.
            variant=variant or (str(exc.fields.get("variant", "")) if isinstance(exc, InfaasError) else ""),
            rows=rows,
            latency_ms=(time.monotonic() - received_s) * 1000.0,
            error=exc.code if isinstance(exc, InfaasError) else "internal_error",
            now_s=time.time(),
            counted=_counted(exc),
            slo=slo,
        )

    def shedding(self) -> bool:
        """Whether the door refuses now: the limit on queries in flight is full, or some tenant's
        door sheds. When neither (the usual case), the door skips the header lookup and the key's
        digest on every query."""
        return (
            self.limit.full
            or any(door.share > 0.0 for door in self._doors.values())
            or any(quota.empty for _, quota in self._quotas.values())
        )

    def quota(self, principal: Principal, now_s: float) -> RateQuota | None:
        """`principal`'s rate quota (None: it has none), rebuilt when its settings change."""
        share = principal.share
        if share.rate_qps is None:
            self._quotas.pop(principal.name, None)
            return None
        held = self._quotas.get(principal.name)
        if held is None or held[0] != share:
            held = self._quotas[principal.name] = (share, RateQuota(share.rate_qps, share.burst, now_s))
        return held[1]

    def _over_quota(self, principal: Principal, quota: RateQuota, wait_s: float) -> Overloaded:
        return Overloaded(
            f"tenant {principal.name!r} is over its rate quota of {quota.rate_qps:g} queries/s "
            f"(burst {quota.burst:g}); retry",
            over_share=True,
            quota_qps=quota.rate_qps,
            retry_after_s=round(max(wait_s, 0.001), 3),
        )

    def _over_share(
        self, principal: Principal, now_s: float, retry_after_s: float, **fields: object
    ) -> Overloaded:
        """The 429 for a query refused because its tenant holds its share of a full limit."""
        limit = self.limit
        weight = principal.share.weight
        held = limit.held(principal.name)
        share = limit.share(principal.name, weight, now_s)
        if held >= limit.in_flight:  # alone: its share is the whole limit
            detail = (
                f"this front end already answers {limit.in_flight} queries, its limit (learned "
                "from late answers: it falls when answers come late and grows while they come "
                "in time); retry"
            )
        else:
            detail = (
                f"tenant {principal.name!r} is over its share: it holds {held} of the "
                f"{limit.in_flight} queries this front end answers, its share of the limit "
                f"{int(limit.limit)} is {share:.1f} (weight {weight:g} against the other active "
                "tenants'); retry"
            )
        return Overloaded(
            detail,
            over_share=held < limit.in_flight,
            in_flight=held,
            retry_after_s=round(retry_after_s, 3),
            **fields,
        )

    def door(self, tenant: str) -> DoorShedder:
        """`tenant`'s shedder at the door: one per tenant, so that one tenant's overload does not
        get another's queries refused on arrival (the task is unknown there: the body is unread)."""
        door = self._doors.get(tenant)
        if door is None:
            door = self._doors[tenant] = DoorShedder()
        return door

    def door_refusal(self, principal: Principal, received_s: float) -> Overloaded | None:
        """The 429 for a query of `principal`'s the door refuses before its body is read, metered
        as a refusal (task unknown: the body was not read); None: it goes on. Refused while the
        limit on queries in flight is full (`try_admit` would refuse it, after parsing its body),
        or when the tenant's door sheds it."""
        door = self.door(principal.name)
        quota = self.quota(principal, received_s)
        wait_s = quota.wait_s(received_s) if quota is not None else 0.0
        if quota is not None and wait_s > 0.0:
            exc = self._over_quota(principal, quota, wait_s)
        elif self.limit.over_share(principal.name, principal.share.weight, received_s):
            # No target to scale the retry by (the body is unread): the last busy refusal's.
            exc = self._over_share(
                principal, received_s, door.retry_after_s or _DOOR_RETRY_AFTER_S, at_door=True
            )
        elif not door.admit(received_s):
            exc = Overloaded(
                f"refusing {door.share:.0%} of this tenant's queries on arrival, as admission "
                "refuses most of the rest as busy; retry",
                retry_after_s=round(door.retry_after_s, 3),
                at_door=True,
            )
        else:
            return None
        self.record_failure(principal, "", exc, received_s)
        return exc

    async def infer(self, principal: Principal, req: InferenceRequest) -> Answer:
        """Answer one query, or raise the error its protocol reports (metered either way)."""
        slot = _Slot()
        try:
            return await self._infer(principal, req, slot)
        finally:  # on every path, a failed charge or a cancelled client included: a slot kept is lost
            if slot.taken:
                self.limit.release(slot.late, time.monotonic(), principal.name, slot.crowded)

    async def _infer(self, principal: Principal, req: InferenceRequest, slot: _Slot) -> Answer:
        received_s = req.received_s
        meter = self._meter
        variant_name, rows, slo = "", 0, req.slo
        try:
            task = await self.router.task_async(req.task, received_s)
            inputs = parse_inputs(req.inputs, task)
            rows = int(inputs.shape[0])
            if slo is None:
                slo = await self.default_targets(principal.name, task.name, received_s)
            routed_s = time.monotonic()
            tenant, weight = principal.name, principal.share.weight
            quota = self.quota(principal, routed_s)
            quota_wait_s = quota.wait_s(routed_s) if quota is not None else 0.0
            # The verdict's first rule, asked before the live state is read (`policy.verdict`).
            if over_share(self.limit.standing(tenant, weight, routed_s, quota_wait_s)):
                if quota is not None and quota_wait_s > 0.0:
                    raise self._over_quota(principal, quota, quota_wait_s)
                self.door(tenant).observe(
                    True, routed_s, loop_busy=self.loop_watch.busy(routed_s), margin_ms=slo.latency_ms
                )
                raise self._over_share(principal, routed_s, min(1.0, slo.latency_ms / 1000.0))
            if quota is not None:
                quota.take(routed_s)
            slot.crowded = self.limit.crowded
            self.limit.take(tenant, weight, routed_s)
            slot.taken = True
            try:
                routed = await self.router.route_async(
                    task.name,
                    rows,
                    slo,
                    routed_s,
                    architecture=req.architecture,
                    variant=req.variant,
                    elapsed_ms=(routed_s - received_s) * 1000.0,
                    tenant=tenant,
                )
            except Overloaded as busy:
                idle_ms = busy.fields.get("predicted_idle_ms")  # absent for a cold variant
                self.door(principal.name).observe(
                    True,
                    routed_s,
                    loop_busy=self.loop_watch.busy(routed_s),
                    margin_ms=0.0 if idle_ms is None else slo.latency_ms - float(idle_ms),
                    retry_after_s=float(busy.fields.get("retry_after_s") or 0.0),
                )
                raise
            self.door(principal.name).observe(False, routed_s, loop_busy=self.loop_watch.busy(routed_s))
            variant_name = routed.variant.name
            # Alone: no other request in the HTTP server. The host's floor (what an idle fleet would
            # do, the 422 verdict's measure) is learned only from such answers: under a 2x overload
            # on a slow 2-core host, answers that merely found the limit half empty had a p99 of
            # ~12 ms beyond their profile, the floor rose to it, and 84 % of the queries were
            # answered 422 (infeasible) instead of 429 (busy).
            in_flight = self._requests_in_flight() if self._requests_in_flight is not None else None
            alone = in_flight is not None and in_flight <= 1
            slot.quiet = (
                (alone or in_flight is None)
                and not slot.crowded
                and routed.queued_ms <= 0.0
                and not self.loop_watch.busy(routed_s)
            )
            # From here a failure (a 504, a worker lost) is an answer not in time. It says the
            # front end holds too many queries if the query found it crowded, or was predicted to
            # wait a quarter of its target behind others (`ConcurrencyLimit.release`).
            slot.crowded = slot.crowded or routed.queued_ms >= 0.25 * slo.latency_ms
            slot.late = late_for_load(math.inf, slo.latency_ms, routed.decision.predicted_latency_ms)
            result = await self._batcher.submit(
                routed.variant,
                routed.profile,
                inputs,
                received_s + slo.latency_ms / 1000.0,
                principal.name,
                principal.share.weight,
                alone=alone,
                predicted_wait_ms=routed.queued_ms,
            )
            cost_pusd = cost_share_pusd(routed.profile, result.batch_rows, rows)
        except Exception as exc:
            self.record_failure(
                principal, req.task, exc, received_s, rows=rows, variant=variant_name, slo=slo
            )
            raise
        decision = routed.decision
        cost_per_1k = routed.profile.cost_usd_per_1k(result.batch_rows)
        within_targets = decision.accuracy >= slo.min_accuracy and (
            slo.max_cost_usd_per_1k is None or cost_per_1k <= slo.max_cost_usd_per_1k
        )
        charged_ms = (time.monotonic() - received_s) * 1000.0
        charged = meter.charge(
            tenant=principal.name,
            task=task.name,
            variant=variant_name,
            rows=rows,
            batch_rows=result.batch_rows,
            cost_pusd=cost_pusd,
            latency_ms=charged_ms,
            slo_met=within_targets and charged_ms <= slo.latency_ms,
            now_s=time.time(),
            slo=slo,
        )
        # The router learns the path's overhead up to the charge, the time before routing included.
        # Not the journal's wait after it: learned as part of the path's p99 overhead, it put an
        # idle front end's path ~2 ms beyond its profile, targets within a few ms of a profile
        # were refused as busy (429) on an idle fleet, and those refusals fed the door (the
        # query-path grid test failed).
        self.router.observe(routed, charged_ms, time.monotonic())
        # The charge is on disk (the usage journal) before the answer leaves: a crash after this
        # point cannot lose it. The wait for it is part of the latency the client sees, so the
        # reply's latency and its verdict are measured after it.
        try:
            await meter.durable()
        finally:  # settled even if the client left meanwhile: the charge is counted already
            latency_ms = (time.monotonic() - received_s) * 1000.0
            slo_met = within_targets and latency_ms <= slo.latency_ms
            meter.settle(charged, latency_ms, slo_met)
            slot.late = late_for_load(
                latency_ms, slo.latency_ms, decision.predicted_latency_ms, routed.queued_ms
            )
            if slot.quiet and result.batch_rows == rows:  # nothing ahead, nothing merged in
                self.router.observe_floor(routed, latency_ms, time.monotonic())
        return Answer(
            task=task.name,
            outputs=result.outputs,
            variant=variant_name,
            architecture=decision.architecture,
            accuracy=decision.accuracy,
            predicted_latency_ms=decision.predicted_latency_ms,
            latency_ms=latency_ms,
            cost_pusd=cost_pusd,
            slo_met=slo_met,
            batch_rows=result.batch_rows,
            reason=decision.reason,
            load_hint=decision.load_hint,
            slo=slo,
        )


def dataplane_of(state: Any) -> DataPlane:
    """The app's data plane (`app.state`), or `Unavailable` while the service starts."""
    dataplane: DataPlane | None = getattr(state, "dataplane", None)
    if dataplane is None:
        raise Unavailable("the service is starting; retry")
    return dataplane
