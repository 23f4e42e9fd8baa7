"""Wire schemas: what crosses HTTP. Separate from the domain types in `infaas.types`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

__all__ = [
    "QueryRequest",
    "QueryResponse",
    "Readiness",
    "ShareIn",
    "TargetsIn",
    "TargetsOut",
    "TenantCreate",
    "TenantCreated",
    "TenantOut",
    "UsageResponse",
    "UsageRow",
]

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Readiness(_Wire):
    """``GET /readyz``, with 200 or 503: each check is `true`, or why it fails (`false` or a reason)."""

    ready: bool
    checks: dict[str, bool | str]


class TenantCreate(_Wire):
    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "acme"}]})

    name: str = Field(pattern=NAME_PATTERN, description="lowercase letters, digits, '.', '_', '-'")
    role: Literal["tenant", "owner"] = Field(
        default="tenant",
        description="tenant: queries; owner: also registers and manages models in the tasks it owns",
    )
    expires_in_s: float | None = Field(
        default=None,
        gt=0.0,
        le=10 * 365 * 86400.0,
        description="the key is refused this many seconds after its creation (unset: never)",
    )


class TenantCreated(_Wire):
    name: str
    role: str = "tenant"
    api_key: str = Field(description="shown once; only its hash is stored")
    expires_at_s: float | None = Field(default=None, description="epoch seconds; unset: never")


class ShareIn(_Wire):
    """A tenant's share under contention: admission and each variant's queue serve the active
    tenants in proportion to their weights; an optional rate quota refuses (429) what exceeds it."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"weight": 2.0, "rate_qps": 100.0}]})

    weight: float = Field(
        default=1.0, gt=0.0, le=1000.0, description="relative to the other tenants' (default 1)"
    )
    rate_qps: float | None = Field(
        default=None, gt=0.0, le=1e6, description="quota: queries a second (none: no quota)"
    )
    burst: float | None = Field(
        default=None,
        ge=1.0,
        le=1e7,
        description="queries the quota lets through at once (default: one second's worth)",
    )


class TenantOut(_Wire):
    name: str
    role: str
    created_at_s: float
    revoked: bool
    share: ShareIn
    expires_at_s: float | None = Field(default=None, description="epoch seconds; unset: never")
    last_used_s: float | None = Field(
        default=None, description="epoch seconds of the key's last use, to within a minute; unset: never used"
    )


# ---- the query path --------------------------------------------------------------------------


# The first image of scikit-learn's digits set (a 0), scaled to [0, 1] as the built-in zoo's
# `digits-classification` task takes it: the document's example is a query that gets an answer.
_DIGIT_ZERO: list[JsonValue] = [
    0.0, 0.0, 0.3125, 0.8125, 0.5625, 0.0625, 0.0, 0.0, 0.0, 0.0, 0.8125, 0.9375, 0.625, 0.9375, 0.3125, 0.0,
    0.0, 0.1875, 0.9375, 0.125, 0.0, 0.6875, 0.5, 0.0, 0.0, 0.25, 0.75, 0.0, 0.0, 0.5, 0.5, 0.0,
    0.0, 0.3125, 0.5, 0.0, 0.0, 0.5625, 0.5, 0.0, 0.0, 0.25, 0.6875, 0.0, 0.0625, 0.75, 0.4375, 0.0,
    0.0, 0.125, 0.875, 0.3125, 0.625, 0.75, 0.0, 0.0, 0.0, 0.0, 0.375, 0.8125, 0.625, 0.0, 0.0, 0.0,
]  # fmt: skip


class QueryRequest(_Wire):
    """``POST /v1/query``: a task and targets (model-less), or a pinned architecture or variant."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "task": "digits-classification",
                    "inputs": [_DIGIT_ZERO],
                    "latency_ms": 50,
                    "min_accuracy": 0.9,
                }
            ]
        }
    )

    task: str = Field(min_length=1, max_length=200)
    # Checked against the task's input spec by the route (shape, dtype, finite), not here: a
    # nested float list validated element by element would cost more than the inference. The
    # document still says what the route accepts: at least one row, each row an array.
    inputs: list[Any] = Field(
        description="rows of the task's input shape (or flattened rows)",
        json_schema_extra={"minItems": 1, "items": {"type": "array"}},
    )
    latency_ms: float = Field(gt=0, le=3_600_000, description="end-to-end bound at the server")
    min_accuracy: float = Field(default=0.0, ge=0.0, le=1.0)
    max_cost_usd_per_1k: float | None = Field(default=None, ge=0.0)
    architecture: str | None = Field(default=None, description="pin a model; infaas picks its variant")
    variant: str | None = Field(default=None, description="pin an exact variant")


class TargetsIn(_Wire):
    """A tenant's default targets for one task."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"latency_ms": 50, "min_accuracy": 0.9}]})

    latency_ms: float = Field(gt=0, le=3_600_000)
    min_accuracy: float = Field(default=0.0, ge=0.0, le=1.0)
    max_cost_usd_per_1k: float | None = Field(default=None, ge=0.0)


class TargetsOut(TargetsIn):
    task: str


class QueryResponse(_Wire):
    outputs: list[list[float]]
    variant: str
    architecture: str
    accuracy: float
    predicted_latency_ms: float
    latency_ms: float = Field(description="measured at the server, from receipt to reply")
    cost_usd: float
    cost_pusd: int = Field(description="the exact charge in pico-dollars (what usage sums)")
    slo_met: bool
    batch_rows: int = Field(description="rows in the batch this query ran in")
    reason: str
    load_hint: str | None = None


class UsageRow(_Wire):
    task: str
    variant: str
    minute: int
    counters: dict[str, int]


class UsageResponse(_Wire):
    """``GET /v1/usage``: the calling tenant's own usage."""

    tenant: str
    from_minute: int | None
    to_minute: int | None
    totals: dict[str, int]
    cost_usd: float
    rows: list[UsageRow]
