"""Integration fixtures: a real uvicorn server on a free port, in a thread of the test process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
import redis
import uvicorn
from fastapi import FastAPI

from infaas.api import create_app
from infaas.settings import Settings
from infaas.workers.inprocess import InProcessPool
from tests.conftest import redis_required

# Ray's dashboard agent listens on this fixed port (`ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT`),
# inside Linux's ephemeral range: picked here while free, it was taken by the Ray that
# `infaas serve` starts before binding its own port (a clean-clone CI run, 2026-12-07).
_RAY_FIXED_PORTS = frozenset({52365})


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _RAY_FIXED_PORTS:
            return port


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by process `pid` and its descendants (those alive now)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # one that exited meanwhile counts nothing
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def wait_until_idle(pid: int, idle_cores: float = 0.3, timeout_s: float = 30.0) -> bool:
    """Wait until process `pid`'s tree uses under `idle_cores` for two seconds in a row (False:
    still busy after `timeout_s`). A service's Ray workers and daemons start up for seconds after
    its first queries (~1 s of CPU each); on 2 cores a measurement taken then measures them."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < deadline:
        before = tree_cpu_seconds(pid)
        time.sleep(1.0)
        quiet = quiet + 1 if tree_cpu_seconds(pid) - before < idle_cores else 0
        if quiet == 2:
            return True
    return False


def create_key(url: str, admin_key: str, name: str, role: str = "tenant") -> str:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60.0) as c:
        r = c.post("/v1/admin/tenants", json={"name": name, "role": role})
        assert r.status_code == 201, r.text
        key: str = r.json()["api_key"]
        return key


@dataclass
class LiveServer:
    url: str
    app: FastAPI
    admin_key: str

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0)

    def new_tenant(self, name: str, role: str = "tenant") -> str:
        """A new key: role "tenant" queries, "owner" also registers into the tasks it owns."""
        return create_key(self.url, self.admin_key, name, role)


