"""`/dashboard`: the admin page, served from files in the package (no CDN, no build step).

The page itself carries no data and needs no key: it asks for the admin key, keeps it in the tab's
session storage and calls the admin JSON routes with it as a bearer token. The content security
policy allows only this origin, so the page cannot load or send anything elsewhere.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

__all__ = ["router"]

router = APIRouter(tags=["dashboard"], include_in_schema=False)

_FILES = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _static(name: str) -> Response:
    body = resources.files("infaas.api").joinpath("static", name).read_bytes()
    return Response(body, media_type=_FILES[name], headers=_HEADERS)


@router.get("/dashboard")
async def dashboard_page() -> Response:
    return _static("dashboard.html")


@router.get("/dashboard/dashboard.js")
async def dashboard_script() -> Response:
    return _static("dashboard.js")


@router.get("/dashboard/dashboard.css")
async def dashboard_style() -> Response:
    return _static("dashboard.css")
