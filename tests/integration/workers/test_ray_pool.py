"""The Ray worker pool with real Ray actors and real ONNX Runtime / scikit-learn variants.

One local Ray instance for the module; each test builds its own pool (its own actors) on it.
The variants are small logistic regressions on scikit-learn's digits, built here with skl2onnx.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from infaas.batching import AsyncBatcher
from infaas.errors import Unavailable
from infaas.settings import Settings
from infaas.types import LatencyPoint, MachineInfo, Parity, Profile, RuntimeName, Variant, VariantSpec
from infaas.workers.ray_pool import RayPool, init_ray
from variants.runtimes import load_variant

pytestmark = [pytest.mark.ray, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _write_variant(root: Path, arch: str, runtime: RuntimeName, data: bytes, filename: str) -> Variant:
    rel = f"{arch}/{filename}"
    (root / arch).mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)
    return Variant(
        spec=VariantSpec(architecture=arch, runtime=runtime, threads=1, max_batch=64),
        artifact=rel,
        sha256=hashlib.sha256(data).hexdigest(),
        parity=Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1),
    )


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Variant], np.ndarray]:
    """Three ONNX logistic regressions and one scikit-learn one, and validation rows."""
    import io

    import joblib
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    root = tmp_path_factory.mktemp("artifacts")
    variants: dict[str, Variant] = {}
    for arch, c in (("lr-a", 0.1), ("lr-b", 1.0), ("lr-c", 10.0)):
        model = LogisticRegression(C=c, max_iter=300).fit(x[:1200], y[:1200])
        onx = to_onnx(model, x[:1], options={id(model): {"zipmap": False}}, target_opset=17)
        variants[arch] = _write_variant(root, arch, "onnxruntime", onx.SerializeToString(), "model.onnx")
    buf = io.BytesIO()
    joblib.dump(LogisticRegression(max_iter=300).fit(x[:1200], y[:1200]), buf)
    variants["sk"] = _write_variant(root, "lr-sk", "sklearn", buf.getvalue(), "model.joblib")
    return root, variants, x[1200:]


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    import ray

    settings = Settings(data_dir=tmp_path_factory.mktemp("data"))
    started = init_ray(settings, num_cpus=2)
    yield settings
    if started:
        ray.shutdown()


def expected(root: Path, variant: Variant, rows: np.ndarray) -> np.ndarray:
    model = load_variant(variant, root)
    try:
        return model.predict(rows)
    finally:
        model.close()


async def test_loads_on_demand_and_matches_the_in_process_runtime(ray_session: Settings, zoo) -> None:  # type: ignore[no-untyped-def]
    root, variants, rows = zoo
    pool = RayPool(ray_session, artifacts_dir=root)
    try:
        a, sk = variants["lr-a"], variants["sk"]
        assert not pool.is_loaded(a.name)
        out = await pool.run(a, rows[:16])
        np.testing.assert_allclose(out, expected(root, a, rows[:16]), rtol=1e-5, atol=1e-6)
        out_sk = await pool.run(sk, rows[:5])
        np.testing.assert_allclose(out_sk, expected(root, sk, rows[:5]), rtol=1e-5, atol=1e-6)
        fleet = {w.family: w for w in pool.fleet()}
        assert fleet["onnxruntime"].loaded == (a.name,) and fleet["sklearn"].loaded == (sk.name,)
        assert all(w.alive and w.memory_used_mb > 0 for w in fleet.values())
        assert [(e.kind, e.variant) for e in pool.events()] == [("load", a.name), ("load", sk.name)]
        # a second variant of the family gets a worker of its own while the family is under its
        # cap: a worker runs one batch at a time, so co-hosted variants would wait for each other
        await pool.run(variants["lr-b"], rows[:3])
        assert pool.placement() == {a.name: ["onnxruntime-0"], sk.name: ["sklearn-1"],
                                    variants["lr-b"].name: ["onnxruntime-2"]}  # fmt: skip
    finally:
        await pool.close()


async def test_batches_take_the_worker_stream_and_match_the_classic_call(ray_session: Settings, zoo) -> None:  # type: ignore[no-untyped-def]
    """Batches reach a worker over its socket stream; 60 at once all come back, each with its own
    rows; an error raised in the worker is a 503 with the cause and leaves the stream serving; a
    classic-call pool answers the same."""
    root, variants, rows = zoo
    a = variants["lr-a"]
    stream = RayPool(
        ray_session.model_copy(update={"worker_channel": "stream"}),
        artifacts_dir=root,
        max_workers_per_family=1,
    )
    classic = RayPool(
        ray_session.model_copy(update={"worker_channel": "classic"}),
        artifacts_dir=root,
        max_workers_per_family=1,
    )
    try:
        outs = await asyncio.gather(*(stream.run(a, rows[i : i + 3]) for i in range(0, 180, 3)))
        np.testing.assert_allclose(np.concatenate(outs), expected(root, a, rows[:180]), rtol=1e-5, atol=1e-6)
        assert [w.channel for w in stream.fleet()] == ["stream"]
        with pytest.raises(Unavailable, match="failed: "):
            await stream.run(a, np.ones((2, 7), dtype=np.float32))  # the model takes 64 features
        again = await stream.run(a, rows[:5])
        np.testing.assert_array_equal(again, await classic.run(a, rows[:5]))
        assert [w.channel for w in classic.fleet()] == ["classic"]
        assert not [e for e in stream.events() if e.kind == "channel"]  # no fallback happened
    finally:
        await stream.close()
        await classic.close()


async def test_evicts_least_recently_used_under_a_small_budget(ray_session: Settings, zoo) -> None:  # type: ignore[no-untyped-def]
    root, variants, rows = zoo
    a, b = variants["lr-a"], variants["lr-b"]
    # 1 MB is below any worker's baseline: every load evicts whatever else the worker holds
    pool = RayPool(ray_session, artifacts_dir=root, memory_budget_mb=1.0, max_workers_per_family=1)
    try:
        await pool.run(a, rows[:2])
        out = await pool.run(b, rows[:4])
        np.testing.assert_allclose(out, expected(root, b, rows[:4]), rtol=1e-5, atol=1e-6)
        assert pool.fleet()[0].loaded == (b.name,) and not pool.is_loaded(a.name)
        await pool.run(a, rows[:2])  # reloaded on demand, evicting b
        assert pool.fleet()[0].loaded == (a.name,)
        kinds = [(e.kind, e.variant) for e in pool.events()]
        assert kinds == [
            ("load", a.name),
            ("evict", a.name),
            ("load", b.name),
            ("evict", b.name),
            ("load", a.name),
        ]
        # Its framework and its model stay out of the collector's sight, evictions included: a
        # full collection walks what the batches make, not the ~320 000 objects of a TF import.
        heap = await pool.worker_handle(pool.fleet()[0].worker_id).heap.remote()
        assert heap["frozen"] > 4 * heap["tracked"], heap
    finally:
        await pool.close()


async def test_replicates_on_another_worker(ray_session: Settings, zoo) -> None:  # type: ignore[no-untyped-def]
    root, variants, rows = zoo
    a = variants["lr-a"]
    pool = RayPool(ray_session, artifacts_dir=root, max_workers_per_family=2)
    try:
        await pool.ensure_loaded(a)
        second = await pool.replicate(a)
        assert pool.replicas(a.name) == 2 and len(set(pool.placement()[a.name])) == 2
        assert second in pool.placement()[a.name]
        with pytest.raises(Unavailable, match="already hold it"):
            await pool.replicate(a)
        outs = await asyncio.gather(*(pool.run(a, rows[i : i + 4]) for i in range(0, 80, 4)))
        np.testing.assert_allclose(np.concatenate(outs), expected(root, a, rows[:80]), rtol=1e-5, atol=1e-6)
        assert [e.kind for e in pool.events()] == ["load", "replicate"]
    finally:
        await pool.close()


async def test_batcher_over_ray_merges_requests_and_splits_outputs(ray_session: Settings, zoo) -> None:  # type: ignore[no-untyped-def]
    root, variants, rows = zoo
    a = variants["lr-c"]
    pool = RayPool(ray_session, artifacts_dir=root)
    batcher = AsyncBatcher(pool, max_in_flight=1)
    point = LatencyPoint(
        batch=1, p50_ms=0.1, p95_ms=0.1, p99_ms=0.1, mean_ms=0.1, throughput_qps=1e4, samples=1,
        stable=True, stop_reason="test", cost_usd_per_1k=0.0,
    )  # fmt: skip
    profile = Profile(
        variant=a.name, machine=MachineInfo(cpu_model="t", cores=2), measured_at_s=0, points=(point,)
    )
    try:
        await pool.ensure_loaded(a)
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(batcher.submit(a, profile, rows[i : i + 2], loop.time() + 30) for i in range(0, 100, 2))
        )
        np.testing.assert_allclose(
            np.concatenate([r.outputs for r in results]), expected(root, a, rows[:100]), rtol=1e-5, atol=1e-6
        )
        assert max(r.batch_requests for r in results) > 1  # merged behind the running batch
    finally:
        await batcher.close()
        await pool.close()


@pytest.mark.parametrize("channel", ["classic", "stream"])
async def test_a_worker_killed_mid_load_loses_no_request_silently(
    ray_session: Settings, zoo, channel: str
) -> None:  # type: ignore[no-untyped-def]
    root, variants, rows = zoo
    a, b = variants["lr-a"], variants["lr-b"]
    pool = RayPool(
        ray_session.model_copy(update={"worker_channel": channel}),
        artifacts_dir=root,
        max_workers_per_family=2,
    )
    try:
        await pool.run(a, rows[:1])
        pid = pool.worker_pid("onnxruntime-0")
        assert pid is not None
        # b is not loaded: its first batches trigger a load on a worker of its own, while a's
        # batches (20 000 rows each: a few ms of work apiece, seconds in all) queue on worker 0,
        # which dies with them in flight.
        big = np.tile(rows[:100], (200, 1))
        want_a, want_b = expected(root, a, big), expected(root, b, rows[:3])
        tasks = [
            asyncio.ensure_future(pool.run(b, rows[:3]) if i % 2 else pool.run(a, big)) for i in range(400)
        ]
        # Kill it once the first answers are back: the rest are queued at it then (a fixed sleep
        # missed them all when the machine was busy: submitting took longer than running them).
        while not any(t.done() for t in tasks):
            await asyncio.sleep(0.001)
        os.kill(pid, signal.SIGKILL)
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=120)
        answered = 0
        for i, result in enumerate(done):
            if isinstance(result, Unavailable):
                assert result.message and "died" in result.message  # a 503 with its reason
                continue
            assert isinstance(result, np.ndarray), result
            np.testing.assert_allclose(result, want_b if i % 2 else want_a, rtol=1e-5, atol=1e-6)
            answered += 1
        assert answered > 0
        # On a fast machine every queued batch may be back before the kill lands: keep sending
        # until the pool has seen it (a crash, or the restarted actor's "no longer holds").
        until = asyncio.get_running_loop().time() + 30
        while not any(e.kind == "retry" for e in pool.events(limit=1000)):
            assert asyncio.get_running_loop().time() < until, pool.events(limit=1000)
            np.testing.assert_allclose(await pool.run(a, big), want_a, rtol=1e-5, atol=1e-6)
        events = pool.events(limit=1000)
        # The kill is seen as a crash when a batch was at the worker as it died; when it landed
        # between two batches (1 run in ~8 here), Ray holds the next ones for the restarted actor,
        # which answers that it no longer holds the variant. Either way the batch is retried.
        retries = [e.reason for e in events if e.kind == "retry"]
        assert retries, [(e.kind, e.reason) for e in events]
        assert any(e.kind == "crash" for e in events) or any("no longer holds" in r for r in retries)
        # the pool serves again afterwards, the restarted worker over a new stream
        np.testing.assert_allclose(
            await pool.run(b, rows[:2]), expected(root, b, rows[:2]), rtol=1e-5, atol=1e-6
        )
        deadline = asyncio.get_running_loop().time() + 60
        while not pool.fleet()[0].alive and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        np.testing.assert_allclose(await pool.run(a, rows[:2]), want_a[:2], rtol=1e-5, atol=1e-6)
        assert all(w.channel == channel for w in pool.fleet() if w.loaded), pool.fleet()
        if any(e.kind == "crash" for e in events):  # seen dying: seen coming back, as a new process
            recovered = [e.reason for e in pool.events(limit=1000) if e.kind == "recover"]
            assert any("restarted as pid" in r for r in recovered), recovered
    finally:
        await pool.close()


@pytest.mark.parametrize("channel", ["classic", "stream"])
async def test_ray_kill_of_an_actor_is_retried_on_a_replica(ray_session: Settings, zoo, channel: str) -> None:  # type: ignore[no-untyped-def]
    import ray

    root, variants, rows = zoo
    a = variants["lr-a"]
    pool = RayPool(
        ray_session.model_copy(update={"worker_channel": channel}),
        artifacts_dir=root,
        max_workers_per_family=2,
    )
    try:
        await pool.ensure_loaded(a)
        await pool.replicate(a)
        first = pool.placement()[a.name][0]
        # Batches of 2 000 rows (a millisecond or so of work each) keep coming, 8 in flight over
        # the two replicas, until the kill has landed: some are at the dead one when it dies.
        batch = np.tile(rows[:100], (20, 1))
        want = expected(root, a, batch)
        loop = asyncio.get_running_loop()
        ray.kill(pool.worker_handle(first), no_restart=False)
        stop_at = loop.time() + 30

        async def sender() -> int:
            answered = 0
            while loop.time() < stop_at and not any(e.kind == "crash" for e in pool.events()):
                np.testing.assert_allclose(await pool.run(a, batch), want, rtol=1e-5, atol=1e-6)
                answered += 1  # every batch answered: one replica lives
            return answered

        assert sum(await asyncio.wait_for(asyncio.gather(*(sender() for _ in range(8))), 60)) > 0
        events = [(e.kind, e.worker_id) for e in pool.events()]
        assert ("crash", first) in events and ("retry", first) in events
    finally:
        await pool.close()


def _cut_tcp(ip: str, port: int, *, listener: bool = False) -> None:
    """Destroy every TCP connection to `ip:port` (and with `listener`, the listening socket too)
    from outside both processes, as a network fault would (`ss -K`: needs root and a kernel with
    socket destroy)."""
    targets = [["state", "listening", "src", ip, "sport", "=", f":{port}"]] if listener else []
    for target in [*targets, ["dst", ip, "dport", "=", f":{port}"]]:
        done = subprocess.run(["ss", "-K", *target], capture_output=True, text=True, check=False)
        assert done.returncode == 0 and f":{port}" in done.stdout, (target, done.stdout, done.stderr)


async def _streaming(pool: RayPool, variant: Variant, rows: np.ndarray) -> tuple[str, tuple[str, int]]:
    """Run one batch of `variant`: (the worker that holds it, the address of its batch stream)."""
    await pool.run(variant, rows[:1])
    [worker] = pool.placement()[variant.name]
    address, _ = await pool.worker_handle(worker).stream_address.remote()
    return worker, (str(address[0]), int(address[1]))


needs_ss_kill = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ss") is None, reason="ss -K (cutting a TCP connection) needs root"
)


@needs_ss_kill
async def test_a_stream_cut_while_its_worker_lives_loses_no_batch_and_is_reopened(
    ray_session: Settings, zoo
) -> None:  # type: ignore[no-untyped-def]
    """The connection to a worker drops while the worker lives: the batches on it fail over (a
    retry, each answered right), the worker is not restarted, comes back with what it holds, and
    its next batches take a new stream."""
    import ray

    root, variants, rows = zoo
    a = variants["lr-a"]
    pool = RayPool(
        ray_session.model_copy(update={"worker_channel": "stream"}),
        artifacts_dir=root,
        max_workers_per_family=2,
    )
    try:
        worker, (ip, port) = await _streaming(pool, a, rows)
        pid = pool.worker_pid(worker)
        big = np.tile(rows[:100], (100, 1))  # 10 000 rows: a few ms each, so some are in flight
        want = expected(root, a, big)
        tasks = [asyncio.ensure_future(pool.run(a, big)) for _ in range(200)]
        while not any(t.done() for t in tasks):
            await asyncio.sleep(0.001)
        _cut_tcp(ip, port)
        done = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        for out in done:  # every batch answered, and right
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        events = pool.events(limit=1000)
        dropped = [e for e in events if e.kind == "crash" and e.worker_id == worker]
        assert dropped and "connection to the worker dropped" in dropped[0].reason, events
        assert any(e.kind == "retry" for e in events), events
        deadline = asyncio.get_running_loop().time() + 30
        while not all(w.alive for w in pool.fleet()):
            assert asyncio.get_running_loop().time() < deadline, pool.fleet()
            await asyncio.sleep(0.05)
        assert pool.worker_pid(worker) == pid  # the same process: nothing was restarted
        recovered = [
            e.reason for e in pool.events(limit=1000) if (e.kind, e.worker_id) == ("recover", worker)
        ]
        assert recovered and "only its stream dropped" in recovered[0] and a.name in recovered[0], recovered
        assert ray.get(pool.worker_handle(worker).describe.remote())["pid"] == pid
        back = {w.worker_id: w for w in pool.fleet()}[worker]
        assert a.name in back.loaded, back  # what it held, mirrored back
        again = await pool.run(a, rows[:5])
        np.testing.assert_allclose(again, expected(root, a, rows[:5]), rtol=1e-5, atol=1e-6)
        # ... over a new connection to the same server, not a fallback to classic calls
        assert not [e for e in pool.events(limit=1000) if e.kind == "channel"]
        assert [w.channel for w in pool.fleet()] == ["stream"] * len(pool.fleet())
        reopened = subprocess.run(
            ["ss", "-Htn", "state", "established", "dst", ip, "dport", "=", f":{port}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert f":{port}" in reopened.stdout, reopened.stdout
    finally:
        await pool.close()


@needs_ss_kill
async def test_a_worker_whose_stream_cannot_be_reopened_falls_back_to_classic_calls(
    ray_session: Settings, zoo
) -> None:  # type: ignore[no-untyped-def]
    """The stream drops and its server no longer accepts (a firewall, a dead thread): the worker's
    batches go as classic actor calls from then on, with a `channel` event that says why."""
    root, variants, rows = zoo
    a = variants["lr-a"]
    pool = RayPool(
        ray_session.model_copy(update={"worker_channel": "stream"}),
        artifacts_dir=root,
        max_workers_per_family=1,
    )
    try:
        worker, (ip, port) = await _streaming(pool, a, rows)
        _cut_tcp(ip, port, listener=True)  # idle: no batch is lost, nothing to retry
        deadline = asyncio.get_running_loop().time() + 30
        while not any(e.kind == "recover" for e in pool.events(limit=1000)):
            assert asyncio.get_running_loop().time() < deadline, pool.events(limit=1000)
            await asyncio.sleep(0.05)
        outs = await asyncio.gather(*(pool.run(a, rows[i : i + 4]) for i in range(0, 80, 4)))
        np.testing.assert_allclose(np.concatenate(outs), expected(root, a, rows[:80]), rtol=1e-5, atol=1e-6)
        fallback = [e for e in pool.events(limit=1000) if e.kind == "channel"]
        assert len(fallback) == 1 and fallback[0].worker_id == worker, fallback
        assert f"{port} could not be opened" in fallback[0].reason and "classic" in fallback[0].reason
        assert [w.channel for w in pool.fleet()] == ["classic"]
        assert not any(e.kind == "retry" for e in pool.events(limit=1000))
    finally:
        await pool.close()


async def test_a_worker_call_that_outlasts_its_timeout_is_unavailable(ray_session: Settings, zoo) -> None:  # type: ignore[no-untyped-def]
    root, variants, rows = zoo
    # 1 ms: no load (a new actor process, ONNX Runtime's import) answers that fast
    impatient = ray_session.model_copy(update={"worker_call_timeout_s": 0.001})
    pool = RayPool(impatient, artifacts_dir=root)
    try:
        with pytest.raises(Unavailable, match=r"did not answer within 0\.001 s"):
            await pool.run(variants["lr-c"], rows[:2])
    finally:
        await pool.close()
