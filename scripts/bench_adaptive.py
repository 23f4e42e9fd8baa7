"""The INFaaS experiment on this machine: one bursty mixed-SLO trace replayed open-loop against
`infaas serve` in three modes, then simulated on the same trace and profiles; real vs simulated.

modelless       queries name a task and targets; the autoscaler may take every action
static          each traffic class pinned to its task's most accurate variant; the autoscaler off
replicate-only  each class pinned once to the cheapest variant meeting its targets at low load;
                the autoscaler may only replicate and remove (INFAAS_AUTOSCALE_ACTIONS)

The pins are the simulator's (`Simulation.pins`), so both sides run the same baseline. The zoo is
the test suite's small zoo (digits and breast-cancer models, quick profiles), built once into a
temporary data dir; the traffic classes are `infaas.sim.zoo.mixed_tenants` (interactive, accurate,
bulk per task, targets set from the task's own profiles). Every mode starts a fresh service on a
copy of that data dir. The simulation models this machine as one worker of `os.cpu_count()` cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import ADMIN_KEY, Server, cpu_seconds, serve_on, stop_server

from infaas.settings import Settings
from infaas.sim.engine import MODES, Mode, SimConfig, Simulation
from infaas.sim.traces import Trace, bursty
from infaas.sim.zoo import Zoo, from_store, mixed_tenants

SETTINGS_BY_MODE: dict[str, dict[str, str]] = {
    "modelless": {},
    "static": {"INFAAS_AUTOSCALE": "false"},
    "replicate-only": {"INFAAS_AUTOSCALE_ACTIONS": "replicate,remove"},
}


def build_zoo(data_dir: Path) -> None:
    from infaas.store import open_store
    from profiler.process import ProcessProfiler
    from variants import zoo

    settings = Settings(data_dir=data_dir)
    store = open_store(settings)
    try:
        zoo.install(
            settings, store, only=zoo.SMALL_ZOO, profiler=ProcessProfiler(settings, store, quick=True)
        )
    finally:
        store.close()


def _request(url: str, body: dict[str, Any] | None, key: str) -> Any:
    """POST `body` (GET when None) with `key`; the JSON answer."""
    import urllib.request

    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


async def replay(server: Server, trace: Trace, keys: dict[str, str], pins: dict[str, str]) -> dict[str, Any]:
    """Send every query of `trace` at its time (open loop); count what came back, per class."""
    from variants import zoo

    rows_of = {task: zoo.load_split(task).x_test for task in trace.tasks}
    out: dict[str, Any] = {
        "sent": 0, "infeasible": 0, "in_slo": 0, "late": 0, "refused": 0, "at_door": 0, "failed": 0,
        "charged_usd": 0.0,
    }  # fmt: skip
    why: Counter[str] = Counter()  # the refusals' and failures' details, numbers blanked
    example: dict[str, str] = {}  # one of each, numbers kept

    async def one(session: aiohttp.ClientSession, tenant: str, task: str, rows: int, latency_ms: float,
                  min_accuracy: float) -> None:  # fmt: skip
        body: dict[str, Any] = {
            "task": task,
            "inputs": rows_of[task][:rows].tolist(),
            "latency_ms": latency_ms,
            "min_accuracy": min_accuracy,
        }
        if tenant in pins:
            body["variant"] = pins[tenant]
        headers = {"Authorization": f"Bearer {keys[tenant]}"}
        try:
            async with session.post(server.url, json=body, headers=headers) as resp:
                answer = await resp.json(content_type=None)
                status = resp.status
        except aiohttp.ClientError:
            status, answer = 599, {}
        out["sent"] += 1
        if status == 200:
            out["in_slo" if answer["slo_met"] else "late"] += 1
            out["charged_usd"] += answer["cost_usd"]
        elif status == 422:
            out["infeasible"] += 1
        else:
            out["refused" if status == 429 else "failed"] += 1
            out["at_door"] += bool(status == 429 and answer.get("at_door"))
            detail = str(answer.get("detail", ""))
            kind = f"{status} " + re.sub(r"[0-9.]+", "#", detail)[:160]
            why[kind] += 1
            example.setdefault(kind, detail)

    tasks: list[asyncio.Task[None]] = []
    start_s = time.monotonic()
    connector = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        for q in trace.queries():
            await asyncio.sleep(max(0.0, start_s + q.time_s - time.monotonic()))
            tasks.append(
                asyncio.create_task(one(session, q.tenant, q.task, q.rows, q.latency_ms, q.min_accuracy))
            )
        await asyncio.gather(*tasks)
    out["why"], out["example"] = why, example
    return out


def run_real(
    data_dir: Path, work: Path, mode: str, trace: Trace, pins: dict[str, str], run: str = ""
) -> dict[str, Any]:
    """Replay `trace` against a fresh service on a copy of `data_dir` (`run` names the copy:
    several loads in one command each start from the zoo as built)."""
    copy = work / f"data-{mode}{run}"
    shutil.copytree(data_dir, copy)
    server = serve_on(copy, mode, work / f"{mode}{run}.log", SETTINGS_BY_MODE[mode])
    base = server.url.removesuffix("/v1/query")
    try:
        keys = {
            name: _request(f"{base}/v1/admin/tenants", {"name": name.replace("/", "-")}, ADMIN_KEY)["api_key"]
            for name in trace.tenants
        }
        # The fleet's cost over the replay only, as the simulation integrates it over the trace
        # (the service's total also holds its start-up and warm-up, before the first query).
        before, cpu_before = _fleet_usd(base), cpu_seconds(server)
        result = asyncio.run(replay(server, trace, keys, pins))
        result["fleet_usd"] = _fleet_usd(base) - before
        used = {k: v - cpu_before[k] for k, v in cpu_seconds(server).items()}
        per_query_ms = 1000.0 / max(result["sent"], 1)
        # The front end's CPU (all its threads), and its event loop's thread on a core or waiting
        # for one: what the simulation's front end, on a core of its own, would have to take.
        result["frontend_ms"] = used["front end"] * per_query_ms
        result["loop_ms"] = (
            used["front end loop on a core"] + used["front end waiting for a core"]
        ) * per_query_ms
        # The loop's thread on a core alone: the process's other threads (the journal's sync, Ray's
        # client, the store's) run beside it on the other core, not in the simulated front end's.
        result["loop_cpu_ms"] = used["front end loop on a core"] * per_query_ms
        events = _request(f"{base}/v1/admin/fleet?events=500", None, ADMIN_KEY)["events"]
        result["actions"] = [e for e in events if e["worker_id"] is None and e["kind"] != "route"]
    finally:
        stop_server(server)
    return result


def _fleet_usd(base: str) -> float:
    import urllib.request

    req = urllib.request.Request(
        f"{base}/v1/admin/fleet?events=0", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        total: float = json.loads(resp.read())["cost"]["total_usd"]
        return total


def sim_config(
    frontend_ms: float, door_ms: float | None = None, refusal_ms: float | None = None
) -> SimConfig:
    """This machine as the simulation sees it: one worker of its cores."""
    return SimConfig(
        workers=1, cores=os.cpu_count() or 2, frontend_ms=frontend_ms, door_ms=door_ms, refusal_ms=refusal_ms
    )


def split_ms(
    real: dict[str, Any], per_query_ms: float, door_ms: float | None, refusal_share: float | None
) -> tuple[float, float | None]:
    """The front end's time an answer takes and a refusal by admission, from its time a query sent
    (`per_query_ms`): less the door's refusals at `door_ms` each (None: no door), the rest spread
    over the answers and admission's refusals, a refusal `refusal_share` of an answer (None: alike)."""
    at_door = real["at_door"] if door_ms is not None else 0
    refused = real["refused"] - at_door + real["infeasible"] if refusal_share is not None else 0
    answered = real["sent"] - at_door - refused
    weight = answered + (refusal_share or 0.0) * refused
    left_ms = max(0.0, per_query_ms * real["sent"] - (door_ms or 0.0) * at_door)
    answer_ms = left_ms / max(weight, 1.0)
    return answer_ms, None if refusal_share is None else refusal_share * answer_ms


