"""Prometheus metrics for one app: its own `CollectorRegistry`, never the process-global one.

Per query (fed by the usage meter's listener hook): request count and latency histogram labelled
by tenant, task, variant and outcome; cost by tenant; the batch size each request ran in, per
variant. At scrape time, from the worker pool and the batcher: queue depth per variant, and loaded
variants, memory used and budget per worker.

Label values are bounded: a query names its task or variant in user input, and a label per typo
would grow the series without limit. Only names the store knows (registered tasks and variants,
created tenants) and the outcome codes of the error tree become label values; anything else is
counted under ``_other``. A hard cap per label (`max_values`) backs that up.

Cost is summed as integer pico-dollars, like the usage rows, and exported in USD at scrape time,
so `infaas_cost_usd_total` equals the usage API's `cost_usd` for the same queries.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infaas import errors
from infaas.autoscaler import FleetCost
from infaas.metering import MeterRecord
from infaas.policy.admission import ConcurrencyLimit
from infaas.store import MetadataStore
from infaas.types import LATENCY_BUCKETS_MS, pusd_to_usd
from infaas.workers.base import Batcher, FleetSource

__all__ = [
    "CONTENT_TYPE_LATEST",
    "OTHER",
    "OUTCOMES",
    "LabelBounds",
    "Metrics",
    "bounded_label",
]

OTHER = "_other"
"""The label value everything outside the known names is counted under."""

NONE = "none"
"""The variant label of a query that failed before a variant was chosen."""


def _error_codes() -> frozenset[str]:
    codes: set[str] = set()
    stack: list[type[errors.InfaasError]] = [errors.InfaasError]
    while stack:
        cls = stack.pop()
        codes.add(cls.code)
        stack.extend(cls.__subclasses__())
    return frozenset(codes)


OUTCOMES: frozenset[str] = frozenset({"ok", "slo_missed", "error"}) | _error_codes()
"""Outcome label values: answered (`ok`, `slo_missed`) or an error code from `infaas.errors`."""

BATCH_ROWS_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def bounded_label(value: str, known: frozenset[str], seen: set[str], max_values: int) -> str:
    """The label value to record for `value`: itself if known and the cap is not reached, else
    `OTHER`. `seen` (values already in use) grows by what this admits; pure otherwise."""
    if value in seen:
        return value
    if value not in known or len(seen) >= max_values:
        return OTHER
    seen.add(value)
    return value


class LabelBounds:
    """Admits the names a source knows; the source is re-read at most every `refresh_s` on a miss,
    so a newly registered variant gets its own label within seconds, and a flood of unknown names
    costs at most one store read per `refresh_s`."""

    def __init__(
        self,
        source: Callable[[], Iterable[str]],
        clock: Callable[[], float],
        refresh_s: float = 5.0,
        max_values: int = 1000,
        fixed: Iterable[str] = (),
    ) -> None:
        self._source = source
        self._clock = clock
        self._refresh_s = refresh_s
        self._max_values = max_values
        self._fixed = frozenset(fixed)
        self._known = self._fixed
        self._loaded_at: float | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def admit(self, value: str) -> str:
        """Known without asking the source (e.g. a tenant that just authenticated): its own label
        from its first use, up to the cap."""
        if value in self._seen:
            return value
        with self._lock:
            self._known = self._known | {value}
            return bounded_label(value, self._known, self._seen, self._max_values)

    def __call__(self, value: str) -> str:
        if value in self._seen:  # the hot path: set reads need no lock, and values never leave
            return value
        with self._lock:
            now = self._clock()
            stale = self._loaded_at is None or now - self._loaded_at >= self._refresh_s
            if value not in self._known and stale:
                self._known = self._fixed | frozenset(self._source())
                self._loaded_at = now
            return bounded_label(value, self._known, self._seen, self._max_values)


class _CostCollector(Collector):
    """USD per tenant from exact integer pico-dollar sums: a counter (`name`_total{tenant}), or
    a gauge where a sum may go down (reserved cost: an interval may give some back)."""

    def __init__(self, name: str, documentation: str, monotonic: bool = True) -> None:
        self._family = CounterMetricFamily if monotonic else GaugeMetricFamily
        self._name = name
        self._documentation = documentation
        self._lock = threading.Lock()
        self._pusd: dict[str, int] = defaultdict(int)

    def add(self, tenant: str, cost_pusd: int) -> None:
        with self._lock:
            self._pusd[tenant] += cost_pusd

    def collect(self) -> Iterator[Metric]:
        family = self._family(self._name, self._documentation, labels=["tenant"])
        with self._lock:
            items = sorted(self._pusd.items())
        for tenant, pusd in items:
            family.add_metric([tenant], pusd_to_usd(pusd))
        yield family


class _FleetCollector(Collector):
    """Gauges read from the pool and the batcher at scrape time (they own the live state)."""

    def __init__(
        self,
        sources: Callable[[], tuple[FleetSource | None, Batcher | None]],
        variants: LabelBounds,
        costs: Callable[[], FleetCost | None],
    ) -> None:
        self._sources = sources
        self._variants = variants
        self._costs = costs

    def collect(self) -> Iterator[Metric]:
        pool, batcher = self._sources()
        queue = GaugeMetricFamily(
            "infaas_queue_depth", "Requests waiting in the batcher, per variant.", labels=["variant"]
        )
        if batcher is not None:
            depths: dict[str, int] = defaultdict(int)
            for variant, depth in batcher.queue_depths().items():
                depths[self._variants(variant)] += depth
            for variant, depth in sorted(depths.items()):
                queue.add_metric([variant], depth)
        yield queue
        loaded = GaugeMetricFamily(
            "infaas_worker_loaded_variants", "Variants loaded on each worker.", labels=["worker", "family"]
        )
        used = GaugeMetricFamily(
            "infaas_worker_memory_used_bytes",
            "Memory the loaded variants use, per worker.",
            labels=["worker"],
        )
        budget = GaugeMetricFamily(
            "infaas_worker_memory_budget_bytes", "Memory budget of each worker.", labels=["worker"]
        )
        up = GaugeMetricFamily("infaas_worker_up", "1 if the worker is alive.", labels=["worker"])
        for worker in pool.fleet() if pool is not None else []:
            loaded.add_metric([worker.worker_id, worker.family], len(worker.loaded))
            used.add_metric([worker.worker_id], worker.memory_used_mb * 1024 * 1024)
            budget.add_metric([worker.worker_id], worker.memory_budget_mb * 1024 * 1024)
            up.add_metric([worker.worker_id], 1.0 if worker.alive else 0.0)
        yield from (loaded, used, budget, up)
        yield from self._fleet_cost(pool)

    def _fleet_cost(self, pool: FleetSource | None) -> Iterator[Metric]:
        replicas = GaugeMetricFamily(
            "infaas_variant_replicas", "Replicas of each loaded variant.", labels=["variant"]
        )
        counts: dict[str, int] = defaultdict(int)
        for worker in pool.fleet() if pool is not None else []:
            for name in worker.loaded:
                counts[self._variants(name)] += 1
        for variant, n in sorted(counts.items()):
            replicas.add_metric([variant], n)
        yield replicas
        held = CounterMetricFamily(
            "infaas_fleet_cost_usd",
            "What the replicas' resources cost so far (replica-seconds × price), per variant.",
            labels=["variant"],
        )
        rate = GaugeMetricFamily(
            "infaas_fleet_cost_usd_per_hour",
            "What the replicas held now cost per hour, per variant.",
            labels=["variant"],
        )
        cost = self._costs()
        if cost is not None:
            usd: dict[str, float] = defaultdict(float)
            per_hour: dict[str, float] = defaultdict(float)
            for name, value in cost.usd.items():
                usd[self._variants(name)] += value
            for name, value in cost.usd_per_s.items():
                per_hour[self._variants(name)] += value * 3600.0
            for variant, value in sorted(usd.items()):
                held.add_metric([variant], value)
            for variant, value in sorted(per_hour.items()):
                rate.add_metric([variant], value)
        yield from (held, rate)


class _AdmissionCollector(Collector):
    """The front end's queries in flight and the limit admission learned (`policy.admission`)."""

    def __init__(self, limit: Callable[[], ConcurrencyLimit | None]) -> None:
        self._limit = limit

    def collect(self) -> Iterator[Metric]:
        limit = self._limit()
        if limit is None:
            return
        yield GaugeMetricFamily(
            "infaas_queries_in_flight", "Admitted queries not yet answered.", value=limit.in_flight
        )
        yield GaugeMetricFamily(
            "infaas_queries_in_flight_limit",
            "Queries in flight beyond which a query is refused as busy (429), learned from late answers.",
            value=int(limit.limit),
        )


