"""Wire schemas of the model routes (`/v1/models`, `/v1/tasks`): what crosses HTTP about
architectures, variants and tasks. Separate from the domain types in `infaas.types`; kept apart from
`infaas.api.schemas` so that the registration surface reads as one unit."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from infaas.api.profile_schemas import ProfileOut, profile_out
from infaas.api.schemas import NAME_PATTERN
from infaas.types import Architecture, Profile, SkippedVariant, Task, Variant
from infaas.versions import VersionsView

__all__ = [
    "ArchitectureOut",
    "CanaryIn",
    "DeletedOut",
    "GrantIn",
    "ModelMetadata",
    "ModelRegistered",
    "PromoteIn",
    "SkippedOut",
    "TaskOut",
    "VariantOut",
    "VariantsOut",
    "VersionOut",
    "VersionsOut",
    "architecture_out",
    "skipped_out",
    "task_out",
    "variant_out",
    "versions_out",
]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelMetadata(_Wire):
    """The `metadata` part of `POST /v1/models`."""

    name: str = Field(pattern=NAME_PATTERN, description="architecture name, e.g. digits-cnn")
    task: str = Field(pattern=NAME_PATTERN, description="task name; created by its first architecture")
    description: str = Field(default="", max_length=500)
    profile: bool = Field(
        default=True, description="measure the new variants now (false: later, with `infaas profile`)"
    )
    new_version: bool = Field(
        default=False,
        description="other bytes under an existing name become its next version (else 409)",
    )
    trust_pickle: bool = Field(
        default=False,
        description="a scikit-learn upload is a pickle, and unpickling it runs whatever code it "
        "holds, in the front end and the workers: the admin says so explicitly (else 400)",
    )


class ArchitectureOut(_Wire):
    name: str = Field(description="the stored name: version 1 is the bare name, later ones name@N")
    version: int
    task: str
    kind: str
    description: str
    owner: str
    created_at_s: float
    source_sha256: str
    variants: int
    skipped: int


class VariantOut(_Wire):
    name: str
    runtime: str
    hardware: str
    precision: str
    threads: int
    max_batch: int
    sha256: str
    top1_agreement: float
    max_abs_diff: float
    parity_samples: int
    profiled: bool
    profile: ProfileOut | None = Field(default=None, description="what was measured, if profiled")


class SkippedOut(_Wire):
    name: str
    reason: str


class VariantsOut(_Wire):
    architecture: str
    task: str
    variants: list[VariantOut]
    skipped: list[SkippedOut]


class TaskOut(_Wire):
    name: str
    input_shape: list[int]
    dtype: str
    num_classes: int
    validation_size: int
    description: str
    architectures: list[str]
    owners: list[str] = Field(description="owner keys that manage it (the admin always does)")


class ModelRegistered(_Wire):
    created: bool = Field(description="false: these bytes were already registered under this name")
    task_created: bool
    architecture: ArchitectureOut
    task: TaskOut
    variants: list[VariantOut]
    skipped: list[SkippedOut]


def architecture_out(arch: Architecture, variants: int, skipped: int) -> ArchitectureOut:
    return ArchitectureOut(
        name=arch.name,
        version=arch.version,
        task=arch.task,
        kind=arch.kind,
        description=arch.description,
        owner=arch.owner,
        created_at_s=arch.created_at_s,
        source_sha256=arch.source_sha256,
        variants=variants,
        skipped=skipped,
    )


def variant_out(variant: Variant, profile: Profile | None = None) -> VariantOut:
    spec = variant.spec
    return VariantOut(
        name=variant.name,
        runtime=spec.runtime,
        hardware=spec.hardware,
        precision=spec.precision,
        threads=spec.threads,
        max_batch=spec.max_batch,
        sha256=variant.sha256,
        top1_agreement=variant.parity.top1_agreement,
        max_abs_diff=variant.parity.max_abs_diff,
        parity_samples=variant.parity.samples,
        profiled=profile is not None and profile.status == "ok",
        profile=None if profile is None else profile_out(profile),
    )


def skipped_out(skipped: SkippedVariant) -> SkippedOut:
    return SkippedOut(name=skipped.name, reason=skipped.reason)


def task_out(task: Task, architectures: list[str]) -> TaskOut:
    return TaskOut(
        name=task.name,
        input_shape=list(task.input_spec.shape),
        dtype=task.input_spec.dtype,
        num_classes=task.num_classes,
        validation_size=task.validation_size,
        description=task.description,
        architectures=architectures,
        owners=list(task.owners),
    )


class CanaryIn(_Wire):
    version: int = Field(ge=1, description="the version that takes the share")
    share: float = Field(gt=0.0, lt=1.0, description="fraction of the architecture's queries, e.g. 0.1")


class PromoteIn(_Wire):
    version: int | None = Field(default=None, ge=1, description="default: the canary")
    force: bool = Field(default=False, description="admin only: promote past the accuracy guard")


class GrantIn(_Wire):
    owner: str = Field(pattern=NAME_PATTERN, description="an owner key's name")


class VersionOut(_Wire):
    version: int
    name: str = Field(description="what a query pins: architecture name@version")
    state: str = Field(description="loading | ready | serving | retired | failed")
    labels: list[str]
    accuracy: float | None
    variants: int
    loaded: list[str]
    created_at_s: float | None
    error: str | None


class VersionsOut(_Wire):
    architecture: str
    task: str
    stable: int
    canary: int | None
    canary_share: float = Field(description="the share set")
    observed_queries: int = Field(description="queries to the architecture since the share was set")
    observed_canary_share: float | None = Field(description="the share the canary really took")
    versions: list[VersionOut]


class DeletedOut(_Wire):
    architecture: str
    versions: list[int]
    variants: int
    artifacts_removed: int


def versions_out(view: VersionsView) -> VersionsOut:
    q = view.observed_queries
    return VersionsOut(
        architecture=view.architecture,
        task=view.task,
        stable=view.stable,
        canary=view.canary,
        canary_share=view.canary_share,
        observed_queries=q,
        observed_canary_share=view.observed_canary / q if q else None,
        versions=[
            VersionOut(
                version=v.version,
                name=v.name,
                state=v.state,
                labels=list(v.labels),
                accuracy=v.accuracy,
                variants=v.variants,
                loaded=list(v.loaded),
                created_at_s=v.created_at_s,
                error=v.error,
            )
            for v in view.versions
        ],
    )
