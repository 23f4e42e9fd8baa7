"""Per-tenant usage and cost: aggregated in memory, flushed atomically to the store.

Each answer is charged the variant's *measured* cost at the batch size it actually ran in, divided
among the rows of that batch (`cost_share_pusd`). Counters are integers (pico-dollars for money)
kept per tenant × task × variant × minute and added to the store in one atomic `add_usage` call per
flush, so a reader never sees half a flush and a total over the store is exactly the sum of what
the responses reported.

With a `UsageJournal`, each charge is also appended to a local journal (see `infaas.journal`), the
query handler awaits `Meter.durable()` before replying, and a flush carries a mark (journal, last
sequence number) that the store applies at most once. A flush that fails stays "in doubt" and is
retried *as the same batch* before anything newer, so a timeout whose write did land is skipped by
its mark instead of counted twice; entries an earlier process journaled but never flushed are
replayed by the first flush. An answer is counted in two steps: `charge` (queries, rows, cost:
journaled) before that wait and `settle` (its SLO verdict and latency bucket) after it, since the
wait is part of the latency the client sees.

`Meter` is pure bookkeeping: the time of each record comes in as an argument (`now_s`, wall-clock
seconds), so tests drive it with a fake clock. `MeterFlusher` is the I/O shell that flushes at
`settings.usage_flush_interval_s` and at shutdown. Listeners (`add_listener`) see one
`MeterRecord` per answered or failed query; the Prometheus metrics hang off that hook.

An offline job's chunk is charged with `charge_once`: its own mark (``job:<id>``, chunk + 1) rather
than the journal's, since the chunk's file on disk is its journal (the job resumes from it and
offers the same charge again, which the store's mark then skips). `flush_once` writes it before
the job's record moves on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from infaas.journal import JournalEntry, UsageJournal
from infaas.periodic import Periodic
from infaas.store.base import UsageMark
from infaas.types import (
    COUNTER_COST_PUSD,
    COUNTER_FAILED,
    COUNTER_QUERIES,
    COUNTER_REFUSED,
    COUNTER_RESERVED_PUSD,
    COUNTER_ROWS,
    COUNTER_SLO_MET,
    COUNTER_SLO_MISSED,
    PUSD_PER_USD,
    SLO,
    Profile,
    UsageDelta,
    UsageKey,
    latency_bucket_counter,
)

__all__ = [
    "Charge",
    "FlakySink",
    "Meter",
    "MeterFlusher",
    "MeterRecord",
    "Outcome",
    "UsageSink",
    "cost_share_pusd",
]

log = logging.getLogger(__name__)

Outcome = str
"""``ok`` or ``slo_missed`` for an answered query, the error code (`infaas.errors`) for a failed one."""


_Key = tuple[str, str, str, int]
"""tenant, task, variant, minute: a `UsageKey`'s fields, in its sort order."""


class UsageSink(Protocol):
    """Where usage goes: the metadata store's atomic counter add."""

    def add_usage(self, deltas: Sequence[UsageDelta], mark: UsageMark | None = None) -> bool: ...

    def usage_mark(self, source: str) -> int: ...


class FlakySink:
    """A shipped fake for tests: forwards to `inner`, but the next `failures` calls raise. With
    `apply_then_fail`, a failing `add_usage` writes first and then raises (a lost reply)."""

    def __init__(self, inner: UsageSink, failures: int = 1, apply_then_fail: bool = False) -> None:
        self.inner = inner
        self.failures = failures
        self.apply_then_fail = apply_then_fail

    def add_usage(self, deltas: Sequence[UsageDelta], mark: UsageMark | None = None) -> bool:
        if self.failures > 0:
            self.failures -= 1
            if self.apply_then_fail:  # the write lands, the reply is lost (a timeout)
                self.inner.add_usage(deltas, mark)
            raise ConnectionError("sink unavailable (FlakySink)")
        return self.inner.add_usage(deltas, mark)

    def usage_mark(self, source: str) -> int:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("sink unavailable (FlakySink)")
        return self.inner.usage_mark(source)


@dataclass(frozen=True, slots=True)
class MeterRecord:
    """One answered (``outcome`` ``ok`` / ``slo_missed``) or failed (the error code) query."""

    tenant: str
    task: str
    variant: str  # "" when the query failed before a variant was chosen
    outcome: Outcome
    latency_ms: float
    cost_pusd: int
    rows: int
    batch_rows: int  # rows in the batch it ran in (0 for a failure before running)
    slo_met: bool
    at_s: float
    error: str | None = None  # the error code of a failed query
    latency_target_ms: float = math.inf  # the query's targets, for the autoscaler's demand view
    min_accuracy: float = 0.0


