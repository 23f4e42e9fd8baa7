"""The metadata store: Protocol, and the typed layer shared by every backend.

Backends implement a handful of primitives over JSON documents (`put_docs`, `get_doc`, `list_docs`,
`delete_docs`) plus atomic integer counters for usage; `DocumentStore` turns those into the typed
`MetadataStore` API once, so the three backends cannot drift apart in behaviour. API keys are stored
only as SHA-256 hashes.
"""

from __future__ import annotations

import abc
import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from infaas.errors import Conflict, TenantNotFound
from infaas.types import (
    Architecture,
    FrontEndInfo,
    Job,
    Labels,
    MachineInfo,
    Profile,
    Share,
    SkippedVariant,
    Targets,
    Task,
    Tenant,
    UsageDelta,
    UsageRecord,
    Variant,
)

__all__ = [
    "CHANGE_LOG_LENGTH",
    "Change",
    "ChangeKind",
    "DocumentStore",
    "MetadataStore",
    "UsageMark",
    "hash_key",
]

M = TypeVar("M", bound=BaseModel)

UsageMark = tuple[str, int]
"""(source, seq): which usage journal a batch of counters comes from, and the last entry it holds."""

ChangeKind = Literal["model", "tenant"]


class Change(NamedTuple):
    """One entry of the store's change log: what another front end must re-read. ``model``: a
    task, architecture, version label or profile (`name` is the architecture or task); ``tenant``:
    a revocation, share or expiry (`name` is the tenant)."""

    seq: int
    kind: ChangeKind
    name: str


CHANGE_LOG_LENGTH = 10_000
"""Entries the change log keeps; a reader further behind sees a gap and re-reads everything."""

# Document kinds: one namespace each.
TASK, ARCH, VARIANT, SKIPPED, PROFILE, TENANT, KEY, TENANT_KEY, LABELS, TARGETS, JOB, FRONT_END, USED = (
    "task",
    "arch",
    "variant",
    "skipped",
    "profile",
    "tenant",
    "key",
    "tenant_key",
    "labels",
    "targets",
    "job",
    "front_end",
    "tenant_used",  # a document of its own: a touch never races a revoke's write of the tenant
)


def hash_key(api_key: str) -> str:
    """Keys are random 32-byte tokens, so a plain SHA-256 (no salt, no stretching) is enough."""
    return hashlib.sha256(api_key.encode()).hexdigest()


