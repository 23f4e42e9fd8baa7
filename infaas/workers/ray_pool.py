"""The production `WorkerPool`: Ray actors that each host several variants of one runtime family.

Layout
    A worker is one Ray actor process hosting variants of one family: ONNX Runtime, scikit-learn,
    or TensorFlow (importing TF costs ~530 MB per process, so it never shares a process with the
    others, and TF's thread pools are fixed per process at its first op, so TF workers are further
    split by thread count). Each variant runs with its own explicit thread count.

Placement
    The front end keeps the placement table (which worker holds which variant, least recently used
    first, and each worker's memory); workers only report back. A variant is loaded on demand by the
    first batch that needs it, on the worker of its family with room for it (a new worker while the
    family has fewer than `max_workers_per_family`), and `replicate` loads it on one more worker.

Memory
    Each worker keeps its process baseline (runtime import) plus its variants, measured as RSS
    growth while loading, under `memory_budget_mb`, evicting the least recently used variant when a
    load would exceed it (`infaas.workers.residency`).

Heap
    A worker's long-lived objects (its framework, its models) are frozen out of the garbage
    collector's sight (`gc.freeze`), as the front end's start-up is: a full collection in a process
    that imported TensorFlow walks ~320 000 objects, 165-180 ms here (2026-12-04), and would stall
    every batch the worker holds, whenever the collector decided. Frozen after start-up and after
    each load; an eviction or unload thaws, collects (the model's cycles, else kept for good) and
    freezes again: one such pause per eviction, while the lock holds batches back anyway.

Artifacts
    Never through a shared filesystem. With a shared artifact store (`infaas.artifacts`, Redis) the
    worker fetches the artifact by content hash into its node's cache; with the local one (one
    machine) the front end reads it once, `ray.put`s the bytes, and the actor writes them into its
    own cache directory before `variants.runtimes.load_variant`.

One fleet per cluster
    Joined to a Ray cluster (`Settings.shared_fleet`), workers are named, detached actors in the
    `fleet_namespace` (``worker:<group>-<slot>``), created with `get_if_exists`: every front end
    on the cluster uses the same workers, and the workers, not any front end, hold the placement
    (what is loaded where). Each front end mirrors it (`sync`, every `fleet_sync_interval_s` and
    before any load), so a variant loaded by one front end serves them all, and a front end that
    stops leaves the fleet running for the others. Each front end has its own batch stream to
    each worker (`infaas.workers.stream`).

Failures
    Actors restart after a crash (`max_restarts`) with nothing loaded. A batch lost with its worker
    (or a worker that forgot the variant by restarting) is retried once, on another replica or by
    loading the variant again elsewhere; a second loss raises `Unavailable` with the reason. Every
    load, eviction, replication, crash and retry is recorded as a `FleetEvent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infaas.artifacts import ArtifactStore, LocalArtifacts, RedisArtifacts, open_artifacts, pack, unpack
from infaas.errors import InfaasError, Unavailable
from infaas.settings import Settings
from infaas.types import FleetEvent, MachineInfo, Variant, WorkerInfo
from infaas.workers.residency import EventLog, Residency, load_into, rss_mb
from infaas.workers.stream import ChannelBroken, ChannelTimeout, StreamChannel, StreamServer, WorkerRaised

__all__ = ["RayPool", "WorkerHost", "init_ray", "stop_fleet", "worker_group"]

_MB = 1024.0 * 1024.0
_WORKER_PREFIX = "worker:"  # a shared fleet's workers are named actors worker:<group>-<slot>
_RESTART_WAIT_S = 120.0  # a restarting TensorFlow worker takes seconds; a lost node never answers


def worker_group(variant: Variant) -> tuple[str, str]:
    """(group key, family) of the workers that may host `variant`. GPU variants get workers of
    their own, which request a GPU share so that Ray places them on a GPU node."""
    runtime = variant.spec.runtime
    if runtime == "tensorflow":
        return f"tensorflow-t{variant.spec.threads}", "tensorflow"
    if runtime == "tensorrt":
        return "tensorrt", "tensorrt"
    if variant.spec.hardware == "gpu":
        return f"{runtime}-gpu", runtime
    return runtime, runtime


def _gpu_group(group: str) -> bool:
    return group == "tensorrt" or group.endswith("-gpu")


def workers_cap(gpu: bool, cpus: float, gpus: float, gpu_share: float, configured: int | None) -> int:
    """How many workers a group may have: a CPU group as many as the cluster has CPUs (each
    worker runs its variants with explicit threads: more would only oversubscribe them), a GPU
    group as many as its share fits the cluster's GPUs (on a 1-GPU node, counting CPUs had a
    second GPU worker wait forever for a GPU held by the first; 0.5 a worker: two a GPU), either
    at most `configured` (`INFAAS_MAX_WORKERS_PER_FAMILY`) when set."""
    if gpu:
        fits = int(gpus / gpu_share + 1e-9)
        return max(1, min(fits, configured or fits)) if fits else 0
    return configured or max(1, int(cpus))


def init_ray(settings: Settings, *, num_cpus: int | None = None) -> bool:
    """Connect to `settings.ray_address`, or start a lean local Ray; True when this call started it.

    Lean: no dashboard, no pre-started worker processes, and workers at normal priority (Ray runs
    them at nice 15 by default, which starves them next to the front end). Ray ≥ 2.60 enables token
    authentication: a local instance writes its own token; to join a cluster, this machine needs the
    cluster's token (``~/.ray/auth_token`` or ``RAY_AUTH_TOKEN``, read by Ray itself)."""
    import ray

    if ray.is_initialized():
        return False
    # Ray warns on every start that it turned token authentication on (its default since 2.60):
    # the setting SECURITY.md documents, not news for the console.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if settings.ray_address:
        ray.init(address=settings.ray_address, configure_logging=False, log_to_driver=False)
        return True
    ray.init(
        address="local",
        include_dashboard=False,
        num_cpus=num_cpus or settings.ray_num_cpus or os.cpu_count() or 1,
        configure_logging=False,
        log_to_driver=False,
        _system_config={
            "worker_niceness": 0,
            "enable_worker_prestart": False,
            "prestart_worker_first_driver": False,
        },
    )
    return True


