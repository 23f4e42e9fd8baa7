"""Wire schemas: what crosses HTTP. Separate from the domain types in `infaas.types`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TenantCreate", "TenantCreated", "TenantOut"]

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantCreate(_Wire):
    name: str = Field(pattern=NAME_PATTERN, description="lowercase letters, digits, '.', '_', '-'")


class TenantCreated(_Wire):
    name: str
    api_key: str = Field(description="shown once; only its hash is stored")


class TenantOut(_Wire):
    name: str
    role: str
    created_at_s: float
    revoked: bool
