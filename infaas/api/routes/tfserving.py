"""TensorFlow Serving's REST API, as an adapter on the data plane.

``POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict`` (row format ``instances`` →
``predictions``, columnar ``inputs`` → ``outputs``), ``:classify`` (``examples`` → ``results`` of
``[label, score]`` pairs), ``GET /v1/models/{name}[/versions/{v}]`` (``model_version_status``) and
``GET /v1/models/{name}[/versions/{v}]/metadata`` (a ``signature_def``). `{name}` is an
architecture (versions and the ``stable`` / ``canary`` labels apply) or a task (model-less); a
request carries no targets, so the tenant's default targets for the task apply.

They share the ``/v1/models`` prefix with infaas's own model routes; the two never collide: the
TF Serving verbs end in ``:predict`` / ``:classify``, TF Serving's status is a GET of
``/v1/models/{name}`` or ``/versions/{v}`` (infaas's own are ``/v1/models``, ``/{name}/variants``
and ``/{name}/versions``), and metadata ends in ``/metadata``.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from infaas.api.auth import authenticate
from infaas.api.errors import protocol_error
from infaas.api.openapi import KEY_REQUIRED, TENANT_KEY, error_responses
from infaas.dataplane import DataPlane, InferenceRequest, ModelRef, dataplane_of
from infaas.errors import InfaasError, InvalidInput, NotFound
from infaas.types import Task

__all__ = ["router"]

router = APIRouter(tags=["tensorflow-serving"])

INPUT_NAME = "input"
OUTPUT_NAME = "probabilities"
Name = Annotated[str, PathParam(min_length=1, max_length=200)]
_READ = error_responses(InvalidInput, NotFound, *TENANT_KEY)
"""The status and metadata GETs are in infaas's OpenAPI document (they share paths with infaas's
own routes, whose other methods are documented there); the verbs (``:predict``) are not."""
_DTYPES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "int64": "DT_INT64", "int32": "DT_INT32"}


def _dataplane(request: Request) -> DataPlane:
    return dataplane_of(request.app.state)


async def _resolve(request: Request, name: str, version: str | None, label: str | None) -> ModelRef:
    dataplane = _dataplane(request)
    if "@" in name:
        raise NotFound(f"no model {name!r}: name versions with /versions/{{v}} or /labels/{{l}}", model=name)
    ref = await dataplane.model(name, time.monotonic())
    if version is None and label is None:
        return ref
    if ref.architecture is None:
        raise NotFound(f"{name!r} is a task: it has no versions or labels", model=name)
    if version is not None and not version.isdigit():
        raise InvalidInput(f"version {version!r} is not a number", version=version)
    return await dataplane.model(f"{name}@{version if version is not None else label}", time.monotonic())


def _instances(body: dict[str, Any]) -> tuple[list[Any], bool]:
    """The rows of a predict or classify body, and whether it was columnar."""
    if "instances" in body and "inputs" in body:
        raise InvalidInput("send either 'instances' (row format) or 'inputs' (columnar), not both")
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list):
            raise InvalidInput("'instances' must be a list of rows")
        # Named row format: each instance an object with the one input.
        return [_named(r) if isinstance(r, dict) else r for r in rows], False
    if "inputs" in body:
        inputs = body["inputs"]
        if isinstance(inputs, dict):
            inputs = _named(inputs)
        if not isinstance(inputs, list):
            raise InvalidInput("'inputs' must be a list of rows or an object with the one input")
        return inputs, True
    raise InvalidInput("a predict request needs 'instances' (row format) or 'inputs' (columnar)")


def _named(obj: dict[str, Any]) -> Any:
    if len(obj) != 1:
        raise InvalidInput(f"the model has one input ({INPUT_NAME!r}); got {sorted(obj)}")
    return next(iter(obj.values()))


def _examples(body: dict[str, Any]) -> list[Any]:
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples:
        raise InvalidInput("a classify request needs 'examples': a non-empty list of feature objects")
    rows = []
    for ex in examples:
        if not isinstance(ex, dict) or len(ex) != 1:
            raise InvalidInput(f"each example must hold one feature (the input row); got {ex!r}"[:300])
        rows.append(next(iter(ex.values())))
    return rows


async def _run(request: Request, name: str, version: str | None, label: str | None, verb: str) -> Response:
    received_s: float = request.scope.get("state", {}).get("received_s") or time.monotonic()
    try:
        principal = await authenticate(request)
        dataplane = _dataplane(request)
    except InfaasError as exc:
        return protocol_error(exc)
    try:
        if verb not in ("predict", "classify"):
            raise NotFound(f"unknown method :{verb}; infaas serves :predict and :classify", method=verb)
        ref = await _resolve(request, name, version, label)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"the request is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidInput("the request must be a JSON object")
        signature = body.get("signature_name", "serving_default")
        if signature not in ("serving_default", "", None):
            raise InvalidInput(f"unknown signature {signature!r}; the model has 'serving_default'")
        rows, columnar = _instances(body) if verb == "predict" else (_examples(body), False)
    except InfaasError as exc:
        dataplane.record_failure(principal, name, exc, received_s)  # a bad request: not charged
        return protocol_error(exc)
    try:
        answer = await dataplane.infer(
            principal,
            InferenceRequest(
                task=ref.task.name, inputs=rows, received_s=received_s, architecture=ref.architecture
            ),
        )
    except InfaasError as exc:  # metered by the data plane
        return protocol_error(exc)
    probs = answer.outputs.tolist()
    if verb == "classify":
        reply: dict[str, Any] = {"results": [[[str(c), p] for c, p in enumerate(row)] for row in probs]}
    else:
        reply = {"outputs": probs} if columnar else {"predictions": probs}
    return Response(json.dumps(reply, separators=(",", ":")), media_type="application/json")


def _verb(tail: str) -> tuple[str, str] | None:
    """(name, verb) of ``name:verb``; None without a verb (the path itself takes no POST)."""
    name, sep, verb = tail.rpartition(":")
    return (name, verb) if sep else None


def _no_post(tail: str) -> JSONResponse:
    return JSONResponse(
        {
            "error": "method_not_allowed",
            "detail": f"POST needs a method: …/{tail}:predict or …/{tail}:classify",
        },
        status_code=405,
        headers={"Allow": "GET, DELETE"},
    )


@router.post("/v1/models/{target}", include_in_schema=False)
async def call(target: Name, request: Request) -> Response:
    parsed = _verb(target)
    if parsed is None:
        return _no_post(target)
    return await _run(request, parsed[0], None, None, parsed[1])


@router.post("/v1/models/{name}/versions/{target}", include_in_schema=False)
async def call_version(name: Name, target: Name, request: Request) -> Response:
    parsed = _verb(target)
    if parsed is None:
        return _no_post(target)
    return await _run(request, name, parsed[0], None, parsed[1])


@router.post("/v1/models/{name}/labels/{target}", include_in_schema=False)
async def call_label(name: Name, target: Name, request: Request) -> Response:
    parsed = _verb(target)
    if parsed is None:
        return _no_post(target)
    return await _run(request, name, None, parsed[0], parsed[1])


# ---- status and metadata ----------------------------------------------------------------------
_TF_STATE = {
    "loading": "LOADING",
    "ready": "AVAILABLE",
    "serving": "AVAILABLE",
    "retired": "AVAILABLE",
    "failed": "END",
}


async def _status(request: Request, name: str, version: str | None) -> Response:
    try:
        await authenticate(request)
        ref = await _resolve(request, name, version, None)
    except InfaasError as exc:
        return protocol_error(exc)
    snap = _dataplane(request).router.snapshot
    if ref.architecture is None:
        states = {1: "serving"}
    else:
        arch = snap.resolve(ref.architecture)
        assert arch is not None  # resolved just now
        labels = snap.labels[arch.line]
        if version is not None:
            states = {arch.version: labels.state(arch.version)}
        else:
            stored = {a.version for a in snap.architectures.values() if a.line == arch.line}
            states = {v: labels.state(v) for v in sorted(stored)}
            states |= {
                v: s for v, s in labels.states.items() if s in ("loading", "failed") and v not in stored
            }
    doc = {
        "model_version_status": [
            {
                "version": str(v),
                "state": _TF_STATE[state],
                "status": {"error_code": "UNKNOWN" if state == "failed" else "OK", "error_message": ""},
            }
            for v, state in sorted(states.items(), reverse=True)
        ]
    }
    return JSONResponse(doc)


# `{architecture}`, not `{name}`: the same paths as infaas's own DELETEs, so one entry in the
# OpenAPI document lists every method a path takes. (It may name a task too.)
@router.get("/v1/models/{architecture}", dependencies=KEY_REQUIRED, responses=_READ)
async def model_status(architecture: Name, request: Request) -> Response:
    """TensorFlow Serving's `model_version_status` of an architecture's versions (or a task's)."""
    return await _status(request, architecture, None)


@router.get("/v1/models/{architecture}/versions/{version}", dependencies=KEY_REQUIRED, responses=_READ)
async def version_status(architecture: Name, version: Name, request: Request) -> Response:
    """TensorFlow Serving's `model_version_status` of one version."""
    return await _status(request, architecture, version)


def _tensor_info(name: str, dtype: str, dims: list[int]) -> dict[str, Any]:
    return {
        "dtype": dtype,
        "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in dims], "unknown_rank": False},
        "name": f"{name}:0",
    }


def _signature(task: Task) -> dict[str, Any]:
    return {
        "inputs": {
            INPUT_NAME: _tensor_info(
                INPUT_NAME, _DTYPES.get(task.input_spec.dtype, "DT_FLOAT"), [-1, *task.input_spec.shape]
            )
        },
        "outputs": {OUTPUT_NAME: _tensor_info(OUTPUT_NAME, "DT_FLOAT", [-1, task.num_classes])},
        "method_name": "tensorflow/serving/predict",
    }


async def _metadata(request: Request, name: str, version: str | None) -> Response:
    try:
        await authenticate(request)
        ref = await _resolve(request, name, version, None)
    except InfaasError as exc:
        return protocol_error(exc)
    arch = _dataplane(request).router.snapshot.resolve(ref.architecture) if ref.architecture else None
    return JSONResponse(
        {
            "model_spec": {"name": name, "signature_name": "", "version": str(arch.version if arch else 1)},
            "metadata": {"signature_def": {"signature_def": {"serving_default": _signature(ref.task)}}},
        }
    )


@router.get("/v1/models/{architecture}/metadata", dependencies=KEY_REQUIRED, responses=_READ)
async def model_metadata(architecture: Name, request: Request) -> Response:
    """TensorFlow Serving's metadata: the `serving_default` signature."""
    return await _metadata(request, architecture, None)


@router.get(
    "/v1/models/{architecture}/versions/{version}/metadata", dependencies=KEY_REQUIRED, responses=_READ
)
async def version_metadata(architecture: Name, version: Name, request: Request) -> Response:
    """TensorFlow Serving's metadata of one version."""
    return await _metadata(request, architecture, version)