def serve_app(app: FastAPI) -> Iterator[str]:
    """Run `app` under uvicorn on a free port until the generator is closed; yields the URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    app.state.requests_in_flight = lambda: len(server.server_state.tasks)  # as `lifecycle.run` does
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass
class Served:
    """`infaas serve` running in its own process (see `serve_process`)."""

    url: str
    settings: Settings
    admin_key: str
    pid: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=60.0)

    def new_tenant(self, name: str, role: str = "tenant") -> str:
        """A new key: role "tenant" queries, "owner" also registers into the tasks it owns."""
        return create_key(self.url, self.admin_key, name, role)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def fleet(self, events: int = 200) -> dict[str, Any]:
        """`GET /v1/admin/fleet`."""
        with self.client(self.admin_key) as http:
            r = http.get("/v1/admin/fleet", params={"events": events})
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

    def register_mlp(self, owner_key: str, name: str = "wide", task: str = "digits") -> list[str]:
        """Register `tests.tiny_models`' ONNX MLP through `POST /v1/models` (profiled); returns
        the names of its variants."""
        from tests import tiny_models

        return self.register_onnx(owner_key, tiny_models.mlp_onnx(), name, task)

    def register_onnx(self, owner_key: str, model: bytes, name: str, task: str = "digits") -> list[str]:
        """Register an ONNX model of 64 digit features through `POST /v1/models`, validated on
        `tests.tiny_models.digits` and profiled; returns the names of its variants."""
        from tests import tiny_models

        x, y = tiny_models.digits(200)
        files = {
            "model": (f"{name}.onnx", model),
            "validation": ("val.npz", tiny_models.validation_bytes(x, y)),
        }
        meta = {"name": name, "task": task, "profile": True}
        with self.client(owner_key) as http:
            r = http.post("/v1/models", files=files, data={"metadata": json.dumps(meta)}, timeout=600)
            assert r.status_code == 201, r.text
            return [v["name"] for v in http.get(f"/v1/models/{name}/variants").json()["variants"]]


@contextmanager
def serve_process(
    source: Settings, workdir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> Iterator[Served]:
    """`infaas serve` in its own process, as deployed (its latencies are not distorted by the
    test's client threads sharing its GIL), on a copy of `source`'s data dir under `workdir` (the
    session's zoo is shared: work on a copy; a second call with the same `workdir` is a restart on
    the same data). `env` adds settings (``INFAAS_*``), `args` options of `infaas serve`. Stopped
    with SIGINT unless the test stopped it: usage flushed, workers closed, Ray stopped. It runs in
    a session of its own, and whatever is left of that session at the end (Ray's agents outlive a
    SIGKILLed driver) is killed."""
    data_dir = workdir / "data"
    if not data_dir.exists():
        shutil.copytree(source.data_dir, data_dir)
    settings = Settings(data_dir=data_dir, admin_key="admin-test-key", usage_flush_interval_s=0.2)
    # The port is free when picked, but `infaas serve` starts Ray (a dozen processes on random
    # ports) before it binds its own: Ray's Prometheus exporter once took it, and answered the
    # readiness check (a clean-clone CI run, 2026-12-08). A port taken meanwhile is picked again.
    for attempt in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = workdir / f"serve-{port}.log"
        log = log_path.open("w")
        proc = _start_serve(data_dir, settings, port, log, env, args)
        try:
            ready = _wait_ready(proc, url, log_path)
        except BaseException:
            _stop_serve(proc, log)
            raise
        if ready:
            break
        _stop_serve(proc, log)
        if attempt == 2:
            raise RuntimeError(f"infaas serve found its port taken three times; the last: {port}")
    try:
        yield Served(
            url=url, settings=settings, admin_key="admin-test-key", pid=proc.pid, proc=proc, log_path=log_path
        )
    finally:
        _stop_serve(proc, log)


def _start_serve(
    data_dir: Path,
    settings: Settings,
    port: int,
    log: IO[str],
    env: dict[str, str] | None,
    args: tuple[str, ...],
) -> subprocess.Popen[bytes]:
    full_env = {
        **os.environ,
        "INFAAS_DATA_DIR": str(data_dir),
        "INFAAS_ADMIN_KEY": settings.admin_key or "",
        "INFAAS_USAGE_FLUSH_INTERVAL_S": "0.2",
        "INFAAS_PORT": str(port),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        **(env or {}),
    }
    return subprocess.Popen(
        # One front end unless asked: the default follows the cores, and tests must not.
        [sys.executable, "-c", "from infaas.cli import main; main()", "serve", *(args or ("--workers", "1"))],
        env=full_env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> bool:
    """True once `url` answers infaas's readiness; False if another process holds its port (its
    answer is not infaas's, or `infaas serve` exited unable to bind); raises on any other failure."""
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            text = log_path.read_text()
            if "address already in use" in text.lower():
                return False
            raise RuntimeError(f"infaas serve exited: {text[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):  # not listening yet
            r = httpx.get(f"{url}/readyz", timeout=1)
            if r.status_code == 200:
                try:
                    return bool(r.json().get("ready"))
                except ValueError:  # not JSON: not infaas
                    return False
        if time.monotonic() > deadline:
            raise RuntimeError("infaas serve did not become ready in 120 s")
        time.sleep(0.2)


def _stop_serve(proc: subprocess.Popen[bytes], log: IO[str]) -> None:
    """Stop `infaas serve` with SIGINT (usage flushed, workers closed, Ray stopped), then kill what
    is left of its session."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # our own session only: Ray's leftovers, if any
    log.close()


def lone_variants(settings: Settings, task: str) -> set[str]:
    """The profiled variants of `task` that run on a Ray worker and may keep a lone copy in the
    front end (`workers.placement.lone_eligible`), under `settings`' bounds."""
    from infaas.store import open_store
    from infaas.workers.placement import decide_where, lone_eligible

    store = open_store(settings)
    try:
        tasks = {a.name: a.task for a in store.list_architectures()}
        profiles = {p.variant: p for p in store.list_profiles() if p.status == "ok"}
        return {
            v.name
            for v in store.list_variants()
            if tasks[v.architecture] == task
            and v.name in profiles
            and decide_where(v, profiles[v.name], settings.fast_path_max_ms).path == "remote"
            and lone_eligible(v, profiles[v.name], settings.lone_max_ms, settings.lone_memory_mb)
        }
    finally:
        store.close()


def tensorflow_variant(settings: Settings) -> str:
    """A profiled TensorFlow variant of the data dir (TensorFlow variants always run on a Ray
    worker, never on the front end's fast path)."""
    from infaas.store import open_store

    store = open_store(settings)
    try:
        ok = {p.variant for p in store.list_profiles() if p.status == "ok"}
        names = [v.name for v in store.list_variants() if v.spec.runtime == "tensorflow" and v.name in ok]
    finally:
        store.close()
    assert names, "the small zoo has a profiled TensorFlow variant"
    return sorted(names)[0]


def _quick_profiling(app: FastAPI, settings: Settings) -> None:
    """Registrations through the API profile their variants in quick mode (seconds, not minutes)."""
    from infaas.registry import build_registry
    from profiler.process import ProcessProfiler

    store = app.state.store
    profiler = ProcessProfiler(settings, store, quick=True)
    app.state.registry = build_registry(settings, store, profiler=profiler)


@pytest.fixture
def live_server(settings: Settings) -> Iterator[LiveServer]:
    # API-surface tests need no workers: an in-process pool keeps Ray (~3.4 s, ~700 MB) out of
    # them; the query path's integration tests start Ray once per module.
    app = create_app(settings, pool=InProcessPool(settings.artifacts_dir))
    _quick_profiling(app, settings)
    for url in serve_app(app):
        yield LiveServer(url=url, app=app, admin_key=app.state.admin_key)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of this test's own, on a free port, that the test may freeze."""
    binary = shutil.which("redis-server")
    if binary is None:
        if redis_required():
            pytest.fail("INFAAS_REQUIRE_REDIS is set but redis-server is not installed")
        pytest.skip(
            "redis-server is not installed (under INFAAS_REQUIRE_REDIS=1, as in CI, this fails instead)"
        )
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield url, proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
