"""``POST /v1/query``: the model-less query path.

authenticate, parse the body, and hand the query to the data plane (`infaas.dataplane`: input
checks, routing, batching, the charge, the SLO verdict, metering), then render its answer.
``latency_ms`` is measured from the moment the request reached the app (`ReceiptStamp`, the
outermost middleware) to the moment its reply is built.
"""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from infaas.api.auth import authenticate
from infaas.api.errors import _validation_detail
from infaas.api.openapi import QUERY_ROUTE
from infaas.api.schemas import QueryRequest, QueryResponse
from infaas.dataplane import DataPlane, InferenceRequest
from infaas.errors import InvalidInput
from infaas.types import SLO

__all__ = ["ReceiptStamp", "route", "router"]

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
    dataplane: DataPlane = request.app.state.dataplane
    try:
        req = _parse_request(await request.body())
    except InvalidInput as exc:
        dataplane.record_failure(principal, "", exc, received_s)
        raise
    answer = await dataplane.infer(
        principal,
        InferenceRequest(
            task=req.task,
            inputs=req.inputs,
            received_s=received_s,
            # Not validated again: `QueryRequest` holds these fields to the same bounds or tighter.
            slo=SLO.model_construct(
                latency_ms=req.latency_ms,
                min_accuracy=req.min_accuracy,
                max_cost_usd_per_1k=req.max_cost_usd_per_1k,
            ),
            architecture=req.architecture,
            variant=req.variant,
        ),
    )
    body = {"outputs": answer.outputs.tolist(), **answer.decision()}
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


route = Route("/v1/query", query, methods=["POST"])
"""How the app serves ``POST /v1/query``: a plain Starlette route, placed ahead of every FastAPI
route. FastAPI's per-request route handling (dependency solving, its scope bookkeeping, the match
against each route before this one) cost ~60 µs per query here, a third of the service's own CPU
per query (docs/benchmarks.md, "Serving"), and this handler uses none of it: it authenticates,
parses the body (`openapi_extra` documents it) and builds its JSON reply itself. The FastAPI route
in `router` stays behind it for the OpenAPI docs; a request never reaches it."""
