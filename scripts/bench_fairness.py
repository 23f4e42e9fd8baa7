"""Noisy-neighbour benchmark of the real service (issue 32), several runs in a row.

`infaas serve` runs on a copy of a data dir holding the built-in zoo (default ~/.infaas, made by
`infaas zoo install` or `scripts/demo`), one front end, local Ray. Two tenants query the same
architecture (default `digits-resnet`) with the same targets (60 ms, 1 row); the noisy one
offers `--overload` × what its queries sustain back to back,
the quiet one 20 q/s, for `--seconds` (`tests/integration/neighbours.py`).

What the noisy tenant's queries sustain back to back is measured once, before the first run.
`--quiet-rate 0`: the flood alone (the issue's overload check: the noisy tenant's admitted
answers in SLO and its 504s are in the summary). Passes when, in every run, the quiet tenant has
>= 99 % of its queries answered in SLO and no 429, and the noisy one nothing but 200 and 429
(every 429 with Retry-After).

`--kill-worker-at S`: in the last run, SIGKILL the service's Ray workers S seconds after the flood
starts (a process killed halfway); that run is reported, not judged (its queries meet a reload).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from infaas.settings import Settings
from tests import tiny_models
from tests.integration.conftest import serve_process
from tests.integration.neighbours import noisy_neighbour


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=Path.home() / ".infaas", help="holds the zoo (copied)")
    ap.add_argument("--architecture", default="digits-resnet")
    ap.add_argument("--target-ms", type=float, default=60.0)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--overload", type=float, default=10.0)
    ap.add_argument("--quiet-rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kill-worker-at", type=float, default=None, help="seconds into the last run's flood")
    ap.add_argument("--keep-log", type=Path, default=None, help="copy the service's log here at the end")
    args = ap.parse_args()
    if not (args.data_dir / "infaas.db").exists():
        print(
            f"error: no zoo in {args.data_dir}: run `infaas zoo install` (or scripts/demo) first",
            file=sys.stderr,
        )
        return 2
    x, _ = tiny_models.digits(200)
    body = {
        "task": "digits-classification",
        "architecture": args.architecture,
        "inputs": [row.tolist() for row in x[: args.rows]],
        "latency_ms": args.target_ms,
    }
    ok = True
    with (
        tempfile.TemporaryDirectory() as tmp,
        serve_process(Settings(data_dir=args.data_dir), Path(tmp)) as served,
    ):
        quiet_key = served.new_tenant("quiet")
        noisy_key = served.new_tenant("noisy")
        url = f"{served.url}/v1/query"
        sustained: float | None = None  # measured before the first run, on a fresh service
        for i in range(args.runs):
            killing = args.kill_worker_at is not None and i == args.runs - 1
            if killing:
                # The flood starts at once here unless this is the only run (the capacity check first).
                killer = threading.Thread(target=kill_workers, args=(served.pid, args.kill_worker_at))
                killer.start()
            run = noisy_neighbour(
                url,
                quiet_key,
                noisy_key,
                body,
                overload=args.overload,
                quiet_rate_per_s=args.quiet_rate,
                seconds=args.seconds,
                sustained_per_s=sustained,
            )
            sustained = run.sustained_per_s
            time.sleep(3.0)  # the last flood's queues drain
            s = run.summary()
            noisy_429 = [o for o in run.noisy.outcomes if o.status == 429]
            failed = [
                why
                for why, bad in (
                    ("quiet < 99 % in SLO", s["quiet_in_slo_share"] < 0.99 and args.quiet_rate > 0),
                    ("quiet refused", s["quiet_statuses"].get(429, 0) > 0),
                    ("flood not only 200 and 429", not set(s["noisy_statuses"]) <= {200, 429}),
                    ("a 429 without Retry-After", not all(o.retry_after_s for o in noisy_429)),
                )
                if bad
            ]
            passed = not failed
            verdict = "PASS" if passed else "FAIL (" + "; ".join(failed) + ")"
            if killing:
                verdict = "KILLED (not judged)"
            ok &= passed or killing
            print(f"run {i + 1}: {verdict} {json.dumps(s)}", flush=True)
            kinds: dict[str, int] = {}
            for o in run.quiet.outcomes + noisy_429[:: max(1, len(noisy_429) // 200)]:
                if o.status != 200 and o.body:
                    key = str(o.body.get("detail", ""))[:90]
                    kinds[key] = kinds.get(key, 0) + 1
            for detail, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:5]:
                print(f"    {n:5d} x {detail}")
            # The flood's other answers one by one, timed from its first query: when in the
            # flood a 504 comes (its onset, a stall) is what tells its causes apart.
            start_s = min((o.sent_s for o in run.noisy.outcomes), default=0.0)
            for o in [o for o in run.noisy.outcomes if o.status not in (200, 429)][:10]:
                detail = str((o.body or {}).get("detail", ""))[:110]
                print(f"    flood +{o.sent_s - start_s:6.2f} s {o.status}: {detail}")
            # Its late answers: how far past the target, against what admission predicted, in
            # which batch; what tells a slow batch from a long wait.
            late = [o for o in run.noisy.outcomes if o.status == 200 and o.body and not o.body["slo_met"]]
            for o in late[:8]:
                b = o.body or {}
                print(
                    f"    flood +{o.sent_s - start_s:6.2f} s late: {b['latency_ms']:.1f} ms, predicted "
                    f"{b['predicted_latency_ms']:.1f} ms, batch {b['batch_rows']} rows"
                )
        if args.keep_log is not None:
            args.keep_log.write_text(served.log())
    print("bench_fairness:", "PASS" if ok else "FAIL", f"({args.runs} runs)")
    return 0 if ok else 1


def kill_workers(service_pid: int, after_s: float) -> None:
    """SIGKILL the Ray workers in `service_pid`'s process tree (not any other Ray on the host)."""
    import psutil

    time.sleep(after_s)
    for proc in psutil.Process(service_pid).children(recursive=True):
        if "ray::WorkerHost" in " ".join(proc.cmdline()):
            print(f"    SIGKILL {proc.pid} ({after_s:g} s into the flood)", flush=True)
            proc.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
