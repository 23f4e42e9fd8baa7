"""Open-loop load for the fault tests: arrivals on a fixed schedule that never wait for answers
(a production client population), each outcome recorded as the client saw it.

Runs on its own event loop in a background thread, with aiohttp (httpx's client is the bottleneck
above ~700 req/s here). Outcomes: the HTTP status with the JSON body for answers, or how the
connection failed: ``refused`` (never accepted: the server was not listening) or ``cut`` (sent,
then the connection dropped before an answer: what a drain must never do).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class Outcome:
    sent_s: float  # monotonic
    status: int | str  # HTTP status, or "refused" / "cut" / "timeout"
    body: dict[str, Any] | None = None


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)

    def answered(self) -> list[dict[str, Any]]:
        return [o.body for o in self.outcomes if o.status == 200 and o.body is not None]

    def statuses(self) -> Counter[int | str]:
        return Counter(o.status for o in self.outcomes)

    def cost_pusd(self) -> int:
        return sum(int(b["cost_pusd"]) for b in self.answered())


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
        self._thread.start()
        return self

    def stop(self) -> LoadResult:
        self._stopping.set()
        self._thread.join(timeout=self._timeout_s + 30)
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
                self.result.outcomes.append(Outcome(sent_s, resp.status, body))
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
