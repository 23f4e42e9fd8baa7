"""Schemathesis over the live service's ``/openapi.json``: every answer must be one the document lists.

The document is what clients, generators and fuzzers read. A status, media type, header or body it
does not list is a bug, in the document or in the code, and a 5xx is a bug in the code (issue 9).
The service runs as deployed (uvicorn, the app factory, a copy of the small zoo) with the
in-process worker pool, so no Ray. Each operation is fuzzed (the document's examples, boundary and
wrong-type cases, random cases), then linked operations are chained (stateful), with a tenant key,
an owner key and the admin key: their answers (403 on admin routes and, for a tenant, on uploads
before the body is read; its own usage) differ.

`@schema.parametrize()` needs the operations when pytest collects the tests, before any server
runs, so the document is built from an app made for that alone (nothing served, nothing written);
the test checks that the live server serves the same document.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from hypothesis.errors import Flaky
from schemathesis import Case, Response

from infaas.api import create_app
from infaas.settings import Settings
from infaas.store import MemoryStore
from infaas.workers.inprocess import InProcessPool
from tests.integration.conftest import LiveServer, serve_app

pytestmark = pytest.mark.slow

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "missing_required_header",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
    "unsupported_method",
)
"""What the document promises about answers, and the auth and resource checks. Left out:
`positive_data_acceptance` and `negative_data_rejection` judge how much of the input validation the
schema can express (a query's rows must fit its task's shape, `from` must parse as a time), not
whether the answers are documented."""

MAX_EXAMPLES = 40
"""Random cases per operation and key; the coverage phase adds its own (boundaries, wrong types)."""

MIN_CASES_PER_KEY = 1000
STATEFUL_STEPS = 6
STATEFUL_MIN_STEPS = 100
STATEFUL_RUNS = 5
STATEFUL_SETTINGS = hypothesis.settings(
    max_examples=25,  # scenarios, each up to STATEFUL_STEPS calls
    stateful_step_count=STATEFUL_STEPS,
    phases=[hypothesis.Phase.generate],  # no shrinking: a replay meets a server in another state
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

ROLES = ("tenant", "owner", "admin")
"""Tenant and owner first: the admin's run deletes tenants it finds (DELETE /v1/admin/tenants/{name})."""

_cases: Counter[str] = Counter()
"""Requests sent per key, fuzzing and stateful together."""

_answers: Counter[tuple[str, str, int]] = Counter()
"""(key, operation, status) of every answer: printed with -s, to see what the fuzzing reached."""


def _document() -> dict[str, Any]:
    unused = Path("/nonexistent/infaas-openapi")  # a memory store and a given key: nothing is written
    settings = Settings(data_dir=unused, admin_key="unused")
    document: dict[str, Any] = create_app(
        settings, store=MemoryStore(), pool=InProcessPool(settings.artifacts_dir)
    ).openapi()
    return document


DOCUMENT = _document()

schema = schemathesis.openapi.from_dict(
    DOCUMENT,
    config=schemathesis.Config.from_dict(
        {
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
        }
    ),
)


@pytest.fixture(scope="module")
def server(small_zoo: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data_dir = tmp_path_factory.mktemp("fuzz") / "data"
    shutil.copytree(small_zoo.data_dir, data_dir)  # the zoo is shared by the session: fuzz a copy
    settings = Settings(data_dir=data_dir, admin_key="admin-test-key")
    app = create_app(settings, pool=InProcessPool(settings.artifacts_dir))
    for url in serve_app(app):
        assert httpx.get(f"{url}/openapi.json").json() == DOCUMENT
        yield LiveServer(url=url, app=app, admin_key=app.state.admin_key)


@pytest.fixture(scope="module", params=ROLES)
def role(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def key(server: LiveServer, role: str) -> str:
    if role == "admin":
        return server.admin_key
    return server.new_tenant(f"fuzz-{uuid.uuid4().hex[:8]}", role=role)


@schema.parametrize()
@hypothesis.settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_documented(case: Case[Any], server: LiveServer, role: str, key: str) -> None:
    _cases[role] += 1
    response = case.call_and_validate(base_url=server.url, headers={"Authorization": f"Bearer {key}"})
    _answers[role, case.operation.label, response.status_code] += 1


def test_chained_calls_answer_as_documented(server: LiveServer, role: str, key: str) -> None:
    """Linked operations in sequence (create a tenant, then delete it, ...), the same checks."""
    fuzzed = _cases[role]
    started_s = time.monotonic()
    failures: list[str] = []

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Case[Any]) -> dict[str, Any]:
            return {"base_url": server.url, "headers": {"Authorization": f"Bearer {key}"}}

        def after_call(self, response: Response, case: Case[Any]) -> None:
            super().after_call(response, case)
            _cases[role] += 1
            _answers[role, case.operation.label, response.status_code] += 1

        def validate_response(self, response: Response, case: Case[Any], *args: Any, **kwargs: Any) -> None:
            try:
                super().validate_response(response, case, *args, **kwargs)
            except Exception as exc:  # kept here: a replay that cannot reproduce it must not hide it
                failures.append(f"{case.operation.label} -> {response.status_code}: {exc}")
                raise

    for _ in range(STATEFUL_RUNS):
        # Hypothesis replays a scenario against a server whose state has moved on (the tenant
        # created last time now answers 409), so its draws differ: not a failure of the API.
        # Schemathesis's own runner restarts the state machine likewise.
        with contextlib.suppress(Flaky):
            Machine.run(settings=STATEFUL_SETTINGS)
        if failures or _cases[role] - fuzzed >= STATEFUL_MIN_STEPS:
            break
    steps = _cases[role] - fuzzed
    print(f"\n{role}: {fuzzed} fuzzed cases, {steps} stateful steps ({time.monotonic() - started_s:.1f} s)")
    for (who, label, status), count in sorted(_answers.items()):
        if who == role:
            print(f"  {label:45} {status}  x{count}")
    assert not failures, "\n".join(failures)
    assert steps > 0
    if fuzzed:  # the fuzzing test ran for this key in this session
        assert _cases[role] >= MIN_CASES_PER_KEY, dict(_cases)
