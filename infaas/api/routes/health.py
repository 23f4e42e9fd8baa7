"""Liveness and readiness: no key needed."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from infaas.api.schemas import Readiness

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        200: {"model": Readiness, "description": "Every check holds"},
        503: {"model": Readiness, "description": "Not ready: a check failed, with why"},
    },
)
async def readyz(request: Request) -> JSONResponse:
    """Ready when every check holds: the store answers, the workers' Ray is up, warm-up is done,
    and the server is not draining. A failing check reports why instead of `true`."""
    checks: dict[str, Any] = {}
    for name, check in getattr(request.app.state, "readiness_checks", {}).items():
        try:
            # Off the event loop: the store check is I/O, and a store that hangs must not stall
            # the queries being answered meanwhile.
            result = await asyncio.to_thread(check)
            checks[name] = result if isinstance(result, str) else bool(result)
        except Exception as exc:  # a failing probe means "not ready", never a 500
            checks[name] = f"{type(exc).__name__}: {exc}"
    ready = all(v is True for v in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)