def probe_machine() -> dict[str, Any]:
    """This node's machine class (run as a Ray task pinned to the node)."""
    from profiler.machine import local_machine

    return local_machine().model_dump()


def pinned(node_id: str) -> Any:
    """A scheduling strategy that runs a task on `node_id` or not at all."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def stop_fleet(settings: Settings) -> int:
    """Kill the shared fleet's workers (named actors ``worker:*`` in `fleet_namespace`); returns
    how many. Front ends still running lose their workers and start new ones on demand."""
    import ray

    init_ray(settings)
    workers = named_workers(settings.fleet_namespace)
    for worker_id in workers:
        ray.kill(
            ray.get_actor(f"{_WORKER_PREFIX}{worker_id}", namespace=settings.fleet_namespace), no_restart=True
        )
    return len(workers)


def named_workers(namespace: str) -> set[str]:
    """The ids of the shared fleet's workers alive in `namespace`."""
    import ray

    return {
        a["name"].removeprefix(_WORKER_PREFIX)
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace and a["name"].startswith(_WORKER_PREFIX)
    }


def _freeze_heap(thaw: bool = False) -> None:
    """Collect, then move what is left out of the collector's sight (module docstring, Heap);
    `thaw`: first give back what was frozen, so that an evicted model's cycles are collected."""
    if thaw:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


def _import_runtime(family: str) -> None:
    """Import the family's framework up front, so the process baseline includes it and a variant's
    measured memory is its own."""
    if family == "tensorflow":
        import tensorflow  # noqa: F401
    elif family == "sklearn":
        import sklearn  # noqa: F401
    else:
        import onnxruntime  # noqa: F401


