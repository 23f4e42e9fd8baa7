"""Domain values shared by every layer.

They are frozen pydantic models: immutable like dataclasses, and they serialise to JSON for the
metadata store without a hand-written codec. Wire schemas for the HTTP API live separately in
`infaas.api.schemas`; these are the service's own vocabulary (see DESIGN.md, "Vocabulary").

Units are in the names. Money is kept as integer pico-dollars (`*_pusd`) wherever it is summed,
because a 10 µs inference costs ~1e-10 USD and float sums drift; floats in USD appear only at the
edge (`*_usd`, `*_usd_per_1k`).
"""

from __future__ import annotations

import bisect
import hashlib
import operator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "COUNTER_COST_PUSD",
    "COUNTER_FAILED",
    "COUNTER_QUERIES",
    "COUNTER_REFUSED",
    "COUNTER_RESERVED_PUSD",
    "COUNTER_ROWS",
    "COUNTER_SLO_MET",
    "COUNTER_SLO_MISSED",
    "LATENCY_BUCKETS_MS",
    "PUSD_PER_USD",
    "SLO",
    "Architecture",
    "Decision",
    "FleetEvent",
    "FrontEndInfo",
    "Hardware",
    "InputSpec",
    "Job",
    "JobState",
    "Labels",
    "LatencyPoint",
    "MachineInfo",
    "ModelKind",
    "Parity",
    "Precision",
    "Principal",
    "Profile",
    "Role",
    "RuntimeName",
    "Share",
    "SkippedVariant",
    "Targets",
    "Task",
    "Tenant",
    "UsageDelta",
    "UsageKey",
    "UsageRecord",
    "Variant",
    "VariantSpec",
    "VersionState",
    "WorkerInfo",
    "latency_bucket_counter",
    "pusd_to_usd",
    "split_version",
    "usd_to_pusd",
    "version_name",
]

PUSD_PER_USD = 10**12
"""Pico-dollars per dollar: 64-bit integers hold ~9.2 million USD of pico-dollars per counter."""


def usd_to_pusd(usd: float) -> int:
    """Convert a float dollar amount to exact integer pico-dollars (rounded to nearest)."""
    return round(usd * PUSD_PER_USD)


def pusd_to_usd(pusd: int) -> float:
    return pusd / PUSD_PER_USD


ModelKind = Literal["keras", "savedmodel", "onnx", "sklearn"]
RuntimeName = Literal["tensorflow", "onnxruntime", "sklearn", "tensorrt"]
Hardware = Literal["cpu", "gpu"]
Precision = Literal["fp32", "fp16", "int8"]
Role = Literal["admin", "owner", "tenant"]
"""admin: everything; owner: registers and manages architectures in the tasks it owns, and
queries; tenant: queries."""
VersionState = Literal["loading", "ready", "serving", "retired", "failed"]

_RUNTIME_SHORT: dict[str, str] = {
    "tensorflow": "tf",
    "onnxruntime": "onnx",
    "sklearn": "sklearn",
    "tensorrt": "trt",
}


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class InputSpec(_Value):
    """Shape of one input row (without the batch dimension) and its dtype."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def row_size(self) -> int:
        size = 1
        for dim in self.shape:
            size *= dim
        return size


class Task(_Value):
    """What is asked, independent of any model: input spec, classes and the validation set."""

    name: str
    input_spec: InputSpec
    num_classes: int = Field(ge=2)
    validation_artifact: str  # path of the .npz under the artifacts dir (content-addressed)
    validation_size: int = Field(ge=1)
    description: str = ""
    created_at_s: float = 0.0
    owners: tuple[str, ...] = ()
    """Owner keys' names that may register and manage architectures here (the creator, and whom
    the admin grants); the admin always may."""


def version_name(architecture: str, version: int) -> str:
    """The stored name of one version: version 1 keeps the bare name (what existed before
    versions did), later ones are ``name@N``. '@' is outside `NAME_RE`, so no registered name
    collides with a version's."""
    return architecture if version == 1 else f"{architecture}@{version}"


def split_version(name: str) -> tuple[str, str | None]:
    """``'net@2'`` → ``('net', '2')``; ``'net@canary'`` → ``('net', 'canary')``; ``'net'`` →
    ``('net', None)``."""
    base, sep, ref = name.partition("@")
    return base, (ref if sep else None)


