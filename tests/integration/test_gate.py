"""Nothing is read before the caller is known (issue 34): uploads and every other request with a
body are authenticated (and, where the headers tell, authorized) before the body is read."""

from __future__ import annotations

import shutil
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from tests.integration.conftest import LiveServer

_MB = 1024 * 1024


def _raw_headers_only(url: str, head: bytes) -> bytes:
    """Send a request's headers and the first bytes of a 150 MB body, then read the reply: one
    that comes before the body was sent was decided without reading it."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(head + b"--b\r\n")
        reply = s.recv(65536)
    return reply


def _upload(key: str | None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
    return (
        b"POST /v1/models HTTP/1.1\r\nHost: infaas\r\n" + auth + b"Content-Type: multipart/form-data; "
        b"boundary=b\r\nContent-Length: " + str(150 * _MB).encode() + b"\r\n\r\n"
    )


def test_uploads_are_refused_from_their_headers(live_server: LiveServer) -> None:
    tenant = live_server.new_tenant("plain")
    for key, status in ((None, b"401"), ("not-a-key", b"401"), (tenant, b"403")):
        reply = _raw_headers_only(live_server.url, _upload(key))
        assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]
        assert b'"error"' in reply
    # Any request with a body: an admin route with a tenant key, a V2 inference without a key.
    admin_route = (
        b"PUT /v1/admin/tenants/plain/share HTTP/1.1\r\nHost: infaas\r\nAuthorization: Bearer "
        + tenant.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    )
    assert _raw_headers_only(live_server.url, admin_route).startswith(b"HTTP/1.1 403")
    infer = b"POST /v2/models/x/infer HTTP/1.1\r\nHost: infaas\r\nContent-Length: 1000000\r\n\r\n"
    assert _raw_headers_only(live_server.url, infer).startswith(b"HTTP/1.1 401")


def _chunks(total: int) -> Iterator[bytes]:
    head = b'--b\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n\r\n'
    yield head
    block = b"\0" * _MB
    for _ in range(total // _MB):
        yield block
    yield b"\r\n--b--\r\n"


def test_an_unauthenticated_150_mb_upload_leaves_nothing_on_disk(live_server: LiveServer) -> None:
    data_dir: Path = live_server.app.state.settings.data_dir
    free_before = shutil.disk_usage(data_dir).free
    with live_server.client() as c:
        r = c.post(
            "/v1/models",
            content=_chunks(150 * _MB),
            headers={"Content-Type": "multipart/form-data; boundary=b"},
        )
    assert r.status_code == 401 and r.json()["error"] == "unauthenticated"
    # Not a byte of it spooled: the data dir's disk has as much free space (within what other
    # processes on this machine may write meanwhile: far less than the 150 MB).
    assert shutil.disk_usage(data_dir).free > free_before - 50 * _MB
    assert not list((data_dir / "tmp").glob("upload-*"))
    with live_server.client() as c:
        assert c.get("/healthz").status_code == 200
