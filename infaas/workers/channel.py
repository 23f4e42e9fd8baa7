"""The data path from the front end to one worker actor: a Ray Compiled Graph.

A classic actor call pays for task submission, an object-store round trip and the result's
ownership bookkeeping: 2.3–2.8 ms per batch on this machine, most of it CPU in the front end. A
compiled graph moves the arguments and the result through shared-memory channels that the actor's
execution loop reads: ~0.55 ms (docs/benchmarks.md, "The data path to workers").

How a batch travels: the event loop puts `(variant, rows, future)` on the channel's queue; one
thread per channel executes the graph and waits for its result, then settles the future on the
loop. Ray also offers an asyncio flavour (`enable_asyncio=True`), measured slower here (p50 1.15
ms against 0.72 ms, and fewer calls/s): it hands every execution to two thread pools (writer and
reader) and back. One thread per worker runs one batch at a time, as the actor does anyway.

Ray's limits on compiled graphs, and how the pool lives with them:
- One compiled graph per actor at a time: each worker has exactly one channel, `run(variant, rows)`,
  which serves every variant the worker hosts. Loads, unloads and health checks stay classic actor
  calls (rare, and they may take seconds).
- Only the compiling process may execute it: a channel belongs to the `RayPool` that spawned the
  worker and never leaves that process.
- A bounded number of executions in flight: the channel's thread has at most one.
- The graph's task runs on a background thread of the actor, beside the main thread that runs the
  classic calls: `WorkerHost` serialises the two with one lock.
- An actor that dies leaves the execution in flight unanswered: the pool learns of the death from
  a call it keeps pending on the actor (`RayPool._watch`), fails the channel (`fail`: every waiting
  batch raises `ChannelBroken` at once and is retried elsewhere), tears it down, and builds a new
  one for the restarted actor.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

import numpy as np

__all__ = ["ChannelBroken", "ChannelTimeout", "CompiledChannel"]

# A thread woken by the teardown may spend up to 10 s asking Ray why the channel failed.
_JOIN_TIMEOUT_S = 15.0


class ChannelBroken(Exception):
    """The worker behind the channel died, or the channel failed: the batch's result is lost."""


class ChannelTimeout(Exception):
    """No result within the caller's bound."""


class CompiledChannel:
    """A compiled graph `handle.run(variant, rows)` and the thread that executes it.

    Build it with `open` (compiling waits for the actor to start the graph's loop, ~150 ms here, so
    it runs off the event loop); call it from that loop only."""

    def __init__(self, graph: Any, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._graph = graph
        self._loop = loop
        self._queue: queue.SimpleQueue[tuple[str, np.ndarray, float, asyncio.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._pending: set[asyncio.Future[Any]] = set()
        self._error: Exception | None = None
        self.closed = False
        self._thread = threading.Thread(target=self._serve, name=f"infaas-channel-{name}", daemon=True)
        self._thread.start()

    @classmethod
    async def open(cls, handle: Any, name: str) -> CompiledChannel:
        def compile_graph() -> Any:
            from ray.dag import InputNode

            with InputNode() as inp:
                dag = handle.run.bind(inp[0], inp[1])
            return dag.experimental_compile()

        return cls(await asyncio.to_thread(compile_graph), asyncio.get_running_loop(), name)

    async def call(self, variant: str, rows: np.ndarray, timeout_s: float) -> Any:
        """`run(variant, rows)` on the actor: its return value (an exception raised in the actor
        comes back as `RayTaskError`); `ChannelBroken` once the channel is known dead;
        `ChannelTimeout` after `timeout_s` (a batch that has started still runs to its end)."""
        if self._error is not None:
            raise self._error
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        self._queue.put((variant, rows, timeout_s, future))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise ChannelTimeout(f"no result within {timeout_s:g} s") from None

    def fail(self, error: Exception) -> None:
        """Mark the channel dead: every waiting and later call raises `error`. Event loop only."""
        if self._error is None:
            self._error = error
        for future in list(self._pending):
            if not future.done():
                future.set_exception(self._error)

    def close(self) -> None:
        """Tear the graph down and stop the thread (blocking: Ray waits for the actor's loop to
        stop, and a thread waiting on a dead actor's result wakes with a channel error). Returns
        once the thread is gone: one still inside Ray when Ray shuts down crashes the process."""
        if not self.closed:
            self.closed = True
            self._queue.put(None)
            self._graph.teardown()
        self._thread.join(timeout=_JOIN_TIMEOUT_S)

    # ---- the channel's thread -------------------------------------------------------------

    def _serve(self) -> None:
        import ray
        from ray.exceptions import RayTaskError

        while (item := self._queue.get()) is not None:
            variant, rows, timeout_s, future = item
            if future.done():  # its caller gave up, or the channel failed, before its turn
                continue
            try:
                # Ray's own bound on a compiled result is 10 s (RAY_CGRAPH_get_timeout): the
                # caller's, plus a margin, applies instead. Past it, the channel is given up.
                out = ray.get(self._graph.execute(variant, rows), timeout=timeout_s + 5.0)
                # It may be a zero-copy view of the channel's buffer, which the next execution
                # reuses: keep a copy (outputs are rows × classes, small).
                result = np.array(out, copy=True) if isinstance(out, np.ndarray) else out
            except RayTaskError as exc:  # raised inside the actor: the pool maps it
                self._loop.call_soon_threadsafe(_settle, future, None, exc)
            except Exception as exc:
                if self.closed:
                    return
                broken = ChannelBroken(f"the channel failed: {type(exc).__name__}: {exc}")
                self._loop.call_soon_threadsafe(self.fail, broken)
                return
            else:
                self._loop.call_soon_threadsafe(_settle, future, result, None)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # timed out meanwhile, or failed with the channel
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
