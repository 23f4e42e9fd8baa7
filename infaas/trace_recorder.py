"""Records the service's own traffic as a trace `infaas simulate --trace FILE.csv` replays.

A `Meter` listener: one row per query the service routed or refused for a task — answered,
refused (429), failed or expired — with the columns `infaas.sim.traces.CSV_FIELDS`
(``time_s,tenant,task,rows,latency_ms,min_accuracy``: when it arrived, relative to the first
recorded query, and the targets it asked). A query that failed validation before naming a task is
not traffic the fleet had to carry and is left out. Rows are buffered in memory and appended by
`flush` (from the app's periodic loop, off the event loop), so the query path only appends a tuple.
"""

from __future__ import annotations

import csv
import threading
from pathlib import Path

from infaas.metering import MeterRecord
from infaas.sim.traces import CSV_FIELDS

__all__ = ["TraceRecorder"]


class TraceRecorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._start_s: float | None = None
        self._rows: list[tuple[float, str, str, int, float, float]] = []
        self._lock = threading.Lock()
        if not path.exists() or path.stat().st_size == 0:
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(CSV_FIELDS)

    def listener(self, record: MeterRecord) -> None:
        if not record.task or record.rows <= 0 or record.latency_target_ms == float("inf"):
            return  # refused before it had a task and targets: a bad request, not traffic
        if self._start_s is None:
            self._start_s = record.at_s
        row = (
            record.at_s - self._start_s,
            record.tenant,
            record.task,
            record.rows,
            record.latency_target_ms,
            record.min_accuracy,
        )
        with self._lock:
            self._rows.append(row)

    def flush(self) -> int:
        """Append what was recorded since the last flush; returns how many rows."""
        with self._lock:
            rows, self._rows = self._rows, []
        if rows:
            with self.path.open("a", newline="") as f:
                out = csv.writer(f)
                for t, tenant, task, n, latency_ms, accuracy in rows:
                    out.writerow([f"{t:.6f}", tenant, task, n, repr(latency_ms), repr(accuracy)])
        return len(rows)
