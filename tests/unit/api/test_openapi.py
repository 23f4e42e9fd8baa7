"""The OpenAPI document lists what each route can answer: statuses from the one table, the one error
body, the key scheme and the media types that are not JSON (`infaas.api.openapi`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infaas import errors as e
from infaas.api import create_app
from infaas.api.openapi import ErrorBody, error_responses, install_openapi
from infaas.api.schemas import QueryRequest
from infaas.settings import Settings
from infaas.store import MemoryStore
from infaas.workers.inprocess import InProcessPool

_ERROR_BODY = {"$ref": "#/components/schemas/ErrorBody"}


def _app(data_dir: Path) -> Any:
    settings = Settings(data_dir=data_dir, admin_key="admin-test-key")
    return create_app(settings, store=MemoryStore(), pool=InProcessPool(settings.artifacts_dir))


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    app = _app(tmp_path_factory.mktemp("openapi") / "data")
    install_openapi(app)  # idempotent: a no-op once the app factory installs it
    doc: dict[str, Any] = app.openapi()
    return doc


def _operations(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{method.upper()} {path}", operation)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    ]


def test_statuses_come_from_the_one_table() -> None:
    responses = error_responses(e.TaskNotFound, e.ArchitectureNotFound, e.NoFeasibleVariant, e.StoreError)
    assert sorted(responses) == [404, 422, 503]
    assert all(r["model"] is ErrorBody for r in responses.values())
    assert "task_not_found, architecture_not_found" in responses[404]["description"]
    assert responses[503]["headers"]["Retry-After"]["required"] is True


def test_a_class_brings_the_codes_of_its_subclasses_with_the_same_status() -> None:
    assert all(
        code in error_responses(e.RegistrationError)[422]["description"]
        for code in ("registration_error", "unsupported_format", "unsafe_archive", "spec_mismatch")
    )
    # PayloadTooLarge is an InvalidInput with a status of its own: a route lists it when it can.
    assert sorted(error_responses(e.InvalidInput)) == [400]
    assert "store_error" in error_responses(e.Unavailable)[503]["description"]


def test_the_error_body_allows_the_fields_an_error_carries() -> None:
    body = e.NoFeasibleVariant("nothing meets 1 ms", alternatives=[{"variant": "a"}]).to_body()
    assert ErrorBody.model_validate(body).model_dump() == body
    assert ErrorBody.model_json_schema()["required"] == ["error", "detail"]


def test_every_error_answer_is_the_error_body(document: dict[str, Any]) -> None:
    for label, operation in _operations(document):
        for status, response in operation["responses"].items():
            if int(status) < 400 or label == "GET /readyz":
                continue
            assert response["content"] == {"application/json": {"schema": _ERROR_BODY}}, (label, status)


def test_a_route_that_needs_a_key_documents_the_scheme_401_and_503(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearer"]["description"],
    }
    keyed = {label for label, op in _operations(document) if op.get("security") == [{"bearer": []}]}
    assert keyed == {
        "POST /v1/query",
        "POST /v1/models",
        "GET /v1/models",
        "GET /v1/models/{architecture}/variants",
        "GET /v1/tasks",
        "GET /v1/usage",
        "GET /v1/usage/advice",
        "GET /v1/admin/usage",
        "GET /v1/admin/tenants",
        "POST /v1/admin/tenants",
        "PUT /v1/admin/tenants/{name}/share",
        "DELETE /v1/admin/tenants/{name}",
        "GET /v1/admin/fleet",
        "GET /metrics",
        "GET /v1/models/{architecture}/versions",
        "PUT /v1/models/{architecture}/canary",
        "DELETE /v1/models/{architecture}/canary",
        "POST /v1/models/{architecture}/promote",
        "POST /v1/models/{architecture}/rollback",
        "DELETE /v1/models/{architecture}",
        "DELETE /v1/models/{architecture}/versions/{version}",
        "POST /v1/admin/tasks/{task}/owners",
        "PUT /v1/targets/{task}",
        "GET /v1/targets",
        "POST /v1/jobs",
        "GET /v1/jobs/{job_id}",
        "GET /v1/jobs/{job_id}/result",
        "DELETE /v1/jobs/{job_id}",
        "GET /v1/models/{architecture}",
        "GET /v1/models/{architecture}/versions/{version}",
        "GET /v1/models/{architecture}/metadata",
        "GET /v1/models/{architecture}/versions/{version}/metadata",
    }
    for label, operation in _operations(document):
        responses = operation["responses"]
        if label in keyed:
            assert responses["401"]["headers"]["WWW-Authenticate"]["required"] is True, label
            assert "Retry-After" in responses["503"]["headers"], label
        if "admin" in operation.get("tags", ()):
            assert "403" in responses, label


def test_each_route_lists_what_its_code_answers(document: dict[str, Any]) -> None:
    statuses = {label: sorted(op["responses"]) for label, op in _operations(document)}
    assert statuses["POST /v1/query"] == ["200", "400", "401", "404", "413", "422", "429", "503", "504"]
    assert statuses["POST /v1/models"] == ["200", "201", "400", "401", "403", "409", "413", "422", "503"]
    assert statuses["POST /v1/admin/tenants"] == ["201", "400", "401", "403", "409", "413", "503"]
    assert statuses["DELETE /v1/admin/tenants/{name}"] == ["204", "401", "403", "404", "413", "503"]
    assert statuses["POST /v1/models/{architecture}/promote"] == [
        "200",
        "400",
        "401",
        "403",
        "404",
        "409",
        "413",
        "503",
    ]
    assert statuses["GET /v1/usage"] == ["200", "400", "401", "403", "503"]
    assert statuses["GET /v1/tasks"] == ["200", "401", "503"]
    assert statuses["GET /healthz"] == ["200"]
    assert statuses["GET /readyz"] == ["200", "503"]


def test_metrics_is_text_and_the_dashboard_html(document: dict[str, Any]) -> None:
    paths = document["paths"]
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert list(paths["/dashboard"]["get"]["responses"]["200"]["content"]) == ["text/html"]
    assert "/dashboard/dashboard.js" not in paths  # the page's own files are not API


def test_install_openapi_drops_the_validation_body_fastapi_adds(tmp_path: Path) -> None:
    """This service answers a failed validation with 400 and the error body, never FastAPI's 422."""
    app = _app(tmp_path / "data")
    install_openapi(app)
    install_openapi(app)  # idempotent
    doc = app.openapi()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert "HTTPValidationError" not in str(doc["paths"])
    statuses = {label: sorted(op["responses"]) for label, op in _operations(doc)}
    assert "422" not in statuses["GET /v1/admin/fleet"]
    assert "422" in statuses["POST /v1/models"] and "422" in statuses["POST /v1/query"]


def test_the_query_example_is_a_query_the_zoo_answers() -> None:
    """The document's example reaches a real answer in the built-in zoo (the fuzz test sends it)."""
    examples = QueryRequest.model_json_schema()["examples"]
    request = QueryRequest.model_validate(examples[0])
    assert request.task == "digits-classification"
    assert [len(row) for row in request.inputs] == [64]
