"""A quiet tenant beside a flooding one, through a running service (issue 32): shared by
`tests/integration/test_fairness.py` (the check, with margins) and `scripts/bench_fairness`
(the strict figures, several runs).

The quiet tenant sends `quiet_rate_per_s` queries a second on an open-loop schedule (aiohttp);
the noisy one `overload` × what the service sustains for its queries back to back, from the bare
HTTP/1.1 client (`BareOpenLoopLoad`: aiohttp's own CPU cannot offer that on 2 shared cores).
Both ask the same task with the same targets; what differs is only how much they ask."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.integration.load import BareOpenLoopLoad, LoadResult, OpenLoopLoad, closed_loop

MAX_RATE_PER_S = 7000.0
"""What `BareOpenLoopLoad` offers on 2 cores shared with the service (~0.3 core at 4 000/s; 6 700/s
reached, 10x a host that sustains 670/s: at 5 000 the flood was 7.6-8.3x on such a host)."""


@dataclass
class NeighbourRun:
    quiet: LoadResult
    noisy: LoadResult
    sustained_per_s: float  # the noisy queries answered back to back, just before
    offered_per_s: float  # the noisy tenant's open-loop rate
    seconds: float

    @staticmethod
    def _in_slo(result: LoadResult) -> int:
        return sum(1 for b in result.answered() if b["slo_met"])

    def summary(self) -> dict[str, Any]:
        """The figures the test asserts and the bench prints."""
        q, n = self.quiet, self.noisy
        latencies = [b["latency_ms"] for b in q.answered()]
        noisy_ms = [b["latency_ms"] for b in n.answered()]
        return {
            "offered_x": round(self.offered_per_s / self.sustained_per_s, 2),
            "sustained_per_s": round(self.sustained_per_s, 1),
            "quiet_sent": len(q.outcomes),
            "quiet_in_slo": self._in_slo(q),
            "quiet_in_slo_share": self._in_slo(q) / max(1, len(q.outcomes)),
            "quiet_statuses": dict(q.statuses()),
            "quiet_p99_ms": round(float(np.percentile(latencies, 99)), 1) if latencies else None,
            "noisy_answered_per_s": round(len(n.answered()) / self.seconds, 1),
            "noisy_p99_ms": round(float(np.percentile(noisy_ms, 99)), 1) if noisy_ms else None,
            "noisy_in_slo_share": self._in_slo(n) / max(1, len(n.answered())),
            "noisy_statuses": dict(n.statuses()),
        }


def noisy_neighbour(
    url: str,
    quiet_key: str,
    noisy_key: str,
    body: dict[str, Any],
    *,
    noisy_body: dict[str, Any] | None = None,
    overload: float = 10.0,
    quiet_rate_per_s: float = 20.0,
    seconds: float = 10.0,
    sustained_per_s: float | None = None,
) -> NeighbourRun:
    """Measure what the noisy tenant's queries sustain (unless given: a run right after another
    measures the service still draining the last flood), then run both loads for `seconds`."""
    noisy_body = noisy_body or body
    if sustained_per_s is None:
        lenient = {**noisy_body, "latency_ms": 60_000}
        closed_loop(url, noisy_key, lenient, 64, 300)  # warm: the autoscaler sees this demand too
        started_s = time.monotonic()
        capacity = closed_loop(url, noisy_key, lenient, 64, 1000)
        sustained_per_s = len(capacity.answered()) / (time.monotonic() - started_s)
    rate_per_s = min(MAX_RATE_PER_S, overload * sustained_per_s)
    noisy = BareOpenLoopLoad(url, noisy_key, noisy_body, rate_per_s).start()
    time.sleep(1.0)  # the flood first: the quiet tenant arrives into it
    quiet = OpenLoopLoad(url, quiet_key, body, quiet_rate_per_s).start() if quiet_rate_per_s > 0 else None
    time.sleep(seconds)
    quiet_result = quiet.stop() if quiet is not None else LoadResult()
    noisy_result = noisy.stop()
    return NeighbourRun(quiet_result, noisy_result, sustained_per_s, rate_per_s, seconds + 1.0)
