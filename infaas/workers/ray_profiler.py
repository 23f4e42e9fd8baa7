"""Profiling on the cluster: each variant measured on a node of every machine class that may run it.

`ProcessProfiler` measures on the host it runs on. On a shared fleet the front end that registers
a model need not be (or be like) the nodes that serve it, so `RayProfiler` runs a `ProcessProfiler`
in a Ray task pinned to one node of each machine class of the cluster (for a GPU variant, only the
classes with a GPU). The task fetches the artifacts and the task's validation split from the shared
artifact store into its node's cache, measures there (a fresh process per variant, as on one
machine), and returns the profiles; the front end stores them, one per variant and machine class.
The router then predicts each variant with the profile of the class where its replica sits
(`infaas.snapshot.choose_profile`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infaas.artifacts import RedisArtifacts
from infaas.settings import Settings
from infaas.store import MetadataStore
from infaas.types import MachineInfo, Profile, Task, Variant
from infaas.workers.ray_pool import pinned, probe_machine
from profiler.cost import PriceTable, load_price_table

__all__ = ["RayProfiler", "profile_here"]

_PROFILE_TIMEOUT_S = 3600.0


def profile_here(
    variants_json: list[str], task_json: str, artifacts: RedisArtifacts, quick: bool, prices: PriceTable
) -> list[str]:
    """The body of the pinned task: measure `variants` on this node, artifacts fetched by hash."""
    from infaas.store import MemoryStore
    from profiler.process import ProcessProfiler

    variants = [Variant.model_validate_json(v) for v in variants_json]
    task = Task.model_validate_json(task_json)
    with tempfile.TemporaryDirectory(prefix="infaas-profile-") as tmp:
        # A data directory of links into this node's artifact cache: the layout ProcessProfiler reads.
        artifacts_dir = Path(tmp) / "data" / "artifacts"
        for rel in {v.artifact for v in variants} | {task.validation_artifact}:
            link = artifacts_dir / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(artifacts.root_path(rel) / rel)
        settings = Settings(data_dir=Path(tmp) / "data")
        profiler = ProcessProfiler(settings, MemoryStore(), quick=quick, prices=prices)
        return [p.model_dump_json() for p in profiler.profile_variants(variants, task)]


class RayProfiler:
    """`VariantProfiler` over a Ray cluster (see the module docstring)."""

    def __init__(
        self, settings: Settings, store: MetadataStore, artifacts: RedisArtifacts, *, quick: bool
    ) -> None:
        self._store = store
        self._artifacts = artifacts.for_nodes()
        self._quick = quick
        self._prices = load_price_table(settings.price_table)

    def profile_variants(self, variants: Sequence[Variant], task: Task) -> list[Profile]:
        import ray

        remote = ray.remote(num_cpus=0.01, max_retries=0)(profile_here)
        runs: list[Any] = []
        for node, machine in self.node_classes().items():
            todo = [v for v in variants if v.spec.hardware != "gpu" or machine.gpu]
            if todo:
                args = ([v.model_dump_json() for v in todo], task.model_dump_json(), self._artifacts)
                runs.append(
                    remote.options(scheduling_strategy=pinned(node)).remote(*args, self._quick, self._prices)
                )
        profiles: list[Profile] = []
        for found in ray.get(runs, timeout=_PROFILE_TIMEOUT_S):
            for raw in found:
                profile = Profile.model_validate_json(raw)
                self._store.put_profile(profile)
                profiles.append(profile)
        return profiles

    @staticmethod
    def node_classes() -> dict[str, MachineInfo]:
        """One live node per machine class: node id → its machine."""
        import ray

        probe = ray.remote(num_cpus=0.01, max_retries=0)(probe_machine)
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        found = ray.get([probe.options(scheduling_strategy=pinned(n)).remote() for n in nodes], timeout=60)
        by_class: dict[str, tuple[str, MachineInfo]] = {}
        for node, raw in zip(nodes, found, strict=True):
            machine = MachineInfo.model_validate(raw)
            by_class.setdefault(machine.fingerprint, (node, machine))
        return dict(by_class.values())
