"""Serving benchmark: ONNX variants behind several servers, measured in one run (see bench_serving).

Models (--models): `tiny`, an MLP 64 → 128 → 10 (~10 µs a row: the front end runs it), and
`heavy`, an MLP 64 → 3×2048 → 10 (compute-bound: a Ray worker runs it), fp32, or `heavy-int8`,
the same quantized to int8 by the variant generator's quantizer.

bare         the ONNX Runtime session called in this process (no server)
handwritten  FastAPI + ONNX Runtime in one uvicorn process, the session called inline
rayserve     a plain Ray Serve deployment behind Serve's HTTP proxy (max_ongoing_requests raised)
infaas-service  the real service: `infaas serve` with the variant registered and profiled in its
             store, queried through POST /v1/query with a tenant key, the variant pinned; the
             usage journal in its default mode (os: each charge handed to the OS before its
             answer, fdatasync'd in the background before every usage flush)
infaas-service-fsync-journal  the same with INFAAS_USAGE_JOURNAL=fsync: each charge on disk
             before its answer
infaas-service-nojournal  the same with the usage journal off (INFAAS_USAGE_JOURNAL=off): what
             journaling every charge before answering costs
infaas-service-nolone  the same with no lone copies (INFAAS_LONE_MAX_MS=0): a query arriving
             alone for a Ray-served variant goes through the Ray hop like any other
infaas-service-nolane  the same with INFAAS_HTTP_LANE=false: every query through the ASGI app
             instead of the HTTP protocol's query lane (`infaas.api.door`)
infaas-service-2fe  `infaas serve --workers 2`: two front-end processes on one port (SO_REUSEPORT)
             sharing one fleet, against `infaas-service` (`--workers 1`)
infaas       the infaas query path alone, as the service wires it: FastAPI front end → per-variant batcher
             (`AsyncBatcher`) → `RayPool`, with the front-end fast path for sub-hop variants
             (`Placement(pool, InProcessPool)`): this 10 µs model then runs in the front end
infaas-ray   the same with every batch through a Ray worker, over its socket stream (the default
             data path to workers, `infaas.workers.stream`)
infaas-ray-classic  the same with a classic Ray actor call per batch (INFAAS_WORKER_CHANNEL=classic)
infaas-nobatch  the same as infaas-ray with batching off: one Ray call per request
mlserver     MLServer 1.7.1 with adaptive batching (64 rows, 2 ms), the same ONNX model through ONNX
             Runtime with one thread, V2 inference protocol; needs its own environment
             (--mlserver-venv, default .venv-mlserver; the command to make it is printed if absent)

Each server runs in its own process; the load generator runs in this one: the c=1 requests through
aiohttp, the c=64 window from a bare asyncio HTTP/1.1 client (`--client bare`, the default: ~0.2
core at 4 000 req/s here, where aiohttp took 0.5-0.7 of the 2 cores the server needs) or from
aiohttp (`--client aiohttp`). All servers parse the same JSON body and return the same JSON answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from starlette.requests import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.integration.conftest import free_port, wait_until_idle  # free_port skips Ray's fixed ports
from tests.integration.load import take_replies  # the load tests' HTTP/1.1 reply parser

FEATURES = 64
ROW = [round(float(v), 4) for v in np.random.default_rng(0).random(FEATURES)]
BODY = json.dumps({"inputs": [ROW]}).encode()
V2_BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, FEATURES], "datatype": "FP32", "data": ROW}]})
# Loose, as in the service rows: these rows measure throughput, and a request the batcher drops
# at its deadline (504) would end the window.
DEADLINE_S = 10.0
MODELS = {  # name → (architecture, hidden layers, precision)
    "tiny": ("bench-mlp", (128,), "fp32"),
    "heavy": ("bench-heavy", (2048, 2048, 2048), "fp32"),
    # The heavy model: the int8 variant infaas picks where int8 is fast (AVX-512 VNNI).
    "heavy-int8": ("bench-heavy", (2048, 2048, 2048), "int8"),
}
# uvloop 0.22 made get_event_loop() raise outside a running loop, which kills MLServer 1.7's workers
MLSERVER_INSTALL = (
    "python3 -m venv .venv-mlserver && "
    ".venv-mlserver/bin/pip install mlserver==1.7.1 'uvloop<0.22' onnxruntime"
)


# ---- the model ------------------------------------------------------------------------------


def build_model(root: Path, model: str) -> tuple[Path, Any]:
    """An MLP (`MODELS[model]`) on scikit-learn's digits, converted to ONNX; (artifact, Variant)."""
    import hashlib
    import warnings

    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from infaas.types import Parity, Variant, VariantSpec

    arch, hidden, precision = MODELS[model]
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a benchmark model, not a good one
        iterations = 100 if len(hidden) == 1 else 2  # the heavy one is for its compute, not accuracy
        mlp = MLPClassifier(hidden_layer_sizes=hidden, max_iter=iterations, random_state=0).fit(x, y)
    onx = to_onnx(mlp, x[:1], options={id(mlp): {"zipmap": False}}, target_opset=17)
    rel = f"{arch}/model.onnx"
    (root / arch).mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(onx.SerializeToString())
    if precision == "int8":
        from variants.converters.quantize import quantize_int8

        quantized, _ = quantize_int8(root / rel, root / arch / "model.int8.onnx", x[:256])
        rel = str(quantized.relative_to(root))
    data = (root / rel).read_bytes()
    variant = Variant(
        spec=VariantSpec(
            architecture=arch, runtime="onnxruntime", precision=precision, threads=1, max_batch=64
        ),
        artifact=rel,
        sha256=hashlib.sha256(data).hexdigest(),
        parity=Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1),
    )
    return root / rel, variant


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    from variants.runtimes.onnxruntime import session_options

    return ort.InferenceSession(
        str(path), sess_options=session_options(1), providers=["CPUExecutionProvider"]
    )


