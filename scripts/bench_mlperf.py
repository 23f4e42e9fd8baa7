"""MLPerf Inference's Server scenario against `infaas serve` and MLServer (see bench_mlperf).

The load is MLCommons' own LoadGen (`mlcommons-loadgen`, module `mlperf_loadgen`), unmodified:
Poisson arrivals at a target QPS, one sample per query, in PerformanceOnly mode. Each trial is one
LoadGen run; LoadGen calls it VALID when the 99th percentile of its latencies (from the query's
scheduled time to `QuerySamplesComplete`) is within `--latency-ms` (15 ms), the minimum duration and
query count are met and its early-stopping check passes. A trial passes only if it is VALID **and
every answer was a 200**: a 429, 503 or 504 (or a timeout, or a dropped connection) fails the QPS,
since a server that refuses load can always keep the latency of the rest low.

The figure per server × model is the highest target QPS that passes: from `--qps-start`, doubling
while trials pass, then bisecting between the last pass and the first failure until they are within
`--precision` (10 %). One server is up at a time (2 cores here), with the same ONNX model
(bench_serving's `tiny`, `heavy`, `heavy-int8`):

infaas    `infaas serve` with the model registered and profiled in its store (bench_serving's
          `infaas-service` row): POST /v1/query with a tenant key, `latency_ms` = the bound, the
          variant pinned (`--model-less`: the task alone, infaas picks; the task has one variant)
mlserver  MLServer 1.7.1 with adaptive batching (64 rows, 2 ms), V2 protocol POST
          /v2/models/bench/infer (bench_serving's `mlserver` row; scripts/bench_mlperf makes
          .venv-mlserver where it is missing)

The SUT's `issue_queries` only hands the samples to an asyncio loop in a background thread, which
sends each one over a pool of keep-alive HTTP/1.1 connections (a bare client: one request out per
connection, a new connection while fewer than `--connections` are open, else the request waits
for the first free one) and calls `QuerySamplesComplete` as each answer arrives. The summary lists
the non-200 answers by status and the body's "error" / "detail".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlperf_loadgen as lg  # type: ignore[import-not-found]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import (
    ADMIN_KEY,
    MLSERVER_INSTALL,
    MODELS,
    ROW,
    SERVICE_TASK,
    Server,
    bare,
    build_model,
    prepare_service,
    serve_on,
    start_mlserver,
    stop_server,
)

from tests.integration.load import take_replies

SERVERS = ("infaas", "mlserver")
QSL_SIZE = 1024  # every sample is the same row; LoadGen only needs indices


# ---- the system under test: LoadGen's callbacks → a bare HTTP/1.1 client on its own loop ----------


@dataclass
class Tally:
    """What one trial's answers were: statuses, and the non-200 answers by (status, error, detail)."""

    statuses: Counter[int | str] = field(default_factory=Counter)
    failures: Counter[tuple[int | str, str, str]] = field(default_factory=Counter)
    examples: dict[tuple[int | str, str, str], str] = field(default_factory=dict)  # one raw body each

    @property
    def non_200(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200)


def _failure_key(status: int | str, body: bytes) -> tuple[int | str, str, str]:
    try:
        answer = json.loads(body)
    except ValueError:
        return status, "", body[:160].decode(errors="replace")
    if not isinstance(answer, dict):
        return status, "", str(answer)[:160]
    error, detail = answer.get("error", ""), answer.get("detail", "")
    # Numbers in the detail (queue lengths, predicted ms) would split one kind of refusal into many.
    detail = re.sub(r"\d+(\.\d+)?", "N", str(detail))[:200]
    return status, str(error)[:80], detail


