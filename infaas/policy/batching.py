"""When to send a variant's queued requests as one batch (pure: no clock reads, no I/O).

The front end's batcher (`infaas.batching`) calls `decide` on every arrival, every batch
completion and every timer it set, with the variant's queue and the clock's value; it does what
the decision says. A batch goes:

1. when the queue holds `max_batch` rows, or more than one batch can take and still answer by the
   tightest deadline in it (**full**: the queue's longest prefix that fits both goes);
2. when waiting any longer would break the tightest deadline in the queue, i.e. ``now_s`` has
   reached ``min(deadline) - latency(rows)`` (**deadline**);
3. when nothing of this variant is running (**idle**): a wait with an idle worker only adds
   latency, and while a batch runs the next one fills for free (work-conserving batching, which
   keeps the bare-call latency at low load and grows batches with load);

and never while `max_in_flight` batches of the variant are already running (**busy**): the
completion of one of them re-triggers the decision, so overload makes batches larger instead of
flooding the workers with small ones.

Before any of these, given the variant's typical run (`floor_ms`, its p50; the wait for a replica
at the running batches' typical runs too, `InFlight.wait(typical=True)`), a request at the head
of the queue that could not answer by its deadline even if it were sent now is refused
(**doomed**: the batcher answers 429, or 504 if the deadline has passed), and while the variant
is busy a timer is set for the moment the head would become so. Early drop, as Nexus (SOSP'19)
does it: the request is refused before its deadline rather than at it, and no
replica runs a batch its deadline has already lost. Why: under a 10x flood, queries admitted at
the edge of their targets (predicted to wait 54-57 ms of 60) and held up behind batches slower
than their profile waited out their deadlines in the queue and were answered 504 after 60-64 ms
(docs/benchmarks.md).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "BatchDecision",
    "BatchParams",
    "InFlight",
    "LatencyFn",
    "Queued",
    "decide",
    "follow_slowdown",
    "predicted_queue_delay_ms",
    "quantum_rows",
]

LatencyFn = Callable[[int], float]
"""Predicted milliseconds from sending a batch of n rows to its outputs being back (the variant's
profile at n plus the path's measured overhead)."""


class Queued(Protocol):
    """What the policy reads of one queued request."""

    @property
    def rows(self) -> int: ...

    @property
    def deadline_s(self) -> float: ...


@dataclass(frozen=True)
class BatchParams:
    """Batching parameters of one variant."""

    max_batch: int  # rows per batch: the variant's max batch (or 1 to turn batching off)
    max_in_flight: int = 2  # batches of this variant running at once (replicas × pipelining)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be ≥ 1")


@dataclass(frozen=True)
class BatchDecision:
    """Send the first `send_requests` queued requests now, or wait until `wait_until_s` (None: until
    the next arrival or completion)."""

    send_requests: int
    send_rows: int
    wait_until_s: float | None
    reason: Literal["empty", "doomed", "busy", "full", "deadline", "idle", "wait"]
    shed_requests: int = 0  # doomed: refuse the first `shed_requests` queued requests

    @property
    def send(self) -> bool:
        return self.send_requests > 0


def _head(
    queue: Sequence[Queued], max_batch: int, latency_ms: LatencyFn, now_s: float
) -> tuple[int, int, int]:
    """(requests, rows) of the longest queue prefix that fits `max_batch` and, sent now, answers
    by the tightest deadline in it that has not passed (at least one request, so an oversized
    request still goes, alone), and the rows of the whole queue. The deadline bound matters under overload:
    merging every queued request into one `max_batch` batch made batches that no deadline in them
    could meet (a 128-row batch of a 5 ms/row model against a 250 ms target). One latency
    lookup when the batch fits (this runs on every arrival), a binary search when it does not."""
    take_n = 0
    take_rows = 0
    total = 0
    tightest_s = float("inf")
    fits = True
    for item in queue:
        total += item.rows
        if fits and (take_n == 0 or take_rows + item.rows <= max_batch):
            take_n += 1
            take_rows += item.rows
            # A deadline already past does not count: the batcher drops that request unrun.
            if now_s <= item.deadline_s < tightest_s:
                tightest_s = item.deadline_s
        else:
            fits = False
    if take_n == 1 or now_s + latency_ms(take_rows) / 1000.0 <= tightest_s:
        return take_n, take_rows, total
    # Too big for its tightest deadline: the longest prefix that is not. Rows grow and the
    # tightest deadline falls with the prefix, so "answers in time" holds up to some length.
    rows: list[int] = []
    tightest: list[float] = []
    acc, low = 0, float("inf")
    for item in itertools.islice(queue, take_n):  # a deque in the batcher: no slicing
        acc += item.rows
        if now_s <= item.deadline_s < low:
            low = item.deadline_s
        rows.append(acc)
        tightest.append(low)
    lo, hi = 1, take_n - 1  # prefix lengths; length 1 always goes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if now_s + latency_ms(rows[mid - 1]) / 1000.0 <= tightest[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo, rows[lo - 1], total


_ROUNDING_S = 1e-6
"""Slack in the doomed rule for the float sums' rounding: a request sent at the deadline rule's
latest moment (where a profile's p50 equals its p99) is on time."""


def _doomed(queue: Sequence[Queued], floor_ms: LatencyFn, wait_ms: float, now_s: float) -> int:
    """How many requests at the head of `queue` could not answer by their deadlines even if sent
    now: `wait_ms` for a replica, then their typical run (`floor_ms`)."""
    n = 0
    for item in queue:
        if now_s + (wait_ms + floor_ms(item.rows)) / 1000.0 <= item.deadline_s + _ROUNDING_S:
            break
        n += 1
    return n


def decide(
    queue: Sequence[Queued],
    latency_ms: LatencyFn,
    params: BatchParams,
    in_flight: int,
    now_s: float,
    floor_ms: LatencyFn | None = None,
    wait_ms: float = 0.0,
) -> BatchDecision:
    """Send now or wait: see the module docstring for the rules, applied in the order doomed
    (only given `floor_ms`, a batch's typical run, and `wait_ms`, the typical wait for a replica;
    `latency_ms` includes its own wait), busy, full, deadline, idle, wait."""
    if not queue:
        return BatchDecision(0, 0, None, "empty")
    if floor_ms is not None:
        doomed = _doomed(queue, floor_ms, wait_ms, now_s)
        if doomed:
            return BatchDecision(0, 0, None, "doomed", doomed)
    if in_flight >= params.max_in_flight:
        if floor_ms is None:
            return BatchDecision(0, 0, None, "busy")
        # Not doomed now, so its wait ends in time; if the batches ahead overrun it, it is just
        # after this moment (a batch sent later answers after its deadline).
        head = queue[0]
        doomed_at_s = head.deadline_s - floor_ms(head.rows) / 1000.0 + 2 * _ROUNDING_S
        return BatchDecision(0, 0, doomed_at_s, "busy")
    take_n, take_rows, total_rows = _head(queue, params.max_batch, latency_ms, now_s)
    if total_rows >= params.max_batch or take_n < len(queue):
        return BatchDecision(take_n, take_rows, None, "full")
    tightest_s = min(item.deadline_s for item in queue)
    latest_send_s = tightest_s - latency_ms(take_rows) / 1000.0
    if now_s >= latest_send_s:
        return BatchDecision(take_n, take_rows, None, "deadline")
    if in_flight == 0:
        return BatchDecision(take_n, take_rows, None, "idle")
    return BatchDecision(0, 0, latest_send_s, "wait")


def predicted_queue_delay_ms(
    queued_rows: int,
    in_flight_remaining_ms: Sequence[float],
    latency_ms: LatencyFn,
    params: BatchParams,
    servers: int | None = None,
) -> float:
    """Predicted wait of a new one-row request beyond its own run, by replaying the rules.

    `in_flight_remaining_ms` are the predicted remaining times of the batches running now. The
    queued rows go first in full batches, each taking a slot for `latency_ms(max_batch)`; the new
    request's batch takes the next free slot, except that a partial batch does not take a free
    slot while another batch runs: it waits for the earliest completion (rule *wait*). Slots are
    `servers` (replicas, each running one batch at a time) when given, else `max_in_flight`.

    The new request's batch also holds the queued rows the full batches before it leave: its run
    takes `latency_ms(rows)` of them and it, not the one row its own prediction prices. Left out
    (before 2026-12-07), a compute-bound variant's queries were predicted as if each ran alone
    once its batch started: on `digits-resnet` (1.7 ms a row) the 22nd query of a flood's first
    read was predicted at 27 ms and answered in 60 in a batch of 22 rows (36 ms), and the path's
    overhead estimate learned the batches' run time as overhead (30-46 ms under a 10x flood)."""
    slots = params.max_in_flight if servers is None else servers
    # With `servers` replicas running batches one at a time, each replica is free when its last
    # batch is done: the `servers` latest predicted finishes (batches queued at a replica are
    # predicted to start when the one before them ends).
    free_at = sorted(max(0.0, ms) for ms in in_flight_remaining_ms)[-slots:] if slots else []
    free_at += [0.0] * max(0, slots - len(free_at))
    heapq.heapify(free_at)
    total_rows = queued_rows + 1
    n_batches = -(-total_rows // params.max_batch)
    full_ms = latency_ms(params.max_batch)
    for _ in range(n_batches - 1):
        heapq.heappush(free_at, heapq.heappop(free_at) + full_ms)
    start_ms = heapq.heappop(free_at)
    last_rows = total_rows - (n_batches - 1) * params.max_batch
    if in_flight_remaining_ms and last_rows < params.max_batch:
        start_ms = max(start_ms, max(0.0, min(in_flight_remaining_ms)))
    return start_ms + max(0.0, latency_ms(last_rows) - latency_ms(1))


SLOWDOWN_RISE = 0.5
"""Weight of a batch slower than the estimate: a busy machine is believed at once."""
SLOWDOWN_FALL = 0.1
"""Weight of a batch faster than the estimate: a quiet spell is believed slowly."""


def follow_slowdown(current: float, ratio: float) -> float:
    """The next slowdown estimate (measured run time ÷ profiled) after a batch measured at `ratio`:
    quick to rise, slow to fall, an envelope of the recent ratios rather than their mean.

    Admission promises a deadline by this number. A mean (the exponential average, both ways at
    0.1, used before) sat under half of the batches while the cores were contended: on the load
    step, admitted queries predicted at 230-249 ms against a 250 ms target were answered in
    330-520 ms in clusters of a few hundred milliseconds, when every variant on the 2 shared cores
    ran at once."""
    ratio = min(max(ratio, 0.5), 20.0)
    weight = SLOWDOWN_RISE if ratio > current else SLOWDOWN_FALL
    return current + weight * (ratio - current)


class InFlight:
    """A variant's batches sent and not yet back, each with its predicted finish (s): what the
    queueing delay (`predicted_queue_delay_ms`) and the wait at a busy replica are read from.

    A batch sent while every replica is busy is predicted to start when the earliest of the
    replicas' last batches ends, and is kept as waiting *behind* that one: when it is back, the
    waiting batch's finish is set from the real time. Predictions chained on predictions drifted
    ahead of the clock by the error of each (0.24 ms fast-path batches predicted at 1.24 ms put
    the queue ~420-500 ms behind within one 3 000-query burst, and admission refused a third of
    it while the variant kept up). The batcher and the simulator both keep one per variant."""

    __slots__ = ("_behind", "_slack_s", "finish_s")

    def __init__(self) -> None:
        self.finish_s: dict[int, float] = {}  # batch id → predicted finish
        self._behind: dict[int, tuple[int, float]] = {}  # waiting batch → (the one ahead, its run s)
        self._slack_s: dict[int, float] = {}  # batch id → its predicted run less its typical one

    def __len__(self) -> int:
        return len(self.finish_s)

    def wait(self, now_s: float, servers: int, *, typical: bool = False) -> tuple[float, int | None]:
        """(ms a batch sent now waits at a replica, the batch it waits behind): (0, None) while
        one of the `servers` replicas is free. `typical`: with each batch's typical run (its
        `floor_ms` when sent) in place of its predicted one, what the doomed rule reads."""
        if len(self.finish_s) < servers:
            return 0.0, None
        finish = self.finish_s
        if typical:
            slack = self._slack_s
            finish = {b: f - slack.get(b, 0.0) for b, f in finish.items()}
        latest = sorted(finish.items(), key=lambda item: item[1])[-servers:]
        ahead, finish_s = latest[0]
        return max(0.0, (finish_s - now_s) * 1000.0), ahead

    def waits(self, now_s: float, servers: int) -> tuple[float, float, int | None]:
        """(`wait`'s ms, its `typical` ms, the batch waited behind): what a pump reads. The typical
        wait is read only when the predicted one is not 0 (no wait at the predicted runs means none
        at the typical ones, each typical finish being earlier), sparing a sort per pump."""
        wait_ms, ahead = self.wait(now_s, servers)
        return wait_ms, self.wait(now_s, servers, typical=True)[0] if wait_ms else 0.0, ahead

    def sent(
        self,
        batch_id: int,
        now_s: float,
        wait_ms: float,
        run_ms: float,
        ahead: int | None,
        floor_ms: float | None = None,
    ) -> None:
        """`batch_id` left at `now_s`: it finishes after `wait_ms` behind `ahead`, then `run_ms`
        (typically `floor_ms`)."""
        self.finish_s[batch_id] = now_s + (wait_ms + run_ms) / 1000.0
        if floor_ms is not None:
            self._slack_s[batch_id] = max(0.0, run_ms - floor_ms) / 1000.0
        if ahead is not None:
            self._behind[batch_id] = (ahead, run_ms / 1000.0)

    def done(self, batch_id: int, now_s: float) -> None:
        """`batch_id` is back (or failed) at `now_s`: the batch waiting behind it starts now."""
        self.finish_s.pop(batch_id, None)
        self._behind.pop(batch_id, None)
        self._slack_s.pop(batch_id, None)
        for waiting, (ahead, run_s) in list(self._behind.items()):
            if ahead == batch_id:
                del self._behind[waiting]
                if waiting in self.finish_s:
                    self.finish_s[waiting] = now_s + run_s

    def remaining_ms(self, now_s: float) -> list[float]:
        """Predicted milliseconds left of each batch in flight."""
        return [(f - now_s) * 1000.0 for f in self.finish_s.values()]


QUANTUM_SHARE = 0.15
"""A shared variant's batch runs for at most this share of the tightest target among the tenants
that use it (`quantum_rows`). 0.15, not 0.25, since the door refuses a flood's pipelined queries
in the HTTP parser (701d9df): the flood's answered/s did not fall (353-507 against 290-506 at
0.25 with that door) and the quiet tenant's p99 went from 38-57 ms to 21-28 ms beside it
(bench_fairness, 9 and 12 runs, docs/benchmarks.md). Before that change the same cut cost the
flood a fifth of its answers."""


def quantum_rows(latency_ms: LatencyFn, max_batch: int, budgets_ms: Sequence[float]) -> int:
    """Rows per batch while several tenants share a variant: the most whose predicted run fits
    `QUANTUM_SHARE` of the tightest budget in `budgets_ms` (each active tenant's latency target),
    at least 1; `max_batch` for one tenant or none.

    A batch is not preempted. A tenant whose query arrives while a neighbour's backlog runs waits
    for the batches in flight (up to two per replica) and then runs in a batch of its own, so it
    meets a target only if a batch takes well under a third of it; left to the deadline rule
    alone, a flooding tenant's 60 ms queries made 40-50 ms batches, and a quiet tenant beside it
    waited past its 60 ms (issue 32, `scripts/bench_fairness`). One tenant keeps the variant's
    whole batch: its own batches delay only itself, and admission prices them."""
    if len(budgets_ms) < 2:
        return max_batch
    quantum_ms = QUANTUM_SHARE * min(budgets_ms)
    lo, hi = 1, max_batch
    while lo < hi:  # the largest rows whose run fits the quantum (latency grows with rows)
        mid = (lo + hi + 1) // 2
        if latency_ms(mid) <= quantum_ms:
            lo = mid
        else:
            hi = mid - 1
    return lo