def ort_predict(session: Any, x: np.ndarray) -> np.ndarray:
    name = session.get_inputs()[0].name
    out = session.run(None, {name: x})
    return np.asarray(out[-1], dtype=np.float32)


def bare(path: Path, variant: Any) -> tuple[dict[str, float], Any]:
    """p50 of the in-process call at batch 1, calls/s, and a Profile for the batcher."""
    import psutil

    from infaas.types import LatencyPoint, MachineInfo, Profile

    rss_before = psutil.Process().memory_info().rss
    session = ort_session(path)
    memory_mb = (psutil.Process().memory_info().rss - rss_before) / 2**20
    x1 = np.asarray([ROW], dtype=np.float32)
    points = []
    for batch in (1, 8, 32, 64):
        x = np.repeat(x1, batch, axis=0)
        for _ in range(200):
            ort_predict(session, x)
        times_ms = []
        for _ in range(1000 if batch == 1 else 300):
            t0 = time.perf_counter()
            ort_predict(session, x)
            times_ms.append((time.perf_counter() - t0) * 1000)
        times_ms.sort()

        def q(p: float, ts: list[float] = times_ms) -> float:
            return ts[min(len(ts) - 1, int(p * len(ts)))]

        points.append(
            LatencyPoint(
                batch=batch,
                p50_ms=q(0.5),
                p95_ms=q(0.95),
                p99_ms=q(0.99),
                mean_ms=statistics.fmean(times_ms),
                throughput_qps=batch * 1000 / statistics.fmean(times_ms),
                samples=len(times_ms),
                stable=True,
                stop_reason="bench",
                cost_usd_per_1k=0.0,
            )
        )
    profile = Profile(
        variant=variant.name,
        machine=MachineInfo(cpu_model="bench", cores=os.cpu_count() or 1),
        measured_at_s=time.time(),
        points=tuple(points),
        memory_mb=max(memory_mb, path.stat().st_size / 2**20),
    )
    p1 = points[0]
    return {"p50_ms": p1.p50_ms, "rps": 1000.0 / p1.mean_ms}, profile


# ---- the servers (each runs in its own process) ---------------------------------------------


def _json_response(outputs: np.ndarray, batch_rows: int | None = None) -> Any:
    from starlette.responses import Response

    body: dict[str, Any] = {"outputs": outputs.tolist()}
    if batch_rows is not None:  # the infaas servers say how large a batch each request ran in
        body["batch_rows"] = batch_rows
    return Response(json.dumps(body), media_type="application/json")


def serve_handwritten(port: int, workdir: Path) -> None:
    import uvicorn
    from fastapi import FastAPI

    session = ort_session(_artifact(workdir))
    app = FastAPI()

    @app.post("/predict")
    async def predict(request: Request) -> Any:
        body = json.loads(await request.body())
        return _json_response(ort_predict(session, np.asarray(body["inputs"], dtype=np.float32)))

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _artifact(workdir: Path) -> Path:
    from infaas.types import Variant

    variant = Variant.model_validate_json((workdir / "variant.json").read_text())
    return workdir / "artifacts" / variant.artifact


