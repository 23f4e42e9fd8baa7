"""What one refusal at the door costs the front end: the door in uvicorn's HTTP parser
(`infaas.api.door.DoorProtocol`) against the same door as ASGI middleware (`QueryDoor` alone, what
served every refusal before), in one run.

Each round starts a server process per mode (the production wrapping: `DrainGate(QueryDoor(app))`
under uvicorn with httptools and uvloop) whose door refuses every query, offers it open-loop
8-row queries (`tests.integration.load.BareOpenLoopLoad`) at a fixed rate, and reads the
server's CPU time over the window. It prints the CPU per refusal of each mode and their ratio. The
door's decision is stubbed (always refuse, no metering: the same in both modes), so the figure is
the HTTP path's cost: under overload most arrivals take it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODES = ("parser", "asgi")


def serve(mode: str, port: int) -> None:
    """The server of one mode (run in its own process by `main`)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from infaas.api.door import QueryDoor, door_protocol
    from infaas.api.lifecycle import DrainGate
    from infaas.errors import Overloaded

    class RefuseAll(QueryDoor):
        def shedding(self) -> bool:
            return True

        def refusal(
            self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]
        ) -> Overloaded | None:
            if method != "POST" or path != "/v1/query":
                return None
            return Overloaded(
                "refusing 95% of this tenant's queries on arrival; retry", retry_after_s=0.5, at_door=True
            )

    async def query(_: object) -> JSONResponse:
        return JSONResponse({"ok": True})

    door = RefuseAll(Starlette(routes=[Route("/v1/query", query, methods=["POST"])]))  # type: ignore[arg-type]
    gate = DrainGate(door)
    http = door_protocol(door, lambda: gate.draining) if mode == "parser" else "httptools"
    uvicorn.run(gate, host="127.0.0.1", port=port, log_level="warning", access_log=False, http=http)


def one(mode: str, rate_per_s: float, seconds: float) -> tuple[float, int]:
    """(server CPU seconds, refusals answered) over `seconds` of offered load."""
    from tests.integration.conftest import free_port
    from tests.integration.load import BareOpenLoopLoad

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", mode, str(port)])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {mode} server did not start") from None
                time.sleep(0.05)
        server = psutil.Process(proc.pid)
        body = {"task": "digits", "inputs": [[0.5] * 64] * 8, "latency_ms": 50}
        load = BareOpenLoopLoad(f"http://127.0.0.1:{port}/v1/query", "key", body, rate_per_s).start()
        time.sleep(1.0)  # connections open, the loop warm
        before = server.cpu_times()
        refused_before = sum(1 for o in load.result.outcomes if o.status == 429)
        time.sleep(seconds)
        after = server.cpu_times()
        refused = sum(1 for o in load.result.outcomes if o.status == 429) - refused_before
        result = load.stop()
        assert set(result.statuses()) <= {429}, result.statuses()
        cpu_s = (after.user - before.user) + (after.system - before.system)
        return cpu_s, refused
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=3000.0, help="offered queries/s (default 3000)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured window per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=2, metavar=("MODE", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    per_refusal_us: dict[str, list[float]] = {m: [] for m in MODES}
    print(f"bench_door: {args.rate:.0f} queries/s offered, {args.seconds:g} s per mode, {args.rounds} rounds")
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:  # alternate the order: the machine drifts
            cpu_s, refused = one(mode, args.rate, args.seconds)
            us = cpu_s / max(refused, 1) * 1e6
            per_refusal_us[mode].append(us)
            print(
                f"  round {r + 1} {mode:6s} {refused / args.seconds:7.0f} refusals/s  "
                f"server CPU {cpu_s / args.seconds:.2f} core  {us:6.1f} µs/refusal"
            )
    ratios = [a / p for p, a in zip(per_refusal_us["parser"], per_refusal_us["asgi"], strict=True)]
    print(
        json.dumps(
            {
                "us_per_refusal_median": {
                    m: round(statistics.median(v), 1) for m, v in per_refusal_us.items()
                },
                "asgi_over_parser_per_round": [round(x, 2) for x in ratios],
            }
        )
    )


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
