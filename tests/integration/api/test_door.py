"""The door in uvicorn's HTTP parser (`DoorProtocol`): a refused query is answered on the wire
without reaching the app, its body is dropped, and the connection stays in step for the next
request (keep-alive, pipelining, ``Connection: close``). Driven over a raw socket against a real
uvicorn server, so that the bytes on the wire are what is checked."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from infaas.api.door import PacedReads, QueryDoor, door_protocol
from infaas.errors import Overloaded
from infaas.policy.shedding import RefusalPacer
from tests.integration.conftest import free_port

SHED = b"Bearer shed-me"


class ShedByKey(QueryDoor):
    """A door that refuses every query carrying the key `SHED` (the decision itself is the
    shedder's, tested in tests/unit/policy/test_shedding.py)."""

    def __init__(self, app: Starlette) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self.refused = 0
        self.judged = 0
        self.entered = 0  # requests that reached the ASGI door (the protocol let them through)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += scope["type"] == "http"
        await super().__call__(scope, receive, send)

    def shedding(self) -> bool:
        return True

    def refusal(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Overloaded | None:
        self.judged += 1
        authorization = dict(headers).get(b"authorization")
        if authorization != SHED or method != "POST" or path != "/v1/query":
            return None
        self.refused += 1
        return Overloaded(
            "refusing 95% of this tenant's queries on arrival; retry", retry_after_s=2.5, at_door=True
        )


async def _query(request: Request) -> JSONResponse:
    body = await request.body()
    await asyncio.sleep(float(request.headers.get("x-delay", "0")))
    return JSONResponse({"bytes": len(body)})


@pytest.fixture
def served() -> Iterator[tuple[int, ShedByKey]]:
    app = Starlette(routes=[Route("/v1/query", _query, methods=["POST"])])
    door = ShedByKey(app)
    port = free_port()
    config = uvicorn.Config(
        door, host="127.0.0.1", port=port, log_level="warning", http=door_protocol(door, lambda: False)
    )
    with serving(uvicorn.Server(config)):
        yield port, door


@contextmanager
def serving(server: uvicorn.Server) -> Iterator[None]:
    """`server` running in a thread of its own while the block runs."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _request(key: bytes, body: bytes, *, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/query HTTP/1.1\r\nhost: t\r\nauthorization: "
        + key
        + b"\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n" % len(body) + extra + b"\r\n" + body
    )


def _responses(conn: socket.socket, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Read `n` HTTP responses (with content-length) from `conn`."""
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            assert chunk, f"connection closed after {len(out)} responses"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        while len(buf) < length:
            buf += conn.recv(65536)
        out.append((int(lines[0].split()[1]), headers, buf[:length]))
        buf = buf[length:]
    return out


def test_a_refused_query_is_answered_on_the_wire_and_the_connection_stays_in_step(
    served: tuple[int, ShedByKey],
) -> None:
    port, door = served
    body = json.dumps({"inputs": [[1.0] * 64] * 8}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(_request(SHED, body))
        [(status, headers, raw)] = _responses(conn, 1)
        assert status == 429
        assert headers["retry-after"] == "3"
        assert headers["content-type"] == "application/json"
        answer = json.loads(raw)
        assert answer["error"] == "overloaded" and answer["at_door"] is True
        assert answer["detail"].startswith("refusing 95%")
        # The refused body was dropped: the next request on the connection parses and is served.
        conn.sendall(_request(b"Bearer ok", body))
        [(status, _, raw)] = _responses(conn, 1)
        assert status == 200 and json.loads(raw) == {"bytes": len(body)}
    assert door.refused == 1
    # Each request judged once: the app's door (ASGI) lets through what the parser's let in (a
    # second judgement would shed a share of the admitted ones again).
    assert door.judged == 2


def test_a_refusal_in_the_same_read_as_other_requests(served: tuple[int, ShedByKey]) -> None:
    """Refused, admitted, refused, in one segment: three answers, in order."""
    port, door = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(_request(SHED, b"{}") + _request(b"Bearer ok", b"[1]") + _request(SHED, b"{}"))
        statuses = [(status, raw) for status, _, raw in _responses(conn, 3)]
    assert [s for s, _ in statuses] == [429, 200, 429]
    assert json.loads(statuses[1][1]) == {"bytes": 3}
    # The last one was pipelined behind a request in progress: refused on arrival by the parser's
    # door, answered after the request ahead of it; only the admitted one reached the app.
    assert door.refused == 2
    assert door.entered == 1


def test_a_refusal_does_not_overtake_a_request_in_progress(served: tuple[int, ShedByKey]) -> None:
    port, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(_request(b"Bearer ok", b"[1, 2]", extra=b"x-delay: 0.2\r\n") + _request(SHED, b"{}"))
        (first, _, raw), (second, _, _) = _responses(conn, 2)
    assert (first, json.loads(raw), second) == (200, {"bytes": 6}, 429)


def test_a_pipelined_burst_behind_a_request_in_progress_is_answered_in_order(
    served: tuple[int, ShedByKey],
) -> None:
    """Refusals pipelined behind a slow answer wait for it, then go out in order, an admitted
    query among them included, without reaching the app (the load generator's flood pipelines
    this way behind its admitted queries)."""
    port, door = served
    burst = (
        _request(b"Bearer ok", b"[1]", extra=b"x-delay: 0.2\r\n")
        + _request(SHED, b"{}") * 200
        + _request(b"Bearer ok", b"[1, 2]")
        + _request(SHED, b"{}") * 3
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(burst)
        answers = _responses(conn, 205)
    assert [status for status, _, _ in answers] == [200] + [429] * 200 + [200] + [429] * 3
    assert [json.loads(answers[i][2]) for i in (0, 201)] == [{"bytes": 3}, {"bytes": 6}]
    assert all(headers["retry-after"] == "3" for _, headers, _ in answers[1:201])
    assert (door.refused, door.entered) == (203, 2)


def test_a_pipelined_refusal_honours_connection_close(served: tuple[int, ShedByKey]) -> None:
    port, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(
            _request(b"Bearer ok", b"[1]", extra=b"x-delay: 0.1\r\n")
            + _request(SHED, b"{}", extra=b"connection: close\r\n")
        )
        (first, _, _), (second, headers, _) = _responses(conn, 2)
        assert (first, second, headers["connection"]) == (200, 429, "close")
        assert conn.recv(1) == b""  # closed by the server


def test_a_client_gone_with_refusals_owed_leaves_the_server_serving(served: tuple[int, ShedByKey]) -> None:
    port, _ = served
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(_request(b"Bearer ok", b"[1]", extra=b"x-delay: 0.1\r\n") + _request(SHED, b"{}") * 20)
    conn.close()
    time.sleep(0.3)  # the answer ahead and the refusals owed meet a closed connection
    with socket.create_connection(("127.0.0.1", port), timeout=10) as again:
        again.sendall(_request(b"Bearer ok", b"[1]"))
        [(status, _, _)] = _responses(again, 1)
    assert status == 200


def test_a_refusal_honours_connection_close(served: tuple[int, ShedByKey]) -> None:
    port, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(_request(SHED, b"{}", extra=b"connection: close\r\n"))
        [(status, headers, _)] = _responses(conn, 1)
        assert (status, headers["connection"]) == (429, "close")
        assert conn.recv(1) == b""  # closed by the server


def test_other_requests_are_not_shed(served: tuple[int, ShedByKey]) -> None:
    port, door = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /v1/query HTTP/1.1\r\nhost: t\r\nauthorization: " + SHED + b"\r\n\r\n")
        [(status, _, _)] = _responses(conn, 1)
    assert status == 405  # the app's answer: the door only sheds queries
    assert door.refused == 0


@dataclass
class Paced:
    port: int
    door: ShedByKey
    deferred: list[float] = field(default_factory=list)


@pytest.fixture
def paced() -> Iterator[Paced]:
    """A server whose refusals may take 5 % of its loop (answers are always in flight here)."""
    app = Starlette(routes=[Route("/v1/query", _query, methods=["POST"])])
    door = ShedByKey(app)
    port = free_port()
    served = Paced(port, door)
    reads = PacedReads(RefusalPacer(share=0.05, burst_s=0.001), lambda: True, served.deferred.append)
    protocol = door_protocol(door, lambda: False, reads=reads)
    config = uvicorn.Config(door, host="127.0.0.1", port=port, log_level="warning", http=protocol)
    with serving(uvicorn.Server(config)):
        yield served


def _refused_connection(port: int) -> socket.socket:
    """A connection whose first query was refused at the door: its next reads are paced."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn.sendall(_request(SHED, b"{}"))
    [(status, _, _)] = _responses(conn, 1)
    assert status == 429
    return conn


def test_a_paced_flood_is_answered_whole_and_in_order(paced: Paced) -> None:
    """A refused connection's pipelined burst is parsed a chunk at a time as the pacer allows:
    every request answered, in order, an admitted one behind the refusals included."""
    with _refused_connection(paced.port) as conn:
        conn.sendall(_request(SHED, b"{}") * 300 + _request(b"Bearer ok", b"[1]"))
        answers = _responses(conn, 301)
    assert [status for status, _, _ in answers] == [429] * 300 + [200]
    assert json.loads(answers[-1][2]) == {"bytes": 3}
    assert all(headers["retry-after"] for _, headers, _ in answers[:300])
    assert paced.door.refused == 301
    assert paced.deferred, "the pacer never put a read off"


def test_a_quiet_connection_is_answered_while_a_paced_flood_waits(paced: Paced) -> None:
    """The point of pacing: a query on another connection is read and answered at once, while
    the flood's backlog (~3 s of its 5 % share) is still being refused."""
    with _refused_connection(paced.port) as flood:
        flood.sendall(_request(SHED, b"{}") * 3000)
        time.sleep(0.2)  # the server is into the backlog
        with socket.create_connection(("127.0.0.1", paced.port), timeout=30) as quiet:
            started = time.monotonic()
            quiet.sendall(_request(b"Bearer ok", b"[1, 2]"))
            [(status, _, raw)] = _responses(quiet, 1)
            quiet_s = time.monotonic() - started
        refused_by_then = paced.door.refused
        assert _responses(flood, 3000)[-1][0] == 429  # the backlog is answered in full later
    assert (status, json.loads(raw)) == (200, {"bytes": 6})
    assert refused_by_then < 3000, f"the flood was refused whole before the quiet answer ({quiet_s:.2f} s)"
    assert quiet_s < 2.0, quiet_s
