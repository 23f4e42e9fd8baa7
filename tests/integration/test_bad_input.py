"""The bad-input matrix over real HTTP: every malformed query or upload gets a 4xx with a JSON body
that says what is wrong, the service keeps answering, and nothing reaches the store.

One live service (uvicorn, the app factory, a copy of the small zoo, the in-process pool) with a
1 MB upload limit, so an upload past it is small. Each test sends its bad request with a tenant of
its own and the valid query after it with another: the bad tenant must never be charged (a failed
query is not), and the store's tasks, architectures, variants, profiles and tenants must stay as
they were.
"""

from __future__ import annotations

import http.client
import io
import json
import shutil
import socket
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from infaas.api import create_app
from infaas.metering import Meter
from infaas.settings import Settings
from infaas.store import MetadataStore
from infaas.workers.inprocess import InProcessPool
from tests.integration.conftest import LiveServer, serve_app

pytestmark = pytest.mark.slow

_MB = 1024 * 1024
MAX_UPLOAD_MB = 1
MAX_REQUEST_BYTES = 16 * _MB  # Settings.max_request_mb's default

TASK = "digits-classification"  # 64 features
ROW = [0.0] * 64
VALID = {"task": TASK, "inputs": [ROW], "latency_ms": 1000}


@dataclass
class Service:
    server: LiveServer
    good_key: str  # the valid query after each test

    @property
    def store(self) -> MetadataStore:
        store: MetadataStore = self.server.app.state.store
        return store


