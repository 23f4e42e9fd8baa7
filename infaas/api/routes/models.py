"""Model registration and listing: `POST /v1/models`, `GET /v1/models`,
`GET /v1/models/{arch}/variants`, `GET /v1/tasks`.

The route only parses the multipart body, spools the parts to a private directory and calls the
registration use case (`infaas.registry.Registry`) in a worker thread, so the event loop keeps
serving queries while a model converts. The listings are plain `def` routes for the same reason:
FastAPI runs them in its thread pool, and a slow or unreachable store then never stalls queries.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path, PurePath
from typing import Annotated

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from infaas.api.auth import TenantPrincipal
from infaas.api.model_schemas import (
    ArchitectureOut,
    ModelMetadata,
    ModelRegistered,
    TaskOut,
    VariantsOut,
    architecture_out,
    skipped_out,
    task_out,
    variant_out,
)
from infaas.api.openapi import KEY_REQUIRED, TENANT_KEY, error_responses
from infaas.errors import (
    ArchitectureNotFound,
    Conflict,
    Forbidden,
    InvalidInput,
    PayloadTooLarge,
    RegistrationError,
)
from infaas.registry import RegistrationResult, Registry
from infaas.router import Router
from infaas.settings import Settings
from infaas.store import MetadataStore
from profiler.machine import local_machine

router = APIRouter(tags=["models"])

_MB = 1024 * 1024
_CHUNK = 1 << 20
_METADATA_MAX_BYTES = 64 * 1024  # a few short fields; anything longer is not metadata


def _store(request: Request) -> MetadataStore:
    store: MetadataStore = request.app.state.store
    return store


async def _metadata_text(part: str | UploadFile) -> str:
    """The `metadata` part's text, whether sent as a form field (``-F metadata='{...}'``) or as a
    file (``-F metadata=@meta.json``)."""
    if isinstance(part, str):
        return part
    raw = await part.read(_METADATA_MAX_BYTES + 1)
    if len(raw) > _METADATA_MAX_BYTES:
        raise InvalidInput(
            f"the 'metadata' part is over {_METADATA_MAX_BYTES} bytes: send the JSON object only"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the 'metadata' part is not UTF-8 text: {exc}") from None


def _parse_metadata(raw: str) -> ModelMetadata:
    try:
        return ModelMetadata.model_validate(json.loads(raw))
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the 'metadata' part is not JSON: {exc}") from exc
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise InvalidInput(f"the 'metadata' part is invalid: {detail}") from exc


async def _spool(part: UploadFile, folder: Path, limit_bytes: int, fallback: str) -> tuple[Path, str]:
    """Write an uploaded part to `folder` under its base name only (never a client-chosen path)."""
    name = PurePath((part.filename or "").replace("\\", "/")).name or fallback
    if name in (".", ".."):
        name = fallback
    path = folder / name
    written = 0
    with path.open("wb") as fh:
        while chunk := await part.read(_CHUNK):
            written += len(chunk)
            if written > limit_bytes:
                raise PayloadTooLarge(f"upload over the {limit_bytes} byte limit", limit_bytes=limit_bytes)
            fh.write(chunk)
    return path, name


def _registered(result: RegistrationResult, store: MetadataStore) -> ModelRegistered:
    archs = [a.name for a in store.list_architectures(result.task.name)]
    return ModelRegistered(
        created=result.created,
        task_created=result.task_created,
        architecture=architecture_out(result.architecture, len(result.variants), len(result.skipped)),
        task=task_out(result.task, archs),
        variants=[variant_out(v, store.get_profile(v.name, local_machine())) for v in result.variants],
        skipped=[skipped_out(s) for s in result.skipped],
    )


@router.post(
    "/v1/models",
    status_code=201,
    response_model=ModelRegistered,
    dependencies=KEY_REQUIRED,
    responses={
        200: {"model": ModelRegistered, "description": "These bytes were already registered under this name"},
        **error_responses(InvalidInput, PayloadTooLarge, Forbidden, Conflict, RegistrationError, *TENANT_KEY),
    },
)
async def register_model(
    request: Request,
    principal: TenantPrincipal,
    model: Annotated[UploadFile, File(description="model file or archive (.keras, .onnx, .zip, .joblib)")],
    metadata: Annotated[
        str | UploadFile,
        Form(
            description='JSON {"name": ..., "task": ..., "description": ...}, as a field or a file',
            examples=[
                '{"name": "digits-net", "task": "digits-classification", "description": "a small CNN"}'
            ],
        ),
    ],
    validation: Annotated[
        UploadFile | None, File(description=".npz with x, y; needed for a new task")
    ] = None,
) -> JSONResponse:
    """Register an architecture; 201 when created, 200 when these bytes were already registered."""
    meta = _parse_metadata(await _metadata_text(metadata))
    settings: Settings = request.app.state.settings
    registry: Registry = request.app.state.registry
    limit = int(settings.max_upload_mb * _MB)
    folder = settings.data_dir / "tmp" / f"upload-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    try:
        model_path, filename = await _spool(model, folder, limit, "model")
        val_path = None
        if validation is not None:
            val_dir = folder / "validation"
            val_dir.mkdir()
            val_path, _ = await _spool(validation, val_dir, limit, "validation.npz")
        result = await run_in_threadpool(
            registry.register,
            model_path,
            name=meta.name,
            task=meta.task,
            validation=val_path,
            description=meta.description,
            filename=filename,
            owner=principal.name,
            role=principal.role,
            profile=meta.profile,
            new_version=meta.new_version,
            trust_pickle=meta.trust_pickle,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    router: Router | None = getattr(request.app.state, "router", None)
    if result.created and result.architecture.version == 1 and router is not None:
        # Warm before answering: the burst that often follows a registration then finds the
        # model's cheapest variant loaded instead of refusals while it loads. (A later version
        # takes no traffic until labelled; `infaas.versions` warms it then.)
        await router.warm_architecture(result.architecture.name)
    elif result.created and router is not None:
        # Read-your-writes: the periodic refresh may have caught the registration half stored
        # (the version's variants without their profiles yet), and a query pinned to the new
        # version right after this answer would be told it has no profiled variant.
        await router.refresh_async()
    body = await run_in_threadpool(_registered, result, _store(request))
    return JSONResponse(body.model_dump(mode="json"), status_code=201 if result.created else 200)


@router.get("/v1/models", dependencies=KEY_REQUIRED, responses=error_responses(*TENANT_KEY))
def list_models(
    request: Request,
    _: TenantPrincipal,
    task: Annotated[
        str | None, Query(description="only this task's", examples=["digits-classification"])
    ] = None,
) -> list[ArchitectureOut]:
    store = _store(request)
    return [
        architecture_out(a, len(store.list_variants(a.name)), len(store.list_skipped(a.name)))
        for a in store.list_architectures(task)
    ]


@router.get(
    "/v1/models/{architecture}/variants",
    dependencies=KEY_REQUIRED,
    responses=error_responses(ArchitectureNotFound, *TENANT_KEY),
)
def list_variants(
    architecture: Annotated[str, PathParam(examples=["digits-logreg"])], request: Request, _: TenantPrincipal
) -> VariantsOut:
    store = _store(request)
    arch = store.get_architecture(architecture)
    if arch is None:
        raise ArchitectureNotFound(
            f"no architecture {architecture!r}; GET /v1/models lists them", architecture=architecture
        )
    profiles = {p.variant: p for p in store.list_profiles(architecture, local_machine())}
    return VariantsOut(
        architecture=arch.name,
        task=arch.task,
        variants=[variant_out(v, profiles.get(v.name)) for v in store.list_variants(architecture)],
        skipped=[skipped_out(s) for s in store.list_skipped(architecture)],
    )


@router.get("/v1/tasks", dependencies=KEY_REQUIRED, responses=error_responses(*TENANT_KEY))
def list_tasks(request: Request, _: TenantPrincipal) -> list[TaskOut]:
    store = _store(request)
    archs = store.list_architectures()
    return [task_out(t, [a.name for a in archs if a.task == t.name]) for t in store.list_tasks()]