@dataclass(frozen=True, slots=True)
class Charge:
    """An answer charged and journaled (`Meter.charge`) whose verdict `Meter.settle` counts."""

    key: _Key
    rows: int
    batch_rows: int
    cost_pusd: int
    at_s: float
    slo: SLO | None


def _charge_counters(rows: int, cost_pusd: int) -> dict[str, int]:
    """The usage counters one answered query's charge adds (`Meter.charge`: journaled)."""
    return {COUNTER_QUERIES: 1, COUNTER_ROWS: rows, COUNTER_COST_PUSD: cost_pusd}


def _verdict_counters(slo_met: bool, latency_ms: float) -> dict[str, int]:
    """The usage counters one answered query's verdict adds (`Meter.settle`)."""
    return {COUNTER_SLO_MET if slo_met else COUNTER_SLO_MISSED: 1, latency_bucket_counter(latency_ms): 1}


def _add(pending: dict[_Key, dict[str, int]], key: _Key, counters: dict[str, int]) -> None:
    row = pending.get(key)
    if row is None:
        row = pending[key] = {}
    for name, value in counters.items():
        row[name] = row.get(name, 0) + value


def cost_share_pusd(profile: Profile, batch_rows: int, rows: int) -> int:
    """This request's share, in integer pico-dollars, of the measured cost of the batch it ran in:
    the batch cost (price × mean latency at that batch size) split by rows."""
    if batch_rows < 1 or rows < 1:
        return 0
    batch_cost_usd = profile.price_usd_per_s * profile.latency_ms(batch_rows, "mean") / 1000.0
    return round(batch_cost_usd * PUSD_PER_USD * rows / batch_rows)