def serve_infaas(port: int, workdir: Path, batching: bool, inline: bool, channel: str) -> None:
    import gc
    from contextlib import asynccontextmanager

    import uvicorn
    from fastapi import FastAPI

    from infaas.batching import AsyncBatcher
    from infaas.settings import Settings
    from infaas.types import Profile, Variant
    from infaas.workers.inprocess import InProcessPool
    from infaas.workers.placement import Placement
    from infaas.workers.ray_pool import RayPool

    variant = Variant.model_validate_json((workdir / "variant.json").read_text())
    profile = Profile.model_validate_json((workdir / "profile.json").read_text())
    settings = Settings(data_dir=workdir / "data", worker_channel=channel)  # type: ignore[arg-type]
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        pool = RayPool(settings, artifacts_dir=workdir / "artifacts")
        await pool.ensure_loaded(variant)
        local = InProcessPool(workdir / "artifacts", memory_budget_mb=256.0) if inline else None
        placement = Placement(pool, local)
        state["batcher"] = AsyncBatcher(placement, batching=batching)
        # As `infaas serve` does after start-up (infaas.api.app): Ray's client and the imports,
        # out of the collector's sight. Without it a full collection walked ~137 000 objects
        # here, ~90 ms each, about once a second at c=64 (11 % of the front end's time).
        gc.collect()
        gc.freeze()
        yield
        await state["batcher"].close()
        await placement.close()
        await pool.close()

    app = FastAPI(
        lifespan=lifespan, telemetry={"tracing": False, "metrics": False, "logs": False}
    )  # as the service

    @app.post("/predict")
    async def predict(request: Request) -> Any:
        body = json.loads(await request.body())
        x = np.asarray(body["inputs"], dtype=np.float32)
        result = await state["batcher"].submit(variant, profile, x, time.monotonic() + DEADLINE_S)
        return _json_response(result.outputs, result.batch_rows)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_rayserve(port: int, workdir: Path) -> None:
    import ray
    from ray import serve

    from infaas.settings import Settings
    from infaas.workers.ray_pool import init_ray

    init_ray(Settings(data_dir=workdir / "data"))
    model_path = _artifact(workdir)

    @serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
    class Model:
        def __init__(self) -> None:
            self.session = ort_session(model_path)

        async def __call__(self, request: Request) -> dict[str, Any]:
            body = json.loads(await request.body())
            out = ort_predict(self.session, np.asarray(body["inputs"], dtype=np.float32))
            return {"outputs": out.tolist()}

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Model.bind(), route_prefix="/predict")  # type: ignore[attr-defined]
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


def direct_batching(workdir: Path, concurrency: int, seconds: float, rounds: int) -> None:
    """Without HTTP: `concurrency` coroutines submit one row each to the batcher over the Ray pool,
    batching on and off alternately; prints {"on": [req/s...], "off": [...]} as JSON."""
    from infaas.batching import AsyncBatcher
    from infaas.settings import Settings
    from infaas.types import Profile, Variant
    from infaas.workers.ray_pool import RayPool

    variant = Variant.model_validate_json((workdir / "variant.json").read_text())
    profile = Profile.model_validate_json((workdir / "profile.json").read_text())
    x = np.asarray([ROW], dtype=np.float32)

    async def window(batcher: AsyncBatcher) -> float:
        stop_s = time.perf_counter() + seconds
        done = 0

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < stop_s:
                await batcher.submit(variant, profile, x, time.monotonic() + DEADLINE_S)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)

    async def main() -> dict[str, list[float]]:
        pool = RayPool(Settings(data_dir=workdir / "data"), artifacts_dir=workdir / "artifacts")
        await pool.ensure_loaded(variant)
        out: dict[str, list[float]] = {"on": [], "off": []}
        try:
            for _ in range(rounds):
                for mode in ("on", "off"):
                    batcher = AsyncBatcher(pool, batching=mode == "on")
                    out[mode].append(await window(batcher))
                    await batcher.close()
        finally:
            await pool.close()
        return out

    print(json.dumps(asyncio.run(main())), flush=True)


# ---- load generation -----------------------------------------------------------------------


async def _post(session: Any, server: Server) -> tuple[float, int | None]:
    """One request: (latency in ms, the batch size it ran in where the server says)."""
    t0 = time.perf_counter()
    async with session.post(server.url, data=server.body, headers=server.headers) as resp:
        payload = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{server.url} answered {resp.status}: {payload[:300]!r}")
    answer = json.loads(payload)
    if len(answer["outputs"]) != 1:
        raise RuntimeError(f"{server.url} returned a wrong number of rows")
    return (time.perf_counter() - t0) * 1000, answer.get("batch_rows")


