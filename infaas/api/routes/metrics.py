"""`GET /metrics`: Prometheus text format from the app's own registry (admin key).

Tenant names and spend are business data, so the scrape needs the admin key like the other admin
views; Prometheus sends it with `authorization: {credentials: <admin key>}` in the scrape config.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from infaas.api.auth import AdminPrincipal
from infaas.api.openapi import ADMIN_KEY, KEY_REQUIRED, error_responses, text_response
from infaas.metrics import CONTENT_TYPE_LATEST, Metrics

__all__ = ["router"]

router = APIRouter(tags=["admin"])


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=KEY_REQUIRED,
    responses={
        **text_response("text/plain", "Prometheus text exposition format"),
        **error_responses(*ADMIN_KEY),
    },
)
def metrics(request: Request, _: AdminPrincipal) -> Response:
    """Request count, latency, cost, batch size, queue depth and worker gauges."""
    registry: Metrics = request.app.state.metrics
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)
