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
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from infaas.api.openapi import KEY_REQUIRED, TENANT_KEY, error_responses
from infaas.api.routes.protocol import Parsed, answer, read
from infaas.dataplane import Answer, ModelRef, dataplane_of
from infaas.errors import InvalidInput, NotFound
from infaas.policy.versions import version_states
from infaas.types import Task, VersionState

__all__ = ["router"]

router = APIRouter(tags=["tensorflow-serving"])

INPUT_NAME = "input"
OUTPUT_NAME = "probabilities"
Name = Annotated[str, PathParam(min_length=1, max_length=200)]
_READ = error_responses(InvalidInput, NotFound, *TENANT_KEY)
"""The status and metadata GETs are in infaas's OpenAPI document (they share paths with infaas's
own routes, whose other methods are documented there); the verbs (``:predict``) are not."""
_DTYPES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "int64": "DT_INT64", "int32": "DT_INT32"}


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


def _parse(verb: str, raw: bytes) -> tuple[Parsed, bool]:
    """The rows of a predict or classify body (TF Serving carries no targets), and whether the
    answer goes columnar."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the request is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput("the request must be a JSON object")
    signature = body.get("signature_name", "serving_default")
    if signature not in ("serving_default", "", None):
        raise InvalidInput(f"unknown signature {signature!r}; the model has 'serving_default'")
    rows, columnar = _instances(body) if verb == "predict" else (_examples(body), False)
    return Parsed(rows), columnar


def _render(verb: str, result: Answer, columnar: bool) -> Response:
    probs = result.outputs.tolist()
    if verb == "classify":
        reply: dict[str, Any] = {"results": [[[str(c), p] for c, p in enumerate(row)] for row in probs]}
    else:
        reply = {"outputs": probs} if columnar else {"predictions": probs}
    return Response(json.dumps(reply, separators=(",", ":")), media_type="application/json")


async def _run(request: Request, name: str, ref: str | None, verb: str) -> Response:
    """A ``:predict`` or ``:classify`` of `name` at `ref` (a version number or a label)."""

    def known_verb() -> None:
        if verb not in ("predict", "classify"):
            raise NotFound(f"unknown method :{verb}; infaas serves :predict and :classify", method=verb)

    return await answer(
        request,
        name,
        ref,
        lambda _, raw: _parse(verb, raw),
        lambda result, columnar: _render(verb, result, columnar),
        check=known_verb,
    )


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
    return await _run(request, parsed[0], None, parsed[1])


@router.post("/v1/models/{name}/versions/{target}", include_in_schema=False)
async def call_version(name: Name, target: Name, request: Request) -> Response:
    parsed = _verb(target)
    if parsed is None:
        return _no_post(target)
    return await _run(request, name, parsed[0], parsed[1])


@router.post("/v1/models/{name}/labels/{target}", include_in_schema=False)
async def call_label(name: Name, target: Name, request: Request) -> Response:
    parsed = _verb(target)
    if parsed is None:
        return _no_post(target)
    return await _run(request, name, parsed[0], parsed[1])


# ---- status and metadata ----------------------------------------------------------------------
_TF_STATE = {
    "loading": "LOADING",
    "ready": "AVAILABLE",
    "serving": "AVAILABLE",
    "retired": "AVAILABLE",
    "failed": "END",
}


def _status(request: Request, ref: ModelRef, one: bool) -> Response:
    if ref.version is None:  # a task: one pseudo-version, always serving
        states: dict[int, VersionState] = {1: "serving"}
        errors: dict[int, str] = {}
    else:
        snap = dataplane_of(request.app.state).router.snapshot
        labels = snap.labels[ref.version.line]
        states = version_states(
            labels, [ref.version.version] if one else snap.versions_of(labels.architecture)
        )
        errors = labels.errors
    return JSONResponse(
        {
            "model_version_status": [
                {
                    "version": str(v),
                    "state": _TF_STATE[state],
                    "status": {
                        "error_code": "UNKNOWN" if state == "failed" else "OK",
                        "error_message": errors.get(v, "") if state == "failed" else "",
                    },
                }
                for v, state in sorted(states.items(), reverse=True)
            ]
        }
    )


# `{architecture}`, not `{name}`: the same paths as infaas's own DELETEs, so one entry in the
# OpenAPI document lists every method a path takes. (It may name a task too.)
@router.get("/v1/models/{architecture}", dependencies=KEY_REQUIRED, responses=_READ)
async def model_status(architecture: Name, request: Request) -> Response:
    """TensorFlow Serving's `model_version_status` of an architecture's versions (or a task's)."""
    return await read(request, architecture, None, lambda ref: _status(request, ref, one=False))


@router.get("/v1/models/{architecture}/versions/{version}", dependencies=KEY_REQUIRED, responses=_READ)
async def version_status(architecture: Name, version: Name, request: Request) -> Response:
    """TensorFlow Serving's `model_version_status` of one version."""
    return await read(request, architecture, version, lambda ref: _status(request, ref, one=True))


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


def _metadata(name: str, ref: ModelRef) -> Response:
    version = ref.version.version if ref.version is not None else 1
    return JSONResponse(
        {
            "model_spec": {"name": name, "signature_name": "", "version": str(version)},
            "metadata": {"signature_def": {"signature_def": {"serving_default": _signature(ref.task)}}},
        }
    )


@router.get("/v1/models/{architecture}/metadata", dependencies=KEY_REQUIRED, responses=_READ)
async def model_metadata(architecture: Name, request: Request) -> Response:
    """TensorFlow Serving's metadata: the `serving_default` signature."""
    return await read(request, architecture, None, lambda ref: _metadata(architecture, ref))


@router.get(
    "/v1/models/{architecture}/versions/{version}/metadata", dependencies=KEY_REQUIRED, responses=_READ
)
async def version_metadata(architecture: Name, version: Name, request: Request) -> Response:
    """TensorFlow Serving's metadata of one version."""
    return await read(request, architecture, version, lambda ref: _metadata(architecture, ref))
