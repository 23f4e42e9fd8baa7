"""What ``/openapi.json`` says a route answers besides success: one error body, statuses from one table.

FastAPI documents a route's success status and, for every route with parameters, a 422 with its
own validation body. Neither is the truth here: every error leaves as
``{"error": <code>, "detail": <message>, ...fields}`` (`ErrorBody`) with the status that
`infaas.api.errors` gives its class (a validation failure is an `InvalidInput`: 400), and keys,
body limits and the store add statuses of their own to most routes. A client generator or a fuzzer
(schemathesis, ``tests/integration/test_openapi_fuzz.py``) reads the document, so it must list
every status a route can answer.

So a route names the errors it can raise, and `error_responses` turns them into its ``responses=``
entries, the status taken from that one table: when a class moves to another status, the document
moves with it. `TENANT_KEY` and `ADMIN_KEY` are the errors that come with a key check (it reads the
store for tenant keys), `SERVING` the 503 of a draining server. `KEY_REQUIRED` puts the bearer
scheme on a route's documentation (it checks nothing; `infaas.api.auth` does), and
`install_openapi` drops the 422 body FastAPI adds on its own, which this service never sends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.params import Depends as DependsParam
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from infaas import errors as e
from infaas.api.errors import status_for

__all__ = [
    "ADMIN_KEY",
    "KEY_REQUIRED",
    "QUERY_ROUTE",
    "SERVING",
    "TENANT_KEY",
    "ErrorBody",
    "error_responses",
    "install_openapi",
    "text_response",
]


class ErrorBody(BaseModel):
    """Every error response: a stable code, a message for people, and fields that depend on the error."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "error": "task_not_found",
                    "detail": "no task 'digit'; GET /v1/tasks lists them",
                    "task": "digit",
                }
            ]
        },
    )

    error: str = Field(description="stable code: invalid_input, unauthenticated, no_feasible_variant, ...")
    detail: str = Field(description="what went wrong and, where it helps, what to send instead")


ErrorClass = type[e.InfaasError]

SERVING: tuple[ErrorClass, ...] = (e.Unavailable,)
"""What any route but the probes can answer: 503 while the server drains (`infaas.api.lifecycle`)."""

TENANT_KEY: tuple[ErrorClass, ...] = (e.Unauthenticated, e.Unavailable)
"""What a route that needs a key can answer: no or a bad key, and 503 (`StoreError` is an
`Unavailable`: tenant keys are looked up in the store; or the server drains)."""

ADMIN_KEY: tuple[ErrorClass, ...] = (*TENANT_KEY, e.Forbidden)
"""A route for the admin key also refuses a valid tenant key."""

_bearer = HTTPBearer(
    auto_error=False,  # documentation only: `infaas.api.auth` checks the key and words the 401
    scheme_name="bearer",
    description="`Authorization: Bearer <key>`: the admin key, or a tenant key (POST /v1/admin/tenants)",
)

KEY_REQUIRED: Sequence[DependsParam] = (Depends(_bearer),)
"""`dependencies=` for a route that needs a key: puts the bearer scheme in its documentation."""

_WHAT: dict[int, str] = {
    400: "Bad request: a malformed body or parameter, or inputs that do not fit",
    401: "No key, or an unknown or revoked one",
    403: "The key is valid but lacks the role this needs",
    404: "Not found",
    409: "Conflict: the name is taken by something different",
    413: "Body over the limit (INFAAS_MAX_REQUEST_MB; uploads: INFAAS_MAX_UPLOAD_MB)",
    422: "Understood but cannot be done",
    429: "Busy: no variant meeting the targets can answer within the deadline given its queue; retry",
    503: "Unavailable for now: the store or a worker failed, or the server drains; retry later",
    504: "The deadline (receipt + latency_ms) passed before the request ran; not charged",
}

_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "the scheme to authenticate with: Bearer",
            "required": True,
            "schema": {"type": "string"},
        }
    },
    503: {
        "Retry-After": {
            "description": "seconds after which a retry may succeed",
            "required": True,
            "schema": {"type": "integer", "minimum": 0},
        }
    },
}
_HEADERS[429] = _HEADERS[503]


def _codes(cls: ErrorClass, status: int) -> list[str]:
    """`cls`'s code and those of its subclasses that answer with the same status (a subclass with
    another status, such as `PayloadTooLarge` under `InvalidInput`, is listed on its own)."""
    codes = [cls.code]
    for sub in cls.__subclasses__():
        if _status(sub) == status:
            codes += [c for c in _codes(sub, status) if c not in codes]
    return codes


def _status(cls: ErrorClass) -> int:
    return status_for(cls(""))


def error_responses(*raised: ErrorClass) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for a route that can raise the errors in `raised`: one per status,
    with `ErrorBody`, the error codes it carries, and its headers (401: WWW-Authenticate,
    503: Retry-After)."""
    codes: dict[int, list[str]] = {}
    for cls in raised:
        status = _status(cls)
        listed = codes.setdefault(status, [])
        listed += [c for c in _codes(cls, status) if c not in listed]
    responses: dict[int | str, dict[str, Any]] = {}
    for status in sorted(codes):
        entry: dict[str, Any] = {
            "model": ErrorBody,
            "description": f"{_WHAT.get(status, 'Error')} ({', '.join(codes[status])})",
        }
        if status in _HEADERS:
            entry["headers"] = _HEADERS[status]
        responses[status] = entry
    return responses


def text_response(media_type: str, description: str) -> dict[int | str, dict[str, Any]]:
    """A 200 that is text, not JSON. For a route whose `response_class` is the bare `Response`:
    FastAPI documents every `model` response under the route's media type, which would put
    `ErrorBody` under text/plain; without one it falls back to JSON."""
    return {200: {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}}


QUERY_ROUTE: dict[str, Any] = {
    "dependencies": KEY_REQUIRED,
    "responses": error_responses(
        e.InvalidInput,
        e.PayloadTooLarge,
        e.TaskNotFound,
        e.ArchitectureNotFound,
        e.VariantNotFound,
        e.NoFeasibleVariant,
        e.Overloaded,
        e.DeadlineExceeded,
        *TENANT_KEY,
    ),
}
"""The documentation arguments of ``POST /v1/query``'s decorator (`infaas.api.routes.query`)."""

_INSTALLED = "_infaas_openapi"
_FASTAPI_422 = {"$ref": "#/components/schemas/HTTPValidationError"}


def _without_fastapi_422(document: dict[str, Any]) -> dict[str, Any]:
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            schema = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema")
            if schema == _FASTAPI_422:
                del responses["422"]
    if _FASTAPI_422["$ref"] not in json.dumps(document.get("paths", {})):
        schemas = document.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
    return document


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` leave out the 422 `HTTPValidationError` that FastAPI adds to every route
    with parameters: this service answers a failed validation with 400 and `ErrorBody`
    (`infaas.api.errors`), which each route documents. Idempotent."""
    if getattr(app.openapi, _INSTALLED, False):
        return
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        return _without_fastapi_422(build())

    setattr(openapi, _INSTALLED, True)
    app.openapi = openapi  # type: ignore[method-assign]
