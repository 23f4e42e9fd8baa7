"""The one map from the error tree to HTTP status, and the handlers that apply it.

Every error response is ``{"error": <code>, "detail": <message>, ...structured fields}``.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from infaas import errors as e

__all__ = [
    "HTTP_STATUS",
    "RETRY_AFTER_S",
    "error_response",
    "install_error_handlers",
    "internal_error",
    "protocol_error",
    "retry_after_s",
    "status_for",
]

HTTP_STATUS: dict[type[e.InfaasError], int] = {
    e.InfaasError: 500,
    e.InvalidInput: 400,
    e.PayloadTooLarge: 413,
    e.Unauthenticated: 401,
    e.Forbidden: 403,
    e.NotFound: 404,
    e.Conflict: 409,
    e.RegistrationError: 422,
    e.NoFeasibleVariant: 422,
    e.Overloaded: 429,
    e.DeadlineExceeded: 504,
    e.Unavailable: 503,
    e.StoreError: 503,
}

RETRY_AFTER_S = 1
"""Sent as ``Retry-After`` with every 503 and 429 (unless the error says how long, in its
``retry_after_s`` field): a drain, a lost worker, a store outage within its timeouts, or full
queues are conditions a client should retry soon, not give up on."""


def status_for(exc: e.InfaasError) -> int:
    """The status of the nearest class in the table along the exception's MRO."""
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


def retry_after_s(exc: e.InfaasError) -> str:
    """The ``Retry-After`` of a 429 or 503: the error's ``retry_after_s`` in whole seconds (at
    least 1), else `RETRY_AFTER_S`."""
    return str(max(1, math.ceil(exc.fields.get("retry_after_s", RETRY_AFTER_S))))


def protocol_error(exc: e.InfaasError) -> JSONResponse:
    """The error as the KServe V2 and TensorFlow Serving protocols carry it: ``error`` is a
    message; infaas's ``detail`` and fields ride along; status and headers as everywhere."""
    body = {**exc.to_body(), "error": f"{exc.code}: {exc.message}", "detail": exc.message}
    return error_response(exc, body)


def error_response(exc: e.InfaasError, body: dict[str, Any] | None = None) -> JSONResponse:
    status = status_for(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, e.Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    if status in (429, 503):
        headers["Retry-After"] = retry_after_s(exc)
    return JSONResponse(exc.to_body() if body is None else body, status_code=status, headers=headers or None)


def internal_error(exc: Exception) -> JSONResponse:
    """The 500 for an exception no handler knows. Never leaks a traceback; the server log has it."""
    body = {"error": "internal_error", "detail": f"{type(exc).__name__}: the server failed"}
    return JSONResponse(body, status_code=500)


def _validation_detail(errors: Any) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    async def on_infaas(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, e.InfaasError)
        return error_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(e.InvalidInput(_validation_detail(exc.errors())))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        # FastAPI answers any error raised while it reads a form or JSON body with "400: There was
        # an error parsing the body"; one of ours (the body limit's 413) keeps its status and words.
        if isinstance(exc.__cause__, e.InfaasError):
            return error_response(exc.__cause__)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        # Starlette's 405 names the allowed methods in `Allow` (RFC 9110): keep its headers.
        return JSONResponse(
            {"error": code, "detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        return internal_error(exc)

    app.add_exception_handler(e.InfaasError, on_infaas)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