class Meter:
    """In-memory usage counters, per tenant × task × variant × minute."""

    def __init__(self, sink: UsageSink, journal: UsageJournal | None = None) -> None:
        self._sink = sink
        self._journal = journal
        self._lock = threading.Lock()  # record() runs on the event loop, flush() may run in a thread
        self._flush_lock = threading.Lock()  # one flush at a time: batches reach the store in order
        self._pending_seq = 0  # the journal's last sequence number in `_pending`
        self._marked_seq = 0  # the last sequence number written with a mark
        self._in_doubt: tuple[list[UsageDelta], int] | None = None  # a batch whose flush failed
        self._replayed = journal is None
        # Keyed by a plain (tenant, task, variant, minute) tuple, not a `UsageKey`: this runs once
        # per query, and building and hashing a pydantic model there costs several µs. The
        # `UsageKey`s are built at flush time.
        self._pending: dict[_Key, dict[str, int]] = {}
        self._once: list[tuple[UsageDelta, UsageMark]] = []  # `charge_once`, in order
        self._listeners: list[Callable[[MeterRecord], None]] = []
        self._charge_listeners: list[Callable[[str, str, int, int, float], None]] = []

    def use_journal(self, journal: UsageJournal | None) -> None:
        """Journal every charge from now on (set before the first query; None: stop journaling).
        The next flush first replays what an earlier process left in `journal`."""
        with self._flush_lock, self._lock:
            self._journal = journal
            self._replayed = journal is None

    def add_listener(self, fn: Callable[[MeterRecord], None]) -> None:
        """Call `fn` with every `MeterRecord` from now on (answered and failed queries)."""
        self._listeners.append(fn)

    def add_charge_listener(self, fn: Callable[[str, str, int, int, float], None]) -> None:
        """Call `fn(tenant, variant, rows, cost_pusd, now_s)` with every charge from now on, online
        answers' and offline chunks' alike (what `policy.attribution` subtracts from the fleet's
        cost)."""
        self._charge_listeners.append(fn)

    def add_reserved(self, *, tenant: str, task: str, variant: str, pusd: int, now_s: float) -> None:
        """Count reserved cost attributed to `tenant` (`policy.attribution`; negative: a credit).
        Not journaled: it is recomputed from the fleet, not charged for an answer."""
        with self._lock:
            _add(self._pending, (tenant, task, variant, int(now_s // 60)), {COUNTER_RESERVED_PUSD: pusd})

    def charge(
        self,
        *,
        tenant: str,
        task: str,
        variant: str,
        rows: int,
        batch_rows: int,
        cost_pusd: int,
        latency_ms: float,
        slo_met: bool,
        now_s: float,
        slo: SLO | None = None,
    ) -> Charge:
        """Count one answered query's charge (queries, rows, cost) in the minute of `now_s` and
        journal it; its SLO verdict is counted by `settle`, once the reply's latency is known (the
        wait for the journal included). `latency_ms` and `slo_met` are the verdict as of now: what
        a replay counts if the process dies before its answer leaves."""
        minute = int(now_s // 60)
        key = (tenant, task, variant, minute)
        journal = self._journal
        with self._lock:
            _add(self._pending, key, _charge_counters(rows, cost_pusd))
            if journal is not None:
                seq = self._pending_seq = journal.next_seq()
                journal.append(
                    JournalEntry(seq, tenant, task, variant, minute, rows, cost_pusd, slo_met, latency_ms)
                )
        for fn in self._charge_listeners:
            fn(tenant, variant, rows, cost_pusd, now_s)
        return Charge(key, rows, batch_rows, cost_pusd, now_s, slo)

    def charge_once(
        self,
        mark: UsageMark,
        *,
        tenant: str,
        task: str,
        variant: str,
        rows: int,
        cost_pusd: int,
        now_s: float,
    ) -> None:
        """Charge a unit of offline work (a job's chunk of `rows` rows: one query in the usage)
        that the store counts at most once under `mark`, however often it is offered again."""
        key = UsageKey(tenant=tenant, task=task, variant=variant, minute=int(now_s // 60))
        counters = {
            COUNTER_QUERIES: 1,
            COUNTER_ROWS: rows,
            COUNTER_COST_PUSD: cost_pusd,
            COUNTER_SLO_MET: 1,  # no latency target: a chunk answered is in its SLO
        }
        with self._lock:
            self._once.append((UsageDelta(key=key, counters=counters), mark))
        for fn in self._charge_listeners:
            fn(tenant, variant, rows, cost_pusd, now_s)

    def flush_once(self) -> int:
        """Write the `charge_once` charges (blocking; raises if the store fails: they stay and are
        retried by the next flush). Returns how many the store counted (not counted before)."""
        with self._flush_lock:
            return self._write_once()

    def _write_once(self) -> int:
        """`flush_once`'s work (the caller holds the flush lock)."""
        counted = 0
        while True:
            with self._lock:
                if not self._once:
                    return counted
                delta, mark = self._once[0]
            counted += self._sink.add_usage([delta], mark=mark)
            with self._lock:
                self._once.pop(0)

    def settle(self, charged: Charge, latency_ms: float, slo_met: bool) -> MeterRecord:
        """Count the verdict of a `charge`d answer (in SLO or not, its latency bucket) and tell the
        listeners. Like refusals, verdicts are not journaled (no money): a crash loses those of the
        last flush interval's answers, never a charge."""
        tenant, task, variant, _ = key = charged.key
        with self._lock:
            _add(self._pending, key, _verdict_counters(slo_met, latency_ms))
        slo = charged.slo
        record = MeterRecord(
            tenant=tenant,
            task=task,
            variant=variant,
            outcome="ok" if slo_met else "slo_missed",
            latency_ms=latency_ms,
            cost_pusd=charged.cost_pusd,
            rows=charged.rows,
            batch_rows=charged.batch_rows,
            slo_met=slo_met,
            at_s=charged.at_s,
            latency_target_ms=slo.latency_ms if slo is not None else math.inf,
            min_accuracy=slo.min_accuracy if slo is not None else 0.0,
        )
        self._notify(record)
        return record

    def record_failure(
        self,
        *,
        tenant: str,
        task: str,
        variant: str,
        rows: int,
        latency_ms: float,
        error: str,
        now_s: float,
        counted: Literal["refused", "failed"] | None = None,
        slo: SLO | None = None,
    ) -> MeterRecord:
        """Tell listeners about a failed query. Nothing is charged. A query the service refused
        as overloaded (`counted="refused"`) or failed on its side (`"failed"`) is counted in the
        usage too, since SLO attainment is over every query a tenant sent; a bad request is not
        (it says nothing about the service)."""
        if counted is not None:
            counter = COUNTER_REFUSED if counted == "refused" else COUNTER_FAILED
            with self._lock:
                _add(self._pending, (tenant, task, variant, int(now_s // 60)), {counter: 1})
        record = MeterRecord(
            tenant=tenant,
            task=task,
            variant=variant,
            outcome=error,
            latency_ms=latency_ms,
            cost_pusd=0,
            rows=rows,
            batch_rows=0,
            slo_met=False,
            at_s=now_s,
            error=error,
            latency_target_ms=slo.latency_ms if slo is not None else math.inf,
            min_accuracy=slo.min_accuracy if slo is not None else 0.0,
        )
        self._notify(record)
        return record

    def _notify(self, record: MeterRecord) -> None:
        for fn in self._listeners:
            try:
                fn(record)
            except Exception:  # a broken metrics hook must not fail the query it observes
                log.exception("meter listener %r failed", fn)

    async def durable(self) -> None:
        """Wait until every charge recorded so far is in the journal on disk (no-op without one).
        The query handler awaits this before replying: an answer sent is an answer billed."""
        if self._journal is not None:
            await self._journal.durable()

    def pending(self) -> list[UsageDelta]:
        """The counters not yet in the store (a copy): the in-doubt batch and the pending ones."""
        with self._lock:
            merged: dict[_Key, dict[str, int]] = {}
            for delta in self._in_doubt[0] if self._in_doubt else []:
                k = delta.key
                _add(merged, (k.tenant, k.task, k.variant, k.minute), delta.counters)
            for key, counters in self._pending.items():
                _add(merged, key, counters)
            return [_delta(k, c) for k, c in sorted(merged.items())]

    def flush(self) -> int:
        """Write what is not yet in the store, in order: the journal of an earlier process (first
        flush only), a batch whose flush failed, then the pending counters, each in one atomic
        call. Returns the usage rows written. On a failure the batch stays in doubt and is retried
        as is by the next flush, so nothing is lost or counted twice."""
        with self._flush_lock:
            if self._journal is not None:
                # The background sync of INFAAS_USAGE_JOURNAL=os, every flush even while the
                # store is down: what a power cut can lose stays one flush interval.
                self._journal.sync()
            written = self._replay()
            written += self._write_once()
            for _ in range(2):  # the batch in doubt, if there is one, then the pending counters
                if self._in_doubt is None:
                    with self._lock:
                        taken, self._pending = self._pending, {}
                        seq = self._pending_seq
                    if not taken:
                        break
                    self._in_doubt = ([_delta(k, c) for k, c in sorted(taken.items())], seq)
                deltas, seq = self._in_doubt
                self._write(deltas, seq)
                self._in_doubt = None
                written += len(deltas)
            return written

    def _write(self, deltas: list[UsageDelta], seq: int) -> None:
        journal = self._journal
        if journal is None or seq <= self._marked_seq:
            # No journal, or no new charge since the last marked write: only refusal and failure
            # counts, which are not journaled (not money), so they carry no mark.
            self._sink.add_usage(deltas)
            return
        # The store's mark must never pass what the journal holds: a restart numbers on from the
        # journal, and entries at or below the store's mark would be skipped.
        journal.wait_durable(seq)
        self._sink.add_usage(deltas, mark=(journal.source, seq))
        self._marked_seq = seq
        journal.trim(seq)

    def _replay(self) -> int:
        """Count, once, what an earlier process journaled but did not flush."""
        journal = self._journal
        if self._replayed or journal is None:
            return 0
        mark = self._sink.usage_mark(journal.source)
        entries = journal.entries(after_seq=mark, before_seq=journal.first_seq)
        written = 0
        if entries:
            merged: dict[_Key, dict[str, int]] = {}
            for e in entries:
                _add(
                    merged,
                    (e.tenant, e.task, e.variant, e.minute),
                    _charge_counters(e.rows, e.cost_pusd) | _verdict_counters(e.slo_met, e.latency_ms),
                )
            deltas = [_delta(k, c) for k, c in sorted(merged.items())]
            self._write(deltas, entries[-1].seq)
            written = len(deltas)
            log.warning(
                "usage journal: replayed %d charge(s) an earlier process answered but had not flushed",
                len(entries),
            )
        else:
            journal.trim(journal.first_seq - 1)
        self._replayed = True
        self._marked_seq = max(self._marked_seq, journal.first_seq - 1)
        return written


def _delta(key: _Key, counters: dict[str, int]) -> UsageDelta:
    tenant, task, variant, minute = key
    return UsageDelta(
        key=UsageKey(tenant=tenant, task=task, variant=variant, minute=minute), counters=counters
    )


class MeterFlusher:
    """Flushes a `Meter` every `interval_s` in the background and once more on `close`."""

    def __init__(self, meter: Meter, interval_s: float) -> None:
        self._meter = meter
        self._loop = Periodic("usage-flush", interval_s, self._flush)

    async def _flush(self) -> None:
        # The store call blocks (SQLite / Redis); keep it off the event loop.
        await asyncio.to_thread(self._meter.flush)

    def start(self) -> None:
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()
        await asyncio.to_thread(self._meter.flush)
