"""Per-variant request queues in the front end: one worker-pool call per batch.

A Ray actor call costs ~0.7 ms and ~3 000 calls/s on the reference machine (DESIGN.md, "Ray"), so
requests are merged *before* the Ray hop: `AsyncBatcher.submit` queues a request's rows under its
variant, `infaas.policy.batching.decide` says when the queue goes as one batch, one
`WorkerPool.run` call runs it, and the output rows are split back to each request.

The shell owns the clock (a `Timer`) and all asyncio; the decision itself is pure. Batching
parameters are per variant (`set_params`), defaulting to the variant's max batch.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from infaas.errors import DeadlineExceeded, InvalidInput, Overloaded, Unavailable
from infaas.overhead import OverheadTracker
from infaas.policy.batching import (
    BatchParams,
    InFlight,
    decide,
    follow_slowdown,
    predicted_queue_delay_ms,
    quantum_rows,
)
from infaas.policy.fairqueue import FairQueue
from infaas.types import Profile, Variant
from infaas.workers.base import BatchResult, WorkerPool
from infaas.workers.placement import Placement

__all__ = ["AsyncBatcher", "LoopTimer", "ManualTimer", "Timer", "TimerHandle"]

_OVERHEAD_EWMA_ALPHA = 0.1
_COMPUTE_BOUND_MS = 2.0  # a batch profiled at this or more measures the machine's slowdown
_TENANT_ACTIVE_S = 1.0  # a tenant that queued on a variant this recently shares it
_CALIBRATED_WAIT_MS = 5.0  # a wait predicted at this or more measures the queue's calibration


def wait_calibration() -> OverheadTracker:
    """How much longer than predicted a variant's queued requests waited: the p99 of (wait ÷
    predicted wait) over the last 2 s, once 20 requests predicted to wait `_CALIBRATED_WAIT_MS`
    or more are there, 1.0 before (the tracker's prior; it decays back to it in ~1 s without
    samples). A dropped request counts with the wait it had when dropped, a lower bound.

    Why: under a 10x flood the queries dropped at their deadline (504) had been predicted to wait
    40-51 ms behind 7-9 one-row batches and waited 60-67 ms, 1.2-1.6 times as long, and the
    path's estimate could not see it: it learns from answers, and prices their p99 residual,
    while the drops were 0.02-0.4 % of the admitted queries (docs/benchmarks.md). A ratio, not a
    residual: the error grows with the batches a request waits behind."""
    return OverheadTracker(
        prior_ms=1.0,
        window=512,
        max_age_s=2.0,
        short_age_s=2.0,
        short_min_samples=20,
        min_samples=20,
        decay_s=1.0,
        clear_run=0,
    )


def _calibrate(
    queue: _VariantQueue, item: _Pending, now_s: float, run_ms: Callable[[int], float] | None = None
) -> None:
    """One sample of `wait_calibration`: `item`'s wait until `now_s`, less its own run where it
    ran (`run_ms` of its rows), against its predicted wait; nothing for a request predicted to
    wait less than `_CALIBRATED_WAIT_MS` (the common case: its run is not even looked up).

    A wait counts at most the request's whole budget (its deadline less its arrival), as a drop
    at the deadline does: beyond it the request is lost either way. Uncapped, the requests that
    waited out a worker killed mid-flood (its batch retried on the reloaded replica, ~1.4 s
    later) put the queue's predictions at 0.9-31 s for the next 2 s."""
    if item.predicted_wait_ms < _CALIBRATED_WAIT_MS:
        return
    waited_ms = (now_s - item.enqueued_s) * 1000.0 - (run_ms(item.rows) if run_ms is not None else 0.0)
    budget_ms = (item.deadline_s - item.enqueued_s) * 1000.0
    queue.calibration.observe(min(waited_ms, budget_ms) / item.predicted_wait_ms, now_s)


def _plus(latency_ms: Callable[[int], float], wait_ms: float, rows: int) -> float:
    return latency_ms(rows) + wait_ms


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timer(Protocol):
    """The batcher's clock: monotonic seconds and a callback at a given time."""

    def now_s(self) -> float: ...

    def call_at(self, when_s: float, callback: Callable[[], None]) -> TimerHandle: ...


class LoopTimer:
    """`time.monotonic` and the running event loop's timers (the clock request deadlines use)."""

    def now_s(self) -> float:
        return time.monotonic()

    def call_at(self, when_s: float, callback: Callable[[], None]) -> TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when_s - time.monotonic()), callback)


