"""The gate: a request that carries a body is authenticated from its headers before any byte of
the body is read.

FastAPI reads a route's body (a JSON document, or a multipart upload spooled to disk) before it
runs the route's dependencies, the key check among them: without the gate anyone who can reach the
port could make the server read and spool 2 × 200 MB per request. The gate runs the same
`authenticate` on the headers alone; a refusal (401, 403, 503) is answered at once and the body is
never read (uvicorn drops it as it arrives). What the headers alone decide is decided here: the
key, the admin routes' role, and that registering a model needs an owner or the admin key. What
needs the body (which task an owner may manage, a pickle only the admin may upload) stays with the
route, after the small `metadata` part and before the model is spooled.

`POST /v1/query` does not pass through it: that route authenticates before it reads the body
itself, and the hot path pays for no extra layer.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from infaas.api.auth import PRINCIPAL_STATE, authenticate
from infaas.api.errors import error_response
from infaas.errors import Forbidden, InfaasError
from infaas.types import Principal

__all__ = ["AuthGate"]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_UPLOADS = frozenset({"/v1/models"})


def required_role(method: str, path: str) -> str | None:
    """Which role a request needs beyond any valid key, as far as its method and path tell: "admin"
    for the admin routes, "owner" to register a model (None: any key, the route decides)."""
    if path.startswith("/v1/admin/"):
        return "admin"
    if method == "POST" and path.rstrip("/") in _UPLOADS:
        return "owner"
    return None


def allowed(principal: Principal, role: str | None) -> bool:
    if role is None or principal.role == "admin":
        return True
    return role == "owner" and principal.role == "owner"


class AuthGate:
    """Pure ASGI middleware; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS or scope["path"] == "/v1/query":
            await self.app(scope, receive, send)
            return
        request = Request(scope)  # no `receive`: nothing here can read the body
        try:
            principal = await authenticate(request)
            role = required_role(scope["method"], scope["path"])
            if not allowed(principal, role):
                what = "the admin key" if role == "admin" else "an owner key or the admin key"
                raise Forbidden(f"this route needs {what}", role=principal.role)
        except InfaasError as exc:
            await error_response(exc)(scope, receive, send)
            return
        scope.setdefault("state", {})[PRINCIPAL_STATE] = principal
        await self.app(scope, receive, send)
