"""KServe V2 (the Open Inference Protocol) over REST, as an adapter on the data plane.

`{name}` is a task (model-less: the variant is picked per query for the targets in the request's
`parameters` — `latency_ms`, `min_accuracy`, `max_cost_usd_per_1k` — else the tenant's default
targets for the task) or an architecture (``/versions/{v}`` pins one of its versions);
``parameters.variant`` pins a variant. Tensors travel as JSON or with the binary tensor data
extension (``Inference-Header-Content-Length``), in both directions, per input and per requested
output. The answer's ``parameters`` carry infaas's decision. Errors are the protocol's
``{"error": "<message>"}`` (with infaas's ``detail`` beside it) and the status of infaas's error
table. Health routes need no key (probes); the model routes need one, as every route does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from infaas.api.routes.protocol import Parsed, answer, read
from infaas.dataplane import Answer, ModelRef, dataplane_of
from infaas.errors import InvalidInput
from infaas.snapshot import Snapshot
from infaas.types import SLO, Task

__all__ = ["DATATYPES", "router"]

router = APIRouter(tags=["kserve-v2"], include_in_schema=False)

HEADER_LENGTH = "inference-header-content-length"
INPUT_NAME = "input"
OUTPUT_NAME = "probabilities"

DATATYPES: dict[str, np.dtype[Any]] = {
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "FP16": np.dtype("<f2"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
}
_NUMPY_TO_V2 = {"float32": "FP32", "float64": "FP64", "int64": "INT64", "int32": "INT32"}

Name = Annotated[str, PathParam(min_length=1, max_length=200)]


def _tensor(name: str, task: Task, rows: int | None, *, output: bool) -> dict[str, Any]:
    shape = [task.num_classes] if output else list(task.input_spec.shape)
    dtype = "FP32" if output else _NUMPY_TO_V2.get(task.input_spec.dtype, "FP32")
    return {"name": name, "datatype": dtype, "shape": [-1 if rows is None else rows, *shape]}


# ---- server -----------------------------------------------------------------------------------
@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return {"name": "infaas", "version": "0.1.0", "extensions": ["binary_tensor_data", "parameters"]}


@router.get("/v2/health/live")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    checks = getattr(request.app.state, "readiness_checks", {})
    ok = all(check() is True for check in checks.values()) and hasattr(request.app.state, "dataplane")
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


# ---- models -----------------------------------------------------------------------------------
def _metadata(request: Request, name: str, ref: ModelRef) -> Response:
    if ref.version is None:  # a task: one pseudo-version
        versions = ["1"]
    elif "@" in (ref.architecture or ""):  # one version, named
        versions = [str(ref.version.version)]
    else:
        versions = [str(v) for v in sorted(_snapshot(request).versions_of(ref.version.line))]
    return JSONResponse(
        {
            "name": name,
            "versions": versions,
            "platform": "infaas",
            "inputs": [_tensor(INPUT_NAME, ref.task, None, output=False)],
            "outputs": [_tensor(OUTPUT_NAME, ref.task, None, output=True)],
            "parameters": {"task": ref.task.name, "architecture": ref.architecture},
        }
    )


def _ready(request: Request, name: str, ref: ModelRef) -> Response:
    table = _snapshot(request).table(ref.task.name, ref.architecture)
    ok = table is not None and len(table.variants) > 0
    return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 400)


def _snapshot(request: Request) -> Snapshot:
    return dataplane_of(request.app.state).router.snapshot


@router.get("/v2/models/{name}")
async def model_metadata(name: Name, request: Request) -> Response:
    return await read(request, name, None, lambda ref: _metadata(request, name, ref))


@router.get("/v2/models/{name}/versions/{version}")
async def version_metadata(name: Name, version: Name, request: Request) -> Response:
    return await read(request, name, version, lambda ref: _metadata(request, name, ref))


@router.get("/v2/models/{name}/ready")
async def model_ready(name: Name, request: Request) -> Response:
    return await read(request, name, None, lambda ref: _ready(request, name, ref))


@router.get("/v2/models/{name}/versions/{version}/ready")
async def version_ready(name: Name, version: Name, request: Request) -> Response:
    return await read(request, name, version, lambda ref: _ready(request, name, ref))


# ---- inference --------------------------------------------------------------------------------
def _split_body(raw: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    """The JSON header and the binary tail of a request (the tail is empty without the extension)."""
    if header_length is None:
        head, tail = raw, b""
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise InvalidInput(f"{HEADER_LENGTH} is not an integer: {header_length!r}") from None
        if not 0 <= length <= len(raw):
            raise InvalidInput(f"{HEADER_LENGTH} {length} is outside the body's {len(raw)} bytes")
        head, tail = raw[:length], raw[length:]
    try:
        body = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the inference request is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput("the inference request must be a JSON object")
    return body, tail


def _input_array(body: dict[str, Any], tail: bytes, task: Task) -> np.ndarray:
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidInput(
            f"send exactly one input tensor ({INPUT_NAME!r}, shape [rows, {task.input_spec.row_size}])"
        )
    tensor = inputs[0]
    datatype = tensor.get("datatype")
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise InvalidInput(
            f"datatype {datatype!r} is not supported here: send one of {sorted(DATATYPES)}",
            datatype=str(datatype),
        )
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidInput(f"shape must be a list of non-negative integers; got {shape!r}")
    count = math.prod(shape)
    params = tensor.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput("an input's parameters must be an object")
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size != len(tail) or size != count * dtype.itemsize:
            raise InvalidInput(
                f"binary_data_size {size!r} does not match the binary data ({len(tail)} bytes) or "
                f"shape {shape} × {datatype} ({count * dtype.itemsize} bytes)"
            )
        flat = np.frombuffer(tail, dtype=dtype)
    else:
        data = tensor.get("data")
        if not isinstance(data, list):
            raise InvalidInput("an input needs 'data' (or binary data with parameters.binary_data_size)")
        try:
            flat = np.asarray(data, dtype=dtype).reshape(-1)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"the input's data is not {datatype} numbers: {exc}") from None
    if flat.size != count:
        raise InvalidInput(f"the input holds {flat.size} values, shape {shape} needs {count}")
    if len(shape) < 2:
        raise InvalidInput(f"shape {shape} has no batch dimension: send [rows, ...]")
    rows = np.asarray(flat, dtype=np.float64 if dtype.kind != "f" else dtype).reshape(shape)
    return rows.reshape(shape[0], -1) if rows.shape[1:] != task.input_spec.shape else rows


def _targets(params: dict[str, Any]) -> SLO | None:
    if "latency_ms" not in params:
        if "min_accuracy" in params or "max_cost_usd_per_1k" in params:
            raise InvalidInput("parameters.latency_ms is needed with min_accuracy / max_cost_usd_per_1k")
        return None
    try:
        return SLO(
            latency_ms=params["latency_ms"],
            min_accuracy=params.get("min_accuracy", 0.0),
            max_cost_usd_per_1k=params.get("max_cost_usd_per_1k"),
        )
    except ValueError as exc:
        raise InvalidInput(f"invalid targets in parameters: {exc}") from None


def _wants_binary(body: dict[str, Any]) -> tuple[bool, str]:
    """Whether the output goes as binary data, and its name (the request may name only ours)."""
    params = body.get("parameters") or {}
    binary = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    outputs = body.get("outputs")
    if outputs is None:
        return binary, OUTPUT_NAME
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise InvalidInput("outputs must be a list of objects")
    for out in outputs:
        if out.get("name") != OUTPUT_NAME:
            raise InvalidInput(f"unknown output {out.get('name')!r}: the output is {OUTPUT_NAME!r}")
        out_params = out.get("parameters") or {}
        if isinstance(out_params, dict) and "binary_data" in out_params:
            binary = bool(out_params["binary_data"])
    return binary, OUTPUT_NAME


def _parse(ref: ModelRef, raw: bytes, header_length: str | None) -> tuple[Parsed, _Reply]:
    body, tail = _split_body(raw, header_length)
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput("parameters must be an object")
    rows = _input_array(body, tail, ref.task)
    binary, output_name = _wants_binary(body)
    pinned = params.get("variant")
    if pinned is not None and not isinstance(pinned, str):
        raise InvalidInput("parameters.variant must be a variant name")
    return Parsed(rows, _targets(params), pinned), _Reply(binary, output_name, body.get("id"))


@dataclass(frozen=True)
class _Reply:
    """What the answer's rendering needs from the request."""

    binary: bool
    output: str
    id: Any


