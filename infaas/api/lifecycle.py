"""Graceful shutdown: drain on SIGTERM / SIGINT, then stop in order, and exit 0.

What a stop must do (every `systemctl stop`, container stop and rolling deploy sends SIGTERM):

1. at once, `/readyz` answers 503 (a load balancer stops sending here) and every new request gets
   503 ``unavailable`` with ``Retry-After`` (`DrainGate`);
2. requests already in flight finish, for up to ``settings.drain_timeout_s``;
3. uvicorn closes its sockets and runs the app's lifespan shutdown: the batcher drains, the meter's
   last flush goes to the store (what cannot be written stays in the usage journal), workers and
   Ray are shut down;
4. the process exits 0.

Two things stand in the way, both handled by `Server`: Ray installs its own SIGTERM handler in the
driver when `ray.init` runs (inside the lifespan, after uvicorn installed its handlers), and that
handler aborts the process; and uvicorn re-raises the captured signal once it has shut down, which
turns a clean stop into death by signal. A second signal forces the exit without draining.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from types import FrameType

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infaas.api.door import PacedReads, QueryDoor, Reply, door_protocol
from infaas.api.routes import query
from infaas.errors import Unavailable
from infaas.policy.shedding import RefusalPacer
from infaas.settings import Settings

__all__ = ["DrainGate", "Server", "run"]

log = logging.getLogger(__name__)

_ALWAYS_OPEN = frozenset({"/healthz", "/readyz", "/metrics"})
"""Probes and scrapes still answer while draining: they are how operators watch the drain."""


class DrainGate:
    """Pure ASGI middleware: counts requests in flight and, once `draining`, refuses new ones with
    503 + ``Retry-After`` (probes excepted)."""

    def __init__(self, app: ASGIApp, retry_after_s: int = 1) -> None:
        self.app = app
        self.draining = False
        self.in_flight = 0
        self._retry_after = str(retry_after_s).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining and scope["path"] not in _ALWAYS_OPEN:
            await self._refuse(send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send if not self.draining else self._closing(send))
        finally:
            self.in_flight -= 1

    @staticmethod
    def _closing(send: Send) -> Send:
        """`send` that asks the client to close the connection after this response: a keep-alive
        connection reused after the server stops would meet a closed socket."""

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        return closing_send

    async def _refuse(self, send: Send) -> None:
        exc = Unavailable("the server is shutting down; retry (another instance will answer)")
        body = json.dumps(exc.to_body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", self._retry_after),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def drain(self, timeout_s: float, grace_s: float = 1.0) -> int:
        """Refuse new requests and wait until none is in flight or `timeout_s` passed; returns the
        number still in flight (0 on a clean drain). Then keep refusing for `grace_s` more (within
        the deadline): each refusal closes its connection, so clients drop the keep-alive
        connections they would otherwise send their next request on just as the server closes
        them (a request cut in transit)."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        left = self.in_flight
        if left == 0:
            await asyncio.sleep(max(0.0, min(grace_s, deadline - time.monotonic())))
        return left


class Server(uvicorn.Server):
    """uvicorn's server with infaas's stop sequence (module docstring).

    `stop` lets the app end the process with an exit code of its own (e.g. its Ray died)."""

    def __init__(self, config: uvicorn.Config, gate: DrainGate, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.gate = gate
        self.drain_timeout_s = drain_timeout_s
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        # Unlike uvicorn, the caught signal is not raised again: the stop was handled, exit 0.

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        # The lifespan has run, and with it `ray.init`, which replaced our SIGTERM handler with
        # one that aborts the process: take the signals back.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self.handle_exit)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.gate.draining or self.should_exit or self._loop is None:
            # A second signal, or one before the app started: stop now.
            self.should_exit = True
            self.force_exit = self.force_exit or self.gate.draining
            return
        name = signal.Signals(sig).name
        print(f"infaas: {name} received: draining (up to {self.drain_timeout_s:g} s)", file=sys.stderr)
        self.gate.draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        left = await self.gate.drain(self.drain_timeout_s)
        if left:
            log.error("drain deadline passed with %d request(s) in flight; they are cut", left)
        self.should_exit = True

    def stop(self, exit_code: int, message: str) -> None:
        """Stop the server from inside the app (no drain: the app cannot serve) with `exit_code`."""
        print(f"infaas: {message}", file=sys.stderr)
        self.exit_code = exit_code
        self.gate.draining = True
        self.should_exit = True


def run(app: FastAPI, settings: Settings, *, reuse_port: bool = False) -> int:
    """Serve `app` until stopped; returns the process exit code (0 after a signal's clean stop).
    `reuse_port`: bind with SO_REUSEPORT, so that several front-end processes share the port and
    the kernel spreads connections over them (`infaas serve --workers N`)."""
    door = QueryDoor(app)
    gate = DrainGate(door)
    app.state.readiness_checks["accepting"] = lambda: not gate.draining

    async def lane(headers: list[tuple[bytes, bytes]], body: bytes, received_s: float) -> Reply:
        gate.in_flight += 1  # the drain waits for it as for a request through the gate
        try:
            return await query.answer(app, headers, body, received_s)
        finally:
            gate.in_flight -= 1

    # Refusing at the door takes at most this share of the loop while answers are in flight.
    reads = None
    if settings.door_refusal_share < 1.0:
        reads = PacedReads(
            RefusalPacer(settings.door_refusal_share),
            answering=lambda: gate.in_flight > 0,
            deferred=lambda now_s: app.state.dataplane.loop_watch.mark(now_s),
        )
    config = uvicorn.Config(
        gate,
        # The door answers most refusals in the HTTP parser's callback, and the query's lane most
        # queries, with no ASGI cycle (`DoorProtocol`).
        http=door_protocol(
            door,
            lambda: gate.draining,
            lane if settings.http_lane else None,
            app.state.max_request_bytes,
            reads,
        ),
        host=settings.host,
        port=settings.port,
        # No access log: at "warning" it would print nothing, yet uvicorn still computes its
        # arguments for every request.
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
    )
    server = Server(config, gate, settings.drain_timeout_s)
    # uvicorn's request tasks, one per request from its parsed headers on: every request that
    # arrived in one read of the sockets counts before any of them runs.
    app.state.requests_in_flight = lambda: len(server.server_state.tasks)
    app.state.stop_server = server.stop
    server.run(sockets=[reuse_port_socket(settings.host, settings.port)] if reuse_port else None)
    return server.exit_code


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound with SO_REUSEPORT (Linux, BSD)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