class WorkerHost:
    """The body of one worker actor (wrapped by `ray.remote` in `RayPool`)."""

    def __init__(
        self,
        worker_id: str,
        group: str,
        family: str,
        memory_budget_mb: float,
        artifacts: RedisArtifacts | None = None,
    ) -> None:
        self._worker_id = worker_id
        self._group = group
        self._family = family
        self._artifacts = artifacts  # a shared store: fetch by hash (else the front end sends bytes)
        # A restarted actor runs __init__ again: start from an empty cache, nothing loaded.
        self._cache = Path(tempfile.gettempdir()) / f"infaas-worker-{worker_id}"
        shutil.rmtree(self._cache, ignore_errors=True)
        self._cache.mkdir(parents=True)
        _import_runtime(family)
        _freeze_heap()
        self._residency: Residency[Any] = Residency(memory_budget_mb, baseline_mb=rss_mb())
        self._roots: dict[str, Path] = {}
        # Batches arrive on the stream server's threads, loads and unloads on the actor's main
        # thread: one at a time, as a classic actor would run them.
        self._lock = threading.RLock()
        self._server: StreamServer | None = None

    def stream_address(self) -> tuple[tuple[str, int], bytes]:
        """(address, token) of this worker's batch stream (`infaas.workers.stream`), started on
        first use: a restarted actor starts a new one, on a new port with a new token."""
        import ray

        if self._server is None:
            self._server = StreamServer(self.run, ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        return self._server.address, self._server.token

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return self._describe()

    def _describe(self) -> dict[str, Any]:
        import ray

        r = self._residency
        return {
            "group": self._group,
            "family": self._family,
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "loaded": [(name, r.memory_mb(name)) for name in r.names],
            "used_mb": r.used_mb,
            "baseline_mb": r.baseline_mb,
        }

    def load(
        self, variant_json: str, artifact: bytes | None, is_dir: bool, expected_mb: float
    ) -> dict[str, Any]:
        """Load a variant from `artifact`'s bytes, or (None) from the shared artifact store."""
        with self._lock:
            return self._load(Variant.model_validate_json(variant_json), artifact, is_dir, expected_mb)

    def _load(
        self, variant: Variant, artifact: bytes | None, is_dir: bool, expected_mb: float
    ) -> dict[str, Any]:
        from variants.artifacts import tree_size_bytes
        from variants.runtimes import load_variant

        evicted: list[str] = []
        load_s = 0.0
        memory_mb = self._residency.memory_mb(variant.name)
        if variant.name not in self._residency:
            if artifact is None:
                if self._artifacts is None:
                    raise Unavailable(f"worker {self._worker_id} got no artifact for {variant.name}")
                root = self._artifacts.root(variant)  # the node's cache: kept after an eviction
                size_mb = tree_size_bytes(root / variant.artifact) / _MB
            else:
                root = self._cache / variant.sha256
                unpack(artifact, is_dir, root / variant.artifact)
                size_mb = len(artifact) / _MB
            loaded = load_into(
                self._residency,
                variant.name,
                lambda: load_variant(variant, root),
                max(expected_mb, size_mb),
                size_mb,
            )
            load_s, memory_mb = loaded.load_s, loaded.memory_mb
            if artifact is not None:
                self._roots[variant.name] = root
            evicted += self._drop(loaded.evicted)
            _freeze_heap(thaw=bool(evicted))
        return {**self._describe(), "evicted": evicted, "load_s": load_s, "memory_mb": memory_mb}

    def heap(self) -> dict[str, int]:
        """What a full collection would walk (`tracked`) and what it skips (`frozen`)."""
        return {"tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}

    def _drop(self, evicted: list[tuple[str, Any]]) -> list[str]:
        for name, model in evicted:
            model.close()
            root = self._roots.pop(name, None)
            if root is not None and root not in self._roots.values():
                shutil.rmtree(root, ignore_errors=True)
        return [name for name, _ in evicted]

    def run(self, variant: str, batch: np.ndarray) -> np.ndarray | None:
        """The batch's outputs; None when this worker does not hold `variant` (e.g. it restarted)."""
        with self._lock:
            model = self._residency.get(variant)
            if model is None:
                return None
            out: np.ndarray = model.predict(batch)
            return out

    def unload(self, variant: str) -> dict[str, Any]:
        with self._lock:
            model = self._residency.pop(variant)
            if model is not None:
                self._drop([(variant, model)])
                _freeze_heap(thaw=True)
            return self._describe()


@dataclass(eq=False)
class _Worker:
    worker_id: str
    group: str
    family: str
    handle: Any
    loaded: OrderedDict[str, float] = field(default_factory=OrderedDict)  # LRU first → memory MB
    used_mb: float = 0.0
    in_flight: int = 0
    alive: bool = True
    incarnation: int = 0
    pid: int | None = None
    channel: StreamChannel | None = None  # the batch stream, opened with the first load
    classic: bool = False  # its stream could not be opened: batches go as classic actor calls
    channel_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    node: str | None = None

    def mirror(self, described: dict[str, Any]) -> None:
        self.loaded = OrderedDict((name, float(mb)) for name, mb in described["loaded"])
        self.used_mb = float(described["used_mb"])
        self.pid = int(described["pid"])
        self.node = str(described["node"])


class _WorkerLost(Exception):
    def __init__(self, worker: _Worker, reason: str) -> None:
        super().__init__(reason)
        self.worker = worker
        self.reason = reason


class RayPool:
    """`WorkerPool` over Ray actors; see the module docstring. Starts (or joins) Ray on creation
    unless Ray is already initialised, and shuts down what it started on `close`."""

    def __init__(
        self,
        settings: Settings,
        *,
        memory_budget_mb: float | None = None,
        max_workers_per_family: int | None = None,
        max_restarts: int = 3,
        worker_num_cpus: float = 0.0,
        num_cpus: int | None = None,
        artifacts_dir: Path | None = None,
    ) -> None:
        import ray

        self._store: ArtifactStore = (
            LocalArtifacts(artifacts_dir) if artifacts_dir is not None else open_artifacts(settings)
        )
        self._budget_mb = memory_budget_mb or settings.worker_memory_budget_mb
        self._owns_ray = init_ray(settings, num_cpus=num_cpus)
        cap = max_workers_per_family or settings.max_workers_per_family
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        cpus, gpus = resources.get("CPU", os.cpu_count() or 1), resources.get("GPU", 0.0)
        self._max_workers = workers_cap(False, cpus, gpus, settings.gpu_per_worker, cap)
        self._max_gpu_workers = workers_cap(True, cpus, gpus, settings.gpu_per_worker, cap)
        self._call_timeout_s = settings.worker_call_timeout_s
        self._shared = settings.shared_fleet
        self._worker_num_cpus = worker_num_cpus
        self._namespace = settings.fleet_namespace
        self._gpu_share = settings.gpu_per_worker
        self._stream = settings.worker_channel == "stream"
        # Threads are explicit per variant, so the actors reserve no logical CPU (0 by default)
        # and spread over the cluster's nodes; a crashed actor restarts, its tasks are not retried
        # by Ray (the pool decides where a lost batch goes).
        self._actor_cls = ray.remote(
            num_cpus=worker_num_cpus,
            max_restarts=max_restarts,
            max_task_retries=0,
            scheduling_strategy="SPREAD",
        )(WorkerHost)
        self._workers: dict[str, _Worker] = {}
        self._ids = itertools.count()
        self._events = EventLog()
        self._artifacts: dict[str, tuple[Any, bool]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._memory_seen_mb: dict[str, float] = {}
        self._restarts: set[asyncio.Task[None]] = set()
        self._sync_lock = asyncio.Lock()
        self._node_machines: dict[str, MachineInfo] = {}  # node id → its class (probed once)
        self._closed = False

    # ---- the WorkerPool protocol ------------------------------------------------------------

    async def run(self, variant: Variant, batch: np.ndarray) -> np.ndarray:
        """Run `batch` on the least busy replica, loading `variant` first when none holds it; a
        batch lost with its worker is retried once elsewhere, then `Unavailable`."""
        self._check_open()
        avoid: set[str] = set()
        first_reason: str | None = None
        while True:
            try:
                return await self._run_once(variant, batch, avoid)
            except _WorkerLost as lost:
                if first_reason is not None:
                    raise Unavailable(
                        f"{variant.name}: the batch was lost twice ({first_reason}; then {lost.reason}); "
                        "retry the request",
                        variant=variant.name,
                        reason=lost.reason,
                    ) from None
                first_reason = lost.reason
                avoid.add(lost.worker.worker_id)
                self._events.add(
                    "retry", variant.name, lost.worker.worker_id, f"retrying once elsewhere: {lost.reason}"
                )

    async def _run_once(self, variant: Variant, batch: np.ndarray, avoid: set[str]) -> np.ndarray:
        worker = self._replica(variant.name, avoid)
        if worker is None:
            worker = await self._load_on_demand(variant, avoid)
        incarnation = worker.incarnation
        worker.in_flight += 1
        try:
            out = await self._run_on(worker, incarnation, variant.name, batch)
        finally:
            worker.in_flight -= 1
        if out is None:
            worker.loaded.pop(variant.name, None)
            raise _WorkerLost(
                worker,
                f"worker {worker.worker_id} no longer holds {variant.name} (restarted or unloaded)",
            )
        if variant.name in worker.loaded:
            worker.loaded.move_to_end(variant.name)
        result: np.ndarray = out
        return result

    async def ensure_loaded(self, variant: Variant) -> None:
        self._check_open()
        if self._replica(variant.name, set()) is None:
            try:
                await self._load_on_demand(variant, set())
            except _WorkerLost as lost:
                raise Unavailable(
                    f"could not load {variant.name}: {lost.reason}", variant=variant.name
                ) from None

    async def replicate(self, variant: Variant, reason: str = "") -> str:
        self._check_open()
        group, family = worker_group(variant)
        async with self._lock(variant.name):
            holders = [w for w in self._group(group) if variant.name in w.loaded]
            worker = self._choose_worker(group, family, variant.name, {w.worker_id for w in holders})
            if worker is None or variant.name in worker.loaded:
                raise Unavailable(
                    f"cannot replicate {variant.name}: all {len(self._group(group))} {family} workers "
                    f"(max {self._cap(group)}) already hold it",
                    variant=variant.name,
                )
            try:
                why = f"replica #{len(holders) + 1}" + (f": {reason}" if reason else "")
                await self._load_on(worker, variant, "replicate", why)
            except _WorkerLost as lost:
                raise Unavailable(
                    f"could not replicate {variant.name}: {lost.reason}", variant=variant.name
                ) from None
            return worker.worker_id

    async def unload(self, variant: str, worker_id: str | None = None, reason: str = "") -> None:
        for worker in list(self._workers.values()):
            if variant not in worker.loaded or (worker_id is not None and worker.worker_id != worker_id):
                continue
            try:
                described = await self._call(worker, worker.incarnation, worker.handle.unload.remote(variant))
            except _WorkerLost:
                continue
            worker.mirror(described)
            self._events.add("unload", variant, worker.worker_id, reason or "unload requested")

    def is_loaded(self, variant: str) -> bool:
        return self.replicas(variant) > 0

    def replicas(self, variant: str) -> int:
        return sum(1 for w in self._workers.values() if w.alive and variant in w.loaded)

    def placement(self) -> dict[str, list[str]]:
        """Variant name → ids of the workers holding it."""
        table: dict[str, list[str]] = {}
        for worker in self._workers.values():
            for name in worker.loaded:
                table.setdefault(name, []).append(worker.worker_id)
        return table

    def fleet(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                worker_id=w.worker_id,
                family=w.family,
                alive=w.alive,
                loaded=tuple(w.loaded),
                memory_used_mb=w.used_mb,
                memory_budget_mb=self._budget_mb,
                queue_depth=w.in_flight,
                pid=w.pid,
                # How its batches go: a stream not (re)opened yet is still the stream's to open.
                channel="stream" if self._stream and not w.classic else "classic",
                node=w.node,
            )
            for w in self._workers.values()
        ]

    def events(self, limit: int = 50) -> list[FleetEvent]:
        return self._events.recent(limit)

    def resources(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """((total vCPUs, GPUs), (available vCPUs, GPUs)) of the cluster, as Ray reports them."""
        import ray

        total = ray.cluster_resources()  # type: ignore[no-untyped-call]
        available = ray.available_resources()  # type: ignore[no-untyped-call]
        return (
            (float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0))),
            (float(available.get("CPU", 0.0)), float(available.get("GPU", 0.0))),
        )

    def health(self) -> str | None:
        """None while the Ray this pool uses is up, else what went wrong. For a local Ray this pool
        started, its own processes (GCS, raylet, ...) are checked: the driver cannot serve
        without them, and Ray does not restart them."""
        import ray

        if self._closed:
            return "the worker pool is shut down"
        if not ray.is_initialized():
            return "Ray is not initialised"
        if self._owns_ray:
            node = ray._private.worker._global_node
            dead: list[tuple[str, Any]] = node.dead_processes() if node is not None else []
            if dead:
                return "the local Ray's processes died: " + ", ".join(
                    f"{kind} (pid {proc.pid}, exit {proc.returncode})" for kind, proc in dead
                )
        return None

    def worker_pid(self, worker_id: str) -> int | None:
        """The OS process id of a worker (for operators and crash tests)."""
        worker = self._workers.get(worker_id)
        return worker.pid if worker is not None else None

    def worker_handle(self, worker_id: str) -> Any:
        return self._workers[worker_id].handle

    async def close(self) -> None:
        """Kill the worker actors, and shut Ray down if this pool started it."""
        if self._closed:
            return
        self._closed = True
        import ray

        for task in self._restarts:
            task.cancel()
        for worker in self._workers.values():
            if worker.channel is not None:
                worker.channel.close()
                worker.channel = None
        # A shared fleet outlives any one front end: its workers stay for the others.
        for worker in [] if self._shared else self._workers.values():
            try:
                ray.kill(worker.handle, no_restart=True)
            except Exception as exc:  # an actor already gone is what we wanted
                self._events.add("unload", "*", worker.worker_id, f"kill at shutdown failed: {exc}")
        self._workers.clear()
        self._artifacts.clear()
        if self._owns_ray:
            ray.shutdown()

    # ---- placement and loading --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the worker pool is shut down")

    def _lock(self, variant: str) -> asyncio.Lock:
        return self._locks.setdefault(variant, asyncio.Lock())

    def _group(self, group: str) -> list[_Worker]:
        return [w for w in self._workers.values() if w.group == group]

    def _replica(self, variant: str, avoid: set[str]) -> _Worker | None:
        holders = [
            w for w in self._workers.values() if w.alive and variant in w.loaded and w.worker_id not in avoid
        ]
        return min(holders, key=lambda w: w.in_flight) if holders else None

    def _cap(self, group: str) -> int:
        return self._max_gpu_workers if _gpu_group(group) else self._max_workers

    def _choose_worker(self, group: str, family: str, variant: str, avoid: set[str]) -> _Worker | None:
        """Where a new copy of `variant` goes: a live worker of its group hosting nothing, else a
        new worker while the group is under its cap, else one with room (fewest variants first),
        else the least loaded worker (which evicts), else — only for a retry — a worker we would
        rather avoid. None: no place. A worker runs one batch at a time, so variants sharing one
        wait for each other, which their queues' predictions do not see: spread first."""
        members = self._group(group)
        expected_mb = self._memory_seen_mb.get(variant, 0.0)
        free = [w for w in members if w.alive and variant not in w.loaded and w.worker_id not in avoid]
        roomy = [w for w in free if w.used_mb + expected_mb <= self._budget_mb]
        empty = [w for w in roomy if not w.loaded]
        if empty:
            return min(empty, key=lambda w: w.in_flight)
        if len(members) < self._cap(group):
            return self._spawn(group, family)
        if roomy:
            return min(roomy, key=lambda w: (len(w.loaded), w.in_flight))
        if free:
            return min(free, key=lambda w: (w.used_mb, w.in_flight))
        fallback = [w for w in members if variant not in w.loaded]
        return min(fallback, key=lambda w: w.in_flight) if fallback else None

    def _spawn(self, group: str, family: str) -> _Worker:
        """A new worker of `group`; in a shared fleet, the named worker of the group's lowest free
        slot (or, when another front end made it meanwhile, that one: `get_if_exists`)."""
        gpu = _gpu_group(group)
        options: dict[str, Any] = {"num_gpus": self._gpu_share} if gpu else {}
        node = self._emptiest_node(gpu)
        if node is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
            # Ray 2.60 places an actor that asks for no CPU on the caller's node whatever the
            # affinity says (measured: 0 of 4 landed on the node asked for); a token share fixes it.
            options["num_cpus"] = max(self._worker_num_cpus, 0.01)
        if self._shared:
            slots = (f"{group}-{i}" for i in itertools.count())
            worker_id = next(w for w in slots if w not in self._workers)
            options.update(
                name=f"{_WORKER_PREFIX}{worker_id}",
                namespace=self._namespace,
                lifetime="detached",
                get_if_exists=True,
            )
        else:
            worker_id = f"{group}-{next(self._ids)}"
        # Workers fetch from a shared artifact store themselves; else the front end sends bytes.
        fetcher = self._store.for_nodes() if isinstance(self._store, RedisArtifacts) else None
        handle = self._actor_cls.options(**options).remote(worker_id, group, family, self._budget_mb, fetcher)
        worker = _Worker(worker_id=worker_id, group=group, family=family, handle=handle, node=node)
        self._workers[worker_id] = worker
        return worker

    def _emptiest_node(self, gpu: bool) -> str | None:
        """The live node (with a GPU, for a GPU worker) hosting the fewest of this fleet's workers:
        new workers go there (a soft preference: Ray places the worker elsewhere if it must), so
        the fleet spreads over the cluster deterministically. None on a single node."""
        import ray

        nodes = [
            n["NodeID"]
            for n in ray.nodes()  # type: ignore[no-untyped-call]
            if n.get("Alive") and (n.get("Resources", {}).get("GPU", 0) > 0 or not gpu)
        ]
        if len(nodes) < 2:
            return None
        count = {n: 0 for n in nodes}
        for w in self._workers.values():
            if w.alive and w.node in count:
                count[w.node] += 1
        emptiest: str = min(nodes, key=lambda n: count[n])
        return emptiest

    async def sync(self) -> None:
        """Shared fleet: adopt the workers other front ends started, forget those gone for good,
        and mirror what every worker holds now. A worker busy loading answers late: it keeps the
        state it had (the data path corrects a stale entry by retrying elsewhere)."""
        if not self._shared or self._closed:
            return
        import ray

        async with self._sync_lock:
            names = await asyncio.to_thread(named_workers, self._namespace)
            for worker_id in names - self._workers.keys():
                try:
                    handle = await asyncio.to_thread(
                        ray.get_actor, f"{_WORKER_PREFIX}{worker_id}", namespace=self._namespace
                    )
                    described: dict[str, Any] = await asyncio.wait_for(handle.describe.remote(), 10.0)
                except Exception:  # gone again, or still starting: the next round sees it
                    continue
                if worker_id in self._workers:  # spawned here meanwhile
                    continue
                found = _Worker(worker_id, str(described["group"]), str(described["family"]), handle)
                found.mirror(described)
                self._workers[worker_id] = found
            known = [w for w in self._workers.values() if w.alive]
            answers = await asyncio.gather(
                *(asyncio.wait_for(w.handle.describe.remote(), 2.0) for w in known), return_exceptions=True
            )
            for worker, answer in zip(known, answers, strict=True):
                if isinstance(answer, dict):
                    worker.mirror(answer)
                elif worker.worker_id not in names:  # killed for good (by an operator, a fleet-down)
                    self._workers.pop(worker.worker_id, None)
        await self.probe_nodes()

    async def probe_nodes(self) -> None:
        """Learn the machine class of each live node not probed yet (a task pinned to it); forget
        nodes that left."""
        import ray

        alive = await asyncio.to_thread(self._alive_nodes)
        for node in list(self._node_machines):
            if node not in alive:
                del self._node_machines[node]
        probe = ray.remote(num_cpus=0.01, max_retries=0)(probe_machine)
        for node in alive - self._node_machines.keys():
            try:
                found = await asyncio.wait_for(probe.options(scheduling_strategy=pinned(node)).remote(), 30.0)
            except Exception:  # the node is going away, or busy starting: the next round asks again
                continue
            self._node_machines[node] = MachineInfo.model_validate(found)

    @staticmethod
    def _alive_nodes() -> set[str]:
        import ray

        return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]

    def machines(self) -> tuple[tuple[MachineInfo, ...], dict[str, MachineInfo]]:
        """(the cluster's machine classes, variant → the class of the node holding its replica), as
        last probed (`probe_nodes`): what the router picks each variant's profile by. A variant with
        replicas on nodes of several classes is predicted with its first replica's class."""
        classes = {m.fingerprint: m for m in self._node_machines.values()}
        replicas: dict[str, MachineInfo] = {}
        for worker in self._workers.values():
            machine = self._node_machines.get(worker.node or "")
            if worker.alive and machine is not None:
                for name in worker.loaded:
                    replicas.setdefault(name, machine)
        return tuple(classes.values()), replicas

    async def _load_on_demand(self, variant: Variant, avoid: set[str]) -> _Worker:
        group, family = worker_group(variant)
        async with self._lock(variant.name):
            worker = self._replica(variant.name, avoid)
            if worker is None and self._shared:
                await self.sync()  # another front end may have loaded it
                worker = self._replica(variant.name, avoid)
            if worker is not None:
                return worker  # loaded by a concurrent request while this one waited
            worker = self._choose_worker(group, family, variant.name, avoid)
            if worker is None:
                raise Unavailable(f"no {family} worker can host {variant.name}", variant=variant.name)
            reason = "on demand: no replica" + (" after a worker loss" if avoid else "")
            await self._load_on(worker, variant, "load", reason)
            return worker

    async def _load_on(self, worker: _Worker, variant: Variant, kind: str, reason: str) -> None:
        artifact_ref, is_dir = await self._artifact(variant)
        expected_mb = self._memory_seen_mb.get(variant.name, 0.0)
        incarnation = worker.incarnation
        worker.in_flight += 1
        try:
            described = await self._call(
                worker,
                incarnation,
                worker.handle.load.remote(variant.model_dump_json(), artifact_ref, is_dir, expected_mb),
            )
        finally:
            worker.in_flight -= 1
        worker.mirror(described)
        await self._channel(worker)  # built with the load (a slow path anyway), not by the first batch
        self._memory_seen_mb[variant.name] = float(described["memory_mb"])
        for name in described["evicted"]:
            self._events.add(
                "evict",
                name,
                worker.worker_id,
                f"least recently used: {worker.worker_id} over its {self._budget_mb:.0f} MB budget "
                f"to fit {variant.name}",
            )
        self._events.add(
            kind,
            variant.name,
            worker.worker_id,
            f"{reason}; loaded in {described['load_s'] * 1000:.0f} ms, {described['memory_mb']:.1f} MB, "
            f"worker at {described['used_mb']:.0f}/{self._budget_mb:.0f} MB",
        )

    async def _artifact(self, variant: Variant) -> tuple[Any, bool]:
        """What a worker loads `variant` from: nothing when workers fetch from a shared artifact
        store, else the artifact's bytes in Ray's object store (put once per content hash and path)."""
        if self._store.shared:
            return None, False
        key = f"{variant.sha256}:{variant.artifact}"
        cached = self._artifacts.get(key)
        if cached is not None:
            return cached
        import ray

        root = await asyncio.to_thread(self._store.root, variant)
        data, is_dir = await asyncio.to_thread(pack, root / variant.artifact)
        entry = (ray.put(data), is_dir)
        self._artifacts[key] = entry
        return entry

    # ---- the data path ----------------------------------------------------------------------

    async def _run_on(self, worker: _Worker, incarnation: int, variant: str, batch: np.ndarray) -> Any:
        """`run(variant, batch)` on `worker`: over its stream (`infaas.workers.stream`), or a
        classic actor call when streams are off or the worker's could not be opened."""
        channel = await self._channel(worker)
        if channel is None:
            return await self._call(worker, incarnation, worker.handle.run.remote(variant, batch))
        try:
            return await channel.call(variant, batch, self._call_timeout_s)
        except ChannelTimeout:
            raise self._timed_out(worker) from None
        except WorkerRaised as exc:
            raise self._task_error(worker, exc.cause) from None
        except ChannelBroken as exc:
            raise _WorkerLost(worker, self._worker_lost(worker, incarnation, exc)) from None

    async def _channel(self, worker: _Worker) -> StreamChannel | None:
        """`worker`'s stream, opened on first use (once per actor incarnation); None for classic
        calls, or while the worker is down."""
        if not self._stream or worker.classic or worker.channel is not None or not worker.alive:
            return worker.channel
        async with worker.channel_lock:
            # Again under the lock: the batches that waited on it learn what the first one found
            # (an open stream, or none to be had), rather than each trying to open one.
            if worker.classic or worker.channel is not None or not worker.alive:
                return worker.channel
            incarnation = worker.incarnation
            address, token = await self._call(worker, incarnation, worker.handle.stream_address.remote())
            try:
                channel = await StreamChannel.open(
                    tuple(address),
                    token,
                    lambda reason: self._worker_lost(worker, incarnation, ChannelBroken(reason)),
                    self._call_timeout_s,
                )
            except (OSError, TimeoutError) as exc:
                # Per worker: a node that cannot be reached (a firewall) says nothing of the others.
                worker.classic = True
                self._events.add(
                    "channel",
                    "*",
                    worker.worker_id,
                    f"the worker's stream at {address[0]}:{address[1]} could not be opened, its batches "
                    f"use classic actor calls: {type(exc).__name__}: {exc}",
                )
                return None
            if worker.incarnation != incarnation:  # it died while connecting
                channel.close()
                return None
            worker.channel = channel
            return channel

    # ---- failures ---------------------------------------------------------------------------

    async def _call(self, worker: _Worker, incarnation: int, ref: Any) -> Any:
        """Await an actor call; a dead or restarting worker becomes `_WorkerLost`, an error raised
        inside the worker becomes that error (infaas errors) or `Unavailable`."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            result = await asyncio.wait_for(ref, self._call_timeout_s)
        except TimeoutError:
            import ray

            with contextlib.suppress(Exception):  # a running actor task may not be cancellable
                ray.cancel(ref)
            raise self._timed_out(worker) from None
        except RayActorError as exc:
            raise _WorkerLost(worker, self._worker_lost(worker, incarnation, exc)) from None
        except RayTaskError as exc:
            raise self._task_error(worker, exc.cause if isinstance(exc.cause, Exception) else exc) from None
        if not worker.alive and worker.incarnation == incarnation:
            worker.alive = True
        return result

    def _timed_out(self, worker: _Worker) -> Unavailable:
        return Unavailable(
            f"worker {worker.worker_id} did not answer within {self._call_timeout_s:g} s "
            "(INFAAS_WORKER_CALL_TIMEOUT_S)",
            worker=worker.worker_id,
        )

    @staticmethod
    def _task_error(worker: _Worker, cause: BaseException) -> InfaasError:
        """An error raised inside the worker: itself when it is an infaas error, else `Unavailable`."""
        if isinstance(cause, InfaasError):
            return cause
        return Unavailable(
            f"worker {worker.worker_id} failed: {type(cause).__name__}: {cause}", worker=worker.worker_id
        )

    def _worker_lost(self, worker: _Worker, incarnation: int, exc: Exception) -> str:
        reason = f"worker {worker.worker_id} died: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        if worker.incarnation == incarnation:
            # First report of this death: it restarts (max_restarts) with nothing loaded, and
            # serves a new stream.
            worker.incarnation += 1
            worker.alive = False
            channel, worker.channel = worker.channel, None
            if channel is not None:
                channel.close(reason)  # its waiting batches fail over at once
            lost = list(worker.loaded)
            worker.loaded.clear()
            self._events.add("crash", ",".join(lost) or "-", worker.worker_id, reason)
            task = asyncio.get_running_loop().create_task(self._await_restart(worker, worker.incarnation))
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)
        return reason

    async def _await_restart(self, worker: _Worker, incarnation: int) -> None:
        """Mark a crashed worker alive once its actor answers again, or drop it when Ray gave up
        (`ActorDiedError`: no restarts left) or it stays unreachable for `_RESTART_WAIT_S`."""
        from ray.exceptions import ActorDiedError, RayActorError

        give_up_s = time.monotonic() + _RESTART_WAIT_S
        while True:
            try:
                described = await worker.handle.describe.remote()
                break
            except RayActorError as exc:
                # ActorUnavailableError: the call reached the dead process before Ray noticed, or
                # the actor is still restarting. Ask again; only a death without restart is final.
                gone = isinstance(exc, ActorDiedError) or time.monotonic() > give_up_s
                if worker.incarnation != incarnation or self._closed:
                    return
                if gone:
                    self._workers.pop(worker.worker_id, None)
                    self._events.add(
                        "crash", "-", worker.worker_id, f"worker gone for good: {exc}".splitlines()[0]
                    )
                    return
            await asyncio.sleep(0.2)
        if worker.incarnation == incarnation:
            before = worker.pid
            worker.alive = True
            worker.mirror(described)
            if worker.pid != before:
                worker.classic = False  # a new process serves a new stream: try it again
            held = ", ".join(name for name, _ in described["loaded"]) or "nothing"
            how = (
                "the same process: only its stream dropped"
                if worker.pid == before
                else f"restarted as pid {worker.pid} (was {before})"
            )
            self._events.add("recover", "-", worker.worker_id, f"answers again, {how}; holds {held}")
