"""The service's traffic recorded as a trace the simulator reads back."""

from __future__ import annotations

import math
from pathlib import Path

from infaas.metering import MeterRecord
from infaas.sim.traces import read_csv
from infaas.trace_recorder import TraceRecorder


def record(at_s: float, outcome: str = "ok", task: str = "digits", latency_ms: float = 50.0) -> MeterRecord:
    return MeterRecord(
        tenant="acme",
        task=task,
        variant="v",
        outcome=outcome,
        latency_ms=3.0,
        cost_pusd=1,
        rows=4,
        batch_rows=4,
        slo_met=outcome == "ok",
        at_s=at_s,
        latency_target_ms=latency_ms,
        min_accuracy=0.9,
    )


def test_recorded_traffic_reads_back_as_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    recorder = TraceRecorder(path)
    recorder.listener(record(1000.0))
    recorder.listener(record(1000.5, outcome="overloaded"))  # refused: still traffic
    recorder.listener(record(1000.6, task=""))  # no task: a bad request, not traffic
    recorder.listener(record(1000.7, latency_ms=math.inf))  # no targets parsed: a bad request
    assert recorder.flush() == 2
    recorder.listener(record(1001.0))
    assert TraceRecorder(path).flush() == 0  # a second recorder appends, keeps the one header
    assert recorder.flush() == 1
    trace = read_csv(path)
    assert [(q.time_s, q.tenant, q.task, q.rows, q.latency_ms, q.min_accuracy) for q in trace.queries()] == [
        (0.0, "acme", "digits", 4, 50.0, 0.9),
        (0.5, "acme", "digits", 4, 50.0, 0.9),
        (1.0, "acme", "digits", 4, 50.0, 0.9),
    ]
