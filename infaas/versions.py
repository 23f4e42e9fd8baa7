"""The version lifecycle use case: canary, promote, rollback, delete, and the versions view.

Transport-independent (the REST routes and, through them, the CLI call it). Label changes are the
pure transitions of `infaas.policy.versions`; what this shell adds is the order that keeps
serving without a gap, TF Serving's availability-preserving policy:

1. validate the change and the caller's right to make it (`may_manage`: the admin, or an owner of
   the architecture's task; forcing past the accuracy guard is the admin's alone);
2. load and warm every version that will newly take traffic, on the workers that will serve it:
   its cheapest variant and its counterparts of what the versions serving now have loaded;
3. write the labels (compare-and-set: a concurrent change makes this one fail, not both
   half-apply) and adopt them in this front end's router at once: the next query sees them;
4. in the background, let the queries already queued for the versions that stopped serving
   finish (up to `drain_timeout_s`), then unload them, unless they serve again by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from infaas.errors import ArchitectureNotFound, Conflict, Forbidden, Unavailable
from infaas.policy import versions as policy
from infaas.registry import Registry, may_manage, versions_of
from infaas.router import Router
from infaas.settings import Settings
from infaas.store import MetadataStore
from infaas.types import Architecture, FleetEvent, Labels, Principal, VersionState, version_name
from infaas.workers.base import Batcher, WorkerPool

__all__ = ["Deleted", "VersionInfo", "Versions", "VersionsView"]

Change = Literal["canary", "promote", "rollback"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionInfo:
    version: int
    name: str  # the stored name queries pin (``net@2``; version 1 is ``net``)
    state: VersionState
    labels: tuple[str, ...]
    accuracy: float | None  # its most accurate profiled variant's, on the task's validation set
    variants: int
    loaded: tuple[str, ...]
    created_at_s: float | None
    error: str | None


@dataclass(frozen=True)
class VersionsView:
    architecture: str
    task: str
    stable: int
    canary: int | None
    canary_share: float
    observed_queries: int  # queries routed to the architecture since the canary's share was set
    observed_canary: int  # of which answered by the canary
    versions: tuple[VersionInfo, ...]


@dataclass(frozen=True)
class Deleted:
    architecture: str
    versions: tuple[int, ...]
    variants: int
    artifacts_removed: int


class Versions:
    """See the module docstring. `on_event` receives the fleet events (the fleet view shows them)."""

    def __init__(
        self,
        settings: Settings,
        store: MetadataStore,
        registry: Registry,
        router: Router,
        pool: WorkerPool,
        batcher: Batcher,
        on_event: Callable[[FleetEvent], None] | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._registry = registry
        self._router = router
        self._pool = pool
        self._batcher = batcher
        self._on_event = on_event
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- reading --------------------------------------------------------------------------
    def _lookup(self, name: str) -> tuple[list[Architecture], Labels]:
        versions = versions_of(self._store, name)
        if not versions:
            raise ArchitectureNotFound(
                f"no architecture {name!r}; GET /v1/models lists them", architecture=name
            )
        return versions, self._store.get_labels(name) or Labels(architecture=name)

    def _authorize(self, arch: Architecture, caller: Principal) -> None:
        if not may_manage(self._store.get_task(arch.task), caller.name, caller.role):
            raise Forbidden(
                f"managing {arch.line!r} needs the admin key or an owner key of task {arch.task!r}",
                architecture=arch.line,
                role=caller.role,
            )

    def view(self, name: str) -> VersionsView:
        """The architecture's versions, labels and the canary share observed (blocking: store)."""
        versions, labels = self._lookup(name)
        stored = {a.version: a for a in versions}
        info: list[VersionInfo] = []
        for v, state in policy.version_states(labels, stored).items():
            arch = stored.get(v)
            variants = self._store.list_variants(arch.name) if arch is not None else []
            tags = tuple(t for t, n in (("stable", labels.stable), ("canary", labels.canary)) if n == v)
            info.append(
                VersionInfo(
                    version=v,
                    name=version_name(name, v),
                    state=state,
                    labels=tags,
                    accuracy=self._accuracy(arch.name) if arch is not None else None,
                    variants=len(variants),
                    loaded=tuple(x.name for x in variants if self._pool.is_loaded(x.name)),
                    created_at_s=arch.created_at_s if arch is not None else None,
                    error=labels.errors.get(v),
                )
            )
        queries, canary = self._router.canary_split.observed(name, labels.canary) if labels.canary else (0, 0)
        return VersionsView(
            architecture=name,
            task=versions[0].task,
            stable=labels.stable,
            canary=labels.canary,
            canary_share=labels.canary_share,
            observed_queries=queries,
            observed_canary=canary,
            versions=tuple(info),
        )

    def _accuracy(self, arch: str) -> float | None:
        measured = [p.accuracy for p in self._store.list_profiles(arch) if p.status == "ok"]
        return max(measured) if measured else None

    # ---- label changes --------------------------------------------------------------------
    async def set_canary(self, name: str, version: int, share: float, caller: Principal) -> VersionsView:
        return await self._change(
            name, caller, "canary", lambda lab, known: policy.set_canary(lab, version, share, known)
        )

    async def end_canary(self, name: str, caller: Principal) -> VersionsView:
        return await self._change(name, caller, "canary", lambda lab, _: policy.end_canary(lab))

    async def promote(self, name: str, version: int | None, force: bool, caller: Principal) -> VersionsView:
        if force and caller.role != "admin":
            raise Forbidden("only the admin may force a promotion past the accuracy guard", role=caller.role)

        def change(labels: Labels, known: set[int]) -> Labels:
            new = policy.promote(labels, version, known)
            if not force:
                self._guard(name, new.stable, labels.stable)
            return new

        return await self._change(name, caller, "promote", change)

    def _guard(self, name: str, candidate: int, stable: int) -> None:
        cand = self._accuracy(version_name(name, candidate))
        base = self._accuracy(version_name(name, stable))
        if cand is None:
            raise Conflict(
                f"version {candidate} of {name} has no measured accuracy yet (not profiled)",
                architecture=name,
                version=candidate,
            )
        why = policy.accuracy_guard(cand, base or 0.0, self._settings.promote_accuracy_tolerance)
        if why is not None:
            raise Conflict(
                f"promotion of {name} version {candidate} refused: {why}",
                architecture=name,
                version=candidate,
                candidate_accuracy=round(cand, 6),
                stable_accuracy=round(base or 0.0, 6),
                tolerance=self._settings.promote_accuracy_tolerance,
            )

    async def rollback(self, name: str, caller: Principal) -> VersionsView:
        return await self._change(name, caller, "rollback", lambda lab, known: policy.rollback(lab, known))

    async def _change(
        self,
        name: str,
        caller: Principal,
        kind: Change,
        change: Callable[[Labels, set[int]], Labels],
    ) -> VersionsView:
        versions, labels = await asyncio.to_thread(self._lookup, name)
        self._authorize(versions[0], caller)
        new = await asyncio.to_thread(change, labels, {a.version for a in versions})
        serving_now = [version_name(name, v) for v in labels.serving]
        like = [n for arch in serving_now for n in self._loaded(arch)]
        for v in sorted(set(new.serving) - set(labels.serving)):
            loaded = await self._router.warm_architecture(version_name(name, v), like)
            if not loaded:
                raise Unavailable(
                    f"version {v} of {name} has no profiled variant that loads: it cannot take "
                    "traffic (see GET /v1/models/{name}/versions)",
                    architecture=name,
                    version=v,
                )
        await asyncio.to_thread(self._write, labels, new)
        await self._router.refresh_async()
        self._event(kind, name, self._describe(labels, new))
        for v in sorted(set(labels.serving) - set(new.serving)):
            self._spawn(self._retire(version_name(name, v)))
        return await asyncio.to_thread(self.view, name)

    def _write(self, expected: Labels, new: Labels) -> None:
        with self._registry.labels_lock:
            current = self._store.get_labels(expected.architecture) or Labels(
                architecture=expected.architecture
            )
            if current != expected:
                raise Conflict(
                    f"{expected.architecture}'s labels changed while this change was prepared; retry",
                    architecture=expected.architecture,
                )
            self._store.put_labels(new)

    @staticmethod
    def _describe(old: Labels, new: Labels) -> str:
        canary = f"canary v{new.canary} at {new.canary_share:.0%}" if new.canary else "no canary"
        return f"stable v{old.stable} → v{new.stable}, {canary}"

    # ---- draining and deleting ------------------------------------------------------------
    def _loaded(self, arch: str) -> list[str]:
        prefix = f"{arch}/"
        return [n for n in self._router.snapshot.variants if n.startswith(prefix) and self._pool.is_loaded(n)]

    async def _drain(self, names: list[str]) -> None:
        """Wait until no query is queued or running for `names` (up to `drain_timeout_s`)."""
        deadline = time.monotonic() + self._settings.drain_timeout_s
        while time.monotonic() < deadline:
            queued, running = self._batcher.queue_depths(), self._batcher.in_flight()
            if not any(queued.get(n) or running.get(n) for n in names):
                return
            await asyncio.sleep(0.05)
        log.warning(
            "versions: %s still busy after %.0f s; unloading anyway", names, self._settings.drain_timeout_s
        )

    async def _retire(self, arch: str, reason: str = "no longer serving (drained)") -> None:
        names = [n for n in self._router.snapshot.variants if n.startswith(f"{arch}/")]
        await self._drain(names)
        if arch in self._router.snapshot.serving:  # rolled back to meanwhile: keep it
            return
        for n in names:
            if self._pool.is_loaded(n):
                try:
                    await self._pool.unload(n, reason=reason)
                except Exception:
                    log.exception("versions: unloading %s failed", n)

    async def delete(self, name: str, version: int | None, caller: Principal) -> Deleted:
        """Delete one version, or the whole architecture: unroutable at once, then drained,
        unloaded, and its artifacts removed unless another version uses them. Usage stays."""
        versions, labels = await asyncio.to_thread(self._lookup, name)
        self._authorize(versions[0], caller)
        if version is None or (len(versions) == 1 and versions[0].version == version):
            targets, new = versions, None
        else:
            targets = [a for a in versions if a.version == version]
            if not targets:
                raise ArchitectureNotFound(
                    f"{name} has no version {version}", architecture=name, version=version
                )
            new = policy.remove_version(labels, version)
        variants = [v for a in targets for v in self._store.list_variants(a.name)]

        def write() -> None:
            with self._registry.labels_lock:
                for arch in targets:
                    self._store.delete_architecture(arch.name)
                if new is None:
                    self._store.delete_labels(name)
                else:
                    self._store.put_labels(new)

        await asyncio.to_thread(write)
        await self._router.refresh_async()
        names = [v.name for v in variants]
        await self._drain(names)
        for n in names:
            if self._pool.is_loaded(n):
                with contextlib.suppress(Exception):
                    await self._pool.unload(n, reason="deleted")
        removed = await asyncio.to_thread(
            self._registry.remove_artifacts, [a.artifact for a in targets] + [v.artifact for v in variants]
        )
        what = name if version is None else version_name(name, version)
        self._event("delete", what, f"deleted {len(targets)} version(s), {len(names)} variant(s)")
        return Deleted(name, tuple(a.version for a in targets), len(names), removed)

    # ---- plumbing -------------------------------------------------------------------------
    def _event(self, kind: Change | Literal["delete"], variant: str, reason: str) -> None:
        if self._on_event is not None:
            self._on_event(FleetEvent(at_s=time.time(), kind=kind, variant=variant, reason=reason))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
