"""The data path from a front end to one worker actor: a socket stream of its own.

Ray moves loads, unloads and health checks (rare, seconds long, and they need Ray's placement and
restarts); batches, thousands a second, go over a TCP connection from the front end to a server
thread inside the worker. A classic actor call costs the front end ~1.5 ms of CPU per batch here
(task submission, the object store, ownership bookkeeping) and a compiled graph ~1 ms; a frame
on a socket costs a pickle, one `send` and one read callback (docs/benchmarks.md, "The data path
to workers").

Frames: `<QH` (pickle length, buffer count), one `<Q` length per buffer, the pickle (protocol 5),
then the buffers it refers to out of band, so an array's bytes are written and read once, never
re-encoded. A request is `(variant, rows)`; a reply `(True, outputs or None)` (None: the worker
does not hold the variant, e.g. it restarted) or `(False, exception)`. One connection per front
end and worker; the worker answers a connection's frames in order, so replies match requests
first in, first out, and several batches may be in flight on one connection.

Why a socket beats Ray's own channels for this: it is what Ray's data plane is built on, less the
parts a batch does not need. The worker's result is the only copy (nothing to reference-count or
free); one connection serves every variant the worker hosts and any number of front ends (a
compiled graph binds an actor to one driver and one graph); and a worker that dies closes it,
which the front end hears at once, with no call kept pending to watch for the death.

Trust: the server binds the node's address on an ephemeral port and accepts a connection only
after it sends the 16-byte token the worker handed out through Ray (whose own calls are
authenticated), so only processes that can call the actor can send it batches. A reply is
unpickled: the workers are this service's own processes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import pickle
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any, cast

import numpy as np

__all__ = ["ChannelBroken", "ChannelTimeout", "StreamChannel", "StreamServer", "WorkerRaised"]

_HEAD = struct.Struct("<QH")  # pickle length, number of out-of-band buffers
_LEN = struct.Struct("<Q")
_TOKEN_BYTES = 16
_JOIN_MAX_BYTES = 1 << 20
_RECV_BYTES = 1 << 20


class ChannelBroken(Exception):
    """The worker behind the channel died, or the channel failed: the batch's result is lost."""


class ChannelTimeout(Exception):
    """No result within the caller's bound."""


class WorkerRaised(Exception):
    """The worker raised `cause` while running the batch; the channel still serves."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


def encode(obj: Any) -> list[bytes | memoryview]:
    """`obj` as one frame: the pieces to write, in order."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = _HEAD.pack(len(body), len(raws)) + b"".join(_LEN.pack(r.nbytes) for r in raws)
    return [head, body, *raws]


class _FrameReader:
    """Splits a byte stream into decoded frames (both ends read with it)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        frames = []
        while True:
            buf = self._buf
            if len(buf) < _HEAD.size:
                break
            body_len, count = _HEAD.unpack_from(buf)
            offset = _HEAD.size + _LEN.size * count
            if len(buf) < offset:
                break
            lens = [n for (n,) in _LEN.iter_unpack(buf[_HEAD.size : offset])]
            end = offset + body_len + sum(lens)
            if len(buf) < end:
                break
            view = memoryview(buf)
            body = view[offset : offset + body_len]
            buffers, at = [], offset + body_len
            for n in lens:
                buffers.append(bytearray(view[at : at + n]))  # own, writable copy: buf is trimmed below
                at += n
            frames.append(pickle.loads(body, buffers=buffers))
            body.release()
            view.release()
            del self._buf[:end]
        return frames


# ---- the worker's side ----------------------------------------------------------------------


class StreamServer:
    """Serves `handler(variant, rows)` on a listening socket, one thread per connection.

    `handler` runs on the connection's thread: the worker serialises it with its other work."""

    def __init__(self, handler: Callable[[str, np.ndarray], Any], host: str) -> None:
        self._handler = handler
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self._listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        threading.Thread(target=self._accept, name="infaas-stream-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), name="infaas-stream", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the front end went away: so does this thread
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not hmac.compare_digest(_recv_exactly(conn, _TOKEN_BYTES) or b"", self.token):
                return
            reader = _FrameReader()
            while data := conn.recv(_RECV_BYTES):
                for variant, rows in reader.feed(data):
                    try:
                        reply: tuple[bool, Any] = (True, self._handler(variant, rows))
                    except Exception as exc:
                        reply = (False, _picklable(exc))
                    conn.sendall(b"".join(encode(reply)))  # one segment: replies are rows × classes

    def close(self) -> None:
        self._listener.close()


def _picklable(exc: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _recv_exactly(conn: socket.socket, n: int) -> bytearray | None:
    """`n` bytes (the token: nothing of the frames after it), or None when the peer closed first."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return buf


# ---- the front end's side -------------------------------------------------------------------


class StreamChannel(asyncio.Protocol):
    """The front end's connection to one worker's `StreamServer`. Event loop only.

    `call` writes a frame and waits for its reply; `on_lost(reason)` runs once when the connection
    drops without `close` (the worker died): every waiting call raises `ChannelBroken`."""

    def __init__(self, on_lost: Callable[[str], object]) -> None:
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._reader = _FrameReader()
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._error: ChannelBroken | None = None
        self.closed = False

    @classmethod
    async def open(
        cls, address: tuple[str, int], token: bytes, on_lost: Callable[[str], object], timeout_s: float
    ) -> StreamChannel:
        loop = asyncio.get_running_loop()
        _, channel = await asyncio.wait_for(loop.create_connection(lambda: cls(on_lost), *address), timeout_s)
        assert channel._transport is not None
        channel._transport.write(token)
        return channel

    async def call(self, variant: str, rows: np.ndarray, timeout_s: float) -> Any:
        """`handler(variant, rows)` on the worker: its return value; `WorkerRaised` for an error
        raised there; `ChannelBroken` once the connection is gone; `ChannelTimeout` after
        `timeout_s` (the batch still runs; its late reply is dropped)."""
        if self._error is not None:
            raise self._error
        assert self._transport is not None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append(future)
        frame = encode((variant, rows))
        if rows.nbytes <= _JOIN_MAX_BYTES:  # one syscall: uvloop's writelines makes one per piece
            self._transport.write(b"".join(frame))
        else:  # an image batch: not worth a copy of its megabytes
            self._transport.writelines(frame)
        # A timer, not asyncio.wait_for, which wraps every call in a task of its own.
        timer = loop.call_later(timeout_s, _expire, future, timeout_s)
        try:
            ok, value = await future
        finally:
            timer.cancel()
        if not ok:
            raise WorkerRaised(value)
        return value

    def close(self, reason: str = "the channel was closed") -> None:
        """Drop the connection; waiting calls raise `ChannelBroken(reason)`."""
        self.closed = True
        if self._transport is not None:
            self._transport.close()
        self._fail(ChannelBroken(reason))

    # ---- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport; they have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        for reply in self._reader.feed(data):
            future = self._waiting.popleft()  # replies come in request order
            if not future.done():  # else its caller timed out: the late reply is dropped
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        reason = f"the connection to the worker dropped ({exc or 'closed by the worker'})"
        self._fail(ChannelBroken(reason))
        with contextlib.suppress(Exception):
            self._on_lost(reason)

    def _fail(self, error: ChannelBroken) -> None:
        if self._error is None:
            self._error = error
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(self._error)


def _expire(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(ChannelTimeout(f"no result within {timeout_s:g} s"))
