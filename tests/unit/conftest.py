"""Unit tests are pure: an autouse fixture fails any test that starts Ray or opens a network socket.

Unix-domain sockets and sockets wrapping an existing descriptor stay allowed: asyncio's event loop
uses a socketpair internally for its self-pipe.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

_RealSocket = socket.socket


class _GuardedSocket(_RealSocket):
    def __init__(self, family: int = -1, *args: Any, **kwargs: Any) -> None:
        fileno = kwargs.get("fileno", args[2] if len(args) > 2 else None)
        if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
            raise AssertionError("unit tests must not open network sockets; move this to tests/integration")
        super().__init__(family, *args, **kwargs)


def _no_connection(*_a: Any, **_k: Any) -> None:
    raise AssertionError("unit tests must not open network connections; move this to tests/integration")


@pytest.fixture(autouse=True)
def _no_ray_no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(socket, "socket", _GuardedSocket)
    monkeypatch.setattr(socket, "create_connection", _no_connection)
    ray = sys.modules.get("ray")
    if ray is not None:
        monkeypatch.setattr(ray, "init", _no_connection)
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        pytest.fail("a unit test started Ray; move it to tests/integration")