class Architecture(_Value):
    """One registered model of a task; the reference that every variant must agree with."""

    name: str
    task: str
    kind: ModelKind
    source_sha256: str
    artifact: str  # path of the uploaded model under the artifacts dir
    description: str = ""
    owner: str = "admin"
    created_at_s: float = 0.0
    version: int = Field(default=1, ge=1)

    @property
    def line(self) -> str:
        """The name its versions share (``net`` for ``net@2``)."""
        return split_version(self.name)[0]


class Labels(_Value):
    """An architecture's versions: their states, which one is `stable`, which one is the `canary`
    and the share of the architecture's traffic the canary takes. No document means one version,
    stable. `previous` holds the stables replaced by a promote, most recent last (what a
    rollback returns to)."""

    architecture: str
    stable: int = 1
    canary: int | None = None
    canary_share: float = Field(default=0.0, ge=0.0, le=1.0)
    previous: tuple[int, ...] = ()
    states: dict[int, VersionState] = Field(default_factory=dict)
    errors: dict[int, str] = Field(default_factory=dict)  # why a `failed` version failed

    def state(self, version: int) -> VersionState:
        if version in (self.stable, self.canary):
            return "serving"
        return self.states.get(version, "ready")

    @property
    def serving(self) -> tuple[int, ...]:
        return (self.stable,) if self.canary is None else (self.stable, self.canary)


class VariantSpec(_Value):
    """What the variant generator plans: runtime × hardware × precision × threads × max batch."""

    architecture: str
    runtime: RuntimeName
    hardware: Hardware = "cpu"
    precision: Precision = "fp32"
    threads: int = Field(default=1, ge=1)
    max_batch: int = Field(default=128, ge=1)

    @property
    def name(self) -> str:
        """Stable readable name, e.g. ``digits-cnn/onnx-cpu-int8-t1``."""
        short = _RUNTIME_SHORT[self.runtime]
        return f"{self.architecture}/{short}-{self.hardware}-{self.precision}-t{self.threads}"

    @property
    def cores(self) -> int:
        """CPU cores the variant holds while running (its thread count)."""
        return self.threads

    def holds(self, gpu_share: float = 1.0) -> tuple[float, float]:
        """(vCPUs, GPUs) one replica holds: a GPU variant's threads feed its device, and are not
        counted as vCPUs (what the autoscaler's free resources and the router's room for a
        replica beside busy ones are counted in); its worker holds `gpu_share` of a GPU
        (`INFAAS_GPU_PER_WORKER`: below 1, several workers, and their variants, share a GPU)."""
        return (0.0, gpu_share) if self.hardware == "gpu" else (float(self.threads), 0.0)

    def replica_price(self, price_usd_per_s: float, gpu_share: float = 1.0) -> float:
        """What one replica costs, from its profile's price (one GPU's, or its threads' vCPUs'):
        `gpu_share` of it for a variant whose worker shares its device, else all of it."""
        return price_usd_per_s * (gpu_share if self.hardware == "gpu" else 1.0)


class Parity(_Value):
    """Agreement of a variant with its architecture's reference on the whole validation set."""

    top1_agreement: float = Field(ge=0.0, le=1.0)
    max_abs_diff: float = Field(ge=0.0)
    samples: int = Field(ge=1)


class Variant(_Value):
    """One runnable build of an architecture, immutable once built."""

    spec: VariantSpec
    artifact: str  # path under the artifacts dir (content-addressed)
    sha256: str
    parity: Parity
    created_at_s: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def architecture(self) -> str:
        return self.spec.architecture


class SkippedVariant(_Value):
    """A planned variant that was not built or failed its parity check, and why."""

    architecture: str
    name: str
    reason: str


class MachineInfo(_Value):
    """Where a profile was measured; profiles from another machine are not mixed silently."""

    cpu_model: str
    cores: int
    gpu: str | None = None

    @property
    def fingerprint(self) -> str:
        return f"{self.cpu_model}|{self.cores}|{self.gpu or '-'}"

    @property
    def machine_class(self) -> str:
        """A short, stable id of the fingerprint: profiles are kept per machine class."""
        return hashlib.sha256(self.fingerprint.encode()).hexdigest()[:12]


_QUANTILE_ATTRS = {"p50": "p50_ms", "p95": "p95_ms", "p99": "p99_ms", "mean": "mean_ms"}
_batch_of = operator.attrgetter("batch")


class LatencyPoint(_Value):
    """Measured latency at one batch size."""

    batch: int = Field(ge=1)
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput_qps: float  # inferences (rows) per second
    samples: int
    stable: bool  # three consecutive windows within tolerance, else a cap stopped it
    stop_reason: str
    cost_usd_per_1k: float


