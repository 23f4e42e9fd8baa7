"""The one place configuration is read.

`Settings` is built once, by the CLI or the app factory, and passed down. Nothing else in infaas
reads the environment (style rule: configuration read at import time forces tests to re-run under
environment permutations).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from infaas.policy.autoscaling import ActionKind

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Service configuration; every field can be set as ``INFAAS_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="INFAAS_", frozen=True, extra="ignore")

    data_dir: Path = Field(default=Path("~/.infaas"), description="Artifacts, SQLite store, admin key.")
    redis_url: str | None = Field(default=None, description="Unset: embedded SQLite at data_dir/infaas.db.")
    ray_address: str | None = Field(default=None, description="Unset: start a lean local Ray.")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    admin_key: str | None = Field(default=None, description="Unset: generated at first start into data_dir.")
    price_table: Path | None = Field(default=None, description="JSON price table; unset: built-in defaults.")
    max_upload_mb: float = Field(default=200.0, gt=0, description="Largest accepted model upload.")
    max_request_mb: float = Field(default=16.0, gt=0, description="Largest accepted query body.")
    http_lane: bool = Field(
        default=True,
        description="`infaas serve` answers POST /v1/query in its HTTP protocol, with no ASGI cycle or "
        "middleware (infaas.api.door); false: every query goes through the ASGI app.",
    )
    door_refusal_share: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="While answers are in flight, the most of a front end's time that refusing a "
        "flood at the door may take; a refused connection's further requests wait in its socket "
        "(infaas.api.door.PacedReads). 1: not paced.",
    )
    worker_memory_budget_mb: float = Field(default=2048.0, gt=0, description="Per worker process.")
    usage_flush_interval_s: float = Field(default=1.0, gt=0)
    change_poll_interval_s: float = Field(
        default=0.25,
        gt=0,
        description="How often each front end reads the store's change log: a key revoked, a share "
        "changed or a model registered on another front end takes effect here within this.",
    )
    key_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="While the store is unreachable, a tenant key confirmed within this many "
        "seconds is still answered; after that it is refused (503) until the store answers.",
    )
    autoscale_interval_s: float = Field(default=1.0, ge=0, description="Autoscaler round; 0: off.")
    autoscale: bool = Field(
        default=True,
        description="false: the fleet stays as the query path loads it (a static deployment); the "
        "rounds still account its cost.",
    )
    autoscale_downscale_delay_s: float = Field(
        default=30.0,
        ge=0,
        description="Hold-down: how long fewer replicas (or a cheaper variant) must suffice before the "
        "autoscaler removes any; also the quiet time after a scale-up before anything goes down.",
    )
    autoscale_actions: str = Field(
        default="replicate,remove,upgrade,downgrade,unload,keep_warm",
        description="The actions the autoscaler may take, comma-separated; e.g. replicate,remove for a "
        "replica-only autoscaler (Ray Serve or SageMaker-like: the baseline the benchmarks compare with).",
    )
    record_trace: Path | None = Field(
        default=None,
        description="Append every query (time_s,tenant,task,rows,latency_ms,min_accuracy) to this CSV, "
        "for `infaas simulate --trace` to replay; unset: off.",
    )
    autoscale_upscale_delay_s: float = Field(
        default=2.0, ge=0, description="How long a variant must need more capacity before it gets it."
    )
    autoscale_target_utilization: float = Field(
        default=0.7, gt=0, le=1, description="Arrival rate ÷ capacity the autoscaler keeps each variant at."
    )
    max_replicas_per_variant: int | None = Field(
        default=None, ge=1, description="Replicas of one variant; unset: as many as free resources allow."
    )
    front_end_cpus: float = Field(
        default=1.0,
        ge=0,
        description="vCPUs the front end itself uses (HTTP, batching, the fast path): left out of what the "
        "autoscaler may give replicas.",
    )
    ray_num_cpus: int | None = Field(
        default=None,
        ge=1,
        description="Logical CPUs of the local Ray this front end starts; unset: the machine's.",
    )
    profile_quick: bool = Field(
        default=False,
        description="Profile models registered through the API with fewer iterations (seconds, not "
        "minutes; noisier figures): for demos and tests.",
    )
    warm_ttl_s: float = Field(
        default=3600.0,
        ge=0,
        description="Warm floor: the cheapest variant of every architecture with traffic (or registered) "
        "within this many seconds stays loaded.",
    )
    store_timeout_s: float = Field(
        default=2.0, gt=0, description="Bound on each store call (Redis socket, SQLite lock wait)."
    )
    usage_journal: Literal["fsync", "os", "off"] = Field(
        default="os",
        description="Write every charge to a local journal before its answer is sent, replayed into "
        "the store at start. os: handed to the OS before the answer (survives a crash of the "
        "process) and synced to disk in the background before every usage flush (a power cut loses "
        "at most the last usage_flush_interval_s of charges); fsync: on disk before the answer "
        "(survives a power cut; ~1 ms more latency here); off.",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM/SIGINT, how long in-flight requests may take to finish; also how "
        "long a version that stopped serving drains before it is unloaded.",
    )
    default_latency_ms: float = Field(
        default=1000.0,
        gt=0,
        description="The latency target of a request that carries no targets (KServe V2, TF Serving "
        "REST) from a tenant that stored no default targets for its task.",
    )
    job_chunk_rows: int = Field(
        default=8192,
        ge=1,
        description="Rows per chunk of an offline job: its unit of progress, charging and resuming.",
    )
    job_share: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="While online queries flow (one was queued in the last second), the share of "
        "wall time an offline job may keep a worker busy; alone, a job runs flat out.",
    )
    promote_accuracy_tolerance: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description="A promotion is refused when the candidate version's measured accuracy is below "
        "the stable version's by more than this (the admin can force it).",
    )
    quarantine_after_failures: int = Field(
        default=3, ge=1, description="Failed loads or crashed batches in a row before a variant is set aside."
    )
    quarantine_backoff_s: float = Field(
        default=30.0, gt=0, description="First quarantine; doubles on each relapse, up to 32x."
    )
    max_workers_per_family: int | None = Field(
        default=None, ge=1, description="Ray workers per runtime family; unset: the cluster's CPUs."
    )
    batches_in_flight_per_replica: int = Field(
        default=2, ge=1, description="Batches of a variant running at once on each of its replicas."
    )
    max_queue_rows: int = Field(
        default=4096, ge=1, description="Rows waiting per variant; beyond, new queries get 429."
    )
    min_queries_in_flight: int = Field(
        default=8,
        ge=1,
        description="Floor of the front end's limit on admitted queries in flight (learned from late "
        "answers, infaas/policy/admission.py): this many concurrent queries are never refused by it.",
    )
    worker_channel: Literal["stream", "classic"] = Field(
        default="stream",
        description="How batches reach Ray workers: a socket stream from each front end to each worker "
        "(stream), or a classic actor call per batch (classic).",
    )
    worker_call_timeout_s: float = Field(
        default=60.0, gt=0, description="Bound on one call to a Ray worker (a load or a batch)."
    )
    artifact_store: Literal["auto", "local", "redis"] = Field(
        default="auto",
        description="Where workers get artifacts: local (the data directory; one machine) or redis (the "
        "shared store; any node of a cluster). auto: redis when INFAAS_REDIS_URL is set.",
    )
    fast_path_max_ms: float = Field(
        default=0.25,
        ge=0,
        description="Variants whose profiled single-row p99 is below this run in the front end itself, "
        "not on a Ray worker (the hop costs more than they do); 0: every variant runs on Ray workers.",
    )
    lone_max_ms: float = Field(
        default=5.0,
        ge=0,
        description="A Ray-served ONNX Runtime or scikit-learn variant whose profiled single-row p99 is "
        "below this keeps a copy in the front end that answers a query arriving while no other is in "
        "flight (no Ray hop: ~0.7 ms at c=1); 0: never.",
    )
    lone_memory_mb: float = Field(
        default=512.0,
        gt=0,
        description="Memory budget of the front end's lone copies (least recently used evicted).",
    )
    fleet_namespace: str = Field(
        default="infaas",
        min_length=1,
        description="Ray namespace of the shared fleet's named workers (with INFAAS_RAY_ADDRESS).",
    )
    fleet_sync_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="With INFAAS_RAY_ADDRESS: how often a front end re-reads the shared fleet (workers "
        "and what they hold) and exchanges demand with the other front ends through the store.",
    )
    front_end_name: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9_.-]*$",
        description="This front end's name among several on one data dir (`serve --workers` sets it): "
        "names its usage journal; empty: the data dir's single journal.",
    )
    gpu_per_worker: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Share of a GPU each GPU worker actor requests, so Ray places it on a GPU node; "
        "the fleet's cost counts that share of a GPU's price per replica.",
    )
    require_redis: bool = Field(default=False, description="Tests: fail instead of skip without Redis.")

    @field_validator("autoscale_actions", mode="after")
    @classmethod
    def _known_actions(cls, value: str) -> str:
        known = set(get_args(ActionKind))
        asked = {a.strip() for a in value.split(",") if a.strip()}
        if asked - known:
            raise ValueError(f"unknown autoscaler action(s) {sorted(asked - known)}; known: {sorted(known)}")
        return ",".join(sorted(asked))

    @field_validator("data_dir", "price_table", "record_trace", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser().resolve() if value is not None else None

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "infaas.db"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def journal_path(self) -> Path:
        journal = self.data_dir / "usage-journal"
        return journal / self.front_end_name if self.front_end_name else journal

    @property
    def shared_fleet(self) -> bool:
        """Whether other front ends may share this one's Ray workers: true when it joins a Ray
        cluster (`ray_address`) rather than starting its own."""
        return self.ray_address is not None

    @property
    def admin_key_path(self) -> Path:
        return self.data_dir / "admin_key"
