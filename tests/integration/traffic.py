"""Helpers for the admin-view tests: a real server over a private copy of the small zoo, and real
`/v1/query` traffic from several tenants (shared by tests/integration and the browser test)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from infaas.api import create_app
from infaas.settings import Settings
from infaas.workers.inprocess import InProcessPool
from tests.integration.conftest import LiveServer, serve_app
from variants import zoo


@contextmanager
def zoo_server(small_zoo: Settings, tmp_path: Path) -> Iterator[LiveServer]:
    """A live server on a copy of the small zoo's data dir (queries write usage; the session's
    zoo stays read-only). Variants run in an in-process pool: real runtimes, no Ray start-up."""
    data_dir = tmp_path / "zoo-data"
    shutil.copytree(small_zoo.data_dir, data_dir)
    settings = Settings(data_dir=data_dir, admin_key="admin-test-key", usage_flush_interval_s=0.1)
    pool = InProcessPool(settings.artifacts_dir)
    app = create_app(settings, pool=pool)
    server = serve_app(app)
    try:
        yield LiveServer(url=next(server), app=app, admin_key=app.state.admin_key)
    finally:
        server.close()  # stops uvicorn (the app's shutdown flushes the meter)
        asyncio.run(pool.close())


@dataclass
class Sent:
    """What the responses said, per tenant: the ground truth the usage views must match."""

    queries: dict[str, int] = field(default_factory=dict)
    cost_pusd: dict[str, int] = field(default_factory=dict)
    by_variant: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, variant) -> queries
    failures: dict[str, int] = field(default_factory=dict)

    def add(self, tenant: str, body: dict[str, Any]) -> None:
        self.queries[tenant] = self.queries.get(tenant, 0) + 1
        self.cost_pusd[tenant] = self.cost_pusd.get(tenant, 0) + int(body["cost_pusd"])
        key = (tenant, body["variant"])
        self.by_variant[key] = self.by_variant.get(key, 0) + 1


def send_traffic(server: LiveServer, keys: dict[str, str], per_tenant: dict[str, int]) -> Sent:
    """`per_tenant[t]` answered queries from tenant `t` (digits and breast cancer, 1-4 rows, from
    4 threads so batches form), plus one query for an unknown task per tenant (a 404)."""
    digits = zoo.load_split(zoo.DIGITS).x_test
    cancer = zoo.load_split(zoo.BREAST_CANCER).x_test
    jobs: list[tuple[str, dict[str, Any]]] = []
    for tenant, n in per_tenant.items():
        for i in range(n):
            x = digits if i % 3 else cancer
            task = zoo.DIGITS if i % 3 else zoo.BREAST_CANCER
            rows = x[i % 20 : i % 20 + 1 + i % 4].tolist()
            jobs.append((tenant, {"task": task, "inputs": rows, "latency_ms": 2000, "min_accuracy": 0.8}))
    sent = Sent()
    clients = {t: server.client(k) for t, k in keys.items()}
    try:

        def one(job: tuple[str, dict[str, Any]]) -> tuple[str, httpx.Response]:
            tenant, body = job
            return tenant, clients[tenant].post("/v1/query", json=body)

        with ThreadPoolExecutor(4) as ex:
            for tenant, resp in ex.map(one, jobs):
                assert resp.status_code == 200, resp.text
                sent.add(tenant, resp.json())
        for tenant, client in clients.items():
            r = client.post("/v1/query", json={"task": "no-such-task", "inputs": [[1.0]], "latency_ms": 50})
            assert r.status_code == 404, r.text
            sent.failures[tenant] = sent.failures.get(tenant, 0) + 1
    finally:
        for c in clients.values():
            c.close()
    return sent


def wait_for_usage(server: LiveServer, expected_queries: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """The admin usage report once the meter's flush has written every answered query."""
    deadline = time.monotonic() + timeout_s
    with server.client(server.admin_key) as admin:
        while True:
            report: dict[str, Any] = admin.get("/v1/admin/usage", params={"from": "1h"}).json()
            if report["totals"]["queries"] >= expected_queries or time.monotonic() > deadline:
                return report
            time.sleep(0.1)
