"""``POST /v1/query``: the model-less query path.

parse and validate → `Router.route` (pure selection over the snapshot and live state) →
`Batcher.submit` (one worker call per batch) → this request's rows, its cost share, the meter.
``latency_ms`` is measured from the moment the request reached the app (`ReceiptStamp`, the
outermost middleware) to the moment its reply is built.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from infaas.api.auth import authenticate
from infaas.api.errors import _validation_detail, status_for
from infaas.api.openapi import QUERY_ROUTE
from infaas.api.schemas import QueryRequest, QueryResponse
from infaas.errors import InfaasError, InvalidInput
from infaas.metering import Meter, cost_share_pusd
from infaas.router import Router
from infaas.types import SLO, Task, pusd_to_usd
from infaas.workers.base import Batcher

__all__ = ["ReceiptStamp", "parse_inputs", "route", "router"]

router = APIRouter(tags=["query"])
"""FastAPI's route for ``POST /v1/query``, kept for the OpenAPI docs; `route` serves it."""

_RECEIVED = "received_s"


class ReceiptStamp:
    """Pure ASGI middleware: stamps when a request reached the app (monotonic seconds)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[_RECEIVED] = time.monotonic()
        await self.app(scope, receive, send)


def parse_inputs(inputs: list[Any], task: Task) -> np.ndarray:
    """Rows as an array of the task's input shape and dtype, or `InvalidInput` saying what is
    wrong. Rows may also come flattened (one list of ``prod(shape)`` numbers each)."""
    spec = task.input_spec
    if not inputs:
        raise InvalidInput("inputs is empty: send at least one row", expected_shape=list(spec.shape))
    try:
        arr = np.asarray(inputs)
        # Strings and booleans are not numbers, though a float64 array would take "1" as 1.0.
        if arr.dtype.kind in "USb":
            raise TypeError(f"found {'booleans' if arr.dtype.kind == 'b' else 'strings'}, send JSON numbers")
        # Object arrays: integers past int64 or nulls among the numbers; float64 takes the first
        # and turns the second into NaN, refused below.
        arr = np.asarray(arr, dtype=np.float64)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(
            f"inputs must be rows of numbers of shape {list(spec.shape)} (ragged or non-numeric: {exc})",
            expected_shape=list(spec.shape),
        ) from None
    rows = arr.shape[0]
    if arr.shape[1:] != spec.shape:
        if arr.ndim == 2 and arr.shape[1] == spec.row_size:
            arr = arr.reshape((rows, *spec.shape))
        else:
            raise InvalidInput(
                f"each row must have shape {list(spec.shape)} (or {spec.row_size} numbers flattened); "
                f"got rows of shape {list(arr.shape[1:])}",
                expected_shape=list(spec.shape),
                got_shape=list(arr.shape[1:]),
            )
    # One pass for both checks: the largest magnitude is NaN or infinite exactly when some input is.
    peak = float(np.abs(arr).max())
    if not math.isfinite(peak):
        bad = int(np.argwhere(~np.isfinite(arr.reshape(rows, -1)))[0][0])
        raise InvalidInput(f"inputs hold NaN or infinity (first in row {bad})", row=bad)
    dtype = np.dtype(spec.dtype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not (np.all(arr == np.round(arr)) and arr.min() >= info.min and arr.max() <= info.max):
            raise InvalidInput(f"inputs must be integers in [{info.min}, {info.max}] ({spec.dtype})")
    elif np.issubdtype(dtype, np.floating):
        limit = float(np.finfo(dtype).max)
        if peak > limit:
            raise InvalidInput(f"inputs overflow {spec.dtype} (|x| > {limit:g})")
    return arr.astype(dtype, copy=False)


def _parse_request(body: bytes) -> QueryRequest:
    if not body:
        raise InvalidInput("empty body: send a JSON object with task, inputs and latency_ms")
    try:
        return QueryRequest.model_validate_json(body)
    except ValidationError as exc:
        if any(err.get("type") == "json_invalid" for err in exc.errors()):
            raise InvalidInput(f"malformed JSON: {exc.errors()[0].get('msg')}") from None
        raise InvalidInput(_validation_detail(exc.errors())) from None


_OPENAPI_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": QueryRequest.model_json_schema()}},
    }
}


@router.post(
    "/v1/query",
    response_model=QueryResponse,
    openapi_extra=_OPENAPI_BODY,
    **QUERY_ROUTE,  # its key scheme and error statuses
)
async def query(request: Request) -> Response:
    """Answer a query on the cheapest variant that meets its targets."""
    # Read from the scope, not `request.state`: that builds a `State` wrapper per request.
    received_s: float = request.scope.get("state", {}).get(_RECEIVED) or time.monotonic()
    # The same check as the `TenantPrincipal` dependency (any valid key), called directly: this
    # handler is served by a plain Starlette route (`route`), which resolves no dependencies.
    principal = await authenticate(request)
    state = request.app.state
    the_router: Router = state.router
    batcher: Batcher = state.batcher
    meter: Meter = state.meter
    task_name, variant_name, rows, slo = "", "", 0, None
    try:
        req = _parse_request(await request.body())
        task_name = req.task
        task = await the_router.task_async(req.task, received_s)
        inputs = parse_inputs(req.inputs, task)
        rows = int(inputs.shape[0])
        # Not validated again: `QueryRequest` holds these fields to the same bounds or tighter.
        slo = SLO.model_construct(
            latency_ms=req.latency_ms,
            min_accuracy=req.min_accuracy,
            max_cost_usd_per_1k=req.max_cost_usd_per_1k,
        )
        routed_s = time.monotonic()
        routed = await the_router.route_async(
            req.task,
            rows,
            slo,
            routed_s,
            architecture=req.architecture,
            variant=req.variant,
            elapsed_ms=(routed_s - received_s) * 1000.0,
        )
        variant_name = routed.variant.name
        result = await batcher.submit(
            routed.variant, routed.profile, inputs, received_s + slo.latency_ms / 1000.0
        )
        cost_pusd = cost_share_pusd(routed.profile, result.batch_rows, rows)
        outputs = result.outputs.tolist()
        latency_ms = (time.monotonic() - received_s) * 1000.0
    except Exception as exc:
        status = status_for(exc) if isinstance(exc, InfaasError) else 500
        meter.record_failure(
            tenant=principal.name,
            task=task_name,
            # A refusal names the variant it would have used.
            variant=variant_name
            or (str(exc.fields.get("variant", "")) if isinstance(exc, InfaasError) else ""),
            rows=rows,
            latency_ms=(time.monotonic() - received_s) * 1000.0,
            error=exc.code if isinstance(exc, InfaasError) else "internal_error",
            now_s=time.time(),
            counted="refused" if status == 429 else "failed" if status >= 500 else None,
            slo=slo,
        )
        raise
    decision = routed.decision
    cost_per_1k = routed.profile.cost_usd_per_1k(result.batch_rows)
    slo_met = (
        latency_ms <= slo.latency_ms
        and decision.accuracy >= slo.min_accuracy
        and (slo.max_cost_usd_per_1k is None or cost_per_1k <= slo.max_cost_usd_per_1k)
    )
    # The router learns the whole path's overhead, receipt to reply, the time before routing
    # included: that is what the latency target is judged on. (Tenant keys never wait on the
    # store once resolved, so a store outage does not inflate it; see `infaas.api.auth`.)
    the_router.observe(routed, latency_ms, time.monotonic())
    meter.record_answer(
        tenant=principal.name,
        task=task.name,
        variant=variant_name,
        rows=rows,
        batch_rows=result.batch_rows,
        cost_pusd=cost_pusd,
        latency_ms=latency_ms,
        slo_met=slo_met,
        now_s=time.time(),
        slo=slo,
    )
    # The charge is on disk (the usage journal) before the answer leaves: a crash after this
    # point cannot lose it.
    await meter.durable()
    body = {
        "outputs": outputs,
        "variant": variant_name,
        "architecture": decision.architecture,
        "accuracy": decision.accuracy,
        "predicted_latency_ms": round(decision.predicted_latency_ms, 4),
        "latency_ms": round(latency_ms, 4),
        "cost_usd": pusd_to_usd(cost_pusd),
        "cost_pusd": cost_pusd,
        "slo_met": slo_met,
        "batch_rows": result.batch_rows,
        "reason": decision.reason,
        "load_hint": decision.load_hint,
    }
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


route = Route("/v1/query", query, methods=["POST"])
"""How the app serves ``POST /v1/query``: a plain Starlette route, placed ahead of every FastAPI
route. FastAPI's per-request route handling (dependency solving, its scope bookkeeping, the match
against each route before this one) cost ~60 µs per query here, a third of the service's own CPU
per query (docs/benchmarks.md, "Serving"), and this handler uses none of it: it authenticates,
parses the body (`openapi_extra` documents it) and builds its JSON reply itself. The FastAPI route
in `router` stays behind it for the OpenAPI docs; a request never reaches it."""
