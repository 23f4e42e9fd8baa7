"""Shared fixtures: settings on a temporary data dir, and the Redis URL for tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from infaas.settings import Settings


def pytest_configure(config: pytest.Config) -> None:
    # TensorFlow logs at import; keep test output readable. Tests are the only code that may
    # touch the environment, and only for third-party libraries.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", admin_key="admin-test-key")


def redis_url_for_tests() -> str:
    return os.environ.get("INFAAS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def redis_required() -> bool:
    return os.environ.get("INFAAS_REQUIRE_REDIS", "") not in ("", "0", "false")


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A reachable Redis URL; skips when none runs, fails instead under INFAAS_REQUIRE_REDIS=1 (CI)."""
    import redis

    url = redis_url_for_tests()
    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError as exc:
        if redis_required():
            pytest.fail(f"INFAAS_REQUIRE_REDIS is set but Redis at {url} is unreachable: {exc}")
        pytest.skip(f"no Redis at {url} (set INFAAS_REQUIRE_REDIS=1 to make this a failure)")
    yield url
