"""How long an answer waits for the usage journal on a busy event loop: the journal's sync in a
helper process (`infaas.journal`, today) against the same journal fsync'd by a thread (the code at
`--baseline-rev`, loaded from git), and the journal's ``os`` mode (no sync: the floor), in one run.

Each round runs one event loop (uvloop, as `infaas serve` does) with open-loop arrivals at
`--rate` per second; each arrival holds the loop for `--work-us` of Python (what a front end
spends on a query: the GIL held, as parsing and routing hold it), appends one record, awaits
`durable()` and records the wait. Modes alternate within each round. It prints each mode's wait
p50 / p99 over all rounds and the ratio of the baseline's p50 and p99 to today's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infaas import journal as today

MODES = ("process", "thread", "os")


def baseline_module(rev: str) -> ModuleType:
    """`infaas/journal.py` as of `rev` (the thread syncer), imported under another name."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "-C", str(root), "show", f"{rev}:infaas/journal.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "journal_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("journal_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hold_gil(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def one_round(journal: Any, entry: type, rate: float, seconds: float, work_s: float) -> list[float]:
    waits_ms: list[float] = []

    async def query() -> None:
        hold_gil(work_s)
        seq = journal.next_seq()
        journal.append(entry(seq, "tenant", "task", "variant", 0, 8, 1000, True, 1.0))
        start = time.perf_counter()
        await journal.durable()
        waits_ms.append((time.perf_counter() - start) * 1000.0)

    tasks: set[asyncio.Task[None]] = set()
    interval = 1.0 / rate
    next_s = time.perf_counter()
    end_s = next_s + seconds
    while next_s < end_s:
        now = time.perf_counter()
        while next_s <= now:
            task = asyncio.create_task(query())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_s += interval
        await asyncio.sleep(max(0.0, next_s - time.perf_counter()))
    while tasks:
        await asyncio.sleep(0.01)
    return waits_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=1500.0, help="arrivals per second")
    parser.add_argument("--work-us", type=float, default=400.0, help="Python per arrival (GIL held)")
    parser.add_argument(
        "--baseline-rev", default="63368c6", help="commit whose journal is the thread baseline"
    )
    args = parser.parse_args()
    old = baseline_module(args.baseline_rev)
    waits: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            with tempfile.TemporaryDirectory() as tmp:
                module = old if mode == "thread" else today
                journal = module.UsageJournal(Path(tmp) / "journal", fsync=mode != "os")
                try:
                    w = uvloop.run(
                        one_round(journal, module.JournalEntry, args.rate, args.seconds, args.work_us / 1e6)
                    )
                finally:
                    journal.close()
            waits[mode] += w
            print(
                f"  round {r + 1} {mode:7s}: wait p50 {np.percentile(w, 50):6.2f} ms, "
                f"p99 {np.percentile(w, 99):6.2f} ms ({len(w)} records)",
                flush=True,
            )
    print(
        f"\n{args.rate:.0f} arrivals/s, {args.work_us:.0f} µs of Python each, "
        f"{args.rounds} rounds of {args.seconds} s\n"
    )
    print("| journal | wait p50 (ms) | wait p99 (ms) |")
    print("|---|---:|---:|")
    names = {
        "process": "fsync, helper process (today)",
        "thread": f"fsync, thread ({args.baseline_rev})",
        "os": "os (no sync)",
    }
    for mode in MODES:
        print(
            f"| {names[mode]} | {np.percentile(waits[mode], 50):.2f} | {np.percentile(waits[mode], 99):.2f} |"
        )
    p = {m: (statistics.median(waits[m]), float(np.percentile(waits[m], 99))) for m in MODES}
    print(
        f"\nthread ÷ process: p50 {p['thread'][0] / p['process'][0]:.2f}, "
        f"p99 {p['thread'][1] / p['process'][1]:.2f}"
    )


if __name__ == "__main__":
    main()
