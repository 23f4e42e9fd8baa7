"""The router's *snapshot* of tasks, architectures, variants and profiles from the store, as one
`VariantTable` per task and per architecture. The router (`infaas.router`) rebuilds it in the
background when the store's registrations or profiles change, and at once (rate-limited) when a
query names something the snapshot does not know yet. Profiles measured on another machine (a
different fingerprint: CPU model, cores, GPU) and failed profiles are left out, with a log line,
so latencies measured elsewhere are never mixed in silently; their variants serve again once
profiled here.

Pure but for `Snapshot.load`, which reads the store: it imports neither the router, the batcher
nor the autoscaler, so the simulator may use it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infaas.policy.selection import VariantTable
from infaas.store import MetadataStore
from infaas.types import (
    Architecture,
    Labels,
    MachineInfo,
    Profile,
    Task,
    Variant,
    split_version,
    version_name,
)
from profiler.machine import local_machine

__all__ = [
    "Catalog",
    "Machines",
    "Snapshot",
    "cheapest_variants",
    "choose_profile",
]


Catalog = dict[str, tuple[Variant, Profile | None]]
"""Variants by name with their usable profile (None: not usable here)."""


def cheapest_variants(variants: Catalog, architectures: set[str]) -> dict[str, str]:
    """Per architecture, its profiled variant with the lowest cost per query (the one warm-up
    loads and the warm floor keeps), on a CPU when the architecture has a CPU variant: GPUs are
    the scarce class, and a floor held idle on one would keep it from the variants that need it."""
    cheapest: dict[str, tuple[bool, float, str]] = {}
    for name, (variant, profile) in variants.items():
        if profile is None or variant.architecture not in architectures:
            continue
        key = (variant.spec.hardware == "gpu", profile.cost_usd_per_1k(1), name)
        best = cheapest.get(variant.architecture)
        if best is None or key < best:
            cheapest[variant.architecture] = key
    return {arch: key[2] for arch, key in cheapest.items()}


@dataclass(frozen=True)
class Machines:
    """Where a front end's variants run: its own machine, the classes of its Ray cluster's nodes,
    and the class of the node holding each loaded variant's replica (`RayPool.machines`)."""

    here: MachineInfo
    nodes: tuple[MachineInfo, ...] = ()
    replicas: Mapping[str, MachineInfo] = field(default_factory=dict)

    def fingerprints(self) -> set[str]:
        """The machine classes whose profiles may be used."""
        return {m.fingerprint for m in (self.here, *self.nodes, *self.replicas.values())}


def choose_profile(found: Sequence[Profile], machines: Machines, variant: str) -> Profile:
    """Of a variant's profiles (one per machine class), the one measured on the class of the node
    holding its replica, else on this machine, else on a node class of the cluster (a GPU
    variant profiled on a GPU node), else the newest (foreign: the caller leaves it out)."""
    for machine in (machines.replicas.get(variant), machines.here, *machines.nodes):
        if machine is None:
            continue
        same = [p for p in found if p.machine.fingerprint == machine.fingerprint]
        if same:
            return max(same, key=lambda p: p.measured_at_s)
    return max(found, key=lambda p: p.measured_at_s)


