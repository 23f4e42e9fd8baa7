"""The query's lane in uvicorn's HTTP parser (`DoorProtocol.lane`): a ``POST /v1/query`` with a
Content-Length within the limit is answered by the lane's function with no ASGI cycle; anything
else goes to the app as before, and the connection stays in step either way (keep-alive,
pipelining, ``Connection: close``, a client gone mid-answer, a failing answer). Driven over a raw
socket against a real uvicorn server, so that the bytes on the wire are what is checked; the real
lane (`infaas.api.routes.query.answer`) is what every `infaas serve` query in the integration
tests goes through."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from infaas.api.door import QueryDoor, Reply, as_reply, door_protocol
from tests.integration.api.test_door import _request, _responses, serving
from tests.integration.conftest import free_port

LIMIT = 100_000


@dataclass
class Lane:
    """A lane that answers ``{"lane": true, "bytes": n}``, after ``x-delay`` seconds, or raises
    on ``x-fail``; it counts what it answered and how many uvicorn tasks were alive meanwhile."""

    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    answered: int = 0
    tasks_seen: list[int] = field(default_factory=list)

    async def __call__(self, headers: list[tuple[bytes, bytes]], body: bytes, received_s: float) -> Reply:
        assert received_s <= time.monotonic()
        named = dict(headers)
        self.tasks_seen.append(len(self.tasks))
        await asyncio.sleep(float(named.get(b"x-delay", b"0")))
        if b"x-fail" in named:
            raise RuntimeError("the lane failed")
        self.answered += 1
        return as_reply(JSONResponse({"lane": True, "bytes": len(body)}))


async def _app_query(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"lane": False, "bytes": len(body)})


@dataclass
class Served:
    port: int
    lane: Lane
    draining: list[bool]


@pytest.fixture
def served() -> Iterator[Served]:
    app = Starlette(routes=[Route("/v1/query", _app_query, methods=["POST"])])
    door = QueryDoor(app)  # type: ignore[arg-type]  # no data plane: it sheds nothing
    lane, draining = Lane(), [False]
    port = free_port()
    protocol = door_protocol(door, lambda: draining[0], lane, LIMIT)
    config = uvicorn.Config(door, host="127.0.0.1", port=port, log_level="critical", http=protocol)
    server = uvicorn.Server(config)
    lane.tasks = server.server_state.tasks
    with serving(server):
        yield Served(port, lane, draining)


def _answers(conn: socket.socket, n: int) -> list[tuple[int, dict[str, object]]]:
    return [(status, json.loads(raw)) for status, _, raw in _responses(conn, n)]


def test_a_query_is_answered_on_the_lane_and_the_connection_kept(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        for body in (b"[1]", b"[1, 2]"):
            conn.sendall(_request(b"Bearer k", body))
            [(status, headers, raw)] = _responses(conn, 1)
            assert (status, json.loads(raw)) == (200, {"lane": True, "bytes": len(body)})
            assert headers["content-type"] == "application/json"
            assert "date" in headers and "connection" not in headers
    assert served.lane.answered == 2
    assert served.lane.tasks_seen == [1, 1]  # its own task, counted as uvicorn counts requests


def test_what_the_lane_does_not_take_goes_to_the_app(served: Served) -> None:
    head = b"POST /v1/query HTTP/1.1\r\nhost: t\r\nauthorization: Bearer k\r\n"
    chunked = head + b"transfer-encoding: chunked\r\n\r\n3\r\n[1]\r\n0\r\n\r\n"
    query_string = _request(b"Bearer k", b"[1]").replace(b"/v1/query", b"/v1/query?x=1", 1)
    over_limit = b"x" * (LIMIT + 1)
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        for raw in (chunked, query_string, _request(b"Bearer k", over_limit)):
            conn.sendall(raw)
            [(status, answer)] = _answers(conn, 1)
            assert status == 200 and answer["lane"] is False
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(
            _request(b"Bearer k", b"", extra=b"expect: 100-continue\r\n").replace(
                b"content-length: 0", b"content-length: 3"
            )
        )
        assert conn.recv(1024).startswith(b"HTTP/1.1 100 Continue")
        conn.sendall(b"[1]")
        assert _answers(conn, 1) == [(200, {"lane": False, "bytes": 3})]
    served.draining[0] = True  # a draining server answers through the app (its 503)
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(_request(b"Bearer k", b"[1]"))
        assert _answers(conn, 1) == [(200, {"lane": False, "bytes": 3})]
    assert served.lane.answered == 0


def test_a_body_larger_than_uvicorns_read_pause_is_read_whole(served: Served) -> None:
    body = json.dumps({"inputs": [[0.5] * 64] * 300}).encode()  # ~70 KB, over uvicorn's 64 KiB mark
    assert 65_536 < len(body) <= LIMIT
    raw = _request(b"Bearer k", body)
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        # In two sends: uvicorn would stop reading after the first (past its mark) and wait for
        # an ASGI app to ask for the rest, which the lane never does.
        conn.sendall(raw[: len(raw) - 1000])
        time.sleep(0.2)
        conn.sendall(raw[len(raw) - 1000 :])
        assert _answers(conn, 1) == [(200, {"lane": True, "bytes": len(body)})]


def test_a_request_pipelined_behind_a_lane_query_is_answered_after_it(served: Served) -> None:
    slow = _request(b"Bearer k", b"[1]", extra=b"x-delay: 0.2\r\n")
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(slow + _request(b"Bearer k", b"[1, 2]") + _request(b"Bearer k", b"[]"))
        answers = _answers(conn, 3)
    # The first on the lane; the two behind it through the app's pipeline, in order.
    assert answers == [
        (200, {"lane": True, "bytes": 3}),
        (200, {"lane": False, "bytes": 6}),
        (200, {"lane": False, "bytes": 2}),
    ]


def test_connection_close_is_honoured(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(_request(b"Bearer k", b"[1]", extra=b"connection: close\r\n"))
        [(status, headers, _)] = _responses(conn, 1)
        assert (status, headers["connection"]) == (200, "close")
        assert conn.recv(1) == b""  # closed by the server


def test_an_http_1_0_query_is_answered_and_its_connection_closed(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(_request(b"Bearer k", b"[1]").replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        [(status, headers, raw)] = _responses(conn, 1)
        assert (status, headers["connection"], json.loads(raw)["lane"]) == (200, "close", True)
        assert conn.recv(1) == b""


def test_a_failing_answer_is_a_json_500_and_the_connection_goes_on(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(_request(b"Bearer k", b"[1]", extra=b"x-fail: 1\r\n"))
        [(status, answer)] = _answers(conn, 1)
        assert status == 500
        assert answer == {"error": "internal_error", "detail": "RuntimeError: the server failed"}
        conn.sendall(_request(b"Bearer k", b"[1]"))
        assert _answers(conn, 1) == [(200, {"lane": True, "bytes": 3})]


def test_a_client_gone_mid_answer_leaves_the_server_serving(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(_request(b"Bearer k", b"[1]", extra=b"x-delay: 0.2\r\n"))
    time.sleep(0.4)  # the answer was computed for a closed connection
    assert served.lane.answered == 1
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(_request(b"Bearer k", b"[1]"))
        assert _answers(conn, 1) == [(200, {"lane": True, "bytes": 3})]