def _render(name: str, snap: Snapshot, answer: Answer, reply: _Reply) -> Response:
    outputs = answer.outputs.astype(np.float32, copy=False)
    out: dict[str, Any] = {"name": reply.output, "datatype": "FP32", "shape": list(outputs.shape)}
    payload = b""
    if reply.binary:
        payload = outputs.tobytes()
        out["parameters"] = {"binary_data_size": len(payload)}
    else:
        out["data"] = outputs.reshape(-1).tolist()
    arch = snap.architectures.get(answer.architecture)
    body: dict[str, Any] = {
        "model_name": name,
        "model_version": str(arch.version if arch is not None else 1),
        "outputs": [out],
        "parameters": answer.decision(),
    }
    if reply.id is not None:
        body["id"] = reply.id
    head = json.dumps(body, separators=(",", ":")).encode()
    if not reply.binary:
        return Response(head, media_type="application/json")
    return Response(
        head + payload,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(head))},
    )


async def _infer(request: Request, name: str, version: str | None) -> Response:
    header_length = request.headers.get(HEADER_LENGTH)
    return await answer(
        request,
        name,
        version,
        lambda ref, raw: _parse(ref, raw, header_length),
        lambda result, reply: _render(name, _snapshot(request), result, reply),
    )


@router.post("/v2/models/{name}/infer")
async def infer(name: Name, request: Request) -> Response:
    return await _infer(request, name, None)


@router.post("/v2/models/{name}/versions/{version}/infer")
async def infer_version(name: Name, version: Name, request: Request) -> Response:
    return await _infer(request, name, version)
