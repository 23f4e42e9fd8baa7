"""The data path from the front end to one worker actor: a Ray Compiled Graph.

A classic actor call pays for task submission, an object-store round trip and the result's
ownership bookkeeping: ~1 ms per batch here, plus the Ray client's CPU in the front end. A compiled
graph moves the arguments and the result through shared-memory channels that the actor's execution
loop reads in a background thread: the per-batch cost is a few hundred µs (docs/benchmarks.md,
"The data path").

Ray's limits on compiled graphs, and how the pool lives with them:
- One compiled graph per actor at a time: each worker has exactly one channel, `run(variant, rows)`,
  which serves every variant the worker hosts. Loads, unloads and health checks stay classic actor
  calls (rare, and they may take seconds).
- Only the compiling process may execute it: a channel belongs to the `RayPool` that spawned the
  worker and never leaves that process.
- A bounded number of executions in flight (`max_in_flight`): a semaphore in front of `execute`
  holds callers back instead of letting Ray raise `RayCgraphCapacityExceeded`. A slot is released
  only when its result has been read, even by a caller that gave up waiting, so the count Ray keeps
  and ours agree.
- The graph's task runs on a background thread of the actor, beside the main thread that runs the
  classic calls: `WorkerHost` serialises the two with one lock.
- An actor that dies tears its graph down: the call raises a channel or actor error, which the pool
  treats like a lost worker (the batch is retried elsewhere), and the pool builds a new channel once
  the restarted actor answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

__all__ = ["ChannelBroken", "ChannelTimeout", "CompiledChannel", "channel_errors"]


class ChannelBroken(Exception):
    """The worker behind the channel died (the pool saw it); the batch did not run, or its result
    is lost."""


class ChannelTimeout(Exception):
    """No result within the caller's bound; the execution still holds its slot until it ends."""


def channel_errors() -> tuple[type[Exception], ...]:
    """The exceptions that mean the channel (or the actor behind it) is gone."""
    from ray.exceptions import RayActorError, RayChannelError

    return (ChannelBroken, RayChannelError, RayActorError)


class CompiledChannel:
    """A compiled graph `handle.run(variant, rows)`, executed from the event loop that built it.

    Build it in the thread that runs the event loop (Ray's async reader and writer bind to it)."""

    def __init__(self, handle: Any, max_in_flight: int) -> None:
        from ray.dag import InputNode

        with InputNode() as inp:
            dag = handle.run.bind(inp[0], inp[1])
        self._graph = dag.experimental_compile(enable_asyncio=True, _max_inflight_executions=max_in_flight)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._executions: set[asyncio.Task[Any]] = set()
        # Set once the channel is known dead: every caller still waiting gets its error at once
        # (after the actor dies, Ray leaves the executions already submitted unanswered).
        self._broken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._broken.add_done_callback(lambda f: f.exception())  # retrieved: no "never retrieved"
        self.closed = False

    async def call(self, variant: str, rows: np.ndarray, timeout_s: float) -> Any:
        """`run(variant, rows)` on the actor: its return value (an exception raised in the actor
        comes back as `RayTaskError`); the channel's error once it is broken; `ChannelTimeout`
        after `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        slot = loop.create_task(self._slots.acquire())
        if not await self._first(slot, deadline_s):
            slot.cancel()
            if slot.done() and not slot.cancelled():
                self._slots.release()
            self._raise_broken_or_timeout(timeout_s)
        execution = loop.create_task(self._execute(variant, rows))
        self._executions.add(execution)
        execution.add_done_callback(self._executions.discard)
        if not await self._first(execution, deadline_s):
            self._raise_broken_or_timeout(timeout_s)  # the execution keeps its slot until it ends
        return execution.result()

    async def _first(self, task: asyncio.Task[Any], deadline_s: float) -> bool:
        """Wait for `task` until the channel breaks or the deadline; True when `task` finished."""
        timeout_s = max(0.0, deadline_s - asyncio.get_running_loop().time())
        await asyncio.wait({task, self._broken}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        return task.done()

    def _raise_broken_or_timeout(self, timeout_s: float) -> None:
        if self._broken.done():
            error = self._broken.exception()
            assert error is not None
            raise error
        raise ChannelTimeout(f"no result within {timeout_s:g} s")

    async def _execute(self, variant: str, rows: np.ndarray) -> Any:
        # Ray 2.60 reports a graph its actor's death tore down in two shapes besides its channel
        # errors: submitting raises RuntimeError("DAG execution cancelled"), and a result its
        # reader could not read comes back as the error object, which it fails to unpack
        # (TypeError: "'RayChannelError' object is not iterable").
        try:
            try:
                future = await self._graph.execute_async(variant, rows)
            except RuntimeError as exc:
                raise ChannelBroken(f"the worker's graph is torn down ({exc})") from None
            try:
                out = await future
            except TypeError as exc:
                raise ChannelBroken(f"the channel to the worker failed ({exc})") from None
        finally:
            self._slots.release()
        # The result may be a zero-copy view of the channel's buffer, which the next execution
        # reuses: keep a copy (outputs are rows × classes, small).
        return np.array(out, copy=True) if isinstance(out, np.ndarray) else out

    def fail(self, error: Exception) -> None:
        """Mark the channel dead: every waiting and later call raises `error`. Event loop only."""
        if not self._broken.done():
            self._broken.set_exception(error)

    def close(self) -> None:
        """Tear the graph down (blocking: Ray waits for the actor's loop to stop; a dead actor
        returns at once). Safe to call twice, from any thread."""
        if self.closed:
            return
        self.closed = True
        self._graph.teardown()
