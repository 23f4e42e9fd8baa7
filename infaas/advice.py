"""What a looser or tighter target would have cost: the tenant's own traffic, simulated again.

The front end keeps each tenant's recent queries (`RecentTraffic`, a meter listener: time, task,
rows and targets of the last `window_s`, at most `max_queries` of them, the most recent). For
`GET /v1/usage/advice` that sample is replayed through the simulator (`infaas.sim`, the service's
own selection, verdict and batching over the same profiles) once as sent and once per point of a
small grid of other targets: every latency target scaled by each factor of `LATENCY_FACTORS`,
and every accuracy floor lowered by `ACCURACY_STEP`. Each point says what the tenant would have
been charged, the share of its queries answered in time, and the variants that would have
answered. The work is bounded (the sample, one simulation per point) and the answer is cached
per tenant for `ttl_s`.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infaas.metering import MeterRecord
from infaas.sim.engine import SimConfig, simulate
from infaas.sim.traces import Query, Trace
from infaas.sim.zoo import Zoo

__all__ = ["ACCURACY_STEP", "LATENCY_FACTORS", "AdvicePoint", "RecentTraffic", "advise", "scaled"]

LATENCY_FACTORS = (0.5, 1.0, 2.0, 4.0)
"""Latency targets tried, as multiples of each query's own."""
ACCURACY_STEP = 0.02
"""How much lower an accuracy floor is tried (besides the one sent)."""
_ANSWERED = frozenset({"ok", "slo_missed"})


@dataclass(frozen=True)
class AdvicePoint:
    latency_factor: float
    accuracy_delta: float  # 0 or -ACCURACY_STEP
    queries: int
    in_slo_share: float
    charged_pusd: int
    variants: dict[str, int]  # answers per variant


class RecentTraffic:
    """Per tenant, its last queries (answered or refused: what it sent) within `window_s`."""

    def __init__(self, window_s: float = 900.0, max_queries: int = 2000) -> None:
        self.window_s = window_s
        self._max = max_queries
        self._lock = threading.Lock()
        self._by_tenant: dict[str, deque[Query]] = {}

    def listener(self, record: MeterRecord) -> None:
        if not record.task or math.isinf(record.latency_target_ms):
            return  # no task (refused at the door) or no latency target: nothing to replay
        if record.outcome not in _ANSWERED and record.error != "overloaded":
            return  # a bad request, or a failure: not traffic a target could change
        query = Query(
            record.at_s,
            record.tenant,
            record.task,
            record.rows,
            record.latency_target_ms,
            record.min_accuracy,
        )
        with self._lock:
            queue = self._by_tenant.get(record.tenant)
            if queue is None:
                queue = self._by_tenant[record.tenant] = deque(maxlen=self._max)
            queue.append(query)

    def sample(self, tenant: str, now_s: float) -> list[Query]:
        """The tenant's queries of the last `window_s`, oldest first, times from 0."""
        with self._lock:
            queries = [q for q in self._by_tenant.get(tenant, ()) if q.time_s >= now_s - self.window_s]
        if not queries:
            return []
        start = queries[0].time_s
        return [q._replace(time_s=q.time_s - start) for q in queries]


def scaled(queries: Sequence[Query], latency_factor: float, accuracy_delta: float) -> Trace:
    """The same queries with every latency target × `latency_factor` and accuracy floor +
    `accuracy_delta` (kept within [0, 1])."""
    return Trace.from_queries(
        [
            q._replace(
                latency_ms=q.latency_ms * latency_factor,
                min_accuracy=float(np.clip(q.min_accuracy + accuracy_delta, 0.0, 1.0)),
            )
            for q in queries
        ]
    )


def advise(zoo: Zoo, queries: Sequence[Query], config: SimConfig) -> list[AdvicePoint]:
    """One point per (latency factor, accuracy delta): the queries simulated with those targets."""
    points = []
    for delta in (0.0, -ACCURACY_STEP):
        for factor in LATENCY_FACTORS:
            result = simulate(zoo, scaled(queries, factor, delta), "modelless", config)
            total = result.total
            points.append(
                AdvicePoint(
                    latency_factor=factor,
                    accuracy_delta=delta,
                    queries=total.queries,
                    in_slo_share=total.in_slo / total.queries if total.queries else 0.0,
                    charged_pusd=total.charged_pusd,
                    variants=dict(sorted(total.by_variant.items())),
                )
            )
    return points
