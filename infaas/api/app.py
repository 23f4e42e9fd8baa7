"""The app factory: the one wiring point of the HTTP service.

`create_app(settings)` builds the store and the services from one `Settings` object; tests pass
their own store. Long-lived resources are opened in the lifespan and closed on shutdown.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from infaas.advice import RecentTraffic
from infaas.api.auth import KeyCache, ensure_admin_key
from infaas.api.errors import install_error_handlers
from infaas.api.gate import AuthGate
from infaas.api.limits import BodyLimit
from infaas.api.openapi import install_openapi
from infaas.api.routes import (
    dashboard,
    fleet,
    health,
    jobs,
    kserve,
    metrics,
    query,
    targets,
    tenants,
    tfserving,
    usage,
)
from infaas.api.routes import models as model_routes
from infaas.api.routes import versions as version_routes
from infaas.artifacts import RedisArtifacts, open_artifacts
from infaas.autoscaler import Autoscaler, Resources
from infaas.batching import AsyncBatcher
from infaas.changes import ChangeFeed
from infaas.dataplane import DataPlane
from infaas.jobs import JobRunner
from infaas.journal import UsageJournal
from infaas.metering import Meter, MeterFlusher
from infaas.metrics import Metrics
from infaas.peers import Peers
from infaas.periodic import Periodic
from infaas.policy.autoscaling import AutoscalingConfig
from infaas.policy.demand import DemandWindow
from infaas.quarantine import Quarantine
from infaas.registry import VariantProfiler, build_registry
from infaas.routelog import RouteLog
from infaas.router import Router
from infaas.settings import Settings
from infaas.snapshot import Machines
from infaas.store import MetadataStore, open_store
from infaas.trace_recorder import TraceRecorder
from infaas.types import MachineInfo
from infaas.versions import Versions
from infaas.workers.base import WorkerPool
from infaas.workers.inprocess import InProcessPool, artifact_loader
from infaas.workers.placement import LONE_FAMILY, Placement
from profiler.machine import local_machine
from profiler.process import ProcessProfiler

__all__ = ["create_app"]

_MB = 1024 * 1024

log = logging.getLogger(__name__)


async def _watch_pool(app: FastAPI, health: Callable[[], str | None]) -> None:
    """A front end whose Ray died cannot answer anything again: stop the process with a message
    and a non-zero code, so a supervisor restarts it, instead of failing every query."""
    problem = health()
    if problem is None:
        return
    stop = app.state.stop_server
    message = f"{problem}; stopping. Start `infaas serve` again (it starts a fresh local Ray)."
    if stop is not None:
        stop(3, message)
    else:
        log.error(message)


def _profiler(settings: Settings, store: MetadataStore) -> VariantProfiler:
    """Where registrations are profiled: here, or on a shared fleet whose artifacts every node can
    fetch, on a node of each machine class of the cluster."""
    artifacts = open_artifacts(settings)
    if settings.shared_fleet and isinstance(artifacts, RedisArtifacts):
        from infaas.workers.ray_profiler import RayProfiler  # only this path imports ray

        return RayProfiler(settings, store, artifacts, quick=settings.profile_quick)
    return ProcessProfiler(settings, store, quick=settings.profile_quick)


def create_app(
    settings: Settings,
    *,
    store: MetadataStore | None = None,
    pool: WorkerPool | None = None,
    machine: MachineInfo | None = None,
) -> FastAPI:
    """Build the service. `store` overrides the one the settings name, `pool` the Ray worker pool
    (tests and tiny setups pass an in-process one); what is passed in is not closed here.
    `machine` is the fingerprint profiles must carry to be used (default: this machine's)."""
    owned_store = store is None
    the_store = store if store is not None else open_store(settings)
    meter = Meter(the_store)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Charges go to the local journal before answers go out; the first flush replays what an
        # earlier process journaled but never flushed (a crash), or leaves it for later (store down).
        journal = (
            UsageJournal(settings.journal_path, fsync=settings.usage_journal == "fsync")
            if settings.usage_journal != "off"
            else None
        )
        meter.use_journal(journal)
        try:
            await asyncio.to_thread(meter.flush)
        except Exception as exc:
            log.warning(
                "usage from the journal not flushed yet (retried every %ss): %s",
                settings.usage_flush_interval_s,
                exc,
            )
        # The query path: worker pool (a lean local Ray unless settings.ray_address) → batcher →
        # router; the meter flushes usage in the background and once more at shutdown.
        resources: Callable[[], Resources] | None = None
        sync: Callable[[], Awaitable[None]] | None = None
        machines: Callable[[], Machines] | None = None
        if app.state.registry.artifacts.shared:
            # Artifacts registered before the store was shared become fetchable by every node.
            await asyncio.to_thread(app.state.registry.publish_artifacts)
        if pool is None:
            from infaas.workers.ray_pool import RayPool  # only this path imports ray

            ray_pool = RayPool(settings)
            resources = ray_pool.resources
            the_pool: WorkerPool = ray_pool
            # Variants faster than the Ray hop (~10 µs ONNX models) answer in the front end.
            fast_path = (
                InProcessPool(loader=artifact_loader(app.state.registry.artifacts), memory_budget_mb=256.0)
                if settings.fast_path_max_ms > 0
                else None
            )
            lone = (
                InProcessPool(
                    loader=artifact_loader(app.state.registry.artifacts),
                    memory_budget_mb=settings.lone_memory_mb,
                    worker_id="inprocess-lone",
                    family=LONE_FAMILY,
                )
                if settings.lone_max_ms > 0
                else None
            )
            placement = Placement(
                ray_pool,
                fast_path,
                inline_max_ms=settings.fast_path_max_ms,
                lone=lone,
                lone_max_ms=settings.lone_max_ms,
                lone_max_memory_mb=settings.lone_memory_mb,
            )
            if settings.shared_fleet:
                sync = ray_pool.sync
                here = machine or local_machine()

                def machines_now() -> Machines:
                    # Each variant is predicted with the profile of the class of the node it runs on.
                    return Machines(here, *ray_pool.machines())

                machines = machines_now
        else:
            the_pool = pool
            placement = Placement.wrap(pool)
        batcher = AsyncBatcher(
            placement,
            max_in_flight=settings.batches_in_flight_per_replica,
            max_queue_rows=settings.max_queue_rows,
        )
        the_router = Router(
            the_store,
            placement,
            batcher,
            machine=machine,
            machines=machines,
            quarantine=Quarantine(settings.quarantine_after_failures, settings.quarantine_backoff_s),
            on_event=app.state.route_log.add,
            # A local Ray's replicas share this host's cores with the front end; a cluster's run
            # on other hosts.
            replica_cores=(
                None
                if settings.shared_fleet
                else (machine or local_machine()).cores - settings.front_end_cpus
            ),
        )
        batcher.on_outcome = lambda variant, error: the_router.report(variant, error, time.monotonic())
        the_router.refresh()
        the_router.start()
        key_cache: KeyCache = app.state.key_cache
        changes = ChangeFeed(
            the_store,
            on_tenant=key_cache.drop_tenant,
            on_models=the_router.refresh_async,
            on_read=key_cache.confirm_all,
            on_gap=key_cache.clear,
            interval_s=settings.change_poll_interval_s,
        )
        await changes.tick()  # the cursor: what is in the log now is in the snapshot just read
        changes.start()
        the_router.warmer.warm_up()
        # Replicates, upgrades, downgrades and unloads from the demand the meter sees; on a shared
        # fleet, from every front end's, and only while this one holds the autoscaler lease.
        demand = DemandWindow()
        meter.add_listener(demand.listener)
        peers: Peers | None = None
        if settings.shared_fleet:
            name = settings.front_end_name or "fe"
            peers = Peers(
                the_store,
                f"{name}@{socket.gethostname()}:{os.getpid()}",
                demand,
                interval_s=settings.fleet_sync_interval_s,
            )

        def reserve(tenant: str, variant: str, pusd: int, now_s: float) -> None:
            """Reserved cost attributed to `tenant` (`policy.attribution`): to its usage and metrics."""
            snap = the_router.snapshot
            entry = snap.variants.get(variant)
            arch = snap.architectures.get(entry[0].architecture) if entry is not None else None
            task = arch.task if arch is not None else ""
            meter.add_reserved(tenant=tenant, task=task, variant=variant, pusd=pusd, now_s=now_s)
            app.state.metrics.observe_reserved(tenant, pusd)

        autoscaler = Autoscaler(
            placement,
            lambda: the_router.snapshot.variants,
            # Versions that take traffic only: the others are loaded and unloaded by their labels.
            lambda: {
                a.name: a.task
                for a in the_router.snapshot.architectures.values()
                if a.name in the_router.snapshot.serving
            },
            peers if peers is not None else demand,
            config=AutoscalingConfig(
                target_utilization=settings.autoscale_target_utilization,
                max_replicas=settings.max_replicas_per_variant,
                upscale_delay_s=settings.autoscale_upscale_delay_s,
                downscale_delay_s=settings.autoscale_downscale_delay_s,
                warm_ttl_s=settings.warm_ttl_s,
                gpu_share=settings.gpu_per_worker,
                actions=frozenset(settings.autoscale_actions.split(",")),
            ),
            queue_age_ms=batcher.oldest_age_ms,
            slowdown=batcher.slowdown,
            resources=resources,
            reserved_cpus=settings.front_end_cpus,
            interval_s=settings.autoscale_interval_s,
            act=settings.autoscale,
            leader=(lambda: peers.leader) if peers is not None else (lambda: True),
            reserve=reserve,
        )
        meter.add_charge_listener(autoscaler.reserved.charged)
        # Two loops: a sync waits on busy workers (one loading a TensorFlow variant answers late),
        # and must not make this front end's report go stale or its lease lapse meanwhile.
        shared_loops: list[Periodic] = []
        if peers is not None:
            await peers.tick()
            shared_loops.append(Periodic("fleet-peers", settings.fleet_sync_interval_s, peers.tick))
        if sync is not None:
            shared_loops.append(Periodic("fleet-sync", settings.fleet_sync_interval_s, sync))
        for loop in shared_loops:
            loop.start()
        app.state.peers = peers
        if settings.autoscale_interval_s > 0:
            if settings.autoscale:
                the_router.warmer.load_gate = autoscaler.admit_load
            autoscaler.start()
        flusher = MeterFlusher(meter, settings.usage_flush_interval_s)
        flusher.start()
        recording: Periodic | None = None
        if settings.record_trace is not None:
            recorder = TraceRecorder(settings.record_trace)
            meter.add_listener(recorder.listener)
            recording = Periodic("trace-recorder", 1.0, lambda: asyncio.to_thread(recorder.flush))
            recording.start()
        app.state.pool, app.state.batcher, app.state.router = the_pool, batcher, the_router
        app.state.placement = placement
        app.state.autoscaler = autoscaler
        app.state.dataplane = DataPlane(
            settings,
            the_store,
            the_router,
            batcher,
            meter,
            # Set by the server that runs the app (`lifecycle.run`): absent, nothing runs alone.
            requests_in_flight=getattr(app.state, "requests_in_flight", None),
        )
        app.state.jobs = job_runner = JobRunner(settings, the_store, the_router, batcher, meter)
        job_runner.start()  # resumes the jobs a stop left queued or running
        app.state.versions = versions = Versions(
            settings, the_store, app.state.registry, the_router, placement, batcher, app.state.route_log.add
        )
        pool_health: Callable[[], str | None] = getattr(the_pool, "health", lambda: None)
        app.state.readiness_checks.update(
            workers=lambda: pool_health() or True,
            warm_up=lambda: (
                the_router.warmer.warming_up == 0 or f"{the_router.warmer.warming_up} variant(s) loading"
            ),
        )
        watch = app.state.dataplane.loop_watch

        async def tick() -> None:
            watch.tick(time.monotonic())

        loop_lag = Periodic("loop-lag", watch.tick_s, tick)
        loop_lag.start()
        watchdog = Periodic("worker-pool-watchdog", 1.0, lambda: _watch_pool(app, pool_health))
        watchdog.start()
        # What start-up made (Ray's client, the imported frameworks, the snapshot) lives as long
        # as the process: out of the collector's sight, a full collection no longer walks it
        # (full collections took 40-80 ms here, each stalling every request in flight).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await watchdog.close()
            await loop_lag.close()
            await changes.close()
            for loop in shared_loops:
                await loop.close()
            if peers is not None:
                await peers.close()
            if recording is not None:
                await recording.close()
                recorder.flush()
            await job_runner.close()
            await versions.close()
            await autoscaler.close()
            await the_router.close()
            await batcher.close()
            try:
                await flusher.close()
            except Exception as exc:
                left = len(journal) if journal is not None else 0
                log.error(
                    "last usage flush failed (%s): %d charge(s) stay in the journal for the next start",
                    exc,
                    left,
                )
            meter.use_journal(None)
            if journal is not None:
                journal.close()
            if pool is None:  # what was passed in is its owner's to close
                await placement.close()
                await the_pool.close()
            if owned_store:
                the_store.close()

    # FastAPI's built-in OpenTelemetry hooks off: infaas exports its own Prometheus metrics, and
    # with them on FastAPI asks the global OTel providers on every request whether to trace.
    app = FastAPI(
        title="infaas",
        version="0.1.0",
        lifespan=lifespan,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.store = the_store
    app.state.admin_key = ensure_admin_key(settings)
    app.state.key_cache = KeyCache(grace_s=settings.key_grace_s)  # resolved tenant keys; see infaas.api.auth
    app.state.readiness_checks = {"store": lambda: the_store.list_tasks() is not None}
    app.state.stop_server = None  # set by `infaas.api.lifecycle.run`: stops the process with a code

    # Admin views: its own Prometheus registry per app (never the global one), fed by the meter.
    def catalog() -> tuple[list[str], list[str]]:
        router: Router | None = getattr(app.state, "router", None)
        snap = router.snapshot if router is not None else None
        return (list(snap.tasks), list(snap.variants)) if snap is not None else ([], [])

    app.state.metrics = Metrics(
        the_store,
        time.monotonic,
        sources=lambda: fleet.fleet_sources(app.state),
        catalog=catalog,
        costs=lambda: autoscaler.cost if (autoscaler := getattr(app.state, "autoscaler", None)) else None,
        admission=lambda: plane.limit if (plane := getattr(app.state, "dataplane", None)) else None,
    )
    app.state.meter = meter
    meter.add_listener(app.state.metrics.listener)
    app.state.route_log = RouteLog()  # routing changes for the fleet view
    meter.add_listener(app.state.route_log.listener)
    app.state.recent_traffic = RecentTraffic()  # each tenant's recent queries, for /v1/usage/advice
    meter.add_listener(app.state.recent_traffic.listener)
    app.state.advice_cache = {}
    install_error_handlers(app)
    install_openapi(app)  # validation failures answer 400 + ErrorBody, not FastAPI's documented 422
    app.state.max_request_bytes = int(settings.max_request_mb * _MB)  # also the HTTP lane's limit
    app.add_middleware(
        BodyLimit,
        max_request_bytes=app.state.max_request_bytes,
        max_upload_bytes=int(settings.max_upload_mb * _MB),
    )
    app.add_middleware(AuthGate)  # outside the body limit: a stranger gets 401, not 413
    app.add_middleware(query.QueryLane, max_request_bytes=app.state.max_request_bytes)
    app.add_middleware(query.ReceiptStamp)  # outermost: latency_ms counts from here
    modules = (
        health,
        tenants,
        usage,
        targets,
        fleet,
        metrics,
        dashboard,
        query,
        version_routes,
        kserve,
        jobs,
    )
    for module in modules:
        app.include_router(module.router)
    # Registration: the use case behind POST /v1/models. Its profiler measures each new variant in
    # a worker process of its own before registration returns, so a new model is servable at once.
    app.state.registry = build_registry(settings, the_store, profiler=_profiler(settings, the_store))
    app.include_router(model_routes.router)
    app.include_router(tfserving.router)  # after infaas's own /v1/models routes (see its docstring)
    return app
