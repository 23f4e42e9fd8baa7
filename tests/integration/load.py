"""Open-loop load for the fault tests: arrivals on a fixed schedule that never wait for answers
(a production client population), each outcome recorded as the client saw it.

Runs on its own event loop in a background thread, with aiohttp (httpx's client is the bottleneck
above ~700 req/s here). Outcomes: the HTTP status with the JSON body for answers, or how the
connection failed: ``refused`` (never accepted: the server was not listening) or ``cut`` (sent,
then the connection dropped before an answer: what a drain must never do).

`BareOpenLoopLoad` is the same schedule from a bare asyncio HTTP/1.1 client, for overload: on 2
shared cores aiohttp's own CPU capped the offered rate at what the service sustains.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class Outcome:
    sent_s: float  # monotonic
    status: int | str  # HTTP status, or "refused" / "cut" / "timeout"
    body: dict[str, Any] | None = None
    retry_after_s: float | None = None  # the Retry-After header, where the reply had one


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)

    def answered(self) -> list[dict[str, Any]]:
        return [o.body for o in self.outcomes if o.status == 200 and o.body is not None]

    def statuses(self) -> Counter[int | str]:
        return Counter(o.status for o in self.outcomes)

    def cost_pusd(self) -> int:
        return sum(int(b["cost_pusd"]) for b in self.answered())


_loads_running = 0


def _hold_collections() -> None:
    """No garbage collection while an open-loop load runs: the schedule must not pause. A full
    collection of the test process (~300 ms: it has imported the frameworks) stopped it, and its
    catch-up burst of ~1 200 requests at once was the overload test's "stall" (late answers and
    504s in most runs, 2026-12-04). Freezing what existed at the start was not enough: a 10x
    flood's own outcomes (~50 000 in 10 s) still set off full collections of 108-190 ms in the
    middle of it (`gc.callbacks`, 2026-12-07), each followed by a burst of ~1 000 requests."""
    global _loads_running
    if _loads_running == 0:
        gc.collect()
        gc.freeze()
        gc.disable()
    _loads_running += 1


def _release_collections() -> None:
    global _loads_running
    _loads_running -= 1
    if _loads_running == 0:
        gc.enable()
        gc.unfreeze()


class OpenLoopLoad:
    """POST `body` to `url` at `rate_per_s` until `stop()`; `stop()` waits for every request sent."""

    def __init__(self, url: str, key: str, body: dict[str, Any], rate_per_s: float, timeout_s: float = 60.0):
        self._url = url
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self._payload = json.dumps(body).encode()  # once: serializing per request was the client's main cost
        self._interval_s = 1.0 / rate_per_s
        self._timeout_s = timeout_s
        self._stopping = threading.Event()
        self.result = LoadResult()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> OpenLoopLoad:
        _hold_collections()
        self._thread.start()
        return self

    def stop(self) -> LoadResult:
        self._stopping.set()
        self._thread.join(timeout=self._timeout_s + 30)
        _release_collections()
        return self.result

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            tasks: set[asyncio.Task[None]] = set()
            next_s = time.monotonic()
            while not self._stopping.is_set():
                task = asyncio.create_task(self._one(session))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_s += self._interval_s
                await asyncio.sleep(max(0.0, next_s - time.monotonic()))
            if tasks:
                await asyncio.gather(*tasks)

    async def _one(self, session: aiohttp.ClientSession) -> None:
        sent_s = time.monotonic()
        try:
            async with session.post(self._url, data=self._payload, headers=self._headers) as resp:
                body = await resp.json(content_type=None)
                retry = resp.headers.get("Retry-After")
                self.result.outcomes.append(
                    Outcome(sent_s, resp.status, body, float(retry) if retry is not None else None)
                )
        except aiohttp.ClientConnectorError:
            self.result.outcomes.append(Outcome(sent_s, "refused"))
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError):
            self.result.outcomes.append(Outcome(sent_s, "cut"))
        except TimeoutError:
            self.result.outcomes.append(Outcome(sent_s, "timeout"))


async def _closed_loop(url: str, key: str, body: dict[str, Any], concurrency: int, total: int) -> LoadResult:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    payload = json.dumps(body).encode()
    result = LoadResult()
    left = iter(range(total))

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in left:
            sent_s = time.monotonic()
            async with session.post(url, data=payload, headers=headers) as resp:
                result.outcomes.append(Outcome(sent_s, resp.status, await resp.json(content_type=None)))

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return result


def closed_loop(url: str, key: str, body: dict[str, Any], concurrency: int, total: int) -> LoadResult:
    """`total` requests from `concurrency` clients that each wait for an answer before sending again."""
    return asyncio.run(_closed_loop(url, key, body, concurrency, total))


@dataclass
class Reply:
    status: int
    body: bytes
    closes: bool  # the server closes the connection after it
    retry_after_s: float | None


def _header(head: bytes, name: bytes) -> bytes | None:
    """The value of header `name` (lower case) in a lower-cased response head, or None."""
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    stop = head.find(b"\r\n", at + 2)
    return head[at + len(name) + 3 : stop if stop >= 0 else None].strip()


def take_replies(buf: bytearray) -> list[Reply]:
    """The complete HTTP/1.1 replies at the start of `buf`, removed from it. A reply still
    arriving stays in `buf`."""
    replies = []
    while (end := buf.find(b"\r\n\r\n")) >= 0:
        head = bytes(buf[:end]).lower()
        length = int(_header(head, b"content-length") or 0)
        if len(buf) < end + 4 + length:
            break
        retry = _header(head, b"retry-after")
        replies.append(
            Reply(
                int(head[9:12]),
                bytes(buf[end + 4 : end + 4 + length]),
                _header(head, b"connection") == b"close",
                float(retry) if retry is not None else None,
            )
        )
        del buf[: end + 4 + length]
    return replies


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: requests written as they come (pipelined when one is
    still out), replies read in order, each one's outcome recorded with its send time."""

    def __init__(self, outcomes: list[Outcome], idle: collections.deque[_Connection]) -> None:
        self._outcomes = outcomes
        self._idle = idle  # where it goes back when nothing of its is out
        self._buf = bytearray()
        self.sent: collections.deque[float] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        self._buf += data
        for reply in take_replies(self._buf):
            body = json.loads(reply.body) if reply.body else None
            self._outcomes.append(Outcome(self.sent.popleft(), reply.status, body, reply.retry_after_s))
            if reply.closes:
                self.open = False  # the server closes after this reply: send nothing more on it
            elif not self.sent:
                self._idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        while self.sent:  # sent, never answered
            self._outcomes.append(Outcome(self.sent.popleft(), "cut"))