async def _wait_ready(server: Server, timeout_s: float) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                await _post(session, server)
                return
            except (aiohttp.ClientError, RuntimeError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


def cpu_seconds(server: Server) -> dict[str, float]:
    """CPU seconds used so far by the load generator (this process), the server's own process
    and its front-end children (the front end), its Ray worker processes and the rest of its tree
    (Ray's daemons)."""
    import psutil

    def used(proc: psutil.Process) -> float:
        try:
            t = proc.cpu_times()
            return float(t.user + t.system)
        except psutil.Error:
            return 0.0

    root = psutil.Process(server.proc.pid)
    out = {"load": used(psutil.Process()), "front end": used(root), "workers": 0.0, "daemons": 0.0}
    # Linux: the front end's main thread (its event loop) on a core, and runnable but waiting for
    # one (schedstat's first two fields): the second tells a front end that waits for work from
    # one that waits for a CPU.
    try:
        fields = Path(f"/proc/{root.pid}/task/{root.pid}/schedstat").read_text().split()
        out["front end loop on a core"] = int(fields[0]) / 1e9
        out["front end waiting for a core"] = int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    for child in root.children(recursive=True):
        try:
            name, cmdline = child.name(), child.cmdline()
        except psutil.Error:
            continue
        # `serve --workers N` starts its front ends as children with --reuse-port.
        ray_worker = "ray::" in name + " " + " ".join(cmdline[:1])
        part = "workers" if ray_worker else "front end" if "--reuse-port" in cmdline else "daemons"
        out[part] += used(child)
    return out


class _ClosedLoopConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the bare client: one request out at a time, the next
    written as soon as the reply is in, until `window.stop_s`."""

    def __init__(self, request: bytes, window: _Window) -> None:
        self._request = request
        self._window = window
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        transport.write(self._request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        for reply in take_replies(self._buf):
            self._window.answered(reply.status, reply.body)
            if time.perf_counter() < self._window.stop_s:
                assert self._transport is not None
                self._transport.write(self._request)
            else:
                self._window.closed(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._window.closed(self, exc)


@dataclass
class _Window:
    """What the bare client's connections count: answers (checked as `_post` checks them) and the
    batch sizes they ran in, until `stop_s`; `finished` resolves once every connection is done."""

    stop_s: float
    finished: asyncio.Future[None]
    open: int
    done: int = 0
    batch_rows: list[int] = field(default_factory=list)
    error: str | None = None

    def answered(self, status: int, body: bytes) -> None:
        if status != 200:
            self.error = self.error or f"answered {status}: {body[:300]!r}"
            return
        answer = json.loads(body)
        if len(answer["outputs"]) != 1:
            self.error = self.error or "a wrong number of rows"
        self.done += 1
        if (rows := answer.get("batch_rows")) is not None:
            self.batch_rows.append(rows)

    def closed(self, conn: _ClosedLoopConnection, exc: Exception | None = None) -> None:
        if exc is not None:
            self.error = self.error or f"connection lost: {exc!r}"
        self.open -= 1
        if self.open == 0 and not self.finished.done():
            self.finished.set_result(None)


async def bare_closed_loop(server: Server, concurrency: int, seconds: float) -> _Window:
    """`concurrency` clients back to back for `seconds`, from a bare asyncio HTTP/1.1 client
    (one request out per connection, the body and headers written once): on 2 shared cores
    aiohttp's own CPU (~0.4-0.55 core here at these rates) is taken from the server it measures."""
    url = urllib.parse.urlsplit(server.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    headers = {**server.headers, "Host": f"{host}:{port}", "Content-Length": str(len(server.body))}
    request = (
        f"POST {url.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    ).encode() + server.body
    loop = asyncio.get_running_loop()
    window = _Window(time.perf_counter() + seconds, loop.create_future(), concurrency)
    for _ in range(concurrency):
        await loop.create_connection(lambda: _ClosedLoopConnection(request, window), host, port)
    await window.finished
    if window.error is not None:
        raise RuntimeError(f"{server.url}: {window.error}")
    return window


async def measure(
    server: Server, c1_requests: int, c64_s: float, concurrency: int, client: str = "bare"
) -> tuple[list[float], float, float | None, dict[str, float]]:
    """One window: `c1_requests` sequential latencies (ms, aiohttp), then req/s at `concurrency`
    for `c64_s` from `client` (`bare`: `bare_closed_loop`; `aiohttp`: one aiohttp session), the
    mean batch size the requests of that window ran in (None where the server does not batch),
    and the cores each part used in that window (`cpu_seconds` ÷ its length). The mean batch
    shows whether the batcher really merges requests arriving over HTTP; the cores show where a
    2-core machine's CPU went."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(50):
            await _post(session, server)
        lat = [(await _post(session, server))[0] for _ in range(c1_requests)]

        stop_s = 0.0
        done = 0
        batch_rows: list[int] = []

        async def one_client() -> None:
            nonlocal done
            while time.perf_counter() < stop_s:
                _, rows = await _post(session, server)
                done += 1
                if rows is not None:
                    batch_rows.append(rows)

        async def window(seconds: float) -> None:
            nonlocal stop_s, done, batch_rows
            if client == "bare":
                counted = await bare_closed_loop(server, concurrency, seconds)
                done, batch_rows = counted.done, counted.batch_rows
            else:
                done, batch_rows, stop_s = 0, [], time.perf_counter() + seconds
                await asyncio.gather(*(one_client() for _ in range(concurrency)))

        settle(server)  # what the c=1 requests started (Ray's idle workers) is not the window's
        await window(0.5)  # warm-up at full concurrency
        cpu_before = cpu_seconds(server)
        t0 = time.perf_counter()
        await window(c64_s)
        elapsed_s = time.perf_counter() - t0
        rps = done / elapsed_s
        cores = {k: (v - cpu_before[k]) / elapsed_s for k, v in cpu_seconds(server).items()}
    return lat, rps, (statistics.fmean(batch_rows) if batch_rows else None), cores


@dataclass
class Server:
    kind: str
    proc: subprocess.Popen[bytes]
    url: str
    body: bytes = BODY
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


SERVICE_TASK = "bench-digits"
ADMIN_KEY = "bench-admin-key"


def prepare_service(workdir: Path, artifact: Path, variant: Any, profile: Any) -> Path:
    """A data dir for `infaas serve` holding the benchmark variant as a registered architecture,
    with its profile measured above (on this machine) and the default price table."""
    import hashlib
    import shutil

    from infaas.settings import Settings
    from infaas.store import open_store
    from infaas.types import Architecture, InputSpec, Task
    from profiler.machine import local_machine

    data_dir = workdir / "service"
    settings = Settings(data_dir=data_dir)
    target = settings.artifacts_dir / variant.artifact
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(artifact, target)
    task = Task(
        name=SERVICE_TASK,
        input_spec=InputSpec(shape=(FEATURES,)),
        num_classes=10,
        validation_artifact="bench/validation.npz",
        validation_size=1,
    )
    arch = Architecture(
        name=variant.architecture,
        task=SERVICE_TASK,
        kind="onnx",
        source_sha256=hashlib.sha256(artifact.read_bytes()).hexdigest(),
        artifact=variant.artifact,
    )
    vcpu_usd_per_s = 0.031611 / 3600  # the default price table's N2 vCPU-hour
    local = profile.model_copy(
        update={"machine": local_machine(), "accuracy": 0.9, "price_usd_per_s": vcpu_usd_per_s}
    )
    store = open_store(settings)
    try:
        store.register_architecture(arch, [variant], [], task=task)
        store.put_profile(local)
    finally:
        store.close()
    return data_dir


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    """Until `infaas serve` at `base` answers /readyz 200; raises if it exits or takes too long."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.3)


def serve_on(data_dir: Path, kind: str, log: Path, settings: dict[str, str]) -> Server:
    """`infaas serve` on `data_dir` with the admin key `ADMIN_KEY` and `settings` (INFAAS_*),
    output to `log`, ready; exits with a pointer to the log if it does not come up."""
    port = free_port()
    env = {
        **os.environ,
        "INFAAS_DATA_DIR": str(data_dir),
        "INFAAS_ADMIN_KEY": ADMIN_KEY,
        "INFAAS_PORT": str(port),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        **settings,
    }
    cmd = [sys.executable, "-c", "from infaas.cli import main; main()", "serve", "--workers", "1"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(kind, proc, f"http://127.0.0.1:{port}/v1/query")
    try:
        wait_ready(server.url.removesuffix("/v1/query"), proc)
    except OSError:
        stop_server(server)
        raise SystemExit(f"{kind}: the service did not start; see {log}") from None
    return server


SERVICE_SETTINGS = {
    "infaas-service": {},
    "infaas-service-fsync-journal": {"INFAAS_USAGE_JOURNAL": "fsync"},
    "infaas-service-nojournal": {"INFAAS_USAGE_JOURNAL": "off"},
    "infaas-service-nolone": {"INFAAS_LONE_MAX_MS": "0"},
    "infaas-service-nolane": {"INFAAS_HTTP_LANE": "false"},
    "infaas-service-2fe": {},
}
"""Each `infaas serve` kind's settings beyond the defaults (the usage journal in its default `os`);
`infaas-service-2fe` runs two front ends, the others one."""


def start_service(workdir: Path, variant: Any, kind: str) -> Server:
    """`infaas serve` as `kind` (`SERVICE_SETTINGS`) on the prepared data dir, and a tenant pinned
    to the benchmark variant."""
    import urllib.request

    port = free_port()
    env = {
        **os.environ,
        "INFAAS_DATA_DIR": str(workdir / "service"),
        "INFAAS_ADMIN_KEY": ADMIN_KEY,
        "INFAAS_PORT": str(port),
        **SERVICE_SETTINGS[kind],
    }
    front_ends = 2 if kind == "infaas-service-2fe" else 1
    cmd = [sys.executable, "-c", "from infaas.cli import main; main()", "serve", "--workers", str(front_ends)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    server = Server(kind, proc, f"{base}/v1/query")
    try:
        wait_ready(base, proc)
        req = urllib.request.Request(
            f"{base}/v1/admin/tenants",
            data=json.dumps({"name": f"bench-{port}"}).encode(),
            headers={"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            api_key = json.loads(resp.read())["api_key"]
        server.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        server.body = json.dumps(
            # A loose target: this measures throughput, not admission. At c=64 on 2 cores the
            # p99 of the service's own latency nears 100 ms, and infaas then refuses (429) what it
            # predicts would miss a 100 ms target.
            {"task": SERVICE_TASK, "inputs": [ROW], "latency_ms": 10_000, "variant": variant.name}
        ).encode()
        asyncio.run(_wait_ready(server, timeout_s=60))
    except Exception:
        stop_server(server)
        _, err = proc.communicate(timeout=30)
        sys.stderr.write(err.decode(errors="replace")[-3000:])
        raise
    return server


def start_mlserver(workdir: Path, venv: Path) -> Server:
    """MLServer from its own environment, serving the model through `mlserver_onnx_runtime`."""
    import shutil

    home = workdir / "mlserver"
    model_dir = home / "bench"
    model_dir.mkdir(parents=True, exist_ok=True)
    runtime = "mlserver_onnx_runtime.py"
    shutil.copyfile(Path(__file__).with_name(runtime), model_dir / runtime)
    port = free_port()
    (home / "settings.json").write_text(
        json.dumps({"http_port": port, "grpc_port": free_port(), "metrics_port": free_port()})
    )
    (model_dir / "model-settings.json").write_text(
        json.dumps(
            {
                "name": "bench",
                "implementation": "mlserver_onnx_runtime.OnnxModel",
                "max_batch_size": 64,
                "max_batch_time": 0.002,
                "parameters": {"uri": str(_artifact(workdir))},
            }
        )
    )
    cmd = [str(venv.resolve() / "bin" / "mlserver"), "start", str(home)]  # it runs in home
    with (home / "mlserver.log").open("w") as log:  # its access log would fill a pipe
        proc = subprocess.Popen(cmd, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server("mlserver", proc, f"http://127.0.0.1:{port}/v2/models/bench/infer", body=V2_BODY.encode())
    return _ready(server)


def start_server(kind: str, workdir: Path) -> Server:
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--workdir", str(workdir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    return _ready(Server(kind, proc, f"http://127.0.0.1:{port}/predict"))


def _ready(server: Server) -> Server:
    """`server` once it answers, or its error output and the exception."""
    proc = server.proc
    try:
        asyncio.run(_wait_ready(server, timeout_s=120))
    except Exception:
        stop_server(server)
        _, err = proc.communicate(timeout=30)
        sys.stderr.write((err or b"(its output went to its log)").decode(errors="replace")[-3000:])
        raise
    return server


def settle(server: Server, idle_cores: float = 0.3, timeout_s: float = 30.0) -> None:
    """Wait until the server's process tree is idle (under `idle_cores` for two seconds in a row):
    in a `--workers 2` service Ray's dashboard agent and idle workers start up for seconds after
    the front ends join it (~1 s of CPU each), and a window that began then measured their
    start-up (0.35-0.65 core of "workers") as the server's. Not under 0.1 core: a `--workers 2`
    service with no queries stayed above that for the whole 30 s in three of five rounds."""
    if not wait_until_idle(server.proc.pid, idle_cores, timeout_s):
        print(f"  ({server.kind} still busy after {timeout_s:.0f} s; measuring anyway)", flush=True)


def stop_server(server: Server) -> None:
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=1000, help="sequential requests for p50 (c=1)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each c=64 throughput window")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--client",
        choices=("bare", "aiohttp"),
        default="bare",
        help="the c=64 load generator: a bare asyncio HTTP/1.1 client, or aiohttp (~2x its CPU)",
    )
    parser.add_argument("--models", default="tiny", help="comma-separated: tiny, heavy, heavy-int8")
    parser.add_argument(
        "--only",
        default="handwritten,rayserve,infaas-service,infaas-service-fsync-journal,infaas-service-nojournal,"
        "infaas,infaas-ray,infaas-nobatch,direct",
        help="servers to measure (direct: batching on/off without HTTP); also infaas-ray-classic, mlserver",
    )
    parser.add_argument("--mlserver-venv", type=Path, default=Path(".venv-mlserver"))
    args = parser.parse_args()
    if args.direct:
        direct_batching(args.workdir, args.concurrency, args.seconds / 2, args.rounds)
        return
    if args.serve:
        if args.serve == "handwritten":
            serve_handwritten(args.port, args.workdir)
        elif args.serve == "rayserve":
            serve_rayserve(args.port, args.workdir)
        else:
            serve_infaas(
                args.port,
                args.workdir,
                batching=args.serve != "infaas-nobatch",
                inline=args.serve == "infaas",
                channel="classic" if args.serve == "infaas-ray-classic" else "stream",
            )
        return
    kinds = [k for k in args.only.split(",") if k != "direct"]
    if "mlserver" in kinds and not (args.mlserver_venv / "bin" / "mlserver").exists():
        where = args.mlserver_venv
        raise SystemExit(f"mlserver: no environment at {where}; make it with\n  {MLSERVER_INSTALL}")

    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="infaas-bench-") as tmp:
        workdirs: dict[str, tuple[Path, Any]] = {}
        for model in args.models.split(","):
            workdir = Path(tmp) / model
            path, variant = build_model(workdir / "artifacts", model)
            results[model] = {}
            results[model]["bare"], profile = bare(path, variant)
            (workdir / "variant.json").write_text(variant.model_dump_json())
            (workdir / "profile.json").write_text(profile.model_dump_json())
            if any(kind.startswith("infaas-service") for kind in kinds):
                prepare_service(workdir, path, variant, profile)
            bare_us = results[model]["bare"]["p50_ms"] * 1000
            print(f"{model}: variant {variant.name}, bare p50 {bare_us:.0f} µs", flush=True)
            workdirs[model] = (workdir, variant)
        # Interleaved rounds, one server up at a time (an idle Ray instance still costs CPU on 2
        # cores): drifting background load on the shared machine then hits every server alike.
        # p50 over all rounds' latencies; throughput is the median round.
        latencies_ms: dict[tuple[str, str], list[float]] = {}
        rps: dict[tuple[str, str], list[float]] = {}
        for round_no in range(args.rounds):
            for model, (workdir, variant) in workdirs.items():
                for kind in kinds:
                    if kind in SERVICE_SETTINGS:
                        server = start_service(workdir, variant, kind)
                    elif kind == "mlserver":
                        server = start_mlserver(workdir, args.mlserver_venv)
                    else:
                        server = start_server(kind, workdir)
                    c1_requests = args.requests // args.rounds
                    try:
                        lat, window_rps, mean_batch, cores = asyncio.run(
                            measure(server, c1_requests, args.seconds, args.concurrency, args.client)
                        )
                    except Exception:
                        stop_server(server)
                        if server.proc.stderr is not None:
                            sys.stderr.write(server.proc.stderr.read().decode(errors="replace")[-3000:])
                        raise
                    finally:
                        stop_server(server)
                    latencies_ms.setdefault((model, kind), []).extend(lat)
                    rps.setdefault((model, kind), []).append(window_rps)
                    batch = "" if mean_batch is None else f", mean batch {mean_batch:.1f} rows"
                    used = ", ".join(f"{part} {n:.2f}" for part, n in cores.items() if n >= 0.005)
                    print(
                        f"  round {round_no + 1} {model} {kind}: p50 {statistics.median(lat):.3f} ms, "
                        f"{window_rps:.0f} req/s{batch}; cores: {used}",
                        flush=True,
                    )
        for (model, kind), values in rps.items():
            results[model][kind] = {
                "p50_ms": statistics.median(latencies_ms[(model, kind)]),
                "rps": statistics.median(values),
            }
        if "direct" in args.only.split(","):
            for model, (workdir, _) in workdirs.items():
                print(f"measuring batching on/off without HTTP ({model}) ...", flush=True)
                cmd = [sys.executable, __file__, "--direct", "--workdir", str(workdir)]
                cmd += ["--concurrency", str(args.concurrency), "--seconds", str(args.seconds)]
                cmd += ["--rounds", str(args.rounds)]
                out = subprocess.run(cmd, check=True, capture_output=True).stdout.splitlines()[-1]
                direct = json.loads(out)
                for mode in ("on", "off"):
                    rate = statistics.median(direct[mode])
                    results[model][f"direct-{mode}"] = {"p50_ms": float("nan"), "rps": rate}
    for model, table in results.items():
        print(f"\n### {model}")
        report(table, args.concurrency)
    data_path_goals(results, rps)


def report(results: dict[str, dict[str, float]], concurrency: int) -> None:
    base = results["bare"]["p50_ms"]
    print()
    print(f"| server | p50 at c=1 (ms) | p50 overhead over bare (ms) | req/s at c={concurrency} |")
    print("|---|---:|---:|---:|")
    for kind, r in results.items():
        rps = "—" if kind == "bare" else f"{r['rps']:.0f}"
        if kind.startswith("direct"):
            print(f"| {kind} (batcher → Ray, no HTTP) | — | — | {rps} |")
            continue
        print(f"| {kind} | {r['p50_ms']:.3f} | {r['p50_ms'] - base:.3f} | {rps} |")
    print()
    # The goals are for the real service when it was measured, else for the bare query path.
    name = "infaas-service" if "infaas-service" in results else "infaas"
    inf = results.get(name)
    if inf is None:
        return
    goals = [
        (f"{name} p50 overhead over bare (ms)", inf["p50_ms"] - base, "≤ 1", inf["p50_ms"] - base <= 1.0),
    ]
    if "handwritten" in results:
        # The query tax (issue 33): what the service adds over a hand-written server of the same
        # model, with every charge journaled in the default mode.
        tax = inf["p50_ms"] - results["handwritten"]["p50_ms"]
        goals.append((f"{name} p50 − hand-written p50 at c=1 (ms)", tax, "≤ 0.3", tax <= 0.3))
        ratio = inf["rps"] / results["handwritten"]["rps"]
        goals.append((f"throughput {name} / hand-written", ratio, "≥ 1.2", ratio >= 1.2))
    if "rayserve" in results:
        ratio = inf["rps"] / results["rayserve"]["rps"]
        goals.append((f"throughput {name} / Ray Serve", ratio, "≥ 5", ratio >= 5))
    off = results.get("infaas-service-nojournal")
    for kind, mode in (("infaas-service", "os"), ("infaas-service-fsync-journal", "fsync")):
        if off is not None and kind in results:
            ratio = results[kind]["rps"] / off["rps"]
            goals.append((f"throughput usage journal {mode} / off", ratio, "≥ 0.95", ratio >= 0.95))
            extra = results[kind]["p50_ms"] - off["p50_ms"]
            goals.append((f"p50 added by the usage journal ({mode}, ms)", extra, "—", True))
    if name != "infaas" and "infaas" in results:
        path = results["infaas"]
        goals.append(
            ("infaas (query path only) p50 overhead over bare (ms)", path["p50_ms"] - base, "—", True)
        )
        if "handwritten" in results:
            ratio = path["rps"] / results["handwritten"]["rps"]
            goals.append(("throughput infaas (query path only) / hand-written", ratio, "—", True))
    if "infaas-ray" in results:
        ray_path = results["infaas-ray"]
        goals.append(("infaas-ray p50 overhead over bare (ms)", ray_path["p50_ms"] - base, "—", True))
        if "handwritten" in results:
            ratio = ray_path["rps"] / results["handwritten"]["rps"]
            goals.append(("throughput infaas-ray / hand-written", ratio, "—", True))
        if "infaas-nobatch" in results:
            ratio = ray_path["rps"] / results["infaas-nobatch"]["rps"]
            goals.append(("throughput batching on / off (Ray path, HTTP)", ratio, "≥ 3", ratio >= 3))
    if "direct-on" in results:
        ratio = results["direct-on"]["rps"] / results["direct-off"]["rps"]
        goals.append(("throughput batching on / off (Ray path, no HTTP)", ratio, "≥ 3", ratio >= 3))
    if "infaas-service-2fe" in results and "infaas-service" in results:
        ratio = results["infaas-service-2fe"]["rps"] / results["infaas-service"]["rps"]
        goals.append(("throughput --workers 2 / --workers 1", ratio, "—", True))
    print("| ratio | measured | goal | met |")
    print("|---|---:|---|---|")
    for name, value, goal, met in goals:
        verdict = "" if goal == "—" else ("yes" if met else "no")
        print(f"| {name} | {value:.2f} | {goal} | {verdict} |")


def data_path_goals(
    results: dict[str, dict[str, dict[str, float]]], rounds: dict[tuple[str, str], list[float]]
) -> None:
    """The data path's goals (issue 15), where this run measured what they compare; `rounds` is
    each server's req/s per round, in round order."""
    goals: list[tuple[str, float, str, bool]] = []
    tiny = results.get("tiny", {})
    for model in ("heavy", "heavy-int8"):
        heavy = results.get(model, {})
        if "infaas" in tiny and "infaas-ray" in heavy:
            ratio = heavy["infaas-ray"]["rps"] / tiny["infaas"]["rps"]
            goals.append((f"{model} through the Ray path / tiny, req/s", ratio, "≥ 0.8", ratio >= 0.8))
            # The same ratio within each round (both measured seconds apart): this machine's
            # speed drifts between rounds by more than the difference asked about.
            paired = [
                h / t for h, t in zip(rounds[(model, "infaas-ray")], rounds[("tiny", "infaas")], strict=True)
            ]
            print(f"{model} through the Ray path / tiny, per round: " + ", ".join(f"{r:.2f}" for r in paired))
            median = statistics.median(paired)
            goals.append((f"{model} through the Ray path / tiny, median of rounds", median, "—", True))
    for model, table in results.items():
        if "infaas" in table and "mlserver" in table:
            ratio = table["infaas"]["rps"] / table["mlserver"]["rps"]
            goals.append((f"{model}: infaas / MLServer, req/s", ratio, "≥ 2", ratio >= 2))
            extra = table["infaas"]["p50_ms"] - table["mlserver"]["p50_ms"]
            goals.append((f"{model}: infaas p50 − MLServer p50 at c=1 (ms)", extra, "< 0", extra < 0))
        if "infaas-ray" in table and "infaas-ray-classic" in table:
            ratio = table["infaas-ray"]["rps"] / table["infaas-ray-classic"]["rps"]
            goals.append((f"{model}: stream / classic Ray path, req/s", ratio, "—", True))
            gain = table["infaas-ray-classic"]["p50_ms"] - table["infaas-ray"]["p50_ms"]
            goals.append((f"{model}: p50 saved by the stream (ms)", gain, "—", True))
    if "infaas" in tiny and "infaas-ray" in tiny:
        extra = tiny["infaas-ray"]["p50_ms"] - tiny["infaas"]["p50_ms"]
        goals.append(("tiny: Ray path p50 − in-process path p50 (ms)", extra, "≤ 0.5", extra <= 0.5))
    if not goals:
        return
    print("\n### the data path")
    print("| ratio | measured | goal | met |")
    print("|---|---:|---|---|")
    for name, value, goal, met in goals:
        verdict = "" if goal == "—" else ("yes" if met else "no")
        print(f"| {name} | {value:.2f} | {goal} | {verdict} |")


if __name__ == "__main__":
    main()
