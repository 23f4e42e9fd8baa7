"""Offline batch jobs: a file of rows in, a file of outputs out, at the lowest cost, below online
queries in priority, charged exactly once even across restarts.

Jobs use the online queries' data path, not one of their own: the router chooses each chunk's
variant (`Router.route_async`, the same selection and verdict, with the job's accuracy and cost
targets and no latency target: a cold variant it wants is loaded and waited for), its rows go
through the variant's batcher queue, and its charge through the meter.

A job is split into chunks of `INFAAS_JOB_CHUNK_ROWS` rows (8 192), each sent in batches of the
chosen variant's largest batch, one at a time, to the batcher as the flow ``job:<tenant>`` with a
weight of `JOB_WEIGHT`: fair queuing puts online rows ahead of it (a job's batch waits for
them, and online rows that arrive behind a job's batch still go first), and the batcher may merge
both into one batch. A job also submits only while no online query waits in any queue, and, while
online queries flow, paces itself to `INFAAS_JOB_SHARE` of wall time (`pause_s`): running flat out
it made ~1 700 worker calls a second from the front end's loop, and online answers waited behind
them (p99 125 ms against a 100 ms target once in CI, 9-16 ms on a quiet machine). Alone, it runs
flat out. A chunk is finished in three steps, in this order, each safe to repeat:

1. its outputs and its cost go to ``jobs/<id>/chunk-<n>.npz`` (written aside, then renamed);
2. its charge goes through the meter (`Meter.charge_once`) with the mark ``("job:<id>", n + 1)``
   and is written to the store (`Meter.flush_once`): the store adds a marked charge at most
   once, so a chunk replayed after a crash is never charged twice;
3. the job's record moves to ``chunks_done = n + 1`` with the chunk's cost added.

After a restart, the runner resumes every job that was queued or running from its record: a chunk
whose file exists is not run again, its (already counted) usage is offered again and refused by the
mark, and the record catches up. Usage shows under the job's tenant with the task
``offline:<task>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import os
import time
import uuid
from pathlib import Path

import numpy as np

from infaas.dataplane import parse_inputs
from infaas.errors import Conflict, InvalidInput, NotFound, Overloaded
from infaas.metering import Meter, cost_share_pusd
from infaas.router import Routed, Router
from infaas.settings import Settings
from infaas.store import MetadataStore
from infaas.types import SLO, Job, Principal, Task
from infaas.workers.base import Batcher

__all__ = ["JOB_WEIGHT", "MAX_ROWS", "ONLINE_RECENT_S", "JobRunner", "pause_s", "read_rows"]

log = logging.getLogger(__name__)

MAX_ROWS = 10_000_000
_OFFLINE_LATENCY_MS = 3_600_000.0  # no latency target: any variant is fast enough for a file
ONLINE_RECENT_S = 1.0  # online traffic "flows" while a query was queued this recently
JOB_WEIGHT = 0.01
"""A job's weight in a variant's fair queue: a hundredth of a tenant's default."""
COLD_WAIT_S = 600.0
"""How long a chunk waits for the variant the router wants to load (a TensorFlow one: seconds)."""


def pause_s(busy_s: float, share: float, online_idle_s: float) -> float:
    """How long a job waits after keeping a worker busy for `busy_s`, so that its busy time is
    `share` of wall time while online queries flow (the last one queued `online_idle_s` ago)."""
    if online_idle_s >= ONLINE_RECENT_S or share >= 1.0:
        return 0.0
    return busy_s * (1.0 - share) / share


def read_rows(data: bytes, filename: str) -> np.ndarray:
    """Rows from an uploaded file: ``.npy``, ``.npz`` (its first array, or ``x``), ``.csv``
    (numbers, one row per line) or ``.jsonl`` (one JSON list per line). Never unpickles."""
    suffix = Path(filename).suffix.lower()
    try:
        if suffix == ".npy":
            return np.asarray(np.load(io.BytesIO(data), allow_pickle=False))
        if suffix == ".npz":
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                if not npz.files:
                    raise InvalidInput("the .npz holds no array")
                return np.asarray(npz["x" if "x" in npz.files else npz.files[0]])
        if suffix == ".csv":
            return np.loadtxt(io.StringIO(data.decode()), delimiter=",", dtype=np.float64, ndmin=2)
        if suffix == ".jsonl":
            lines = [line for line in data.decode().splitlines() if line.strip()]
            return np.asarray([json.loads(line) for line in lines], dtype=np.float64)
    except InvalidInput:
        raise
    except (ValueError, TypeError, UnicodeDecodeError, json.JSONDecodeError, OSError) as exc:
        raise InvalidInput(f"cannot read the rows from {filename!r}: {str(exc)[:300]}") from None
    raise InvalidInput(f"rows must come as .npy, .npz, .csv or .jsonl; got {filename!r}", filename=filename)