class BareOpenLoopLoad(OpenLoopLoad):
    """`OpenLoopLoad`'s schedule and outcomes from a bare asyncio HTTP/1.1 client over
    `connections` keep-alive connections: a request goes on an idle connection, else is
    pipelined on the least busy one. It costs ~0.3 core at 4 000 requests/s where aiohttp costs
    ~0.75 (measured against a bare Starlette app here), so on 2 cores shared with the service it
    can offer a real overload. For a server that stays up: a connection that fails to open or
    drops is reported (`refused`, `cut`), not replaced; replies still out `timeout_s` after
    `stop()` are `timeout`."""

    def __init__(
        self,
        url: str,
        key: str,
        body: dict[str, Any],
        rate_per_s: float,
        timeout_s: float = 60.0,
        connections: int = 256,
    ) -> None:
        super().__init__(url, key, body, rate_per_s, timeout_s)
        parsed = urllib.parse.urlsplit(url)
        self._host, self._port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self._request = (
            f"POST {parsed.path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(self._payload)}\r\n\r\n"
        ).encode() + self._payload
        self._connections = connections

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        outcomes = self.result.outcomes
        conns: list[_Connection] = []
        idle: collections.deque[_Connection] = collections.deque()
        for _ in range(self._connections):
            try:
                _, made = await loop.create_connection(
                    lambda: _Connection(outcomes, idle), self._host, self._port
                )
            except OSError:
                outcomes.append(Outcome(time.monotonic(), "refused"))
                continue
            conns.append(made)
            idle.append(made)
        next_s = time.monotonic()
        while not self._stopping.is_set():
            now_s = time.monotonic()
            while next_s <= now_s:
                while idle and not idle[0].open:
                    idle.popleft()
                if idle:
                    conn: _Connection | None = idle.popleft()
                else:  # every connection has a request out: pipeline on the least busy
                    conn = min((c for c in conns if c.open), key=lambda c: len(c.sent), default=None)
                if conn is None:
                    outcomes.append(Outcome(next_s, "cut"))  # no connection left to send it on
                else:
                    conn.sent.append(next_s)
                    assert conn.transport is not None
                    conn.transport.write(self._request)
                next_s += self._interval_s
            await asyncio.sleep(max(0.0, next_s - time.monotonic()))
        give_up_s = time.monotonic() + self._timeout_s
        while any(c.sent for c in conns) and time.monotonic() < give_up_s:
            await asyncio.sleep(0.01)
        for conn in conns:
            while conn.sent:
                outcomes.append(Outcome(conn.sent.popleft(), "timeout"))
            if conn.transport is not None:
                conn.transport.close()
