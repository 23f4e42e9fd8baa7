"""`/dashboard`: the admin page, served from files in the package (no CDN, no build step).

The page itself carries no data and needs no key: it asks for the admin key, keeps it in the tab's
session storage and calls the admin JSON routes with it as a bearer token. The content security
policy allows only this origin, so the page cannot load or send anything elsewhere.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from infaas.api.openapi import SERVING, error_responses, text_response

__all__ = ["router"]

router = APIRouter(tags=["dashboard"])

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


@router.get(
    "/dashboard",
    response_class=Response,
    responses={**text_response("text/html", "The admin page"), **error_responses(*SERVING)},
)
async def dashboard_page() -> Response:
    return _static("dashboard.html")


# The page's script and style belong to the page, not to the API: left out of the document.
@router.get("/dashboard/dashboard.js", include_in_schema=False)
async def dashboard_script() -> Response:
    return _static("dashboard.js")


@router.get("/dashboard/dashboard.css", include_in_schema=False)
async def dashboard_style() -> Response:
    return _static("dashboard.css")
