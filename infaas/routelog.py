"""Recent routing decisions for the fleet view, from the usage meter's per-query records.

One event when a task starts being served by a variant (the first answer from it, or the first
after `idle_s` without one), and likewise when a task starts failing to find a feasible variant or
a worker. Logging every query would bury the decisions an admin looks for under thousands of
identical lines; keying on the (task, variant) pair rather than on the task's latest variant keeps
tenants with different targets, served by different variants of one task, from flapping the log.
Times are the records' own (`at_s`, wall clock), the clock the worker pool stamps its load and
eviction events with, so nothing here reads a clock.
"""

from __future__ import annotations

import threading
from collections import deque

from infaas.metering import MeterRecord
from infaas.types import FleetEvent

__all__ = ["ROUTING_ERRORS", "RouteLog"]

ROUTING_ERRORS = frozenset({"no_feasible_variant", "unavailable"})
"""Failures that are routing outcomes; bad inputs or unknown names say nothing about routing."""


class RouteLog:
    """Keeps the last `maxlen` routing events; `listener` goes to `Meter.add_listener`."""

    def __init__(self, maxlen: int = 200, idle_s: float = 60.0) -> None:
        self._events: deque[FleetEvent] = deque(maxlen=maxlen)
        self._idle_s = idle_s
        self._last_s: dict[tuple[str, str], float] = {}  # (task, variant or "!error") -> last seen
        self._lock = threading.Lock()

    def listener(self, record: MeterRecord) -> None:
        if not record.task:
            return  # rejected before the task was known
        if record.error is not None and record.error not in ROUTING_ERRORS:
            return
        key = (record.task, record.variant if record.error is None else f"!{record.error}")
        with self._lock:
            last_s = self._last_s.get(key)
            self._last_s[key] = record.at_s
            if last_s is not None and record.at_s - last_s < self._idle_s:
                return  # the steady state: no event, a dict update per query
            self._events.append(self._event(record, resumed=last_s is not None))

    def _event(self, record: MeterRecord, resumed: bool) -> FleetEvent:
        if record.error is not None:
            reason = f"{record.task}: {record.error.replace('_', ' ')} (tenant {record.tenant})"
            return FleetEvent(at_s=record.at_s, kind="route", variant=record.variant or "-", reason=reason)
        first = f"first answer in {self._idle_s:g} s" if resumed else "first answer"
        reason = (
            f"{record.task} routed to {record.variant} ({first}: tenant {record.tenant}, "
            f"{record.latency_ms:.1f} ms in a batch of {record.batch_rows} rows, "
            f"SLO {'met' if record.slo_met else 'missed'})"
        )
        return FleetEvent(at_s=record.at_s, kind="route", variant=record.variant, reason=reason)

    def add(self, event: FleetEvent) -> None:
        """Record a routing decision made elsewhere (a quarantine)."""
        with self._lock:
            self._events.append(event)

    def events(self, limit: int = 50) -> list[FleetEvent]:
        """The most recent events, oldest first (as `WorkerPool.events`)."""
        with self._lock:
            return list(self._events)[-limit:] if limit > 0 else []
