"""The profiling worker: ``python -m profiler.worker JOB.json RESULT.json``.

One process per variant, so a variant is measured alone with its own thread setting, TensorFlow's
~530 MB and thread pools never enter the CLI or the server, and a variant that crashes the
process or hangs only loses its own profile. The parent (`profiler.process`) writes the job, waits
with a timeout and reads the result; a missing result means the worker died.

This module imports only the standard library at the top: thread-count variables must be set
before numpy (OpenBLAS) or any framework is imported, and they depend on the job.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

__all__ = ["main", "pin_threads"]

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pin_threads(threads: int) -> None:
    """Cap the native thread pools of BLAS and OpenMP at the variant's thread count (these are
    read by the libraries at import, not by infaas)."""
    for name in _THREAD_VARIABLES:
        os.environ[name] = str(threads)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m profiler.worker JOB.json RESULT.json", file=sys.stderr)
        return 2
    job_path, result_path = Path(argv[0]), Path(argv[1])
    threads = int(json.loads(job_path.read_text())["variant"]["spec"].get("threads", 1))
    pin_threads(threads)
    from profiler.process import run_job

    run_job(job_path, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
