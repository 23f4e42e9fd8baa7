"""Offline batch jobs over HTTP: `POST /v1/jobs`, `GET /v1/jobs/{id}`, `GET /v1/jobs/{id}/result`,
`DELETE /v1/jobs/{id}`. Thin: parsing and rendering here, the rest in `infaas.jobs.JobRunner`."""

from __future__ import annotations

import io
import json
import time
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from infaas.api.auth import TenantPrincipal
from infaas.api.openapi import KEY_REQUIRED, TENANT_KEY, error_responses, text_response
from infaas.errors import (
    ArchitectureNotFound,
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    TaskNotFound,
    Unavailable,
)
from infaas.jobs import JobRunner, read_rows
from infaas.router import Router
from infaas.types import Job, pusd_to_usd

__all__ = ["JobOut", "router"]

router = APIRouter(tags=["jobs"])

JobId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{16}$", examples=["3f2a9c1e0b7d4a65"])]


class JobOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    state: str
    task: str
    architecture: str | None
    rows: int
    rows_done: int
    eta_s: float | None
    cost_usd: float
    cost_pusd: int
    variants: list[str]
    error: str | None


def _out(job: Job) -> JobOut:
    return JobOut(
        id=job.id,
        state=job.state,
        task=job.task,
        architecture=job.architecture,
        rows=job.rows,
        rows_done=job.rows_done,
        eta_s=JobRunner.eta_s(job, time.time()),
        cost_usd=pusd_to_usd(job.cost_pusd),
        cost_pusd=job.cost_pusd,
        variants=list(job.variants),
        error=job.error,
    )


def _runner(request: Request) -> JobRunner:
    runner: JobRunner | None = getattr(request.app.state, "jobs", None)
    if runner is None:
        raise Unavailable("the service is starting; retry")
    return runner


@router.post(
    "/v1/jobs",
    status_code=202,
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, PayloadTooLarge, TaskNotFound, ArchitectureNotFound, *TENANT_KEY),
)
async def submit_job(
    request: Request,
    principal: TenantPrincipal,
    rows: Annotated[UploadFile, File(description="rows: .npy, .npz, .csv or .jsonl")],
    task: Annotated[
        str | None, Form(description="model-less: the cheapest variant meeting the targets")
    ] = None,
    architecture: Annotated[str | None, Form(description="or an architecture (or version)")] = None,
    min_accuracy: Annotated[float, Form(ge=0.0, le=1.0)] = 0.0,
    max_cost_usd_per_1k: Annotated[float | None, Form(ge=0.0)] = None,
) -> JSONResponse:
    """Queue a job; it runs in the background below online queries. 202 with its id."""
    runner = _runner(request)
    the_router: Router = request.app.state.router
    if (task is None) == (architecture is None):
        raise InvalidInput("name either a task or an architecture")
    now_s = time.monotonic()
    if architecture is not None:
        arch = the_router.snapshot.resolve(architecture)
        if arch is None:
            raise ArchitectureNotFound(f"no architecture {architecture!r}", architecture=architecture)
        task = arch.task
    assert task is not None
    the_task = await the_router.task_async(task, now_s)
    data = await rows.read()
    arr = await run_in_threadpool(read_rows, data, rows.filename or "rows")
    job = await run_in_threadpool(
        runner.submit,
        principal,
        the_task,
        arr,
        architecture=architecture,
        min_accuracy=min_accuracy,
        max_cost_usd_per_1k=max_cost_usd_per_1k,
    )
    return JSONResponse(_out(job).model_dump(mode="json"), status_code=202)


@router.get(
    "/v1/jobs/{job_id}",
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, NotFound, *TENANT_KEY),
)
def job_status(job_id: JobId, request: Request, principal: TenantPrincipal) -> JobOut:
    """State, rows done, ETA, cost so far."""
    return _out(_runner(request).get(job_id, principal))


@router.get(
    "/v1/jobs/{job_id}/result",
    dependencies=KEY_REQUIRED,
    response_class=Response,
    responses={
        **text_response("application/octet-stream", "the outputs, one row per input row"),
        **error_responses(InvalidInput, NotFound, Conflict, *TENANT_KEY),
    },
)
def job_result(
    job_id: JobId,
    request: Request,
    principal: TenantPrincipal,
    format: Annotated[Literal["npy", "jsonl"], Query(description="npy (float32) or jsonl")] = "npy",
) -> Response:
    """The outputs, in input order, once the job is done (409 before)."""
    outputs = _runner(request).result(job_id, principal)
    if format == "jsonl":
        body = "".join(json.dumps(row) + "\n" for row in outputs.tolist())
        return Response(body, media_type="application/jsonl")
    buf = io.BytesIO()
    np.save(buf, outputs, allow_pickle=False)
    return Response(buf.getvalue(), media_type="application/octet-stream")


@router.delete(
    "/v1/jobs/{job_id}",
    dependencies=KEY_REQUIRED,
    responses=error_responses(InvalidInput, PayloadTooLarge, NotFound, Conflict, *TENANT_KEY),
)
def cancel_job(job_id: JobId, request: Request, principal: TenantPrincipal) -> JobOut:
    """Cancel: no chunk starts after this; what ran is charged."""
    return _out(_runner(request).cancel(job_id, principal))
