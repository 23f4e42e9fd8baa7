"""What the KServe V2 and TensorFlow Serving adapters share: a model name resolved for a key, and
the query cycle — authenticate, resolve, parse the protocol's body, the data plane, render — with
every error in the protocols' shape (`protocol_error`). A request that fails before the data plane
is metered as a bad request (not charged); the data plane meters the rest."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import Request, Response

from infaas.api.auth import authenticate
from infaas.api.errors import protocol_error
from infaas.dataplane import Answer, InferenceRequest, ModelRef, dataplane_of
from infaas.errors import InfaasError
from infaas.types import SLO

__all__ = ["Parsed", "answer", "model_ref", "read"]

C = TypeVar("C")


@dataclass(frozen=True)
class Parsed:
    """What a protocol's body says, in the data plane's terms."""

    rows: list[Any] | np.ndarray
    slo: SLO | None = None  # None: the tenant's default targets
    variant: str | None = None


async def model_ref(request: Request, name: str, version: str | None = None) -> ModelRef:
    """Authenticate, then resolve `name` (and `version`, a number or a label)."""
    await authenticate(request)
    return await dataplane_of(request.app.state).model(name, time.monotonic(), version)


async def read(
    request: Request, name: str, version: str | None, render: Callable[[ModelRef], Response]
) -> Response:
    """A GET about a model: its rendering, or the error."""
    try:
        ref = await model_ref(request, name, version)
    except InfaasError as exc:
        return protocol_error(exc)
    return render(ref)


async def answer(
    request: Request,
    name: str,
    version: str | None,
    parse: Callable[[ModelRef, bytes], tuple[Parsed, C]],
    render: Callable[[Answer, C], Response],
    check: Callable[[], None] = lambda: None,
) -> Response:
    """One query over a protocol: `check` (the route itself) and `parse` raise what is wrong
    with the request; `render` gets the answer and what `parse` kept for it."""
    received_s: float = request.scope.get("state", {}).get("received_s") or time.monotonic()
    try:
        principal = await authenticate(request)
        dataplane = dataplane_of(request.app.state)
    except InfaasError as exc:
        return protocol_error(exc)
    try:
        check()
        ref = await dataplane.model(name, received_s, version)
        parsed, context = parse(ref, await request.body())
    except InfaasError as exc:
        dataplane.record_failure(principal, name, exc, received_s)  # a bad request: not charged
        return protocol_error(exc)
    query = InferenceRequest(
        task=ref.task.name,
        inputs=parsed.rows,
        received_s=received_s,
        slo=parsed.slo,
        architecture=ref.architecture,
        variant=parsed.variant,
    )
    try:
        result = await dataplane.infer(principal, query)
    except InfaasError as exc:  # metered by the data plane
        return protocol_error(exc)
    return render(result, context)
