"""One error tree for the whole service.

Every error carries a human message and structured fields (``err.fields``) that the API returns
as ``{"error": <code>, "detail": <message>, ...fields}``. The HTTP status of each class lives in
one table, `infaas.api.errors.HTTP_STATUS`, not here: domain code does not know about HTTP.

    InfaasError
    ├── InvalidInput              bad query inputs, bad parameters, malformed request
    │   └── PayloadTooLarge       body or upload over the configured limit
    ├── AuthError
    │   ├── Unauthenticated       no key, or an unknown / revoked key
    │   └── Forbidden             a valid key without the role for this action
    ├── NotFound
    │   ├── TaskNotFound
    │   ├── ArchitectureNotFound
    │   ├── VariantNotFound
    │   └── TenantNotFound
    ├── Conflict                  a name already taken by something different
    ├── RegistrationError         an upload that cannot become an architecture
    │   ├── UnsupportedFormat
    │   ├── UnsafeArchive         '..', absolute paths or links inside an archive
    │   └── SpecMismatch          input spec differs from the task's / output not probabilities
    ├── NoFeasibleVariant         nothing meets the SLO even on an idle fleet; carries the
    │                             nearest alternatives
    ├── Overloaded                a variant meets the targets, but not within the deadline given
    │                             the queues now; retry after `retry_after_s`
    ├── DeadlineExceeded          the deadline passed while the request waited; it never ran
    └── Unavailable               a worker was lost, the server drains, or capacity is
        │                         exhausted; retry later
        └── StoreError            the metadata store failed or timed out (an outage: retry later)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArchitectureNotFound",
    "AuthError",
    "Conflict",
    "DeadlineExceeded",
    "Forbidden",
    "InfaasError",
    "InvalidInput",
    "NoFeasibleVariant",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RegistrationError",
    "SpecMismatch",
    "StoreError",
    "TaskNotFound",
    "TenantNotFound",
    "Unauthenticated",
    "Unavailable",
    "UnsafeArchive",
    "UnsupportedFormat",
    "VariantNotFound",
]


class InfaasError(Exception):
    """Base of every error infaas raises on purpose."""

    code = "internal_error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields

    def __reduce__(self) -> tuple[Any, ...]:
        # The fields are keyword arguments, which Exception's own pickling drops: an error raised
        # in a worker crosses to the front end pickled and must arrive whole.
        return (_rebuild, (type(self), self.message, self.fields))

    def to_body(self) -> dict[str, Any]:
        """The JSON error body: ``error`` (stable code), ``detail`` (message) and the fields."""
        return {"error": self.code, "detail": self.message, **self.fields}


def _rebuild(cls: type[InfaasError], message: str, fields: dict[str, Any]) -> InfaasError:
    return cls(message, **fields)


class InvalidInput(InfaasError):
    code = "invalid_input"


class PayloadTooLarge(InvalidInput):
    code = "payload_too_large"


class AuthError(InfaasError):
    code = "auth_error"


class Unauthenticated(AuthError):
    code = "unauthenticated"


class Forbidden(AuthError):
    code = "forbidden"


class NotFound(InfaasError):
    code = "not_found"


class TaskNotFound(NotFound):
    code = "task_not_found"


class ArchitectureNotFound(NotFound):
    code = "architecture_not_found"


class VariantNotFound(NotFound):
    code = "variant_not_found"


class TenantNotFound(NotFound):
    code = "tenant_not_found"


class Conflict(InfaasError):
    code = "conflict"


class RegistrationError(InfaasError):
    code = "registration_error"


class UnsupportedFormat(RegistrationError):
    code = "unsupported_format"


class UnsafeArchive(RegistrationError):
    code = "unsafe_archive"


class SpecMismatch(RegistrationError):
    code = "spec_mismatch"


class NoFeasibleVariant(InfaasError):
    code = "no_feasible_variant"


class Overloaded(InfaasError):
    code = "overloaded"


class DeadlineExceeded(InfaasError):
    code = "deadline_exceeded"


class Unavailable(InfaasError):
    code = "unavailable"


class StoreError(Unavailable):
    code = "store_error"