class Profile(_Value):
    """What was measured for one variant on one machine."""

    variant: str
    status: Literal["ok", "failed"] = "ok"
    error: str | None = None
    machine: MachineInfo
    measured_at_s: float
    points: tuple[LatencyPoint, ...] = ()
    fit_intercept_ms: float = 0.0
    fit_slope_ms: float = 0.0  # per row in the batch
    fit_error: float = 0.0  # max relative error of the fit at the measured points
    load_time_s: float = 0.0
    warmup_s: float = 0.0
    memory_mb: float = 0.0
    accuracy: float = 0.0
    price_usd_per_s: float = 0.0  # what the resources the variant holds cost per second

    def latency_ms(self, batch: int, quantile: Literal["p50", "p95", "p99", "mean"] = "p99") -> float:
        """Latency at any batch size up to the largest measured, by linear interpolation
        between measured points (exact at them); beyond the last point, the fitted line."""
        pts = self.points
        if not pts:
            return float("inf")
        attr = _QUANTILE_ATTRS[quantile]
        # Asked several times on every query's routing: no list of the batch sizes built per call.
        i = bisect.bisect_left(pts, batch, key=_batch_of)
        if i < len(pts) and pts[i].batch == batch:
            return float(getattr(pts[i], attr))
        if i == 0:
            return float(getattr(pts[0], attr))
        if i == len(pts):
            last = pts[-1]
            return float(getattr(last, attr)) + self.fit_slope_ms * (batch - last.batch)
        lo, hi = pts[i - 1], pts[i]
        frac = (batch - lo.batch) / (hi.batch - lo.batch)
        lo_v, hi_v = float(getattr(lo, attr)), float(getattr(hi, attr))
        return lo_v + frac * (hi_v - lo_v)

    def cost_usd_per_1k(self, batch: int = 1) -> float:
        """Cost per 1 000 rows when run in batches of `batch`: price × mean batch time ÷ rows."""
        mean_ms = self.latency_ms(batch, "mean")
        return self.price_usd_per_s * (mean_ms / 1000.0) / batch * 1000.0


class SLO(_Value):
    """A query's targets."""

    latency_ms: float = Field(gt=0)
    min_accuracy: float = Field(default=0.0, ge=0.0, le=1.0)
    max_cost_usd_per_1k: float | None = Field(default=None, ge=0.0)


class Decision(_Value):
    """The router's answer for one query."""

    variant: str
    architecture: str
    predicted_latency_ms: float
    cost_usd_per_1k: float
    accuracy: float
    reason: str
    load_hint: str | None = None  # a cheaper feasible variant the pool should load


class Targets(_Value):
    """A tenant's default targets for one task: what a request that carries none is held to."""

    tenant: str
    task: str
    latency_ms: float = Field(gt=0)
    min_accuracy: float = Field(default=0.0, ge=0.0, le=1.0)
    max_cost_usd_per_1k: float | None = Field(default=None, ge=0.0)

    @property
    def slo(self) -> SLO:
        return SLO(
            latency_ms=self.latency_ms,
            min_accuracy=self.min_accuracy,
            max_cost_usd_per_1k=self.max_cost_usd_per_1k,
        )


class Share(_Value):
    """A tenant's part of the service under contention (admin settings; `policy.admission`,
    `policy.fairqueue`): its `weight` against the other active tenants', and an optional rate
    quota (queries a second, with a burst of `burst` queries; default one second's worth)."""

    weight: float = Field(default=1.0, gt=0.0, le=1000.0)
    rate_qps: float | None = Field(default=None, gt=0.0)
    burst: float | None = Field(default=None, ge=1.0)


class Tenant(_Value):
    name: str
    role: Role = "tenant"
    created_at_s: float = 0.0
    revoked: bool = False
    share: Share = Field(default_factory=Share)
    expires_at_s: float | None = None  # epoch seconds; the key is refused from then on

    def expired(self, now_s: float) -> bool:
        return self.expires_at_s is not None and now_s >= self.expires_at_s


JobState = Literal["queued", "running", "done", "failed", "cancelled"]


