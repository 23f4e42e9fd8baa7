"""``POST /v1/query``: the model-less query path.

authenticate, parse the body, and hand the query to the data plane (`infaas.dataplane`: input
checks, routing, batching, the charge, the SLO verdict, metering), then render its answer.
``latency_ms`` is measured from the moment the request reached the app (`ReceiptStamp`, the
outermost middleware) to the moment its reply is built.

`infaas serve` answers it in its HTTP protocol (`infaas.api.door.DoorProtocol`'s lane, through
`answer`): once a query's headers and body are read, the protocol calls `answer`, which does what
`query` does on the raw header and body (no `Request`, no `Response`: its answer is bytes), and
writes it itself, with no ASGI cycle, task wrapper or middleware in between;
``latency_ms`` then counts from when its task starts, as from `ReceiptStamp` (door.py says why
not from its parsed headers). What the lane does not take (a body without a
Content-Length, over the limit, or behind ``Expect: 100-continue``; a request pipelined behind
another; any server that does not run the protocol, such as the in-process test clients) goes
through the app, where `QueryLane`, the middleware just inside `ReceiptStamp`, answers it past
the rest of the app's middleware and its router: a query pays for what it uses (its body limit,
errors as JSON) and not for eight layers of ASGI calls that do nothing for it. The FastAPI route
in `router` stays for the OpenAPI document; a request never reaches it.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from infaas.api.auth import authenticate, principal_for
from infaas.api.door import Reply, as_reply
from infaas.api.errors import _validation_detail, error_response
from infaas.api.limits import limited_receive, too_large
from infaas.api.openapi import QUERY_ROUTE
from infaas.api.schemas import QueryRequest, QueryResponse
from infaas.dataplane import DataPlane, InferenceRequest
from infaas.errors import InfaasError, InvalidInput
from infaas.types import SLO, Principal

__all__ = ["QueryLane", "ReceiptStamp", "answer", "router"]

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


class QueryLane:
    """Pure ASGI middleware (see the module docstring): ``POST /v1/query`` is answered here with
    `query`; any other request goes on into the app. An `InfaasError` becomes its JSON answer as
    the app's handlers would make it; anything else propagates to the app's outermost handler
    (a JSON 500)."""

    def __init__(self, app: ASGIApp, max_request_bytes: int) -> None:
        self.app = app
        self._limit = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/query" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            refused = too_large(scope, self._limit)
            if refused is not None:
                raise refused
            response = await query(Request(scope, limited_receive(receive, self._limit)))
        except InfaasError as exc:
            response = error_response(exc)
        await response(scope, receive, send)


_JSON_TYPE = (b"content-type", b"application/json")


async def answer(app: Any, headers: list[tuple[bytes, bytes]], body: bytes, received_s: float) -> Reply:
    """The answer to a ``POST /v1/query`` whose headers (lower-case names, as uvicorn parses them)
    and whole body the HTTP protocol has read: what `query` answers, without its `Request`, an
    `InfaasError` as its JSON answer. Anything else propagates (the caller answers a JSON 500)."""
    authorization = next((value for name, value in headers if name == b"authorization"), b"")
    try:
        principal = await principal_for(app.state, authorization.decode("latin-1"))
        answered = await _answered(app.state.dataplane, principal, body, received_s)
    except InfaasError as exc:
        return as_reply(error_response(exc))
    return 200, [_JSON_TYPE, (b"content-length", b"%d" % len(answered))], answered


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
    # handler is served by `QueryLane`, which resolves no dependencies.
    principal = await authenticate(request)
    body = await _answered(request.app.state.dataplane, principal, await request.body(), received_s)
    return Response(body, media_type="application/json")


async def _answered(dataplane: DataPlane, principal: Principal, body: bytes, received_s: float) -> bytes:
    """`principal`'s query in `body` answered by the data plane, as the JSON body of its 200."""
    try:
        req = _parse_request(body)
    except InvalidInput as exc:
        dataplane.record_failure(principal, "", exc, received_s)
        raise
    answer = await dataplane.infer(
        principal,
        InferenceRequest(
            task=req.task,
            inputs=req.inputs,
            received_s=received_s,
            slo=_targets(req.latency_ms, req.min_accuracy, req.max_cost_usd_per_1k),
            architecture=req.architecture,
            variant=req.variant,
        ),
    )
    return orjson.dumps({"outputs": answer.outputs.tolist(), **answer.decision()})


_SLOS: dict[tuple[float, float, float | None], SLO] = {}


def _targets(latency_ms: float, min_accuracy: float, max_cost_usd_per_1k: float | None) -> SLO:
    """The `SLO` of a query's targets, one object per distinct set: clients repeat theirs, and
    building one per query (~2 µs) showed in the lane's profile. Not validated again: `QueryRequest`
    holds these fields to the same bounds or tighter."""
    key = (latency_ms, min_accuracy, max_cost_usd_per_1k)
    slo = _SLOS.get(key)
    if slo is None:
        if len(_SLOS) >= 4096:  # many distinct targets: start over rather than track recency
            _SLOS.clear()
        slo = _SLOS[key] = SLO.model_construct(
            latency_ms=latency_ms, min_accuracy=min_accuracy, max_cost_usd_per_1k=max_cost_usd_per_1k
        )
    return slo
