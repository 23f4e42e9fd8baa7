"""The worker batch stream over a real loopback socket: a `StreamServer` in this process serving a
plain function, and the front end's `StreamChannel` on an asyncio loop."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from infaas.errors import InvalidInput
from infaas.workers.stream import (
    ChannelBroken,
    ChannelTimeout,
    StreamChannel,
    StreamServer,
    WorkerRaised,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[pytest.param(False, id="asyncio"), pytest.param(True, id="uvloop")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    # The service runs on uvloop, whose transports are not asyncio's classes.
    return "asyncio", {"use_uvloop": request.param}


def _handler(variant: str, rows: np.ndarray) -> Any:
    if variant == "missing":
        return None
    if variant == "bad":
        raise InvalidInput("rows have the wrong width", expected=64)
    if variant.startswith("sleep:"):
        time.sleep(float(variant.removeprefix("sleep:")))
    return rows * 2


async def _open(server: StreamServer, lost: list[str], token: bytes | None = None) -> StreamChannel:
    return await StreamChannel.open(server.address, token or server.token, lost.append, 5.0)


async def test_many_batches_in_flight_come_back_each_with_its_own_rows() -> None:
    server = StreamServer(_handler, "127.0.0.1")
    lost: list[str] = []
    channel = await _open(server, lost)
    try:
        batches = [np.full((i + 1, 64), i, dtype=np.float32) for i in range(50)]
        outs = await asyncio.gather(*(channel.call("v", b, 5.0) for b in batches))
        for batch, out in zip(batches, outs, strict=True):
            np.testing.assert_array_equal(out, batch * 2)
            assert out.flags.writeable  # callers may split or scale outputs in place
        assert await channel.call("missing", batches[0], 5.0) is None
        big = np.arange(3 * 1024 * 1024, dtype=np.float32).reshape(-1, 1024)  # 12 MB: written in pieces
        np.testing.assert_array_equal(await channel.call("v", big, 30.0), big * 2)
    finally:
        channel.close()
        server.close()
    assert lost == []  # closing it ourselves is not a loss


async def test_an_error_in_the_worker_comes_back_as_itself_and_the_channel_keeps_serving() -> None:
    server = StreamServer(_handler, "127.0.0.1")
    channel = await _open(server, [])
    try:
        with pytest.raises(WorkerRaised) as raised:
            await channel.call("bad", np.ones((1, 3), dtype=np.float32), 5.0)
        assert isinstance(raised.value.cause, InvalidInput)
        assert raised.value.cause.fields == {"expected": 64}
        out = await channel.call("v", np.ones((2, 2), dtype=np.float32), 5.0)
        np.testing.assert_array_equal(out, np.full((2, 2), 2.0))
    finally:
        channel.close()
        server.close()


async def test_a_late_reply_goes_to_no_one_and_the_next_call_gets_its_own() -> None:
    server = StreamServer(_handler, "127.0.0.1")
    channel = await _open(server, [])
    try:
        with pytest.raises(ChannelTimeout):
            await channel.call("sleep:0.3", np.zeros((1, 1), dtype=np.float32), 0.05)
        out = await channel.call("v", np.full((1, 1), 7.0, dtype=np.float32), 5.0)
        assert out.tolist() == [[14.0]]
    finally:
        channel.close()
        server.close()


async def test_a_wrong_token_is_refused_and_reported_as_a_lost_connection() -> None:
    server = StreamServer(_handler, "127.0.0.1")
    lost: list[str] = []
    channel = await _open(server, lost, token=b"x" * 16)
    try:
        with pytest.raises(ChannelBroken):
            await channel.call("v", np.ones((1, 1), dtype=np.float32), 5.0)
        assert len(lost) == 1 and "dropped" in lost[0]
    finally:
        channel.close()
        server.close()


def _dying_server(after: int) -> tuple[tuple[str, int], Callable[[], None]]:
    """A peer that reads the token and `after` bytes of frames, then closes: a worker killed
    with batches in flight."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        got = 0
        while got < 16 + after and (chunk := conn.recv(65536)):
            got += len(chunk)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[:2], listener.close


async def test_a_peer_that_dies_fails_every_waiting_call_and_every_later_one() -> None:
    address, stop = _dying_server(after=1)
    lost: list[str] = []
    channel = await StreamChannel.open(address, b"t" * 16, lost.append, 5.0)
    try:
        calls = [channel.call("v", np.ones((4, 4), dtype=np.float32), 5.0) for _ in range(5)]
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5.0)
        assert all(isinstance(r, ChannelBroken) for r in results), results
        assert len(lost) == 1
        with pytest.raises(ChannelBroken):
            await channel.call("v", np.ones((1, 1), dtype=np.float32), 5.0)
    finally:
        channel.close()
        stop()
