"""`infaas serve --workers N`: N front-end processes on one host, sharing one port and one fleet.

One Python process serves HTTP on one core, whatever the machine has. With N > 1 this process
becomes a supervisor: it starts the local Ray (or joins `INFAAS_RAY_ADDRESS`), then N front ends,
each `infaas serve` joined to that Ray (so they share its fleet: `RayPool`'s shared mode) and
bound to the same port with SO_REUSEPORT (the kernel spreads connections over them). Each has its
own usage journal (`INFAAS_FRONT_END_NAME`); they share the store (SQLite in WAL mode, or Redis).
SIGINT / SIGTERM are passed on, every front end drains, then Ray stops. A front end that dies is
started again; one that dies again within `_CRASH_LOOP_S` of its start stops the lot.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from infaas.settings import Settings

__all__ = ["default_front_ends", "serve_front_ends"]

log = logging.getLogger(__name__)

_CRASH_LOOP_S = 10.0


def default_front_ends(cpus: int | None = None) -> int:
    """One front end per 4 cores: under load a front end (HTTP, batching, the fast path) keeps
    about one core busy, and the workers need the rest."""
    return max(1, (cpus or os.cpu_count() or 1) // 4)


def serve_front_ends(settings: Settings, n: int) -> int:
    """Run `n` front ends until a signal stops them; returns the exit code."""
    import ray

    from infaas.workers.ray_pool import init_ray

    started = init_ray(settings)
    address = settings.ray_address or ray.get_runtime_context().gcs_address
    env = {
        **os.environ,
        "INFAAS_RAY_ADDRESS": address,
        "INFAAS_HOST": settings.host,
        "INFAAS_PORT": str(settings.port),
        "INFAAS_DATA_DIR": str(settings.data_dir),
        # The front ends' cores are not the workers': the autoscaler leaves all of them out.
        "INFAAS_FRONT_END_CPUS": str(settings.front_end_cpus * n),
    }
    stopping = False

    def spawn(i: int) -> tuple[subprocess.Popen[bytes], float]:
        child_env = {**env, "INFAAS_FRONT_END_NAME": f"fe-{i}"}
        command = [sys.executable, "-c", "from infaas.cli import main; main()", "serve", "--workers", "1"]
        return subprocess.Popen([*command, "--reuse-port"], env=child_env), time.monotonic()

    def stop(sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc, _ in children.values():
            if proc.poll() is None:
                proc.send_signal(sig)

    children = {i: spawn(i) for i in range(n)}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    code = 0
    try:
        while children:
            for i, (proc, since) in list(children.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del children[i]
                if stopping:
                    code = code or rc
                elif time.monotonic() - since < _CRASH_LOOP_S:
                    log.error("front end fe-%d exited (%d) right after its start: stopping all", i, rc)
                    code = rc or 1
                    stop(signal.SIGTERM, None)
                else:
                    log.warning("front end fe-%d exited (%d): starting it again", i, rc)
                    children[i] = spawn(i)
            time.sleep(0.2)
    finally:
        if started:
            ray.shutdown()
    return code
