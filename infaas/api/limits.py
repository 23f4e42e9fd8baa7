"""Body-size limits enforced before a route reads the body (declared length and streamed bytes)."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infaas.api.errors import status_for
from infaas.errors import PayloadTooLarge

__all__ = ["BodyLimit", "limited_receive", "too_large"]


_UPLOADS = frozenset({"/v1/models", "/v1/jobs"})


def too_large(scope: Scope, limit: int) -> PayloadTooLarge | None:
    """The 413 for a request whose declared length is over `limit` (None: under it, or unsaid)."""
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return PayloadTooLarge(f"body over the {limit} byte limit", limit_bytes=limit)
    return None


def limited_receive(receive: Receive, limit: int) -> Receive:
    """`receive` that raises `PayloadTooLarge` once more than `limit` body bytes have come."""
    seen = 0

    async def counting_receive() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise PayloadTooLarge(f"body over the {limit} byte limit", limit_bytes=limit)
        return message

    return counting_receive


class BodyLimit:
    """Pure ASGI middleware: uploads (a model, a job's rows) get one limit, everything else another."""

    def __init__(self, app: ASGIApp, max_request_bytes: int, max_upload_bytes: int) -> None:
        self.app = app
        self.max_request = max_request_bytes
        self.max_upload = max_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self.max_upload if scope["path"].rstrip("/") in _UPLOADS else self.max_request
        refused = too_large(scope, limit)
        if refused is not None:
            await self._reject(send, refused)
            return
        await self.app(scope, limited_receive(receive, limit), send)

    async def _reject(self, send: Send, exc: PayloadTooLarge) -> None:
        body = json.dumps(exc.to_body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status_for(exc),
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
