"""The hop to a Ray worker: one batch's round trip through `RayPool`, socket stream vs classic
actor call, against the same batch run in the front end's own process (`InProcessPool`), in one
run. A logistic regression on scikit-learn's digits (64 features → 10 classes, ONNX, one
thread), batches of 32 rows; p50 and p99 of sequential calls,
calls/s with 8 in flight, and the front end's process CPU per call."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import resource
import tempfile
import time
from pathlib import Path

import numpy as np


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(root: Path) -> tuple[object, np.ndarray]:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    from infaas.types import Parity, Variant, VariantSpec

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    model = LogisticRegression(max_iter=300).fit(x, y)
    data = to_onnx(model, x[:1], options={id(model): {"zipmap": False}}, target_opset=17).SerializeToString()
    (root / "lr").mkdir(parents=True)
    (root / "lr/model.onnx").write_bytes(data)
    variant = Variant(
        spec=VariantSpec(architecture="lr", runtime="onnxruntime", threads=1, max_batch=64),
        artifact="lr/model.onnx",
        sha256=hashlib.sha256(data).hexdigest(),
        parity=Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1),
    )
    return variant, x[:32]


async def measure(
    channel: str, root: Path, variant: object, batch: np.ndarray, calls: int
) -> dict[str, float]:
    from infaas.settings import Settings
    from infaas.workers.inprocess import InProcessPool
    from infaas.workers.ray_pool import RayPool

    pool: InProcessPool | RayPool
    if channel == "in-process":
        pool = InProcessPool(root)
    else:
        settings = Settings(data_dir=root / "data", worker_channel=channel)  # type: ignore[arg-type]
        pool = RayPool(settings, artifacts_dir=root, max_workers_per_family=1)
    try:
        await pool.ensure_loaded(variant)  # type: ignore[arg-type]
        for _ in range(200):
            await pool.run(variant, batch)  # type: ignore[arg-type]
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await pool.run(variant, batch)  # type: ignore[arg-type]
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        done = 0
        stop_s = time.perf_counter() + 3.0
        cpu0, t0 = cpu_s(), time.perf_counter()

        async def caller() -> None:
            nonlocal done
            while time.perf_counter() < stop_s:
                await pool.run(variant, batch)  # type: ignore[arg-type]
                done += 1

        await asyncio.gather(*(caller() for _ in range(8)))
        return {
            "p50_ms": times[len(times) // 2],
            "p99_ms": times[int(len(times) * 0.99)],
            "calls_per_s": done / (time.perf_counter() - t0),
            "cpu_ms_per_call": (cpu_s() - cpu0) * 1000 / max(done, 1),
        }
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import ray

    from infaas.settings import Settings
    from infaas.workers.ray_pool import init_ray

    with tempfile.TemporaryDirectory(prefix="infaas-hop-") as tmp:
        root = Path(tmp)
        variant, batch = build(root)
        init_ray(Settings(data_dir=root / "data"))
        results: dict[str, list[dict[str, float]]] = {"in-process": [], "classic": [], "stream": []}
        for _ in range(args.rounds):  # interleaved: drift on a shared machine hits both
            for channel in results:
                r = asyncio.run(measure(channel, root, variant, batch, args.calls))
                results[channel].append(r)
                print(
                    f"  {channel}: p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
                    f"{r['calls_per_s']:.0f} calls/s at 8 in flight, {r['cpu_ms_per_call']:.3f} ms CPU/call",
                    flush=True,
                )
        ray.shutdown()
    med = {c: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for c, rs in results.items()}
    print("\n| path | p50 (ms) | p99 (ms) | calls/s, 8 in flight | front-end CPU per call (ms) |")
    print("|---|---:|---:|---:|---:|")
    for channel, r in med.items():
        print(
            f"| {channel} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['calls_per_s']:.0f} "
            f"| {r['cpu_ms_per_call']:.3f} |"
        )
    c, k = med["stream"], med["classic"]
    p50, rate = c["p50_ms"] / k["p50_ms"], c["calls_per_s"] / k["calls_per_s"]
    print(f"\nstream / classic: p50 {p50:.2f}×, calls/s {rate:.2f}×")
    above = c["p50_ms"] - med["in-process"]["p50_ms"]
    print(f"stream p50 above the in-process call: {above * 1000:.0f} µs")


if __name__ == "__main__":
    main()
