"""HTTP API: app factory, routes, wire schemas, the error table."""

from infaas.api.app import create_app

__all__ = ["create_app"]