def _known_tasks(store: MetadataStore) -> Callable[[], list[str]]:
    return lambda: [t.name for t in store.list_tasks()]


def _known_variants(store: MetadataStore) -> Callable[[], list[str]]:
    return lambda: [v.name for v in store.list_variants()]


def _known_tenants(store: MetadataStore) -> Callable[[], list[str]]:
    return lambda: [t.name for t in store.list_tenants()]


class Metrics:
    """The metrics of one app. `observe_query` is called once per answered or failed query."""

    def __init__(
        self,
        store: MetadataStore,
        clock: Callable[[], float],
        sources: Callable[[], tuple[FleetSource | None, Batcher | None]] = lambda: (None, None),
        max_label_values: int = 1000,
        catalog: Callable[[], tuple[Iterable[str], Iterable[str]]] | None = None,
        costs: Callable[[], FleetCost | None] = lambda: None,
        admission: Callable[[], ConcurrencyLimit | None] = lambda: None,
    ) -> None:
        """`catalog` (task names, variant names) replaces the store as the source of known names:
        the app passes the router's snapshot, so a label miss never waits on the store."""
        self.registry = CollectorRegistry()
        self.tenants = LabelBounds(
            _known_tenants(store), clock, max_values=max_label_values, fixed=("admin",)
        )
        tasks, variants = (
            (lambda: catalog()[0], lambda: catalog()[1])
            if catalog is not None
            else (_known_tasks(store), _known_variants(store))
        )
        self.tasks = LabelBounds(tasks, clock, max_values=max_label_values)
        self.variants = LabelBounds(variants, clock, max_values=max_label_values, fixed=(NONE,))
        labels = ["tenant", "task", "variant", "outcome"]
        self._requests = Counter(
            "infaas_requests", "Queries answered or failed.", labels, registry=self.registry
        )
        self._latency = Histogram(
            "infaas_request_latency_seconds",
            "Latency from receipt to reply, measured at the server.",
            labels,
            buckets=[ms / 1000.0 for ms in LATENCY_BUCKETS_MS],
            registry=self.registry,
        )
        self._batch_rows = Histogram(
            "infaas_batch_size_rows",
            "Rows in the batch each answered query ran in (request-weighted), per variant.",
            ["variant"],
            buckets=BATCH_ROWS_BUCKETS,
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, str, str], tuple[Counter, Histogram, Histogram]] = {}
        self._cost = _CostCollector(
            "infaas_cost_usd", "Cost charged to each tenant, in USD (summed exactly in pico-dollars)."
        )
        self._reserved = _CostCollector(
            "infaas_reserved_cost_usd",
            "The fleet's cost beyond what answers were charged, attributed to each tenant by its "
            "traffic (policy.attribution), in USD since the start (summed exactly in pico-dollars).",
            monotonic=False,
        )
        self.registry.register(self._cost)
        self.registry.register(self._reserved)
        self.registry.register(_FleetCollector(sources, self.variants, costs))
        self.registry.register(_AdmissionCollector(admission))

    def observe_query(
        self,
        *,
        tenant: str,
        task: str,
        variant: str | None,
        outcome: str,
        latency_ms: float,
        cost_pusd: int = 0,
        batch_rows: int = 0,
    ) -> None:
        """Count one query. Unknown names are recorded as `OTHER`; a failed query without a
        chosen variant as variant `none`."""
        labels = (
            self.tenants(tenant),
            self.tasks(task),
            self.variants(variant or NONE),
            outcome if outcome in OUTCOMES else OTHER,
        )
        # This runs once per query on the event loop: resolve the labelled children once per label
        # set (prometheus-client's `labels()` costs ~2.5 µs a call; a dict hit ~0.1 µs).
        children = self._children.get(labels)
        if children is None:
            children = self._children[labels] = (
                self._requests.labels(*labels),
                self._latency.labels(*labels),
                self._batch_rows.labels(labels[2]),
            )
        requests, latency, batch = children
        requests.inc()
        latency.observe(latency_ms / 1000.0)
        if cost_pusd:
            self._cost.add(labels[0], cost_pusd)
        if batch_rows > 0:
            batch.observe(batch_rows)

    def observe_reserved(self, tenant: str, pusd: int) -> None:
        """Attributed reserved cost (may be negative: a credit)."""
        self._reserved.add(self.tenants(tenant), pusd)

    def render(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4)."""
        return generate_latest(self.registry)

    def listener(self, record: MeterRecord) -> None:
        """The hook for `Meter.add_listener`: one record per answered or failed query. Its tenant
        is an authenticated principal, so it gets its own label from its first query."""
        self.tenants.admit(record.tenant)
        self.observe_query(
            tenant=record.tenant,
            task=record.task,
            variant=record.variant,
            outcome=record.outcome,
            latency_ms=record.latency_ms,
            cost_pusd=record.cost_pusd,
            batch_rows=record.batch_rows,
        )