@pytest.fixture(scope="module")
def service(small_zoo: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    data_dir = tmp_path_factory.mktemp("bad-input") / "data"
    shutil.copytree(small_zoo.data_dir, data_dir)  # the zoo is shared by the session: work on a copy
    settings = Settings(data_dir=data_dir, admin_key="admin-test-key", max_upload_mb=MAX_UPLOAD_MB)
    app = create_app(settings, pool=InProcessPool(settings.artifacts_dir))
    for url in serve_app(app):
        server = LiveServer(url=url, app=app, admin_key=app.state.admin_key)
        yield Service(server, good_key=server.new_tenant("good"))


@dataclass
class Sender:
    name: str
    key: str


@pytest.fixture
def bad(service: Service) -> Sender:
    """An owner of the task, of this test's own, for its bad requests (an owner key, so that bad
    uploads reach the checks past ownership): its usage must stay empty."""
    name = f"bad-{uuid.uuid4().hex[:8]}"
    key = service.server.new_tenant(name, role="owner")
    with service.server.client(service.server.admin_key) as c:
        assert c.post(f"/v1/admin/tasks/{TASK}/owners", json={"owner": name}).status_code == 200
    return Sender(name, key)


def _snapshot(service: Service, tenant: str) -> dict[str, Any]:
    """What a bad request must not change: the catalogue, the tenants, the artifacts on disk, and
    the `tenant`'s usage (in the store and not yet flushed)."""
    store = service.store
    meter: Meter = service.server.app.state.meter
    settings: Settings = service.server.app.state.settings
    return {
        "tasks": [t.model_dump() for t in store.list_tasks()],
        "architectures": [a.model_dump() for a in store.list_architectures()],
        "variants": [v.model_dump() for v in store.list_variants()],
        "skipped": [s.model_dump() for s in store.list_skipped()],
        "profiles": [p.model_dump() for p in store.list_profiles()],
        "tenants": [t.model_dump() for t in store.list_tenants()],
        "artifacts": sorted(str(p) for p in settings.artifacts_dir.rglob("*")),
        "usage": [u.model_dump() for u in store.usage(tenant=tenant)]
        + [d.model_dump() for d in meter.pending() if d.key.tenant == tenant],
    }


@pytest.fixture
def unchanged(service: Service, bad: Sender) -> Iterator[None]:
    """After the test: a valid query still gets 200, and nothing was written."""
    before = _snapshot(service, bad.name)
    yield
    with service.server.client(service.good_key) as c:
        r = c.post("/v1/query", json=VALID)
        assert r.status_code == 200, r.text
    after = _snapshot(service, bad.name)
    assert after == before
    assert after["usage"] == []
    settings: Settings = service.server.app.state.settings
    assert not any((settings.data_dir / "tmp").glob("*")), "an upload was left behind"


def _assert_error(status: int, body: bytes, expected_status: int, error: str, says: str) -> None:
    assert status == expected_status, body[:500]
    parsed = json.loads(body)
    assert parsed["error"] == error, parsed
    assert says in parsed["detail"], parsed


# ---- POST /v1/query --------------------------------------------------------------------------


def _million_rows() -> bytes:
    """10⁶ one-number rows (4 MB): under the request limit, so the route itself must refuse them."""
    rows = b",".join([b"[0]"] * 1_000_000)
    return b'{"task": "%s", "latency_ms": 1000, "inputs": [%s]}' % (TASK.encode(), rows)


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


_ROW_TAIL = b",0" * 63
QUERY_CASES: dict[str, tuple[bytes, int, str, str]] = {
    # case: (body, status, error code, what the detail must say)
    "wrong-shape": (_json({**VALID, "inputs": [[1, 2, 3]]}), 400, "invalid_input", "shape [64]"),
    "words-for-numbers": (_json({**VALID, "inputs": [["one"] * 64]}), 400, "invalid_input", "non-numeric"),
    "numeric-strings": (_json({**VALID, "inputs": [["1"] * 64]}), 400, "invalid_input", "numbers"),
    "nan-literal": (
        b'{"task": "%s", "latency_ms": 1000, "inputs": [[NaN%s]]}' % (TASK.encode(), _ROW_TAIL),
        400,
        "invalid_input",
        "NaN or infinity",
    ),
    "1e999": (
        b'{"task": "%s", "latency_ms": 1000, "inputs": [[1e999%s]]}' % (TASK.encode(), _ROW_TAIL),
        400,
        "invalid_input",
        "NaN or infinity",
    ),
    "no-rows": (_json({**VALID, "inputs": []}), 400, "invalid_input", "at least one row"),
    "empty-row": (_json({**VALID, "inputs": [[]]}), 400, "invalid_input", "shape [64]"),
    "million-rows": (_million_rows(), 400, "invalid_input", "shape [64]"),
    "16MB-plus-one-byte": (b" " * (MAX_REQUEST_BYTES + 1), 413, "payload_too_large", str(MAX_REQUEST_BYTES)),
    "truncated-json": (_json(VALID)[:40], 400, "invalid_input", "malformed JSON"),
    "unknown-task": (_json({**VALID, "task": "no-such-task"}), 404, "task_not_found", "GET /v1/tasks"),
    "unknown-architecture": (
        _json({**VALID, "architecture": "no-such-arch"}),
        404,
        "architecture_not_found",
        "no-such-arch",
    ),
    "unknown-variant": (
        _json({**VALID, "variant": "no-such/variant"}),
        404,
        "variant_not_found",
        "no-such/variant",
    ),
}


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize("case", list(QUERY_CASES))
def test_bad_query_gets_a_4xx_that_says_why(service: Service, bad: Sender, case: str) -> None:
    body, status, error, says = QUERY_CASES[case]
    with service.server.client(bad.key) as c:
        r = c.post("/v1/query", content=body, headers={"Content-Type": "application/json"})
    _assert_error(r.status_code, r.content, status, error, says)
    assert r.headers["content-type"].startswith("application/json")


@pytest.mark.usefixtures("unchanged")
def test_query_body_streamed_past_the_limit_gets_413(service: Service, bad: Sender) -> None:
    """Without a Content-Length the limit holds on the bytes as they arrive."""

    def chunks() -> Iterator[bytes]:
        for _ in range(17):
            yield b" " * _MB

    with service.server.client(bad.key) as c:
        r = c.post("/v1/query", content=chunks(), headers={"Content-Type": "application/json"})
    _assert_error(r.status_code, r.content, 413, "payload_too_large", str(MAX_REQUEST_BYTES))


# ---- POST /v1/models -------------------------------------------------------------------------


def _zip_with_dotdot() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("sm/saved_model.pb", b"\x08\x01")
        zf.writestr("sm/../../escape.pb", b"x")
    return buf.getvalue()


UPLOAD_CASES: dict[str, tuple[tuple[str, bytes], int, str, str]] = {
    # case: (model part, status, error code, what the detail must say)
    "corrupt-onnx": (("m.onnx", b"\x00not protobuf" * 50), 422, "unsupported_format", "ONNX"),
    "zip-with-dotdot": (("m.zip", _zip_with_dotdot()), 422, "unsafe_archive", "'..'"),
    "over-the-upload-limit": (
        ("m.onnx", b"\x00" * (2 * _MB)),
        413,
        "payload_too_large",
        str(MAX_UPLOAD_MB * _MB),
    ),
}


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize("case", list(UPLOAD_CASES))
def test_bad_upload_gets_a_4xx_that_says_why(service: Service, bad: Sender, case: str) -> None:
    model, status, error, says = UPLOAD_CASES[case]
    meta = json.dumps({"name": f"bad-{case}", "task": TASK})
    with service.server.client(bad.key) as c:
        r = c.post("/v1/models", files={"model": model}, data={"metadata": meta})
    _assert_error(r.status_code, r.content, status, error, says)


# ---- bodies past the limit are refused as they arrive, not after ------------------------------


def _send_unfinished(url: str, head: str, chunks: Iterable[bytes]) -> tuple[int, bytes]:
    """Send `head` and `chunks` but never the end of the body, then read the answer. A server that
    read the whole body before judging its size would wait for the rest and never answer (the
    socket's timeout fails the test)."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head.encode())
        for chunk in chunks:
            sock.sendall(chunk)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


def _head(path: str, key: str, content_type: str, framing: str) -> str:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: {content_type}\r\n{framing}\r\n\r\n"
    )


def _chunked(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    """`data` in HTTP/1.1 chunks, without the last (empty) chunk that would end the body."""
    for start in range(0, len(data), size):
        piece = data[start : start + size]
        yield b"%x\r\n%s\r\n" % (len(piece), piece)


_BOUNDARY = "infaas-test-boundary"


def _multipart_start(meta: str) -> bytes:
    return (
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n{meta}\r\n'
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


@pytest.mark.usefixtures("unchanged")
def test_upload_declared_past_the_limit_is_refused_before_its_body(service: Service, bad: Sender) -> None:
    head = _head(
        "/v1/models",
        bad.key,
        f"multipart/form-data; boundary={_BOUNDARY}",
        f"Content-Length: {2 * _MB}",
    )
    status, body = _send_unfinished(service.server.url, head, [])  # not one byte of the body
    _assert_error(status, body, 413, "payload_too_large", str(MAX_UPLOAD_MB * _MB))


@pytest.mark.usefixtures("unchanged")
def test_query_streamed_past_the_limit_is_refused_before_its_end(service: Service, bad: Sender) -> None:
    head = _head("/v1/query", bad.key, "application/json", "Transfer-Encoding: chunked")
    status, body = _send_unfinished(service.server.url, head, _chunked(b" " * (MAX_REQUEST_BYTES + _MB)))
    _assert_error(status, body, 413, "payload_too_large", str(MAX_REQUEST_BYTES))


@pytest.mark.usefixtures("unchanged")
def test_upload_streamed_past_the_limit_is_refused_before_its_end(service: Service, bad: Sender) -> None:
    head = _head(
        "/v1/models", bad.key, f"multipart/form-data; boundary={_BOUNDARY}", "Transfer-Encoding: chunked"
    )
    meta = json.dumps({"name": "streamed", "task": TASK})
    data = _multipart_start(meta) + b"\x00" * (MAX_UPLOAD_MB * _MB + 128 * 1024)
    status, body = _send_unfinished(service.server.url, head, _chunked(data))
    _assert_error(status, body, 413, "payload_too_large", str(MAX_UPLOAD_MB * _MB))
