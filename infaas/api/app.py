"""The app factory: the one wiring point of the HTTP service.

`create_app(settings)` builds the store and the services from one `Settings` object; tests pass
their own store. Long-lived resources are opened in the lifespan and closed on shutdown.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from infaas.api.auth import ensure_admin_key
from infaas.api.errors import install_error_handlers
from infaas.api.limits import BodyLimit
from infaas.api.routes import dashboard, fleet, health, metrics, tenants, usage
from infaas.api.routes import models as model_routes
from infaas.metrics import Metrics
from infaas.registry import build_registry
from infaas.settings import Settings
from infaas.store import MetadataStore, open_store
from profiler.process import ProcessProfiler

__all__ = ["create_app"]

_MB = 1024 * 1024


def create_app(settings: Settings, *, store: MetadataStore | None = None) -> FastAPI:
    """Build the service. `store` overrides the one the settings name (tests)."""
    owned_store = store is None
    the_store = store if store is not None else open_store(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owned_store:
                the_store.close()

    app = FastAPI(title="infaas", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.store = the_store
    app.state.admin_key = ensure_admin_key(settings)
    app.state.readiness_checks = {"store": lambda: the_store.list_tasks() is not None}
    # Admin views: its own Prometheus registry per app (never the global one), fed by the meter.
    app.state.metrics = Metrics(the_store, time.monotonic, sources=lambda: fleet.fleet_sources(app.state))
    install_error_handlers(app)
    app.add_middleware(
        BodyLimit,
        max_request_bytes=int(settings.max_request_mb * _MB),
        max_upload_bytes=int(settings.max_upload_mb * _MB),
    )
    for module in (health, tenants, usage, fleet, metrics, dashboard):
        app.include_router(module.router)
    # Registration: the use case behind POST /v1/models. Its profiler measures each new variant in
    # a worker process of its own before registration returns, so a new model is servable at once.
    app.state.registry = build_registry(settings, the_store, profiler=ProcessProfiler(settings, the_store))
    app.include_router(model_routes.router)
    return app