@runtime_checkable
class MetadataStore(Protocol):
    """Everything infaas persists except artifact bytes (those live under data_dir)."""

    def put_task(self, task: Task) -> None: ...
    def get_task(self, name: str) -> Task | None: ...
    def list_tasks(self) -> list[Task]: ...

    def register_architecture(
        self,
        arch: Architecture,
        variants: Sequence[Variant],
        skipped: Sequence[SkippedVariant],
        task: Task | None = None,
        labels: Labels | None = None,
    ) -> None:
        """Write an architecture, its variants (and its new task, its labels) in one atomic step."""
        ...

    def get_architecture(self, name: str) -> Architecture | None: ...
    def list_architectures(self, task: str | None = None) -> list[Architecture]: ...
    def delete_architecture(self, name: str) -> None: ...

    def get_labels(self, architecture: str) -> Labels | None: ...
    def list_labels(self) -> list[Labels]: ...
    def put_labels(self, labels: Labels) -> None: ...
    def delete_labels(self, architecture: str) -> None: ...

    def get_targets(self, tenant: str, task: str) -> Targets | None: ...
    def list_targets(self, tenant: str) -> list[Targets]: ...
    def put_targets(self, targets: Targets) -> None: ...

    def get_job(self, job_id: str) -> Job | None: ...
    def list_jobs(self) -> list[Job]: ...
    def put_job(self, job: Job) -> None: ...

    def get_variant(self, name: str) -> Variant | None: ...
    def list_variants(self, architecture: str | None = None) -> list[Variant]: ...
    def list_skipped(self, architecture: str | None = None) -> list[SkippedVariant]: ...

    def put_profile(self, profile: Profile) -> None:
        """Keep `profile` as its variant's profile on its machine class (`MachineInfo.machine_class`):
        front ends or nodes on other hardware keep theirs beside it."""
        ...

    def get_profile(self, variant: str, machine: MachineInfo | None = None) -> Profile | None:
        """`variant`'s profile on `machine`'s class, else (or without `machine`) its newest."""
        ...

    def list_profiles(
        self, architecture: str | None = None, machine: MachineInfo | None = None
    ) -> list[Profile]:
        """One profile per variant (of `architecture`), chosen as `get_profile` does."""
        ...

    def list_all_profiles(self, architecture: str | None = None) -> list[Profile]:
        """Every machine class's profiles (of `architecture`)."""
        ...

    def create_tenant(self, tenant: Tenant, api_key: str) -> None: ...
    def tenant_for_key(self, api_key: str) -> Tenant | None: ...
    def get_tenant(self, name: str) -> Tenant | None: ...
    def list_tenants(self) -> list[Tenant]: ...
    def revoke_tenant(self, name: str) -> None: ...
    def touch_tenant(self, name: str, at_s: float) -> None:
        """Record that `name`'s key was used at `at_s` (epoch seconds; callers rate-limit it)."""
        ...

    def last_used(self) -> dict[str, float]:
        """Each tenant's last recorded use (tenants never used are absent)."""
        ...

    def set_share(self, name: str, share: Share) -> Tenant:
        """Set an active tenant's share (weight, rate quota); the updated tenant."""
        ...

    def add_usage(self, deltas: Sequence[UsageDelta], mark: UsageMark | None = None) -> bool:
        """Add integer counters atomically (all deltas or none). With a `mark` (source, seq), the
        add happens only if the store's mark for that source is below `seq`, and the mark moves to
        `seq` in the same atomic step: a batch replayed after a crash is never counted twice.
        Returns False when the mark said the batch was already counted."""
        ...

    def usage_mark(self, source: str) -> int:
        """The highest `seq` counted for `source` (0 when none)."""
        ...

    def usage(
        self, tenant: str | None = None, from_minute: int | None = None, to_minute: int | None = None
    ) -> list[UsageRecord]:
        """Usage rows in [from_minute, to_minute], optionally for one tenant, sorted by key."""
        ...

    def put_front_end(self, info: FrontEndInfo) -> None: ...
    def list_front_ends(self) -> list[FrontEndInfo]: ...
    def delete_front_end(self, name: str) -> None: ...

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take the lease `name` for `holder`, or renew it when `holder` has it, for `ttl_s`
        seconds; True when `holder` holds it now. One holder at a time, atomically."""
        ...

    def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up if `holder` has it (a clean stop: the next holder need not wait)."""
        ...

    def publish_change(self, kind: ChangeKind, name: str) -> int:
        """Append to the change log (the typed writes do it themselves); its sequence number."""
        ...

    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        """The change log's entries after `seq`, oldest first, at most `limit` (the log keeps the
        last `CHANGE_LOG_LENGTH`)."""
        ...

    def change_cursor(self) -> int:
        """The last sequence number in the change log (0 when empty)."""
        ...

    def close(self) -> None: ...