@dataclass(frozen=True)
class Snapshot:
    """Everything selection needs from the store, immutable; swapped whole on change."""

    fingerprint: str
    tasks: dict[str, Task]
    architectures: dict[str, Architecture]  # every stored version, by stored name (``net@2``)
    variants: Catalog
    by_task: dict[str, VariantTable]  # the stable versions' variants: what model-less routing sees
    by_architecture: dict[str, VariantTable]  # per stored version
    excluded: dict[str, str] = field(default_factory=dict)  # variant → why its profile is not used
    labels: dict[str, Labels] = field(default_factory=dict)  # per architecture (every one has some)
    serving: frozenset[str] = frozenset()  # stored names of the versions that take traffic

    @classmethod
    def empty(cls) -> Snapshot:
        return cls("", {}, {}, {}, {}, {})

    def table(self, task: str, architecture: str | None = None) -> VariantTable | None:
        """What serves a query: the task's stable versions, or one architecture's (`resolve`d)
        version; None when the name designates nothing."""
        if architecture is None:
            return self.by_task.get(task)
        arch = self.resolve(architecture)
        return None if arch is None else self.by_architecture.get(arch.name)

    def versions_of(self, line: str) -> dict[int, Architecture]:
        """An architecture's stored versions, by number."""
        return {a.version: a for a in self.architectures.values() if a.line == line}

    def resolve(self, name: str) -> Architecture | None:
        """The stored version a name designates: ``net`` (its stable), ``net@2``, ``net@stable``,
        ``net@canary``; None when there is no such version."""
        line, ref = split_version(name)
        labels = self.labels.get(line)
        if labels is None:
            return None
        if ref is None or ref == "stable":
            version: int | None = labels.stable
        elif ref == "canary":
            version = labels.canary
        else:
            version = int(ref) if ref.isdigit() else None
        return None if version is None else self.architectures.get(version_name(line, version))

    @classmethod
    def load(cls, store: MetadataStore, local: MachineInfo | Machines | None = None) -> Snapshot:
        """The store's registrations with the profiles usable where their variants run (`local`:
        this front end's machine, and on a cluster its nodes' classes; default: this machine)."""
        machines = local if isinstance(local, Machines) else Machines(local or local_machine())
        here = machines.here
        usable = machines.fingerprints()
        tasks = {t.name: t for t in store.list_tasks()}
        archs = {a.name: a for a in store.list_architectures()}
        labels = {lab.architecture: lab for lab in store.list_labels()}
        stored = {v.name: v for v in store.list_variants() if v.architecture in archs}
        measured: dict[str, list[Profile]] = {}
        for p in store.list_all_profiles():
            if p.variant in stored:
                measured.setdefault(p.variant, []).append(p)
        profiles: dict[str, Profile] = {}
        excluded: dict[str, str] = {}
        for name, found in sorted(measured.items()):
            variant, p = stored[name], choose_profile(found, machines, name)
            if p.status != "ok":
                excluded[name] = f"its profiling failed ({p.error or 'no reason recorded'})"
            elif p.machine.fingerprint not in usable:
                excluded[name] = (
                    f"it was profiled on another machine ({p.machine.fingerprint}; here "
                    f"{here.fingerprint}): run `infaas profile {variant.architecture}` to measure it here"
                )
            else:
                profiles[name] = p
        variants = {name: (v, profiles.get(name)) for name, v in stored.items()}
        digest = hashlib.sha256()
        for name in sorted(tasks):
            digest.update(tasks[name].model_dump_json().encode())
        for name in sorted(archs):
            digest.update(archs[name].model_dump_json().encode())
        for name in sorted(labels):
            digest.update(labels[name].model_dump_json().encode())
        for name in sorted(variants):
            variant, profile = variants[name]
            digest.update(variant.sha256.encode() + name.encode())
            digest.update(profile.model_dump_json().encode() if profile else b"-")
            digest.update(excluded.get(name, "").encode())
        return cls.build(digest.hexdigest(), tasks, archs, variants, excluded, labels)

    @classmethod
    def build(
        cls,
        fingerprint: str,
        tasks: dict[str, Task],
        archs: dict[str, Architecture],
        variants: dict[str, tuple[Variant, Profile | None]],
        excluded: dict[str, str] | None = None,
        labels: dict[str, Labels] | None = None,
    ) -> Snapshot:
        # Every architecture has labels: without a document, its one version is stable.
        all_labels = {a.line: Labels(architecture=a.line) for a in archs.values()} | (labels or {})
        by_arch: dict[str, list[tuple[Variant, Profile]]] = {name: [] for name in archs}
        by_task: dict[str, list[tuple[Variant, Profile]]] = {name: [] for name in tasks}
        for variant, profile in variants.values():
            if profile is None:
                continue
            arch = archs[variant.architecture]
            by_arch[arch.name].append((variant, profile))
            if arch.version == all_labels[arch.line].stable:
                by_task.setdefault(arch.task, []).append((variant, profile))
        return cls(
            fingerprint=fingerprint,
            tasks=tasks,
            architectures=archs,
            variants=variants,
            by_task={name: VariantTable(entries) for name, entries in by_task.items()},
            by_architecture={name: VariantTable(entries) for name, entries in by_arch.items()},
            excluded=dict(excluded or {}),
            labels=all_labels,
            serving=frozenset(n for n, a in archs.items() if a.version in all_labels[a.line].serving),
        )