class JobRunner:
    """Stores, runs, resumes and cancels jobs (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        store: MetadataStore,
        router: Router,
        batcher: Batcher,
        meter: Meter,
        *,
        idle_wait_s: float = 0.005,
    ) -> None:
        self._root = settings.data_dir / "jobs"
        self._chunk_rows = settings.job_chunk_rows
        self._share = settings.job_share
        self._store = store
        self._router = router
        self._batcher = batcher
        self._meter = meter
        self._idle_wait_s = idle_wait_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._cancelled: set[str] = set()

    # ---- the store ------------------------------------------------------------------------
    def _get(self, job_id: str) -> Job | None:
        return self._store.get_job(job_id)

    def _put(self, job: Job) -> None:
        self._store.put_job(job)

    def _all(self) -> list[Job]:
        return self._store.list_jobs()

    def get(self, job_id: str, principal: Principal) -> Job:
        """The job, for its tenant or the admin; 404 for anyone else (blocking: the store)."""
        job = self._get(job_id)
        if job is None or (principal.role != "admin" and job.tenant != principal.name):
            raise NotFound(f"no job {job_id!r}", job=job_id)
        return job

    def _dir(self, job_id: str) -> Path:
        return self._root / job_id

    # ---- the API's operations (blocking: call them in a thread) -----------------------------
    def submit(
        self,
        principal: Principal,
        task: Task,
        rows: np.ndarray,
        *,
        architecture: str | None,
        min_accuracy: float,
        max_cost_usd_per_1k: float | None,
    ) -> Job:
        arr = parse_inputs(rows, task)
        if len(arr) > MAX_ROWS:
            raise InvalidInput(f"{len(arr)} rows is over the {MAX_ROWS} a job takes", rows=len(arr))
        job = Job(
            id=uuid.uuid4().hex[:16],
            tenant=principal.name,
            task=task.name,
            architecture=architecture,
            min_accuracy=min_accuracy,
            max_cost_usd_per_1k=max_cost_usd_per_1k,
            rows=len(arr),
            chunk_rows=self._chunk_rows,
            chunks=math.ceil(len(arr) / self._chunk_rows),
            created_at_s=time.time(),
        )
        folder = self._dir(job.id)
        folder.mkdir(parents=True)
        np.save(folder / "input.npy", arr, allow_pickle=False)
        self._put(job)
        self._wake.set()
        return job

    def cancel(self, job_id: str, principal: Principal) -> Job:
        job = self.get(job_id, principal)
        if job.state in ("done", "failed", "cancelled"):
            raise Conflict(f"job {job_id} is already {job.state}", job=job_id, state=job.state)
        self._cancelled.add(job_id)
        job = job.model_copy(update={"state": "cancelled", "finished_at_s": time.time()})
        self._put(job)
        return job

    def result(self, job_id: str, principal: Principal) -> np.ndarray:
        job = self.get(job_id, principal)
        if job.state != "done":
            raise Conflict(f"job {job_id} is {job.state}: its result is ready once done", state=job.state)
        folder = self._dir(job_id)
        parts = []
        for n in range(job.chunks):
            with np.load(folder / f"chunk-{n:06d}.npz", allow_pickle=False) as chunk:
                parts.append(chunk["outputs"])
        return np.concatenate(parts)

    @staticmethod
    def eta_s(job: Job, now_s: float) -> float | None:
        if job.state != "running" or job.started_at_s is None or job.chunks_done == 0:
            return None
        per_chunk = (now_s - job.started_at_s) / job.chunks_done
        return per_chunk * (job.chunks - job.chunks_done)

    # ---- running ------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="job-runner")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _loop(self) -> None:
        while True:
            pending = [j for j in await asyncio.to_thread(self._all) if j.state in ("queued", "running")]
            for job in sorted(pending, key=lambda j: j.created_at_s):
                try:
                    await self._run(job)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.exception("job %s failed", job.id)
                    latest = await asyncio.to_thread(self._get, job.id)
                    if latest is not None and latest.state == "running":
                        failed = latest.model_copy(
                            update={"state": "failed", "error": str(exc)[:500], "finished_at_s": time.time()}
                        )
                        await asyncio.to_thread(self._put, failed)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)

    async def _run(self, job: Job) -> None:
        if job.state == "queued":
            job = job.model_copy(update={"state": "running", "started_at_s": time.time()})
            await asyncio.to_thread(self._put, job)
        rows = await asyncio.to_thread(np.load, self._dir(job.id) / "input.npy", None, False)
        for n in range(job.chunks_done, job.chunks):
            if job.id in self._cancelled:
                return
            job = await self._chunk(job, n, rows[n * job.chunk_rows : (n + 1) * job.chunk_rows])
        done = job.model_copy(update={"state": "done", "finished_at_s": time.time()})
        await asyncio.to_thread(self._put, done)

    async def _route(self, job: Job) -> Routed:
        """The router's choice for the job's targets (no latency target), waiting while the
        variant it wants loads (its verdict then is "cold": 429)."""
        slo = SLO(
            latency_ms=_OFFLINE_LATENCY_MS,
            min_accuracy=job.min_accuracy,
            max_cost_usd_per_1k=job.max_cost_usd_per_1k,
        )
        give_up_s = time.monotonic() + COLD_WAIT_S
        while True:
            try:
                # Priced per row at one row: the policy's own ranking.
                return await self._router.route_async(
                    job.task, 1, slo, time.monotonic(), architecture=job.architecture, tenant=_flow(job)
                )
            except Overloaded as busy:
                if time.monotonic() > give_up_s:
                    raise
                await asyncio.sleep(min(1.0, max(0.05, float(busy.fields.get("retry_after_s") or 0.1))))

    async def _chunk(self, job: Job, n: int, rows: np.ndarray) -> Job:
        path = self._dir(job.id) / f"chunk-{n:06d}.npz"
        if path.exists():  # run before a restart: reuse, never recompute (its cost is in it)
            with np.load(path, allow_pickle=False) as saved:
                cost_pusd, variant = int(saved["cost_pusd"]), str(saved["variant"])
        else:
            routed = await self._route(job)
            variant = routed.variant.name
            cost_pusd, outputs = await self._compute(routed, job, rows)
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, outputs=outputs, cost_pusd=np.int64(cost_pusd), variant=np.str_(variant))
            os.replace(tmp, path)
        self._meter.charge_once(
            (f"job:{job.id}", n + 1),
            tenant=job.tenant,
            task=f"offline:{job.task}",
            variant=variant,
            rows=len(rows),
            cost_pusd=cost_pusd,
            now_s=time.time(),
        )
        counted = await asyncio.to_thread(self._meter.flush_once)
        latest = await asyncio.to_thread(self._get, job.id)
        if latest is None or latest.state == "cancelled":
            self._cancelled.add(job.id)
            return job
        if latest.chunks_done > n:  # the record already holds this chunk
            return latest
        variants = latest.variants if variant in latest.variants else (*latest.variants, variant)
        job = latest.model_copy(
            update={"chunks_done": n + 1, "cost_pusd": latest.cost_pusd + cost_pusd, "variants": variants}
        )
        await asyncio.to_thread(self._put, job)
        if not counted:
            log.info("job %s chunk %d: usage was already counted before a restart", job.id, n)
        return job

    async def _compute(self, routed: Routed, job: Job, rows: np.ndarray) -> tuple[int, np.ndarray]:
        """Run `rows` on the routed variant through its batcher queue, in batches of its largest
        size, one at a time, only while no online query waits, and paced to the job's share while
        online queries flow. Returns the cost and the outputs."""
        variant, profile = routed.variant, routed.profile
        step = variant.spec.max_batch
        outputs = []
        cost = 0
        for start in range(0, len(rows), step):
            while self._batcher.queue_depths():
                await asyncio.sleep(self._idle_wait_s)  # online first
            batch = rows[start : start + step]
            sent_s = time.monotonic()
            result = await self._batcher.submit(
                variant,
                profile,
                batch,
                sent_s + _OFFLINE_LATENCY_MS / 1000.0,
                _flow(job),
                JOB_WEIGHT,
                background=True,
            )
            outputs.append(result.outputs)
            now_s = time.monotonic()
            cost += cost_share_pusd(profile, result.batch_rows, len(batch))
            pause = pause_s(now_s - sent_s, self._share, now_s - self._batcher.last_submit_s())
            if pause > 0.0:
                await asyncio.sleep(pause)
        return cost, np.concatenate(outputs).astype(np.float32, copy=False)


def _flow(job: Job) -> str:
    """The job's flow in the fair queues: apart from its tenant's online queries."""
    return f"job:{job.tenant}"