class _Conn(asyncio.Protocol):
    """One keep-alive connection of `HttpSut`: one request out at a time."""

    def __init__(self, sut: HttpSut) -> None:
        self.sut = sut
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.sample: int | None = None  # the LoadGen sample id out on it
        self.sent_s = 0.0
        self.usable = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.usable = True

    def send(self, sample: int) -> None:
        assert self.transport is not None
        self.sample, self.sent_s = sample, time.monotonic()
        self.transport.write(self.sut.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for reply in take_replies(self.buf):
            sample, self.sample = self.sample, None
            if sample is not None:
                self.sut.complete(sample, reply.status, reply.body)
            if reply.closes:
                self.usable = False
        if self.sample is None:
            self.sut.free(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self.sut.lost(self)
        if self.sample is not None:
            sample, self.sample = self.sample, None
            self.sut.complete(sample, "cut", b"")


class HttpSut:
    """LoadGen's SUT for one server: samples go to an asyncio loop in a background thread, each
    one POSTed as `server.body`; LoadGen hears of each answer (any status) as it arrives."""

    def __init__(self, server: Server, connections: int, timeout_s: float) -> None:
        url = urllib.parse.urlsplit(server.url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        headers = {
            **server.headers,
            "Host": f"{self.host}:{self.port}",
            "Content-Length": str(len(server.body)),
        }
        self.request = (
            f"POST {url.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        ).encode() + server.body
        self.max_connections = connections
        self.timeout_s = timeout_s
        self.idle: collections.deque[_Conn] = collections.deque()
        self.conns: set[_Conn] = set()
        self.opening = 0
        self.waiting: collections.deque[int] = collections.deque()
        self.tally = Tally()
        self.max_open = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sut-loop", daemon=True)
        self.thread.start()
        self.loop.call_soon_threadsafe(self._sweep)
        self.sut = lg.ConstructSUT(self.issue_queries, self.flush_queries)

    # LoadGen's thread: hand over and return.
    def issue_queries(self, samples: list[Any]) -> None:
        self.loop.call_soon_threadsafe(self._issue, [s.id for s in samples])

    def flush_queries(self) -> None:
        pass

    # The loop's thread from here on.
    def _issue(self, ids: list[int]) -> None:
        for sample in ids:
            while self.idle and not self.idle[0].usable:
                self.idle.popleft()
            if self.idle:
                self.idle.popleft().send(sample)
                continue
            self.waiting.append(sample)
            if len(self.conns) + self.opening < self.max_connections and self.opening < len(self.waiting):
                self.opening += 1
                self.loop.create_task(self._open())

    async def _open(self) -> None:
        try:
            _, conn = await self.loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except OSError:
            self.opening -= 1
            if self.waiting and not self.conns and not self.opening:
                self.complete(self.waiting.popleft(), "refused", b"")
                self._issue([])  # try again for the rest
            return
        self.opening -= 1
        self.conns.add(conn)
        self.max_open = max(self.max_open, len(self.conns))
        self.free(conn)

    def free(self, conn: _Conn) -> None:
        if not conn.usable:
            return
        if self.waiting:
            conn.send(self.waiting.popleft())
        else:
            self.idle.append(conn)

    def lost(self, conn: _Conn) -> None:
        self.conns.discard(conn)
        if self.waiting:
            self._issue([])  # opens a replacement

    def complete(self, sample: int, status: int | str, body: bytes) -> None:
        self.tally.statuses[status] += 1
        if status != 200:
            key = _failure_key(status, body)
            self.tally.failures[key] += 1
            self.tally.examples.setdefault(key, body[:400].decode(errors="replace"))
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample, 0, 0)])

    def _sweep(self) -> None:
        """Answers later than `timeout_s`: counted as `timeout` and their connection closed, so a
        server that never answers cannot hang LoadGen."""
        now = time.monotonic()
        for conn in list(self.conns):
            if conn.sample is not None and now - conn.sent_s > self.timeout_s:
                sample, conn.sample = conn.sample, None
                conn.usable = False
                self.complete(sample, "timeout", b"")
                if conn.transport is not None:
                    conn.transport.abort()
        self.loop.call_later(0.5, self._sweep)

    def reset(self) -> Tally:
        """The tally so far, and a new one (call between trials, when nothing is out)."""
        tally, self.tally = self.tally, Tally()
        return tally

    def close(self) -> None:
        lg.DestroySUT(self.sut)

        def stop() -> None:
            for conn in self.conns:
                if conn.transport is not None:
                    conn.transport.abort()
            self.loop.stop()

        self.loop.call_soon_threadsafe(stop)
        self.thread.join(timeout=10)


# ---- one trial, and the search ----------------------------------------------------------------


@dataclass
class Trial:
    qps: float
    valid: bool  # LoadGen's verdict
    tally: Tally
    p99_ms: float
    completed_qps: float
    why: str  # LoadGen's failed checks, where INVALID

    @property
    def passed(self) -> bool:
        return self.valid and self.tally.non_200 == 0


def _summary_field(text: str, name: str) -> str | None:
    m = re.search(rf"^\s*{re.escape(name)}\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else None


def run_trial(sut: HttpSut, qsl: Any, qps: float, args: argparse.Namespace, logdir: Path) -> Trial:
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = float(qps)
    settings.server_target_latency_ns = int(args.latency_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_duration_ms = int(args.min_duration_s * 1000)
    settings.min_query_count = args.min_queries
    logdir.mkdir(parents=True, exist_ok=True)
    out = lg.LogOutputSettings()
    out.outdir = str(logdir)
    out.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = out
    log_settings.enable_trace = False
    sut.reset()
    lg.StartTestWithLogSettings(sut.sut, qsl, settings, log_settings)
    tally = sut.reset()
    text = (logdir / "mlperf_log_summary.txt").read_text()
    verdict = _summary_field(text, "Result is") or "?"
    p99 = _summary_field(text, "99.00 percentile latency (ns)")
    completed = _summary_field(text, "Completed samples per second")
    failed = [
        check
        for check in ("Performance constraints satisfied", "Min duration satisfied", "Min queries satisfied")
        if (_summary_field(text, check) or "").lower().startswith("no")
    ]
    if (_summary_field(text, "Early stopping satisfied") or "").lower().startswith("no"):
        failed.append("Early stopping satisfied")
    return Trial(
        qps=qps,
        valid=verdict == "VALID",
        tally=tally,
        p99_ms=float(p99) / 1e6 if p99 else float("nan"),
        completed_qps=float(completed) if completed else float("nan"),
        why=", ".join(f"not: {c}" for c in failed),
    )


def _show(name: str, model: str, trial: Trial) -> None:
    statuses = ", ".join(f"{s}: {n}" for s, n in sorted(trial.tally.statuses.items(), key=str))
    verdict = "pass" if trial.passed else "FAIL"
    why = f"; {trial.why}" if trial.why else ""
    print(
        f"  {model} {name} @ {trial.qps:g} QPS: {verdict} (LoadGen {'VALID' if trial.valid else 'INVALID'}"
        f"{why}), p99 {trial.p99_ms:.2f} ms, completed {trial.completed_qps:.0f}/s, answers {statuses}",
        flush=True,
    )


def search(
    sut: HttpSut, qsl: Any, name: str, model: str, args: argparse.Namespace, logs: Path
) -> list[Trial]:
    """Trials from `--qps-start`: doubling while they pass, else halving until one passes; then
    bisecting between the highest pass and the lowest failure until within `--precision`."""
    trials: list[Trial] = []

    def trial(qps: float) -> bool:
        qps = round(qps, 1)
        t = run_trial(sut, qsl, qps, args, logs / f"{model}-{name}-{len(trials):02d}-{qps:g}")
        trials.append(t)
        _show(name, model, t)
        return t.passed

    passed: float | None = None
    failed: float | None = None
    qps = args.qps_start
    if trial(qps):
        passed = qps
        while qps * 2 <= args.qps_max and trial(qps * 2):
            qps *= 2
            passed = qps
        failed = qps * 2 if qps * 2 <= args.qps_max else None
    else:
        failed = qps
        while qps / 2 >= args.qps_min:
            qps /= 2
            if trial(qps):
                passed = qps
                break
            failed = qps
    if passed is None or failed is None:
        return trials
    while failed / passed > 1 + args.precision:
        mid = (passed + failed) / 2
        if trial(mid):
            passed = mid
        else:
            failed = mid
    return trials


# ---- the servers --------------------------------------------------------------------------------


def start_infaas(workdir: Path, variant: Any, args: argparse.Namespace, log: Path) -> Server:
    """`infaas serve` on the prepared data dir (output to `log`: a pipe nobody reads would fill up
    with 429s' warnings) and a tenant whose queries carry the latency bound as their target."""
    server = serve_on(workdir / "service", "infaas", log, {})
    base = server.url.removesuffix("/v1/query")
    req = urllib.request.Request(
        f"{base}/v1/admin/tenants",
        data=json.dumps({"name": "bench-mlperf"}).encode(),
        headers={"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        api_key = json.loads(resp.read())["api_key"]
    server.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    body: dict[str, Any] = {"task": SERVICE_TASK, "inputs": [ROW], "latency_ms": args.latency_ms}
    if not args.model_less:
        body["variant"] = variant.name
    server.body = json.dumps(body).encode()
    return server


def warm_up(server: Server, requests: int = 300) -> None:
    """`requests` sequential queries, each a 200 (also: the model loaded, the first query's cost
    paid outside the trials)."""
    url = urllib.parse.urlsplit(server.url)
    deadline = time.monotonic() + 120
    done = 0
    while done < requests:
        req = urllib.request.Request(server.url, data=server.body, headers=server.headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
                done += 1
        except OSError as exc:  # HTTPError too: not ready yet, or refused
            if time.monotonic() > deadline:
                detail = exc.read()[:300] if isinstance(exc, urllib.error.HTTPError) else exc
                raise SystemExit(f"{url.netloc}: warm-up failed: {detail!r}") from None
            time.sleep(0.2)


# ---- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="tiny,heavy", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument(
        "--only", default=",".join(SERVERS), help="servers: infaas, mlserver (comma-separated)"
    )
    parser.add_argument("--min-duration-s", type=float, default=10.0, help="LoadGen's min duration per trial")
    parser.add_argument(
        "--min-queries",
        type=int,
        default=1024,
        help="LoadGen's min query count per trial (its early stopping needs ~460 at p99 with none late); "
        "a trial lasts the longer of --min-duration-s and this ÷ QPS",
    )
    parser.add_argument(
        "--latency-ms", type=float, default=15.0, help="the p99 latency bound (and infaas's target)"
    )
    parser.add_argument("--qps-start", type=float, default=200.0, help="the first target QPS tried")
    parser.add_argument("--qps-min", type=float, default=10.0, help="give up halving below this")
    parser.add_argument("--qps-max", type=float, default=20_000.0, help="stop doubling above this")
    parser.add_argument("--precision", type=float, default=0.1, help="bisect until hi/lo ≤ 1 + this")
    parser.add_argument("--connections", type=int, default=256, help="the client's most open connections")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="an answer later than this: 'timeout'")
    parser.add_argument("--model-less", action="store_true", help="infaas: the task alone, no pinned variant")
    parser.add_argument("--mlserver-venv", type=Path, default=Path(".venv-mlserver"))
    parser.add_argument("--keep-logs", type=Path, help="keep LoadGen's and the servers' logs in this folder")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    servers = [s for s in args.only.split(",") if s]
    for m in models:
        if m not in MODELS:
            parser.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    for s in servers:
        if s not in SERVERS:
            parser.error(f"unknown server {s!r}; choose from {', '.join(SERVERS)}")
    if "mlserver" in servers and not (args.mlserver_venv / "bin" / "mlserver").exists():
        raise SystemExit(
            f"mlserver: no environment at {args.mlserver_venv}; make it with\n  {MLSERVER_INSTALL}"
        )

    started = time.monotonic()
    results: dict[tuple[str, str], list[Trial]] = {}
    with tempfile.TemporaryDirectory(prefix="infaas-mlperf-") as tmp:
        logs = args.keep_logs or Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        qsl = lg.ConstructQSL(QSL_SIZE, QSL_SIZE, lambda _: None, lambda _: None)
        try:
            for model in models:
                workdir = Path(tmp) / model
                path, variant = build_model(workdir / "artifacts", model)
                _, profile = bare(path, variant)
                (workdir / "variant.json").write_text(variant.model_dump_json())
                (workdir / "profile.json").write_text(profile.model_dump_json())
                if "infaas" in servers:
                    prepare_service(workdir, path, variant, profile)
                print(
                    f"{model}: variant {variant.name}, bare p50 {profile.points[0].p50_ms * 1000:.0f} µs",
                    flush=True,
                )
                for name in servers:
                    t0 = time.monotonic()
                    if name == "infaas":
                        server = start_infaas(workdir, variant, args, logs / f"{model}-infaas.log")
                    else:
                        server = start_mlserver(workdir, args.mlserver_venv)
                    sut = None
                    try:
                        warm_up(server)
                        gc.collect()
                        gc.freeze()  # no full collection of this process mid-trial
                        sut = HttpSut(server, args.connections, args.timeout_s)
                        results[(model, name)] = search(sut, qsl, name, model, args, logs)
                        print(
                            f"  {model} {name}: {len(results[(model, name)])} trials in "
                            f"{time.monotonic() - t0:.0f} s, at most {sut.max_open} connections open",
                            flush=True,
                        )
                    finally:
                        if sut is not None:
                            sut.close()
                        gc.unfreeze()
                        stop_server(server)
                        if name == "mlserver" and args.keep_logs:
                            mlog = workdir / "mlserver" / "mlserver.log"
                            if mlog.exists():
                                (logs / f"{model}-mlserver.log").write_bytes(mlog.read_bytes())
        finally:
            lg.DestroyQSL(qsl)
    report(results, models, servers, args, time.monotonic() - started)


def best(trials: list[Trial]) -> Trial | None:
    passed = [t for t in trials if t.passed]
    return max(passed, key=lambda t: t.qps) if passed else None


def report(
    results: dict[tuple[str, str], list[Trial]],
    models: list[str],
    servers: list[str],
    args: argparse.Namespace,
    elapsed_s: float,
) -> None:
    print(
        f"\n### MLPerf Server scenario: highest target QPS VALID at p99 ≤ {args.latency_ms:g} ms "
        f"with every answer a 200 ({args.min_duration_s:g} s min per trial, ±{args.precision:.0%})\n"
    )
    print("| model | server | QPS | p99 at it (ms) | lowest failed QPS | why it failed | trials |")
    print("|---|---|---:|---:|---:|---|---:|")
    for model in models:
        for name in servers:
            trials = results.get((model, name), [])
            top = best(trials)
            above = [t for t in trials if not t.passed and (top is None or t.qps > top.qps)]
            low_fail = min(above, key=lambda t: t.qps) if above else None
            why = "—"
            if low_fail is not None:
                reasons = []
                if not low_fail.valid:
                    reasons.append(f"INVALID, p99 {low_fail.p99_ms:.1f} ms")
                if low_fail.tally.non_200:
                    reasons.append(f"{low_fail.tally.non_200} non-200")
                why = "; ".join(reasons)
            print(
                f"| {model} | {name} | {f'{top.qps:g}' if top else f'< {args.qps_min:g}'} | "
                f"{f'{top.p99_ms:.2f}' if top else '—'} | {f'{low_fail.qps:g}' if low_fail else '—'} | "
                f"{why} | {len(trials)} |"
            )
    if "infaas" in servers and "mlserver" in servers:
        print("\n| model | infaas ÷ MLServer (QPS) |")
        print("|---|---:|")
        for model in models:
            inf, mls = best(results.get((model, "infaas"), [])), best(results.get((model, "mlserver"), []))
            ratio = f"{inf.qps / mls.qps:.2f}" if inf and mls else "—"
            print(f"| {model} | {ratio} |")
    failures = {key: trials for key, trials in results.items() if any(t.tally.non_200 for t in trials)}
    examples: dict[tuple[str, str, tuple[int | str, str, str]], str] = {}
    if failures:
        print("\n### non-200 answers (all trials; numbers in details shown as N)\n")
        print("| model | server | status | error | detail | count | at QPS |")
        print("|---|---|---|---|---|---:|---|")
        for (model, name), trials in failures.items():
            seen: Counter[tuple[int | str, str, str]] = Counter()
            where: dict[tuple[int | str, str, str], list[float]] = {}
            for t in trials:
                for k, n in t.tally.failures.items():
                    seen[k] += n
                    where.setdefault(k, []).append(t.qps)
                    examples.setdefault((model, name, k), t.tally.examples[k])
            for (status, error, detail), n in seen.most_common():
                qps = ", ".join(f"{q:g}" for q in sorted(where[(status, error, detail)]))
                detail = detail.replace("|", "\\|")
                print(f"| {model} | {name} | {status} | {error} | {detail} | {n} | {qps} |")
        print("\none body of each kind, as sent:")
        for (model, name, (status, _, _)), body in examples.items():
            print(f"  {model} {name} {status}: {body}")
    else:
        print("\nevery answer in every trial was a 200")
    print(f"\n(run took {elapsed_s / 60:.1f} min; {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
