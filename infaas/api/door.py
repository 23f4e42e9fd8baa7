"""The door: a tenant's queries refused before the app, as cheaply as the server can refuse.

Under overload most arrivals are refused (while the limit on queries in flight is full, and a
share `policy.shedding.DoorShedder` learns from admission), so the cost of one refusal sets how
many answers the front end's single event loop has left to give. One decision
(`QueryDoor.refusal`), two entry points:

- `DoorProtocol`, uvicorn's httptools protocol with the door in its parser callback: a refused
  query is answered from ``on_headers_complete`` with pre-rendered bytes; uvicorn never builds an
  ASGI scope, a request cycle or a task for it, and its body is dropped as it arrives. Measured
  with `scripts/bench_door`: 75-78 µs of the front end's CPU per refusal against 112 µs through
  the ASGI door (docs/benchmarks.md, "The door in the HTTP parser").
  A request pipelined behind one still in progress is judged on arrival too; its refusal waits
  in uvicorn's pipeline for its turn (`_Owed`: its answer must not overtake that one's). Through
  the ASGI door instead, such refusals took ~24 % of the front end's samples under a 10x flood
  (pipelined by the load generator behind admitted queries), twice the parser's own refusals,
  and escaped the pacer below.
- `QueryDoor`, the same door as pure ASGI middleware, for any server that does not run
  `DoorProtocol` (the in-process test servers).

The protocol also holds the query's lane (`DoorProtocol.lane`): a ``POST /v1/query`` the door lets
in, with a Content-Length within the limit, is read by the protocol and answered by the lane's
function (`infaas.api.routes.query.answer`) in a task of the protocol's own, its reply written as
bytes. It skips uvicorn's request cycle, the ASGI middleware stack and the response's two ``send``
messages: 1.14x the front end's throughput on a tiny model at c=64 and -0.09 ms p50 at c=1
(docs/benchmarks.md, "The query's lane in the HTTP protocol"). ``INFAAS_HTTP_LANE=false`` turns
it off.

And it paces what it refuses (`PacedReads`, `policy.shedding.RefusalPacer`): while answers are in
flight, refusing may take `INFAAS_DOOR_REFUSAL_SHARE` of the event loop; past that, a connection
whose last request was refused has its further bytes parsed a chunk at a time as the share
refills, its reads paused meanwhile (TCP holds the rest at the client). A 10x flood otherwise came
in passes of the loop of ~20 ms of refusals, and every admitted query waited several of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httptools
from fastapi import FastAPI
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from infaas.api.auth import known_principal
from infaas.api.errors import error_response, internal_error, retry_after_s
from infaas.dataplane import DataPlane
from infaas.errors import Overloaded
from infaas.policy.shedding import RefusalPacer

__all__ = [
    "DoorProtocol",
    "Lane",
    "PacedReads",
    "QueryDoor",
    "Reply",
    "as_reply",
    "door_protocol",
    "is_query",
]

log = logging.getLogger(__name__)

Reply = tuple[int, list[tuple[bytes, bytes]], bytes]
"""A whole HTTP answer as the lane writes it: status, headers (after the server's own), body."""

Lane = Callable[[list[tuple[bytes, bytes]], bytes, float], Awaitable[Reply]]
"""A query's answer from its headers, its whole body and when it was received (monotonic seconds):
`infaas.api.routes.query.answer` bound to the app."""


def as_reply(response: Response) -> Reply:
    """A rendered `Response` (an error's) as a `Reply`."""
    return response.status_code, response.raw_headers, bytes(response.body)


_PASSED = "infaas.door_passed"
"""Set in a request's ASGI ``state`` by `DoorProtocol` when it let the request in: `QueryDoor`
then does not judge it again (twice judged, a query passed with probability (1 - share)²)."""


def is_query(method: str, path: str) -> bool:
    """Whether a request is a query in one of the protocols the data plane serves: ``POST
    /v1/query``, KServe V2 ``POST /v2/models/{name}[/versions/{v}]/infer``, TF Serving ``POST
    /v1/models/{name}[/versions/{v}|/labels/{l}]:predict`` or ``:classify``."""
    if method != "POST":
        return False
    if path == "/v1/query":
        return True
    if path.startswith("/v2/models/"):
        return path.endswith("/infer")
    return path.startswith("/v1/models/") and path.endswith((":predict", ":classify"))


class QueryDoor:
    """Pure ASGI, outside every middleware of the app: sheds a query (`is_query`: any protocol's)
    while the front end's limit on queries in flight is full or when the tenant's `DoorShedder`
    (`DataPlane.door`) says so (`DataPlane.door_refusal`), for a key the key cache knows (any
    other request goes in: the app authenticates it). One shedder per tenant whatever the
    protocol: admission refuses the tenant's queries from all of them, and feeds the shedder from
    all of them (`DataPlane.infer`)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _PASSED not in scope.get("state", ()) and self.shedding():
            refused = self.refusal(scope["method"], scope["path"], scope["headers"])
            if refused is not None:
                await error_response(refused)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def shedding(self) -> bool:
        """Whether any tenant's door refuses now; when none does (the usual case), a request is let
        in without reading its path or headers."""
        dataplane: DataPlane | None = getattr(self.app.state, "dataplane", None)
        return dataplane is not None and dataplane.shedding()

    def refusal(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Overloaded | None:
        """The 429 for this request if the door sheds it now (metered as a refusal), else None."""
        dataplane: DataPlane | None = getattr(self.app.state, "dataplane", None)
        if dataplane is None or not is_query(method, path):
            return None
        now_s = time.monotonic()
        authorization = next((v for k, v in headers if k == b"authorization"), b"")
        principal = known_principal(self.app.state.key_cache, authorization, now_s)
        return None if principal is None else dataplane.door_refusal(principal, now_s)


class _Answered:
    """What `HttpToolsProtocol` reads of a request's cycle, for a request the door answered: its
    response is complete, so the parser drops its body as it arrives."""

    response_complete = True
    disconnected = False
    keep_alive = True
    message_event = asyncio.Event()  # set when the connection is lost; nothing waits on it


_ANSWERED: Any = _Answered()


class _Owed:
    """A request pipelined behind one in progress and refused on arrival: its 429, rendered, waits
    in uvicorn's pipeline and is written when its turn comes (`DoorProtocol._start_asgi_task`).
    Incomplete until then, so what is pipelined behind it waits too; its body is dropped."""

    def __init__(self, headers: list[tuple[bytes, bytes]], body: bytes, keep_alive: bool) -> None:
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.message_event = _Answered.message_event


_CHUNK = 4096
"""The most of a refused connection's bytes parsed at once while reads are paced: ~5 queries of
the benchmarks' size, ~0.5 ms of refusals."""


class PacedReads:
    """The reads of refused connections that a `RefusalPacer` put off, resumed one chunk at a time
    in arrival order as it refills (one timer per front end). The pacer applies while `answering()`
    (admitted work in flight); otherwise one chunk goes per pass of the event loop, so a request
    that arrives meanwhile waits for one chunk, not for the whole backlog. `deferred(now_s)` is told
    each time a read is put off (`LoopWatch.mark`: the door's shedder counts the loop as busy)."""

    def __init__(
        self, pacer: RefusalPacer, answering: Callable[[], bool], deferred: Callable[[float], None]
    ) -> None:
        self.pacer = pacer
        self._answering = answering
        self._deferred = deferred
        self._waiting: deque[DoorProtocol] = deque()
        self._timer: asyncio.Handle | None = None

    def may_read(self, now_s: float) -> bool:
        """Whether a refused connection may parse a chunk now (nothing put off before it)."""
        return not self._waiting and (not self._answering() or self.pacer.ready(now_s))

    def defer(self, conn: DoorProtocol, now_s: float) -> None:
        """Put the rest of `conn`'s bytes off until its turn."""
        self._waiting.append(conn)
        if self._answering() and not self.pacer.ready(now_s):
            self._deferred(now_s)
        self._arm(now_s)

    def _arm(self, now_s: float) -> None:
        if self._timer is not None or not self._waiting:
            return
        loop = asyncio.get_running_loop()
        wait_s = self.pacer.wait_s(now_s) if self._answering() else 0.0
        self._timer = loop.call_later(wait_s, self._wake) if wait_s > 0.0 else loop.call_soon(self._wake)

    def _wake(self) -> None:
        self._timer = None
        if self._waiting:
            self._waiting.popleft()._pump(time.monotonic())
        self._arm(time.monotonic())


class _LaneCycle:
    """What `HttpToolsProtocol` reads and writes of a request's cycle (its body as it arrives, the
    connection's state), for a query on the lane."""

    message_event = _Answered.message_event  # uvicorn sets it on each body chunk; nothing waits

    def __init__(self, keep_alive: bool, headers: list[tuple[bytes, bytes]]) -> None:
        self.keep_alive = keep_alive
        self.headers = headers
        self.body = bytearray()
        self.response_complete = False
        self.disconnected = False


class DoorProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the door (`door`) in ``on_headers_complete`` and the
    query's lane (`lane`, if set); see the module docstring. Subclasses made by `door_protocol`
    set `door`, `draining`, `lane` and `lane_max_bytes`."""

    door: QueryDoor
    draining: Callable[[], bool]  # while the server drains, every request goes to the app (503)
    lane: Lane | None = None
    lane_max_bytes = 0
    reads: PacedReads | None = None  # None: a refused connection is read as fast as it sends

    # This connection's last request was refused at the door; its bytes not parsed yet (while its
    # reads are paced); whether it waits in `reads` for its turn; whether `_pump` paused its reads
    # (not uvicorn's flow control of a request's body); whether the body of a request let in is
    # being read (not paced: its clock may have started, as a pipelined request's does in the app).
    _refused = False
    _unread = bytearray()  # replaced per connection before its first byte is put in
    _deferred = False
    _paused = False
    _admitted_body = False

    def data_received(self, data: bytes) -> None:
        if self.reads is None or not (self._refused or self._unread):
            super().data_received(data)
            return
        self._unset_keepalive_if_required()  # a connection put off is not idle
        if self._unread:
            self._unread += data
        else:
            self._unread = bytearray(data)
        if not self._deferred:
            self._pump(time.monotonic(), turn=False)

    def _pump(self, now_s: float, *, turn: bool = True) -> None:
        """Parse one chunk of this refused connection's bytes on its `turn` (called by `reads`) or
        if the pacer allows, and put the rest off, its reads paused (TCP holds what follows at the
        client)."""
        reads = self.reads
        assert reads is not None
        self._deferred = False
        if self.transport.is_closing():
            self._unread = bytearray()
            return
        if turn or reads.may_read(now_s):
            # One chunk, and more while a request let in is still being read: paced, a pipelined
            # query's body came 0.5 s after its turn in the app under a 10x flood, and it was
            # dropped at its deadline (504).
            while True:
                chunk = bytes(self._unread[:_CHUNK])
                del self._unread[:_CHUNK]  # cheap at a bytearray's start
                super().data_received(chunk)
                if not (self._admitted_body and self._unread) or self.transport.is_closing():
                    break
            done_s = time.monotonic()
            if self._refused:
                reads.pacer.spend(done_s - now_s, done_s)
            now_s = done_s
        if self._unread and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            if not self.flow.read_paused:
                self.flow.pause_reading()
                self._paused = True
            self._deferred = True
            reads.defer(self, now_s)
        elif self._paused:
            self._paused = False
            self.flow.resume_reading()

    def on_headers_complete(self) -> None:
        self._refused = False
        self._admitted_body = True  # unless `_answer` refuses it
        if not self.draining():
            # Behind a request still in progress on this connection (pipelining), a refusal
            # waits for its turn: answered now, it would overtake that one's answer.
            behind = not (self.cycle is None or self.cycle.response_complete)
            if self.door.shedding():
                method = self.parser.get_method().decode("ascii")
                path = httptools.parse_url(self.url).path.decode("ascii")
                refused = self.door.refusal(method, path, self.headers)
                if refused is not None:
                    self._answer(refused, behind)
                    return
            self.scope["state"][_PASSED] = True
            if not behind and self._on_lane():
                self._unset_keepalive_if_required()
                keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
                cycle: Any = _LaneCycle(keep_alive, self.headers)
                self.cycle = cycle
                return
        # A refusal answered earlier in this read armed the keep-alive timeout; a request that
        # follows it in the same read must not be cut by it while it runs.
        self._unset_keepalive_if_required()
        super().on_headers_complete()

    def _on_lane(self) -> bool:
        """Whether the lane takes this request: a ``POST /v1/query`` (no query string) whose body
        has a Content-Length within the limit and is not held back for ``100 Continue``."""
        if self.lane is None or self.url != b"/v1/query" or self.expect_100_continue:
            return False
        if self.limit_concurrency is not None or self.parser.get_method() != b"POST":
            return False
        length = b""
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                return False
        return length.isdigit() and int(length) <= self.lane_max_bytes

    def on_body(self, body: bytes) -> None:
        if isinstance(self.cycle, _LaneCycle):  # read whole without pausing: its length is bounded
            self.cycle.body += body
            return
        if isinstance(self.cycle, _Owed):  # refused: dropped
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._admitted_body = False
        cycle = self.cycle
        if isinstance(cycle, _Owed):
            return
        if isinstance(cycle, _LaneCycle):
            task = self.loop.create_task(self._run_lane(cycle))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)  # the server's count of requests in progress, and its drain
            return
        super().on_message_complete()

    async def _run_lane(self, cycle: _LaneCycle) -> None:
        assert self.lane is not None
        # Received when its task starts, as `ReceiptStamp` stamps a request when the app is called,
        # not when its headers were parsed: under a 10x flood the wait between the two is the
        # event loop's backlog of the flood's own refusals; counted in every answer's latency, it
        # went into the path's overhead estimate and the limit's late answers, and admission
        # refused the quiet tenant's queries (tests/integration/test_fairness.py: 31 and 69 % in
        # SLO; with this stamp 71-89 %, median 88 %; without the lane 59-83 %, median 79 %).
        received_s = time.monotonic()
        try:
            status, headers, body = await self.lane(cycle.headers, bytes(cycle.body), received_s)
        except Exception as exc:  # as the app's outermost handler does: logged, a JSON 500
            log.exception("POST /v1/query failed")
            status, headers, body = as_reply(internal_error(exc))
        if cycle.disconnected:
            cycle.response_complete = True
            return
        if self.flow.write_paused:
            await self.flow.drain()
        cycle.response_complete = True
        # Once the server drains, a reused keep-alive connection would meet a closed socket.
        keep_alive = cycle.keep_alive and not self.draining()
        self._reply(status, headers, body, keep_alive)

    def _answer(self, refused: Overloaded, behind: bool = False) -> None:
        """Answer a refused request now, or once the requests ahead of it are answered (`behind`)."""
        body = json.dumps(refused.to_body(), ensure_ascii=False, separators=(",", ":")).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"retry-after", retry_after_s(refused).encode()),
        ]
        self._refused = True
        self._admitted_body = False
        # A client waiting for "100 Continue" has not sent the body the parser now expects; a
        # request without keep-alive asked for the close. 429: `Overloaded`'s status (api/errors.py).
        keep_alive = not self.expect_100_continue and self.parser.should_keep_alive()
        if behind:
            owed: Any = _Owed(headers, body, keep_alive)
            self.cycle = owed
            self.flow.pause_reading()  # as uvicorn does for a pipelined request
            self.pipeline.appendleft((owed, self.app))
            return
        self.cycle = _ANSWERED
        self._reply(429, headers, body, keep_alive)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if not isinstance(cycle, _Owed):
            super()._start_asgi_task(cycle, app)
            return
        # Its turn: written on the loop's next pass, not from inside the answer ahead of it (a
        # long pipeline of refusals would otherwise recurse once per refusal).
        self.loop.call_soon(self._pay, cycle)

    def _pay(self, owed: _Owed) -> None:
        owed.response_complete = True
        if self.transport.is_closing():
            return
        keep_alive = owed.keep_alive and not self.draining()
        self._reply(429, owed.headers, owed.body, keep_alive)

    def _reply(
        self, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes, keep_alive: bool
    ) -> None:
        """Write a whole response (after uvicorn's default headers), then close the connection or,
        with `keep_alive`, ready it for its next request, as uvicorn's own cycle does."""
        head = [STATUS_LINE[status]]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        head.append(b"\r\n" if keep_alive else b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + body)
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()  # counts the request; starts a pipelined one unless closing


def door_protocol(
    door: QueryDoor,
    draining: Callable[[], bool],
    lane: Lane | None = None,
    lane_max_bytes: int = 0,
    reads: PacedReads | None = None,
) -> type[DoorProtocol]:
    """The `DoorProtocol` class for uvicorn's ``http`` setting (uvicorn builds one per
    connection), with `door`, `draining` (a callable), the query's `lane` (None: every admitted
    request goes to the app) and the refused connections' paced `reads` (None: not paced) bound."""
    members: dict[str, Any] = {
        "door": door,
        "draining": staticmethod(draining),
        "lane_max_bytes": lane_max_bytes,
        "reads": reads,
    }
    if lane is not None:
        members["lane"] = staticmethod(lane)
    return type("BoundDoorProtocol", (DoorProtocol,), members)