def run_sim(
    zoo: Zoo,
    trace: Trace,
    mode: Mode,
    frontend_ms: float,
    door_ms: float | None = None,
    refusal_ms: float | None = None,
) -> dict[str, Any]:
    res = Simulation(zoo, trace, mode, sim_config(frontend_ms, door_ms, refusal_ms)).run()
    t = res.total
    return {
        "sent": t.queries,
        "infeasible": t.infeasible,
        "in_slo": t.in_slo,
        "late": t.late,
        "refused": t.refused,
        "failed": t.dropped + t.failed,
        "charged_usd": t.charged_usd,
        "fleet_usd": res.fleet_usd,
        "frontend_ms": frontend_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument(
        "--rate",
        type=float,
        nargs="+",
        default=[150.0],
        help="mean queries/s of the bursty trace; several: one trace each, then the validation table "
        "(issue 35's three loads: --rate 50 400 1000 --modes modelless)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--frontend-ms",
        type=float,
        default=None,
        help="the front end's time per query in the simulation; default: as measured in the real "
        "replay, the service process's CPU seconds over it divided by the queries sent, and a second "
        "simulation at its event loop thread's seconds running or waiting runnable for a core (the "
        "simulated front end has a core of its own; the real one shares two with the load generator "
        "and the Ray worker). A fixed 0.375 ms before (1 / bench_serving's c=64 req/s)",
    )
    parser.add_argument(
        "--door-ms",
        type=float,
        default=0.08,
        help="the front end's time a refusal at the door takes in the simulation (SimConfig.door_ms; "
        "scripts/bench_door measured 75-78 µs); the rest of the measured time a query is spread over "
        "the queries admission judged",
    )
    parser.add_argument("--no-door", action="store_true", help="simulate without the door, as before")
    parser.add_argument(
        "--refusal-share",
        type=float,
        default=0.6,
        help="the front end's time for a query admission refuses, as a share of an answer's "
        "(SimConfig.refusal_ms): scripts/bench_query_cpu measured the query path's CPU at 86 µs a "
        "refusal against 172 µs an answer (--target-ms 0.001 against the default), and HTTP adds "
        "~50 µs to each; 1: alike, as before",
    )
    parser.add_argument(
        "--slack-ms",
        type=float,
        default=10.0,
        help="added to each class's latency target (`mixed_tenants`' overhead): the real service's path "
        "costs ~1 ms idle and more under load, which the simulator's constant 0.9 ms does not see",
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="infaas-adaptive-") as tmp:
        work = Path(tmp)
        data_dir = work / "zoo"
        print("==> building the small zoo (quick profiles)")
        build_zoo(data_dir)
        zoo = from_store(str(data_dir))
        mix = mixed_tenants(zoo, overhead_ms=args.slack_ms)
        by_rate: list[tuple[float, list[tuple[str, dict[str, Any], dict[str, Any]]]]] = []
        for rate in args.rate:
            trace = bursty(args.seconds, rate, mix, np.random.default_rng(args.seed))
            classes = ", ".join(trace.tenants)
            print(f"==> trace at {rate:g}/s: {len(trace)} queries over {trace.duration_s:.0f} s; {classes}")
            rows: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
            for mode in args.modes:
                pins = Simulation(zoo, trace, mode, sim_config(0.0)).pins
                print(f"==> {mode}: real service" + (f" (pins: {pins})" if pins else ""))
                real = run_real(data_dir, work, mode, trace, pins, run=f"-{rate:g}")
                door_ms = None if args.no_door else args.door_ms
                share = None if args.refusal_share == 1.0 else args.refusal_share
                frontend_ms, refusal_ms = split_ms(real, real["frontend_ms"], door_ms, share)
                print(
                    f"    the front end a query: {real['frontend_ms']:.3f} ms of CPU, its event loop "
                    f"{real['loop_ms']:.3f} ms running or waiting for a core; {real['at_door']} of the "
                    f"{real['refused']} 429s at the door; an answer {frontend_ms:.3f} ms of CPU"
                    + ("" if refusal_ms is None else f", a refusal by admission {refusal_ms:.3f} ms")
                )
                if args.frontend_ms is not None:
                    frontend_ms, refusal_ms = args.frontend_ms, None
                rows.append((mode, real, run_sim(zoo, trace, mode, frontend_ms, door_ms, refusal_ms)))
                if args.frontend_ms is None:
                    # The bracket's other side: the front end's core as busy as the real loop's
                    # thread was, its waits for the shared cores included.
                    loop_ms, loop_refusal_ms = split_ms(real, real["loop_ms"], door_ms, share)
                    waits = run_sim(zoo, trace, mode, loop_ms, door_ms, loop_refusal_ms)
                    print(
                        f"    simulated at the loop's time ({loop_ms:.3f} ms an answer): in SLO "
                        f"{waits['in_slo']}, 429 {waits['refused']} "
                        f"(real: {real['in_slo']}, {real['refused']})"
                    )
                    cpu_ms, cpu_refusal_ms = split_ms(real, real["loop_cpu_ms"], door_ms, share)
                    alone = run_sim(zoo, trace, mode, cpu_ms, door_ms, cpu_refusal_ms)
                    print(
                        f"    simulated at the loop thread's time on a core ({cpu_ms:.3f} ms an answer): "
                        f"in SLO {alone['in_slo']}, 429 {alone['refused']}"
                    )
            by_rate.append((rate, rows))
    for rate, rows in by_rate:
        if len(by_rate) > 1:
            print(f"\n==== mean {rate:g} queries/s")
        report(rows)
    if len(by_rate) > 1:
        validation(by_rate)


def agree(real: float, sim: float, noise: float = 0.0) -> bool:
    """Within 10 % of the real figure, or both at most `noise` (0 against 3 refusals agrees)."""
    return max(real, sim) <= noise or abs(sim - real) <= 0.1 * abs(real)


def validation(by_rate: list[tuple[float, list[tuple[str, dict[str, Any], dict[str, Any]]]]]) -> None:
    """Issue 35's table: in SLO, 429 and fleet cost, real against simulated, per load and mode."""
    print("\n| load (mean q/s) | mode | in SLO real / sim | 429 real / sim | fleet USD real / sim | agree |")
    print("|---|---|---|---|---|---|")
    for rate, rows in by_rate:
        for mode, real, sim in rows:
            sent = real["sent"]
            checks = {
                "in SLO": agree(real["in_slo"], sim["in_slo"], 0.005 * sent),
                "429": agree(real["refused"], sim["refused"], 0.005 * sent),
                "fleet": agree(real["fleet_usd"], sim["fleet_usd"]),
            }
            off = [k for k, ok in checks.items() if not ok]
            verdict = "no: " + ", ".join(off) if off else "yes"
            print(
                f"| {rate:g} | {mode} | {real['in_slo']} / {sim['in_slo']} "
                f"| {real['refused']} / {sim['refused']} "
                f"| {real['fleet_usd']:.4g} / {sim['fleet_usd']:.4g} | {verdict} |"
            )


def report(rows: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
    keys = (
        "sent",
        "infeasible",
        "in_slo",
        "late",
        "refused",
        "failed",
        "charged_usd",
        "fleet_usd",
        "frontend_ms",
    )
    print(f"\n{'mode':<15} {'':<5} " + " ".join(f"{k:>12}" for k in keys) + f" {'violations':>11}")
    for mode, real, sim in rows:
        for side, r in (("real", real), ("sim", sim)):
            # violations over the queries whose targets are feasible (422s are the client's to fix)
            viol = (r["late"] + r["refused"] + r["failed"]) / max(r["sent"] - r["infeasible"], 1)
            cells = " ".join(f"{r[k]:>12.4g}" for k in keys)
            print(f"{mode:<15} {side:<5} {cells} {viol:>10.1%}")
        ratio = " ".join(f"{(sim[k] / real[k]) if real[k] else float('nan'):>12.2f}" for k in keys)
        print(f"{mode:<15} {'sim/real':<5} {ratio}")
    for mode, real, _ in rows:
        if real["why"] or real["actions"]:
            print(f"\n{mode}, real: why not answered (top 3), and the autoscaler's actions")
        for kind, n in real["why"].most_common(3):
            print(f"  {n:>6} × e.g. {real['example'][kind][:300]}")
        for e in real["actions"]:
            print(f"  {e['kind']:<10} {e['variant']}: {e['reason'][:120]}")
    by_mode = {mode: real for mode, real, _ in rows}
    if {"modelless", "static", "replicate-only"} <= set(by_mode):
        m = by_mode["modelless"]

        def viol(r: dict[str, Any]) -> float:
            return float(r["late"] + r["refused"] + r["failed"])

        print(
            "\nreal, model-less against each baseline (goals: ≥10× fewer violations and ≥10× lower fleet cost"
        )
        print("than static; ≥2× fewer violations and ≥1.6× goodput than replicate-only):")
        for base in ("static", "replicate-only"):
            b = by_mode[base]
            print(
                f"  vs {base:<15} violations {viol(b) / max(viol(m), 1):.2f}× fewer, fleet cost "
                f"{b['fleet_usd'] / max(m['fleet_usd'], 1e-12):.2f}× lower, "
                f"goodput {m['in_slo'] / max(b['in_slo'], 1):.2f}×"
            )


if __name__ == "__main__":
    main()
