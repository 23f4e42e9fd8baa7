"""Recent routing decisions for the fleet view, from the usage meter's per-query records.

One event per *change*: the first query of a task, a task moving to another variant, a task that
stops (or starts again) finding a feasible variant. Logging every query would bury the decisions
an admin looks for under thousands of identical lines. Times are the records' own (`at_s`, wall
clock), the same clock the worker pool stamps its load and eviction events with.
"""

from __future__ import annotations

import threading
from collections import deque

from infaas.metering import MeterRecord
from infaas.types import FleetEvent

__all__ = ["RouteLog"]


class RouteLog:
    """Keeps the last `maxlen` routing changes; `listener` goes to `Meter.add_listener`."""

    def __init__(self, maxlen: int = 200) -> None:
        self._events: deque[FleetEvent] = deque(maxlen=maxlen)
        self._current: dict[str, str] = {}  # task -> variant, or "!<error code>" while failing
        self._lock = threading.Lock()

    def listener(self, record: MeterRecord) -> None:
        if not record.task:
            return  # rejected before the task was known: not a routing decision
        if record.error is None:
            state = record.variant
            reason = (
                f"{record.task} routed to {record.variant} (first such answer: tenant {record.tenant}, "
                f"{record.latency_ms:.1f} ms in a batch of {record.batch_rows} rows, "
                f"SLO {'met' if record.slo_met else 'missed'})"
            )
        elif record.error in ("no_feasible_variant", "unavailable"):
            state = f"!{record.error}"
            reason = f"{record.task}: {record.error.replace('_', ' ')} (tenant {record.tenant})"
        else:
            return  # bad input or an unknown name says nothing about routing
        with self._lock:
            previous = self._current.get(record.task)
            if previous == state:
                return
            self._current[record.task] = state
            if previous is not None and not previous.startswith("!") and not state.startswith("!"):
                reason += f"; was {previous}"
            self._events.append(
                FleetEvent(at_s=record.at_s, kind="route", variant=record.variant or "-", reason=reason)
            )

    def events(self, limit: int = 50) -> list[FleetEvent]:
        """The most recent changes, oldest first (as `WorkerPool.events`)."""
        with self._lock:
            return list(self._events)[-limit:] if limit > 0 else []
