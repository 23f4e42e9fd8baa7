"""Load-step benchmark of the real service: the adaptive fleet against a static one, in one run.

Each mode starts `infaas serve` on an empty data dir, registers a compute-bound model through
`POST /v1/models` (`tests.tiny_models.deep_conv_onnx`: ~1.6 ms per row on one thread here), and
sends open-loop traffic of 32-row queries with a 250 ms target: a low phase, a step to a rate far
above what one replica sustains, then low again. Every second it reads `/v1/admin/fleet`
(replicas, fleet cost) and records every answer as the client saw it.

static    the autoscaler off (INFAAS_AUTOSCALE=false): what the query path loads stays, nothing
          more (the warm-up's variant, one replica); its cost is still accounted
adaptive  the autoscaler on, with a short hold-down so the step down shows within the run

The local Ray is given 4 logical CPUs (`--ray-cpus`) so that the policy has room to act; on the
2-core reference machine they share 2 real cores, so added replicas add contention as much as
capacity: read the replica and cost columns as what the policy does, the latency columns as what
this machine gives.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_serving import ADMIN_KEY, Server, serve_on, stop_server

from tests import tiny_models

TARGET_MS = 250.0
ROWS = 32


@dataclass
class Answer:
    sent_s: float
    status: int
    latency_ms: float | None = None
    slo_met: bool = False


@dataclass
class Run:
    mode: str
    phases: list[tuple[str, float, float]]  # (name, seconds, queries/s)
    answers: list[Answer] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # t_s, replicas, usd_per_hour, usd
    events: list[dict[str, Any]] = field(default_factory=list)
    start_s: float = 0.0  # monotonic
    start_wall_s: float = 0.0  # the fleet events' clock


def _request(url: str, body: dict[str, Any] | None, key: str, timeout: float = 600.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {key}"})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def start(workdir: Path, mode: str, ray_cpus: int, hold_down_s: float) -> tuple[Server, str]:
    settings = {
        "INFAAS_PROFILE_QUICK": "1",
        "INFAAS_RAY_NUM_CPUS": str(ray_cpus),
        "INFAAS_AUTOSCALE_DOWNSCALE_DELAY_S": str(hold_down_s),
        "INFAAS_AUTOSCALE": "false" if mode == "static" else "true",
    }
    server = serve_on(workdir / mode, mode, workdir / f"{mode}.log", settings)
    base = server.url.removesuffix("/v1/query")
    # An owner key: registering into a task takes one (a tenant key is refused, 403).
    owner = _request(f"{base}/v1/admin/tenants", {"name": "bench", "role": "owner"}, ADMIN_KEY)
    return server, owner["api_key"]


def register(base: str, key: str) -> None:
    """The model through the public API, as a model owner would (quick profiling)."""
    import httpx

    x, y = tiny_models.digits(200)
    files = {
        "model": ("conv.onnx", tiny_models.deep_conv_onnx(channels=128, layers=12)),
        "validation": ("val.npz", tiny_models.validation_bytes(x, y)),
    }
    meta = {"name": "conv", "task": "digits", "profile": True}
    r = httpx.post(
        f"{base}/v1/models",
        files=files,
        data={"metadata": json.dumps(meta)},
        headers={"Authorization": f"Bearer {key}"},
        timeout=600,
    )
    r.raise_for_status()


async def _drive(run: Run, url: str, key: str, body: bytes) -> None:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    tasks: set[asyncio.Task[None]] = set()

    async def one(session: aiohttp.ClientSession) -> None:
        sent_s = time.monotonic()
        async with session.post(url, data=body, headers=headers) as resp:
            answer = await resp.json(content_type=None)
        latency = answer.get("latency_ms") if resp.status == 200 else None
        run.answers.append(Answer(sent_s - run.start_s, resp.status, latency, bool(answer.get("slo_met"))))

    connector = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        for _, seconds, rate in run.phases:
            end_s = time.monotonic() + seconds
            next_s = time.monotonic()
            while next_s < end_s:
                task = asyncio.create_task(one(session))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_s += 1.0 / rate
                await asyncio.sleep(max(0.0, next_s - time.monotonic()))
        await asyncio.gather(*tasks)


def _sample(run: Run, base: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            fleet = _request(f"{base}/v1/admin/fleet?events=0", None, ADMIN_KEY, timeout=5)
        except OSError:
            continue
        run.samples.append(
            {
                "t_s": time.monotonic() - run.start_s,
                "replicas": dict(fleet["replicas"]),
                "usd_per_hour": fleet["cost"]["usd_per_hour"],
                "usd": fleet["cost"]["total_usd"],
            }
        )


def measure(
    workdir: Path, mode: str, phases: list[tuple[str, float, float]], args: argparse.Namespace
) -> Run:
    server, key = start(workdir, mode, args.ray_cpus, args.hold_down)
    base = server.url.removesuffix("/v1/query")
    try:
        register(base, key)
        x, _ = tiny_models.digits(ROWS)
        body = json.dumps({"task": "digits", "inputs": x[:ROWS].tolist(), "latency_ms": TARGET_MS}).encode()
        run = Run(mode, phases, start_s=time.monotonic(), start_wall_s=time.time())
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(run, base, stop), daemon=True)
        sampler.start()
        asyncio.run(_drive(run, server.url, key, body))
        stop.set()
        sampler.join()
        fleet = _request(f"{base}/v1/admin/fleet?events=300", None, ADMIN_KEY)
        run.events = [e for e in fleet["events"] if e["worker_id"] is None and e["kind"] != "route"]
    finally:
        stop_server(server)
    return run


def bins(run: Run, width_s: float) -> list[dict[str, Any]]:
    total_s = sum(s for _, s, _ in run.phases)
    out = []
    for i in range(int(np.ceil(total_s / width_s))):
        lo, hi = i * width_s, (i + 1) * width_s
        sent = [a for a in run.answers if lo <= a.sent_s < hi]
        ok = [a.latency_ms for a in sent if a.status == 200 and a.latency_ms is not None]
        samples = [s for s in run.samples if lo <= s["t_s"] < hi] or [{"replicas": {}, "usd_per_hour": 0.0}]
        last = samples[-1]
        out.append(
            {
                "t_s": lo,
                "sent": len(sent),
                "answered": len(ok),
                "in_slo": sum(1 for a in sent if a.status == 200 and a.slo_met),
                "refused": sum(1 for a in sent if a.status == 429),
                "other": sum(1 for a in sent if a.status not in (200, 429)),
                "p99_ms": float(np.percentile(ok, 99)) if ok else None,
                "replicas": sum(last["replicas"].values()),
                "variants": ",".join(f"{v.split('/')[-1]}×{n}" for v, n in sorted(last["replicas"].items())),
                "usd_per_hour": last["usd_per_hour"],
            }
        )
    return out


def summary(run: Run) -> dict[str, float]:
    ok = [a for a in run.answers if a.status == 200]
    return {
        "sent": len(run.answers),
        "answered": len(ok),
        "in_slo": sum(1 for a in ok if a.slo_met),
        "refused": sum(1 for a in run.answers if a.status == 429),
        "fleet_usd": run.samples[-1]["usd"] if run.samples else 0.0,
        "replica_s": sum(sum(s["replicas"].values()) for s in run.samples),  # 1 s between samples
    }


def svg(runs: list[Run], path: Path, width_s: float) -> None:
    """Replicas, answered p99 and fleet cost per hour over time, one line per mode."""
    charts = [
        ("replicas", "replicas"),
        ("p99_ms", "answered p99 (ms)"),
        ("usd_per_hour", "fleet cost (USD/h)"),
    ]
    colors = {"static": "#888888", "adaptive": "#1f77b4"}
    w, h, pad = 640, 150, 40  # one chart: width, height, margin
    data = {run.mode: bins(run, width_s) for run in runs}
    total_s = max(b["t_s"] for bs in data.values() for b in bs) + width_s
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{len(charts) * (h + 32) + 30}">']
    parts.append("<style>text{font:11px sans-serif}</style>")
    for i, (key, title) in enumerate(charts):
        top = 20 + i * (h + 32)
        values = [b[key] for bs in data.values() for b in bs if b[key] is not None]
        vmax = max(values + ([TARGET_MS] if key == "p99_ms" else []) + [1e-12]) * 1.1
        parts.append(f'<text x="{pad}" y="{top - 4}">{title} (max {vmax / 1.1:.3g})</text>')
        parts.append(
            f'<rect x="{pad}" y="{top}" width="{w - 2 * pad}" height="{h}" fill="none" stroke="#ccc"/>'
        )

        def xy(t: float, v: float, top: int = top, vmax: float = vmax) -> str:
            return f"{pad + (w - 2 * pad) * t / total_s:.1f},{top + h - h * v / vmax:.1f}"

        for t in range(0, int(total_s) + 1, 10):
            x = pad + (w - 2 * pad) * t / total_s
            parts.append(f'<text x="{x:.1f}" y="{top + h + 12}" text-anchor="middle">{t} s</text>')
        if key == "p99_ms":
            parts.append(
                f'<line x1="{pad}" x2="{w - pad}" y1="{top + h - h * TARGET_MS / vmax:.1f}" '
                f'y2="{top + h - h * TARGET_MS / vmax:.1f}" stroke="#d62728" stroke-dasharray="4"/>'
            )
        for mode, bs in data.items():
            points = " ".join(xy(b["t_s"] + width_s / 2, b[key]) for b in bs if b[key] is not None)
            parts.append(
                f'<polyline points="{points}" fill="none" stroke="{colors.get(mode, "#000")}" '
                'stroke-width="2"/>'
            )
    legend_y = len(charts) * (h + 32) + 20
    for j, mode in enumerate(data):
        parts.append(
            f'<text x="{pad + j * 120}" y="{legend_y}" fill="{colors.get(mode, "#000")}">— {mode}</text>'
        )
    parts.append("</svg>")
    path.write_text("\n".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--low", type=float, default=8.0, help="queries/s before and after the step")
    parser.add_argument("--high", type=float, default=200.0, help="queries/s during the step")
    parser.add_argument("--seconds", type=float, nargs=3, default=(10.0, 15.0, 25.0), help="low, high, low")
    parser.add_argument("--hold-down", type=float, default=10.0, help="the autoscaler's hold-down (s)")
    parser.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    parser.add_argument("--bin", type=float, default=5.0, help="seconds per row of the timeline")
    parser.add_argument("--svg", type=Path, default=Path("docs/loadstep.svg"))
    args = parser.parse_args()
    phases = [
        ("low", args.seconds[0], args.low),
        ("step", args.seconds[1], args.high),
        ("low", args.seconds[2], args.low),
    ]
    runs = []
    with tempfile.TemporaryDirectory(prefix="infaas-loadstep-") as tmp:
        for mode in ("static", "adaptive"):
            print(f"==> {mode}: registering, then {' → '.join(f'{r:g}/s for {s:g} s' for _, s, r in phases)}")
            runs.append(measure(Path(tmp), mode, phases, args))
    for run in runs:
        print(f"\n{run.mode}: per {args.bin:g} s (32-row queries, {TARGET_MS:g} ms target)")
        print(
            f"{'t (s)':>6} {'sent':>5} {'200':>5} {'in SLO':>6} {'429':>5} {'other':>5} {'p99 ms':>7} "
            f"{'repl':>4} {'USD/h':>9}  variants"
        )
        for b in bins(run, args.bin):
            p99 = f"{b['p99_ms']:.0f}" if b["p99_ms"] is not None else "-"
            print(
                f"{b['t_s']:>6.0f} {b['sent']:>5} {b['answered']:>5} {b['in_slo']:>6} {b['refused']:>5} "
                f"{b['other']:>5} {p99:>7} {b['replicas']:>4} {b['usd_per_hour']:>9.5f}  {b['variants']}"
            )
        for e in reversed(run.events):
            print(
                f"   {e['at_s'] - run.start_wall_s:6.1f} s  {e['kind']:<9} {e['variant']}: {e['reason'][:96]}"
            )
    static, adaptive = (summary(r) for r in runs)
    print("\nsummary           static   adaptive   adaptive/static")
    for key in ("sent", "answered", "in_slo", "refused", "replica_s", "fleet_usd"):
        ratio = adaptive[key] / static[key] if static[key] else float("nan")
        print(f"{key:<14} {static[key]:>10.4g} {adaptive[key]:>10.4g} {ratio:>12.2f}")
    svg(runs, args.svg, args.bin)
    print(f"\nplot: {args.svg}")


if __name__ == "__main__":
    main()
