"""The drain gate: requests in flight finish, new ones get 503 + Retry-After, probes still answer
(pure ASGI, no server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from infaas.api.lifecycle import DrainGate


class SlowApp:
    """Answers 200 once `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app: Any, path: str) -> tuple[int, dict[str, str], bytes]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app({"type": "http", "path": path, "method": "POST", "headers": []}, receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}
    return sent[0]["status"], headers, sent[1]["body"]


def test_drain_refuses_new_requests_and_waits_for_those_in_flight() -> None:
    async def scenario() -> None:
        inner = SlowApp()
        gate = DrainGate(inner)
        first = asyncio.create_task(call(gate, "/v1/query"))
        await asyncio.sleep(0.01)
        assert gate.in_flight == 1
        drain = asyncio.create_task(gate.drain(timeout_s=5.0))
        await asyncio.sleep(0.01)
        status, headers, body = await call(gate, "/v1/query")  # arrives while draining
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(body)["error"] == "unavailable"
        assert not drain.done()  # the one in flight is still running
        inner.release.set()
        assert (await first)[0] == 200
        assert await drain == 0
        assert (await call(gate, "/readyz"))[0] == 200  # probes pass the gate (the route says 503)

    asyncio.run(scenario())


def test_drain_gives_up_at_its_deadline_and_reports_what_is_left() -> None:
    async def scenario() -> None:
        inner = SlowApp()
        gate = DrainGate(inner)
        stuck = asyncio.create_task(call(gate, "/v1/query"))
        await asyncio.sleep(0.01)
        assert await gate.drain(timeout_s=0.05) == 1
        inner.release.set()
        await stuck

    asyncio.run(scenario())
