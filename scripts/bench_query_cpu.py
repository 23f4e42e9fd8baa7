"""CPU per query of the service's own query path, without HTTP or a load generator.

The real app (`infaas.api.create_app` and its lifespan: local Ray, the data plane, the meter and
the usage journal in its default mode) on bench_serving's tiny model (it runs in the front end),
pinned, queried through `infaas.api.routes.query.answer`, the function the HTTP lane calls, by
`--concurrency` coroutines at once. This process's CPU (`time.process_time`, every thread) per
answered query, per round, and the median. On this shared 2-core machine its rounds differ by
~±10 % (286-341 µs in one run), an HTTP benchmark's by ±30 %: a change to the query path worth a
few per cent shows here first, and `--profile` says where the CPU goes by function.

    scripts/bench_query_cpu [--queries 20000] [--rounds 5] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import ROW, SERVICE_TASK, bare, build_model, prepare_service


async def run(
    data_dir: Path,
    variant: str,
    queries: int,
    rounds: int,
    concurrency: int,
    profile: bool = False,
    target_ms: float = 10_000.0,
) -> list[float]:
    import json

    from infaas.api import create_app
    from infaas.api.auth import new_api_key
    from infaas.api.routes.query import answer
    from infaas.settings import Settings
    from infaas.store import open_store
    from infaas.types import Tenant

    settings = Settings(data_dir=data_dir)
    key = new_api_key()
    store = open_store(settings)
    try:
        store.create_tenant(Tenant(name="bench", created_at_s=time.time()), key)
    finally:
        store.close()
    headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
    body = json.dumps(
        {"task": SERVICE_TASK, "inputs": [ROW], "latency_ms": target_ms}
        | ({"variant": variant} if target_ms >= 1.0 else {})
    ).encode()
    # Under the variant's own run no target is met even idle: every query is a 422, refused by
    # the route's verdict, as a query refused as busy (429) is (not pinned: a pinned variant is
    # served whatever its target).
    expected = 200 if target_ms >= 1.0 else 422
    app = create_app(settings)
    per_query_us: list[float] = []
    async with app.router.lifespan_context(app):

        async def client(n: int) -> None:
            for _ in range(n):
                status, _, reply = await answer(app, headers, body, time.monotonic())
                if status != expected:
                    raise RuntimeError(f"answered {status}: {reply[:300]!r}")

        await asyncio.gather(*(client(200 // concurrency + 1) for _ in range(concurrency)))  # warm-up
        each = max(1, queries // concurrency)
        if profile:  # one more round under cProfile: where the query path's CPU goes, by function
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            await asyncio.gather(*(client(each) for _ in range(concurrency)))
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(35)
        for i in range(rounds):
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(client(each) for _ in range(concurrency)))
            n = each * concurrency
            cpu_us = (time.process_time() - cpu0) / n * 1e6
            wall_us = (time.perf_counter() - wall0) / n * 1e6
            per_query_us.append(cpu_us)
            print(
                f"  round {i + 1}: {cpu_us:.1f} µs CPU a query ({wall_us:.1f} µs wall), {n} queries",
                flush=True,
            )
    return per_query_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=20_000, help="per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--profile", action="store_true", help="first, one round under cProfile (printed)")
    ap.add_argument(
        "--target-ms",
        type=float,
        default=10_000.0,
        help="the queries' latency target; under 1 ms none is met even idle, and the CPU measured is "
        "that of a query the route's verdict refuses (422), against an answer's at the default",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path, variant = build_model(workdir / "models", "tiny")
        _, profile = bare(path, variant)
        data_dir = prepare_service(workdir, path, variant, profile)
        per_query = asyncio.run(
            run(
                data_dir,
                variant.name,
                args.queries,
                args.rounds,
                args.concurrency,
                args.profile,
                args.target_ms,
            )
        )
    print(f"query path CPU: median {statistics.median(per_query):.1f} µs a query over {args.rounds} rounds")


if __name__ == "__main__":
    main()
