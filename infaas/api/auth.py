"""Bearer-key authentication: the admin key, and tenant keys resolved through the store (hashed)."""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from infaas.errors import Forbidden, Unauthenticated
from infaas.settings import Settings
from infaas.store import MetadataStore
from infaas.types import Role

__all__ = ["AdminPrincipal", "Principal", "TenantPrincipal", "ensure_admin_key", "new_api_key"]


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role


def new_api_key() -> str:
    return secrets.token_urlsafe(32)


def ensure_admin_key(settings: Settings) -> str:
    """The admin key: from settings, else read from data_dir, else generated there (mode 0600)."""
    if settings.admin_key:
        return settings.admin_key
    path = settings.admin_key_path
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = new_api_key()
    # O_EXCL: two processes starting at once cannot both write different keys.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
    return token.strip()


def authenticate(request: Request) -> Principal:
    """Any valid key: the admin's or an active tenant's."""
    token = _bearer(request)
    admin_key: str = request.app.state.admin_key
    if hmac.compare_digest(token.encode(), admin_key.encode()):
        return Principal(name="admin", role="admin")
    store: MetadataStore = request.app.state.store
    tenant = store.tenant_for_key(token)
    if tenant is None:
        raise Unauthenticated("unknown or revoked API key")
    return Principal(name=tenant.name, role=tenant.role)


def require_admin(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if principal.role != "admin":
        raise Forbidden("this route needs the admin key", role=principal.role)
    return principal


TenantPrincipal = Annotated[Principal, Depends(authenticate)]
AdminPrincipal = Annotated[Principal, Depends(require_admin)]
