"""One background loop shape for the front end's control work (usage flushes, the autoscaler,
the router's snapshot refresh): run a coroutine every `interval_s` on the running event loop; a
failing round is logged and the next one runs; `close` cancels and waits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

__all__ = ["Periodic"]

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, interval_s: float, round_fn: Callable[[], Awaitable[object]]) -> None:
        self.name = name
        self._interval_s = interval_s
        self._round = round_fn
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Start the loop (call from the running event loop)."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self._round()
            except Exception:
                log.exception("%s: a round failed; trying again in %.1f s", self.name, self._interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