class DocumentStore(abc.ABC):
    """Typed `MetadataStore` built on a backend's document and counter primitives."""

    # ---- backend primitives -------------------------------------------------------------
    @abc.abstractmethod
    def put_docs(self, docs: Iterable[tuple[str, str, str]]) -> None:
        """Write (kind, key, json) documents in one atomic step."""

    @abc.abstractmethod
    def get_doc(self, kind: str, key: str) -> str | None: ...

    @abc.abstractmethod
    def list_docs(self, kind: str, prefix: str = "") -> list[str]:
        """Documents of a kind whose key starts with `prefix`, ordered by key."""

    @abc.abstractmethod
    def delete_docs(self, kind: str, prefix: str, exact: bool = False) -> None:
        """Delete the documents of a kind whose key starts with `prefix`, or equals it when
        `exact` (atomic per call)."""

    @abc.abstractmethod
    def add_usage(self, deltas: Sequence[UsageDelta], mark: UsageMark | None = None) -> bool: ...

    @abc.abstractmethod
    def usage_mark(self, source: str) -> int: ...

    @abc.abstractmethod
    def usage(
        self, tenant: str | None = None, from_minute: int | None = None, to_minute: int | None = None
    ) -> list[UsageRecord]: ...

    @abc.abstractmethod
    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool: ...

    @abc.abstractmethod
    def release_lease(self, name: str, holder: str) -> None: ...

    @abc.abstractmethod
    def publish_change(self, kind: ChangeKind, name: str) -> int: ...

    @abc.abstractmethod
    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]: ...

    @abc.abstractmethod
    def change_cursor(self) -> int: ...

    def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release connections; the default backend holds none."""

    # ---- typed layer --------------------------------------------------------------------
    def _get(self, model: type[M], kind: str, key: str) -> M | None:
        raw = self.get_doc(kind, key)
        return None if raw is None else model.model_validate_json(raw)

    def _list(self, model: type[M], kind: str, prefix: str = "") -> list[M]:
        return [model.model_validate_json(raw) for raw in self.list_docs(kind, prefix)]

    def put_task(self, task: Task) -> None:
        self.put_docs([(TASK, task.name, task.model_dump_json())])
        self.publish_change("model", task.name)

    def get_task(self, name: str) -> Task | None:
        return self._get(Task, TASK, name)

    def list_tasks(self) -> list[Task]:
        return self._list(Task, TASK)

    def register_architecture(
        self,
        arch: Architecture,
        variants: Sequence[Variant],
        skipped: Sequence[SkippedVariant],
        task: Task | None = None,
        labels: Labels | None = None,
    ) -> None:
        docs: list[tuple[str, str, str]] = []
        if task is not None:
            docs.append((TASK, task.name, task.model_dump_json()))
        if labels is not None:
            docs.append((LABELS, labels.architecture, labels.model_dump_json()))
        docs.append((ARCH, arch.name, arch.model_dump_json()))
        docs += [(VARIANT, v.name, v.model_dump_json()) for v in variants]
        docs += [(SKIPPED, s.name, s.model_dump_json()) for s in skipped]
        self.put_docs(docs)
        self.publish_change("model", arch.name)

    def get_architecture(self, name: str) -> Architecture | None:
        return self._get(Architecture, ARCH, name)

    def list_architectures(self, task: str | None = None) -> list[Architecture]:
        archs = self._list(Architecture, ARCH)
        return [a for a in archs if task is None or a.task == task]

    def delete_architecture(self, name: str) -> None:
        """Delete one stored architecture (one version) with its variants and profiles; usage,
        keyed by variant name, stays."""
        prefix = f"{name}/"
        for kind in (VARIANT, SKIPPED, PROFILE):
            self.delete_docs(kind, prefix)
        self.delete_docs(ARCH, name, exact=True)
        self.publish_change("model", name)

    def get_labels(self, architecture: str) -> Labels | None:
        return self._get(Labels, LABELS, architecture)

    def list_labels(self) -> list[Labels]:
        return self._list(Labels, LABELS)

    def put_labels(self, labels: Labels) -> None:
        self.put_docs([(LABELS, labels.architecture, labels.model_dump_json())])
        self.publish_change("model", labels.architecture)

    def delete_labels(self, architecture: str) -> None:
        self.delete_docs(LABELS, architecture, exact=True)
        self.publish_change("model", architecture)

    def get_targets(self, tenant: str, task: str) -> Targets | None:
        return self._get(Targets, TARGETS, f"{tenant}/{task}")

    def list_targets(self, tenant: str) -> list[Targets]:
        return self._list(Targets, TARGETS, f"{tenant}/")

    def put_targets(self, targets: Targets) -> None:
        self.put_docs([(TARGETS, f"{targets.tenant}/{targets.task}", targets.model_dump_json())])

    def get_job(self, job_id: str) -> Job | None:
        return self._get(Job, JOB, job_id)

    def list_jobs(self) -> list[Job]:
        return self._list(Job, JOB)

    def put_job(self, job: Job) -> None:
        self.put_docs([(JOB, job.id, job.model_dump_json())])

    def get_variant(self, name: str) -> Variant | None:
        return self._get(Variant, VARIANT, name)

    def list_variants(self, architecture: str | None = None) -> list[Variant]:
        return self._list(Variant, VARIANT, f"{architecture}/" if architecture else "")

    def list_skipped(self, architecture: str | None = None) -> list[SkippedVariant]:
        return self._list(SkippedVariant, SKIPPED, f"{architecture}/" if architecture else "")

    def put_profile(self, profile: Profile) -> None:
        key = f"{profile.variant}@{profile.machine.machine_class}"
        self.put_docs([(PROFILE, key, profile.model_dump_json())])
        self.publish_change("model", profile.variant.split("/", 1)[0])

    def get_profile(self, variant: str, machine: MachineInfo | None = None) -> Profile | None:
        found = [p for p in self._list(Profile, PROFILE, variant) if p.variant == variant]
        return _pick_profile(found, machine)

    def list_all_profiles(self, architecture: str | None = None) -> list[Profile]:
        return self._list(Profile, PROFILE, f"{architecture}/" if architecture else "")

    def list_profiles(
        self, architecture: str | None = None, machine: MachineInfo | None = None
    ) -> list[Profile]:
        by_variant: dict[str, list[Profile]] = {}
        for p in self.list_all_profiles(architecture):
            by_variant.setdefault(p.variant, []).append(p)
        picked = (_pick_profile(found, machine) for _, found in sorted(by_variant.items()))
        return [p for p in picked if p is not None]

    def create_tenant(self, tenant: Tenant, api_key: str) -> None:
        existing = self.get_tenant(tenant.name)
        if existing is not None and not existing.revoked:
            raise Conflict(f"tenant {tenant.name!r} already exists", tenant=tenant.name)
        digest = hash_key(api_key)
        self.put_docs(
            [
                (TENANT, tenant.name, tenant.model_dump_json()),
                (KEY, digest, tenant.name),
                (TENANT_KEY, tenant.name, digest),
            ]
        )
        self.delete_docs(USED, tenant.name, exact=True)  # a name re-created after a revoke

    def tenant_for_key(self, api_key: str) -> Tenant | None:
        name = self.get_doc(KEY, hash_key(api_key))
        if name is None:
            return None
        tenant = self.get_tenant(name)
        return None if tenant is None or tenant.revoked or tenant.expired(time.time()) else tenant

    def get_tenant(self, name: str) -> Tenant | None:
        return self._get(Tenant, TENANT, name)

    def list_tenants(self) -> list[Tenant]:
        return self._list(Tenant, TENANT)

    def revoke_tenant(self, name: str) -> None:
        tenant = self.get_tenant(name)
        if tenant is None or tenant.revoked:
            raise TenantNotFound(f"no active tenant {name!r}", tenant=name)
        # Flag first (the key is refused from here on), then drop the key so that a tenant
        # re-created under the same name does not revive the old key.
        self.put_docs([(TENANT, name, tenant.model_copy(update={"revoked": True}).model_dump_json())])
        digest = self.get_doc(TENANT_KEY, name)
        if digest is not None:
            self.delete_docs(KEY, digest, exact=True)
        self.publish_change("tenant", name)

    def touch_tenant(self, name: str, at_s: float) -> None:
        self.put_docs([(USED, name, json.dumps([name, at_s]))])

    def last_used(self) -> dict[str, float]:
        return {name: float(at_s) for name, at_s in map(json.loads, self.list_docs(USED))}

    def set_share(self, name: str, share: Share) -> Tenant:
        tenant = self.get_tenant(name)
        if tenant is None or tenant.revoked:
            raise TenantNotFound(f"no active tenant {name!r}", tenant=name)
        updated = tenant.model_copy(update={"share": share})
        self.put_docs([(TENANT, name, updated.model_dump_json())])
        self.publish_change("tenant", name)
        return updated

    def put_front_end(self, info: FrontEndInfo) -> None:
        self.put_docs([(FRONT_END, info.name, info.model_dump_json())])

    def list_front_ends(self) -> list[FrontEndInfo]:
        return self._list(FrontEndInfo, FRONT_END)

    def delete_front_end(self, name: str) -> None:
        self.delete_docs(FRONT_END, name, exact=True)


def _pick_profile(found: list[Profile], machine: MachineInfo | None) -> Profile | None:
    """The newest profile measured on `machine`'s class, else the newest of all (a caller that
    compares fingerprints then sees it is foreign)."""
    if machine is not None:
        here = [p for p in found if p.machine.fingerprint == machine.fingerprint]
        found = here or found
    return max(found, key=lambda p: p.measured_at_s, default=None)