@dataclass(order=True)
class _ManualEntry:
    when_s: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimer:
    """A fake clock for tests: time moves only when `advance` is called, which fires due callbacks
    in time order."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now_s = start_s
        self._heap: list[_ManualEntry] = []
        self._seq = itertools.count()

    def now_s(self) -> float:
        return self._now_s

    def call_at(self, when_s: float, callback: Callable[[], None]) -> TimerHandle:
        entry = _ManualEntry(when_s, next(self._seq), callback)
        heapq.heappush(self._heap, entry)
        return entry

    def advance(self, seconds: float) -> None:
        target_s = self._now_s + seconds
        while self._heap and self._heap[0].when_s <= target_s:
            entry = heapq.heappop(self._heap)
            if entry.cancelled:
                continue
            self._now_s = max(self._now_s, entry.when_s)
            entry.callback()
        self._now_s = target_s

    def stall(self, seconds: float) -> None:
        """Time passes and no callback fires (a blocked event loop); those due fire at the next
        `advance`."""
        self._now_s += seconds

    @property
    def pending(self) -> int:
        return sum(1 for e in self._heap if not e.cancelled)


@dataclass(eq=False)
class _Pending:
    inputs: np.ndarray
    rows: int
    deadline_s: float
    enqueued_s: float
    future: asyncio.Future[BatchResult]
    predicted_wait_ms: float = 0.0  # the router's predicted queueing, before the calibration
    admitted_wait_ms: float = 0.0  # the same, calibrated: what admission priced it at


@dataclass(eq=False)
class _VariantQueue:
    variant: Variant
    profile: Profile
    params: BatchParams
    overhead_ms: float
    # In weighted fair order across tenants (`policy.fairqueue`): one tenant's backlog is not
    # another's wait. It keeps its rows' sum as requests come and go (the router reads it per query).
    pending: FairQueue[_Pending] = field(default_factory=FairQueue)
    in_flight: InFlight = field(default_factory=InFlight)  # batches sent, with predicted finishes
    # Replicas: batches run in parallel up to this many; beyond it a batch waits at a replica
    # (a worker runs one batch at a time; the extra ones in flight only hide the hop).
    servers: int = 1
    timer: TimerHandle | None = None
    timer_at_s: float | None = None
    pump_scheduled: bool = False

    slowdown: float = 1.0  # measured run time ÷ profiled, for batches whose compute dominates
    calibration: OverheadTracker = field(default_factory=wait_calibration)  # waits ÷ predicted
    # Tenants that queued here lately: when each last did, and its latency budget then (ms). While
    # several share the variant, batches are cut to a quantum of the tightest (`quantum_rows`).
    tenants: dict[str, tuple[float, float]] = field(default_factory=dict)
    shared: tuple[tuple[float, float, float, BatchParams], BatchParams] | None = (
        None  # `_shared_params`'s last
    )

    def latency_ms(self, rows: int) -> float:
        return self.profile.latency_ms(rows, "p99") * self.slowdown + self.overhead_ms

    def floor_ms(self, rows: int) -> float:
        """A batch's typical run (its p50): below it, a request's deadline is lost (doomed)."""
        return self.profile.latency_ms(rows, "p50") * self.slowdown + self.overhead_ms

    @property
    def queued_rows(self) -> int:
        return self.pending.queued_rows

    def pop(self) -> _Pending:
        return self.pending.popleft()


class AsyncBatcher:
    """The `Batcher` of the front end: per-variant queues, one `WorkerPool.run` per batch.

    `initial_overhead_ms` is the path's overhead beyond the profile (the Ray hop, ~0.7 ms here)
    until the first batches measure it; afterwards it follows an exponential average of
    ``run_ms - profile p50``. `batching=False` sends every request alone (benchmarks).

    `pool` is where batches run: a `Placement` (front end or Ray replica, decided there), or any
    `WorkerPool`, which is then the only path."""

    def __init__(
        self,
        pool: WorkerPool,
        *,
        timer: Timer | None = None,
        max_in_flight: int = 2,
        max_queue_rows: int = 4096,
        initial_overhead_ms: float = 1.0,
        batching: bool = True,
    ) -> None:
        self._pool = Placement.wrap(pool)
        self._timer: Timer = timer or LoopTimer()
        self._max_in_flight = max_in_flight  # per replica
        self._max_queue_rows = max_queue_rows
        self._initial_overhead_ms = initial_overhead_ms
        self._batching = batching
        self._queues: dict[str, _VariantQueue] = {}
        self._overrides: dict[str, BatchParams] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._batch_ids = itertools.count()
        self._closed = False
        self._last_submit_s = -math.inf
        self.on_outcome: Callable[[str, Exception | None], None] | None = None
        """Told of every batch's outcome (variant, error or None): the router's quarantine."""

    # ---- parameters -------------------------------------------------------------------------

    def default_params(self, variant: Variant, max_rows: int | None = None) -> BatchParams:
        """The variant's max batch (or the smaller `max_rows` its path takes), `max_in_flight`
        batches per replica."""
        if not self._batching:
            return BatchParams(max_batch=1, max_in_flight=1024)
        max_batch = min(variant.spec.max_batch, max_rows or variant.spec.max_batch)
        return BatchParams(max_batch=max_batch, max_in_flight=self._max_in_flight)

    def set_params(self, variant: str, params: BatchParams) -> None:
        """Per-variant batching parameters (override the variant's max batch or its in-flight cap)."""
        self._overrides[variant] = params
        queue = self._queues.get(variant)
        if queue is not None:
            queue.params = params
            self._pump(queue)

    def params(self, variant: str) -> BatchParams | None:
        queue = self._queues.get(variant)
        return queue.params if queue is not None else self._overrides.get(variant)

    # ---- the request path -------------------------------------------------------------------

    async def submit(
        self,
        variant: Variant,
        profile: Profile,
        rows: np.ndarray,
        deadline_s: float,
        tenant: str = "",
        weight: float = 1.0,
        background: bool = False,
        alone: bool = False,
        predicted_wait_ms: float = 0.0,
    ) -> BatchResult:
        """Queue `rows` for `variant` on behalf of `tenant` (its fair share: `weight`) and wait
        for this request's share of its batch."""
        if self._closed:
            raise Unavailable("the batcher is shutting down; retry on another front end")
        if rows.ndim < 1 or rows.shape[0] < 1:
            raise InvalidInput("a query needs at least one input row")
        if not background:
            self._last_submit_s = self._timer.now_s()
        queue = self._queues.get(variant.name)
        ahead = queue.pending.rows_ahead(tenant) if queue is not None else 0
        if ahead + rows.shape[0] > self._max_queue_rows:
            # Bounded queues: under any overload the front end's memory stays bounded, and a
            # client learns at once to come back rather than waiting behind thousands of rows.
            # Counted ahead of this tenant's query: a neighbour's backlog is not its wait.
            wait_ms = self.queue_delay_ms(variant.name, tenant)
            raise Overloaded(
                f"{variant.name}: {ahead} rows already wait ahead of this query (the bound is "
                f"{self._max_queue_rows}, INFAAS_MAX_QUEUE_ROWS); retry",
                variant=variant.name,
                retry_after_s=round(wait_ms / 1000.0, 3),
            )
        if queue is None or queue.profile is not profile:
            where = self._pool.place(variant, profile)
            params = self._overrides.get(variant.name) or self.default_params(variant, where.max_rows)
            if queue is None:
                # A batch on the front end's own path pays no hop: its prior overhead is none.
                overhead_ms = 0.0 if where.path == "local" else self._initial_overhead_ms
                queue = _VariantQueue(variant, profile, params, overhead_ms)
                self._queues[variant.name] = queue
            queue.profile, queue.params = profile, params
        now_s = self._timer.now_s()
        queue.tenants[tenant] = (now_s, (deadline_s - now_s) * 1000.0)
        if alone and not queue.pending and not queue.in_flight:
            # What the pump would do (an idle variant sends at once, and nothing could join),
            # without its three loop iterations: ~0.05 ms of a one-query answer's latency here.
            result = self._run_now(queue, rows)
            if result is not None:
                return result
        future: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        uncalibrated_ms = predicted_wait_ms
        if predicted_wait_ms >= _CALIBRATED_WAIT_MS:
            # Kept as predicted before the calibration: measured against the calibrated figure,
            # the ratio would fall to 1 once calibrated, and the calibration with it, in turns.
            uncalibrated_ms /= max(1.0, queue.calibration.current(now_s))
        queue.pending.push(
            _Pending(rows, int(rows.shape[0]), deadline_s, now_s, future, uncalibrated_ms, predicted_wait_ms),
            tenant,
            weight,
        )
        if not queue.pump_scheduled:
            # Decide at the end of this loop iteration, not now: requests that arrived together
            # (one read of many sockets) then leave in one batch, at no cost in latency.
            queue.pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_pump, queue)
        return await future

    def _in_flight_cap(self, queue: _VariantQueue) -> BatchParams:
        """Batches in flight per variant = its replicas × `max_in_flight` per replica (unless set
        for the variant by `set_params`, or batching is off)."""
        name = queue.variant.name
        replicas = self._pool.replicas(name)
        queue.servers = max(1, replicas)
        if name in self._overrides or not self._batching:
            return queue.params
        cap = max(1, replicas) * self._max_in_flight
        if cap != queue.params.max_in_flight:
            queue.params = BatchParams(max_batch=queue.params.max_batch, max_in_flight=cap)
        return queue.params

    def _shared_params(self, queue: _VariantQueue, now_s: float) -> BatchParams:
        """`queue.params`, with batches cut to a quantum while several tenants share the variant
        (`policy.batching.quantum_rows`): tenants seen in the last `_TENANT_ACTIVE_S`."""
        tenants = queue.tenants
        if len(tenants) < 2:
            return queue.params
        horizon_s = now_s - _TENANT_ACTIVE_S
        for gone in [t for t, (seen_s, _) in tenants.items() if seen_s < horizon_s]:
            del tenants[gone]
        if len(tenants) < 2:
            return queue.params
        # Asked for every query routed here: the search is redone only when what it reads moved
        # (the tightest budget, to the ms, the batches' measured slowdown and overhead).
        key = (round(min(b for _, b in tenants.values())), queue.slowdown, queue.overhead_ms, queue.params)
        if queue.shared is None or queue.shared[0] != key:
            rows = quantum_rows(queue.latency_ms, queue.params.max_batch, [b for _, b in tenants.values()])
            cut = queue.params
            if rows < cut.max_batch:
                cut = BatchParams(max_batch=rows, max_in_flight=cut.max_in_flight)
            queue.shared = (key, cut)
        return queue.shared[1]

    def _pump(self, queue: _VariantQueue) -> None:
        self._in_flight_cap(queue)
        params = self._shared_params(queue, self._timer.now_s())
        while True:
            while queue.pending and queue.pending[0].future.done():
                queue.pop()  # cancelled by its caller (client gone)
            now_s = self._timer.now_s()
            wait_ms, typical_ms, ahead = queue.in_flight.waits(now_s, queue.servers)
            latency = queue.latency_ms if not wait_ms else functools.partial(_plus, queue.latency_ms, wait_ms)
            decision = decide(
                queue.pending.items, latency, params, len(queue.in_flight), now_s, queue.floor_ms, typical_ms
            )
            for _ in range(decision.shed_requests):
                self._shed(queue, queue.pop(), now_s, typical_ms)
            if decision.shed_requests:
                continue
            if not decision.send:
                self._arm(queue, decision.wait_until_s)
                return
            batch = [queue.pop() for _ in range(decision.send_requests)]
            batch = [p for p in batch if not p.future.done() and not self._expired(queue, p, now_s)]
            if not batch:
                continue
            batch_id = next(self._batch_ids)
            run_ms, floor_ms = queue.latency_ms(decision.send_rows), queue.floor_ms(decision.send_rows)
            queue.in_flight.sent(batch_id, now_s, wait_ms, run_ms, ahead, floor_ms)
            task = asyncio.get_running_loop().create_task(self._run(queue, batch_id, batch, wait_ms))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _shed(self, queue: _VariantQueue, item: _Pending, now_s: float, wait_ms: float) -> None:
        """Refuse a doomed request (`policy.batching.decide`): 429 before its deadline, not
        charged; at or past it, the 504 of `_expired`. Calibrated as a drop at the deadline: its
        wait would have taken at least its whole budget."""
        if item.future.done() or self._expired(queue, item, now_s):
            return
        _calibrate(queue, item, item.deadline_s)
        left_ms = (item.deadline_s - now_s) * 1000.0
        run_ms = queue.floor_ms(item.rows)
        item.future.set_exception(
            Overloaded(
                f"{queue.variant.name}: its queue fell behind after this query was admitted (predicted "
                f"to wait {item.admitted_wait_ms:.1f} ms, waited {(now_s - item.enqueued_s) * 1000.0:.1f} "
                f"ms so far): sent now, it would answer after its deadline ({left_ms:.1f} ms left, "
                f"{wait_ms:.1f} ms for a replica and {run_ms:.1f} ms to run); refused before it ran, "
                "not charged; retry",
                variant=queue.variant.name,
                retry_after_s=round(max(wait_ms, run_ms) / 1000.0, 3),
            )
        )

    @staticmethod
    def _expired(queue: _VariantQueue, item: _Pending, now_s: float) -> bool:
        """Drop a request whose deadline passed while it waited: it is answered 504 and, never
        having run, is not charged."""
        if now_s < item.deadline_s:
            return False
        waited_ms = (now_s - item.enqueued_s) * 1000.0
        _calibrate(queue, item, now_s)  # its wait so far: a lower bound
        item.future.set_exception(
            DeadlineExceeded(
                f"the deadline passed after {waited_ms:.1f} ms in the queue (queued with "
                f"{(item.deadline_s - item.enqueued_s) * 1000.0:.1f} ms of its target left, predicted "
                f"to wait {item.admitted_wait_ms:.1f} ms), before the request ran; it was not charged",
                waited_ms=round(waited_ms, 3),
            )
        )
        return True

    def _scheduled_pump(self, queue: _VariantQueue) -> None:
        queue.pump_scheduled = False
        if not self._closed:
            self._pump(queue)

    def _arm(self, queue: _VariantQueue, when_s: float | None) -> None:
        if when_s == queue.timer_at_s:
            return
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        queue.timer_at_s = when_s
        if when_s is not None:
            queue.timer = self._timer.call_at(when_s, lambda: self._on_timer(queue))

    def _on_timer(self, queue: _VariantQueue) -> None:
        queue.timer = None
        queue.timer_at_s = None
        self._pump(queue)

    async def _run(
        self, queue: _VariantQueue, batch_id: int, batch: list[_Pending], wait_ms: float = 0.0
    ) -> None:
        sent_s = self._timer.now_s()
        try:
            inputs = batch[0].inputs if len(batch) == 1 else np.concatenate([p.inputs for p in batch])
            outputs = await self._pool.run(queue.variant, inputs)
            if outputs.shape[0] != inputs.shape[0]:
                raise Unavailable(
                    f"worker returned {outputs.shape[0]} rows for a batch of {inputs.shape[0]}",
                    variant=queue.variant.name,
                )
        except BaseException as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc if isinstance(exc, Exception) else Unavailable(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            if self.on_outcome is not None and not self._closed:
                self.on_outcome(queue.variant.name, exc)
            return
        finally:
            queue.in_flight.done(batch_id, self._timer.now_s())
            if not self._closed:
                self._pump(queue)
        if self.on_outcome is not None:
            self.on_outcome(queue.variant.name, None)
        done_s = self._timer.now_s()
        run_ms = (done_s - sent_s) * 1000.0
        rows = int(inputs.shape[0])
        if self._pool.path(queue.variant.name) == "remote":  # the deadline rule budgets for the hop
            # Two things make a batch slower than its profile: the hop (a constant) and a busy
            # machine (compute runs slower in proportion: other processes share the cores). A
            # batch whose profiled time is well above the hop measures the second, others the first.
            own_ms = run_ms - wait_ms
            profiled_ms = queue.profile.latency_ms(rows, "p50")
            if profiled_ms >= _COMPUTE_BOUND_MS:
                queue.slowdown = follow_slowdown(queue.slowdown, (own_ms - queue.overhead_ms) / profiled_ms)
            else:
                measured_overhead_ms = own_ms - profiled_ms * queue.slowdown
                queue.overhead_ms += _OVERHEAD_EWMA_ALPHA * (
                    max(0.0, measured_overhead_ms) - queue.overhead_ms
                )
        offset = 0
        for p in batch:
            _calibrate(queue, p, done_s, queue.latency_ms)
            share = outputs[offset : offset + p.rows]
            offset += p.rows
            if not p.future.done():
                p.future.set_result(
                    BatchResult(
                        outputs=share,
                        batch_rows=rows,
                        batch_requests=len(batch),
                        queue_ms=(sent_s - p.enqueued_s) * 1000.0,
                        run_ms=run_ms,
                    )
                )

    def _run_now(self, queue: _VariantQueue, rows: np.ndarray) -> BatchResult | None:
        """A batch of `rows` alone, run on this thread when the front end runs the variant and
        has it loaded (`Placement.run_now`; None otherwise)."""
        name = queue.variant.name
        sent_s = self._timer.now_s()
        try:
            outputs = self._pool.run_now(queue.variant, rows)
            if outputs is not None and outputs.shape[0] != rows.shape[0]:
                raise Unavailable(
                    f"the model returned {outputs.shape[0]} rows for {rows.shape[0]}", variant=name
                )
        except Exception as exc:
            if self.on_outcome is not None and not self._closed:
                self.on_outcome(name, exc)
            raise
        if outputs is None:
            return None
        if self.on_outcome is not None:
            self.on_outcome(name, None)
        run_ms = (self._timer.now_s() - sent_s) * 1000.0
        batch_rows = int(rows.shape[0])
        return BatchResult(
            outputs=outputs, batch_rows=batch_rows, batch_requests=1, queue_ms=0.0, run_ms=run_ms
        )

    async def warm(self, variant: Variant, profile: Profile) -> None:
        """Load `variant` where its batches will run (`Placement.place`)."""
        self._pool.place(variant, profile)
        await self._pool.ensure_loaded(variant)

    # ---- what the router and the dashboard read ---------------------------------------------

    def queue_delay_ms(self, variant: str, tenant: str = "") -> float:
        """Predicted wait of a new request of `tenant` to `variant` before its batch is sent (0
        when idle): the rows fair queuing puts ahead of it, not the queue's depth, times how much
        longer than predicted the variant's queued requests waited lately (`wait_calibration`)."""
        queue = self._queues.get(variant)
        if queue is None:
            return 0.0
        now_s = self._timer.now_s()
        remaining_ms = queue.in_flight.remaining_ms(now_s)
        predicted_ms = predicted_queue_delay_ms(
            queue.pending.rows_ahead(tenant),
            remaining_ms,
            queue.latency_ms,
            self._shared_params(queue, now_s),
            servers=queue.servers,
        )
        return predicted_ms * max(1.0, queue.calibration.current(now_s)) if predicted_ms else 0.0

    def waiting_rows(self, variant: str, tenant: str = "") -> int:
        """Rows of `tenant`'s queries waiting for `variant` (sent batches not counted)."""
        queue = self._queues.get(variant)
        return queue.pending.rows_of(tenant) if queue is not None else 0

    def queued_rows_by_tenant(self, variant: str) -> dict[str, int]:
        """Rows waiting for `variant`, per tenant."""
        queue = self._queues.get(variant)
        return queue.pending.rows_by_tenant() if queue is not None else {}

    def oldest_age_ms(self, variant: str) -> float:
        """How long the oldest request waiting for `variant` has waited (0 when none waits)."""
        queue = self._queues.get(variant)
        if queue is None or not queue.pending:
            return 0.0
        return (self._timer.now_s() - queue.pending[0].enqueued_s) * 1000.0

    def overhead_ms(self, variant: str) -> float:
        """Measured overhead of the pool call beyond the profile's p50 (the Ray hop, mostly)."""
        queue = self._queues.get(variant)
        return queue.overhead_ms if queue is not None else self._initial_overhead_ms

    def slowdown(self, variant: str) -> float:
        """Measured run time ÷ profiled for `variant`'s compute-bound batches, an envelope of the
        recent batches (`policy.batching.follow_slowdown`; 1.0 until measured)."""
        queue = self._queues.get(variant)
        return queue.slowdown if queue is not None else 1.0

    def queue_depths(self) -> dict[str, int]:
        """Requests waiting (not yet sent) per variant."""
        return {name: len(q.pending) for name, q in self._queues.items() if q.pending}

    def in_flight(self) -> dict[str, int]:
        """Batches running now per variant."""
        return {name: len(q.in_flight) for name, q in self._queues.items() if q.in_flight}

    def last_submit_s(self) -> float:
        """When an online request was last queued, on the timer's clock (-inf before the first)."""
        return self._last_submit_s

    async def close(self) -> None:
        """Refuse new requests, answer queued ones with `Unavailable`, let running batches finish."""
        self._closed = True
        for queue in self._queues.values():
            self._arm(queue, None)
            while queue.pending:
                p = queue.pop()
                if not p.future.done():
                    p.future.set_exception(Unavailable("the batcher shut down before this request ran"))
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
