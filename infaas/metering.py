"""Per-tenant usage and cost: aggregated in memory, flushed atomically to the store.

Each answer is charged the variant's *measured* cost at the batch size it actually ran in, divided
among the rows of that batch (`cost_share_pusd`). Counters are integers (pico-dollars for money)
kept per tenant × task × variant × minute and added to the store in one atomic `add_usage` call per
flush, so a reader never sees half a flush and a total over the store is exactly the sum of what
the responses reported.

`Meter` is pure bookkeeping: the time of each record comes in as an argument (`now_s`, wall-clock
seconds), so tests drive it with a fake clock. `MeterFlusher` is the I/O shell that flushes at
`settings.usage_flush_interval_s` and at shutdown. Listeners (`add_listener`) see one
`MeterRecord` per answered or failed query; the Prometheus metrics hang off that hook.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from infaas.periodic import Periodic
from infaas.types import (
    COUNTER_COST_PUSD,
    COUNTER_QUERIES,
    COUNTER_ROWS,
    COUNTER_SLO_MET,
    COUNTER_SLO_MISSED,
    PUSD_PER_USD,
    Profile,
    UsageDelta,
    UsageKey,
    latency_bucket_counter,
)

__all__ = ["FlakySink", "Meter", "MeterFlusher", "MeterRecord", "Outcome", "UsageSink", "cost_share_pusd"]

log = logging.getLogger(__name__)

Outcome = str
"""``ok`` or ``slo_missed`` for an answered query, the error code (`infaas.errors`) for a failed one."""


_Key = tuple[str, str, str, int]
"""tenant, task, variant, minute: a `UsageKey`'s fields, in its sort order."""


class UsageSink(Protocol):
    """Where usage goes: the metadata store's atomic counter add."""

    def add_usage(self, deltas: Sequence[UsageDelta]) -> None: ...


class FlakySink:
    """A shipped fake for tests: forwards to `inner`, but the next `failures` calls raise."""

    def __init__(self, inner: UsageSink, failures: int = 1) -> None:
        self.inner = inner
        self.failures = failures

    def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("sink unavailable (FlakySink)")
        self.inner.add_usage(deltas)


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


def cost_share_pusd(profile: Profile, batch_rows: int, rows: int) -> int:
    """This request's share, in integer pico-dollars, of the measured cost of the batch it ran in:
    the batch cost (price × mean latency at that batch size) split by rows."""
    if batch_rows < 1 or rows < 1:
        return 0
    batch_cost_usd = profile.price_usd_per_s * profile.latency_ms(batch_rows, "mean") / 1000.0
    return round(batch_cost_usd * PUSD_PER_USD * rows / batch_rows)


class Meter:
    """In-memory usage counters, per tenant × task × variant × minute."""

    def __init__(self, sink: UsageSink) -> None:
        self._sink = sink
        self._lock = threading.Lock()  # record() runs on the event loop, flush() may run in a thread
        # Keyed by a plain (tenant, task, variant, minute) tuple, not a `UsageKey`: this runs once
        # per query, and building and hashing a pydantic model there costs several µs. The
        # `UsageKey`s are built at flush time.
        self._pending: dict[_Key, dict[str, int]] = {}
        self._listeners: list[Callable[[MeterRecord], None]] = []

    def add_listener(self, fn: Callable[[MeterRecord], None]) -> None:
        """Call `fn` with every `MeterRecord` from now on (answered and failed queries)."""
        self._listeners.append(fn)

    def record_answer(
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
    ) -> MeterRecord:
        """Count one answered query (charged `cost_pusd`) in the minute of `now_s`."""
        key = (tenant, task, variant, int(now_s // 60))
        bucket = latency_bucket_counter(latency_ms)
        with self._lock:
            row = self._pending.get(key)
            if row is None:
                row = self._pending[key] = {}
            row[COUNTER_QUERIES] = row.get(COUNTER_QUERIES, 0) + 1
            row[COUNTER_ROWS] = row.get(COUNTER_ROWS, 0) + rows
            row[COUNTER_COST_PUSD] = row.get(COUNTER_COST_PUSD, 0) + cost_pusd
            slo_counter = COUNTER_SLO_MET if slo_met else COUNTER_SLO_MISSED
            row[slo_counter] = row.get(slo_counter, 0) + 1
            row[bucket] = row.get(bucket, 0) + 1
        record = MeterRecord(
            tenant=tenant,
            task=task,
            variant=variant,
            outcome="ok" if slo_met else "slo_missed",
            latency_ms=latency_ms,
            cost_pusd=cost_pusd,
            rows=rows,
            batch_rows=batch_rows,
            slo_met=slo_met,
            at_s=now_s,
        )
        self._notify(record)
        return record

    def record_failure(
        self, *, tenant: str, task: str, variant: str, rows: int, latency_ms: float, error: str, now_s: float
    ) -> MeterRecord:
        """Tell listeners about a failed query. Nothing is charged, so usage is not touched."""
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
        )
        self._notify(record)
        return record

    def _notify(self, record: MeterRecord) -> None:
        for fn in self._listeners:
            try:
                fn(record)
            except Exception:  # a broken metrics hook must not fail the query it observes
                log.exception("meter listener %r failed", fn)

    def pending(self) -> list[UsageDelta]:
        """The counters not yet flushed (a copy)."""
        with self._lock:
            return [_delta(k, dict(c)) for k, c in sorted(self._pending.items())]

    def flush(self) -> int:
        """Write pending counters to the sink in one atomic call; returns the rows written. On a
        sink failure the counters are merged back, so nothing is lost or counted twice."""
        with self._lock:
            taken, self._pending = self._pending, {}
        if not taken:
            return 0
        deltas = [_delta(k, c) for k, c in sorted(taken.items())]
        try:
            self._sink.add_usage(deltas)
        except Exception:
            with self._lock:
                for key, counters in taken.items():
                    row = self._pending.setdefault(key, {})
                    for name, value in counters.items():
                        row[name] = row.get(name, 0) + value
            raise
        return len(deltas)


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