class Job(_Value):
    """An offline batch job's record (`infaas.jobs`): rows in chunks, progress, what it cost."""

    id: str
    tenant: str
    task: str
    architecture: str | None = None
    min_accuracy: float = Field(default=0.0, ge=0.0, le=1.0)
    max_cost_usd_per_1k: float | None = Field(default=None, ge=0.0)
    rows: int = Field(ge=1)
    chunk_rows: int = Field(ge=1)
    chunks: int = Field(ge=1)
    chunks_done: int = 0
    state: JobState = "queued"
    cost_pusd: int = 0
    created_at_s: float
    started_at_s: float | None = None
    finished_at_s: float | None = None
    error: str | None = None
    variants: tuple[str, ...] = ()  # the variants its chunks ran on

    @property
    def rows_done(self) -> int:
        return min(self.rows, self.chunks_done * self.chunk_rows)


class Principal(_Value):
    """Who sent a request: a key's name and role, and the tenant's share (admission reads it)."""

    name: str
    role: Role
    share: Share = Field(default_factory=Share)
    expires_at_s: float | None = None  # epoch seconds (a cached key expires too)

    @classmethod
    def of(cls, tenant: Tenant) -> Principal:
        return cls(name=tenant.name, role=tenant.role, share=tenant.share, expires_at_s=tenant.expires_at_s)


class UsageKey(_Value):
    """Usage is aggregated per tenant × task × variant × minute (epoch minute)."""

    tenant: str
    task: str
    variant: str
    minute: int


class UsageDelta(_Value):
    """Integer counters to add to one usage key (queries, cost_pusd, slo_met, slo_missed, ...)."""

    key: UsageKey
    counters: dict[str, int]


class UsageRecord(_Value):
    key: UsageKey
    counters: dict[str, int]


# ---- usage counters and the fleet view (shared by metering, the usage API and the dashboard) ----

LATENCY_BUCKETS_MS: tuple[float, ...] = (
    0.25,
    0.5,
    1.0,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    50.0,
    75.0,
    100.0,
    200.0,
    500.0,
    1000.0,
)
"""Upper bounds of the latency histogram kept per usage row (counter ``lat_le_<ms>``; ``lat_inf``
counts the rest), so p50/p99 per tenant can be estimated from stored integer counters."""

COUNTER_QUERIES = "queries"
COUNTER_ROWS = "rows"
COUNTER_COST_PUSD = "cost_pusd"
COUNTER_RESERVED_PUSD = "reserved_pusd"  # the fleet's cost beyond charges, attributed (`policy.attribution`)
COUNTER_SLO_MET = "slo_met"
COUNTER_SLO_MISSED = "slo_missed"
COUNTER_REFUSED = "refused"
"""Queries refused as overloaded (429): not answered, not charged, but not in SLO either."""
COUNTER_FAILED = "failed"
"""Queries that failed on the service's side (5xx, or 504 deadline exceeded): not charged."""


def latency_bucket_counter(latency_ms: float) -> str:
    """Name of the histogram counter a latency falls in."""
    i = bisect.bisect_left(LATENCY_BUCKETS_MS, latency_ms)
    return "lat_inf" if i == len(LATENCY_BUCKETS_MS) else f"lat_le_{LATENCY_BUCKETS_MS[i]:g}"


class WorkerInfo(_Value):
    """One worker process as the fleet view shows it."""

    worker_id: str
    family: str  # runtime family hosted: onnxruntime | tensorflow | sklearn
    alive: bool
    loaded: tuple[str, ...]  # variant names, least recently used first
    memory_used_mb: float
    memory_budget_mb: float
    queue_depth: int = 0
    pid: int | None = None  # the worker's OS process (None until it answered once)
    channel: Literal["stream", "classic", "inline"] = "classic"  # how batches reach it
    node: str | None = None  # the Ray node it runs on (None: the front end's own process)


class FrontEndInfo(_Value):
    """One front end of a shared fleet, as it last told the others through the store."""

    name: str
    at_s: float  # when it last reported (wall clock)
    leader: bool = False  # holds the autoscaler lease
    # Per variant, its demand window's totals (`infaas.policy.demand.DemandWindow.totals`).
    demand: dict[str, tuple[float, ...]] = Field(default_factory=dict)


class FleetEvent(_Value):
    """A routing, loading, eviction or scaling decision, with its reason, for the fleet view."""

    at_s: float
    kind: Literal[
        "route",
        "load",
        "evict",
        "replicate",
        "unload",
        "crash",
        "recover",
        "retry",
        "quarantine",
        "place",
        "channel",
        "upgrade",
        "downgrade",
        "remove",
        "keep_warm",
        "canary",
        "promote",
        "rollback",
        "delete",
    ]
    variant: str
    worker_id: str | None = None
    reason: str
