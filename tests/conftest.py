"""Shared fixtures: settings on a temporary data dir, the Redis URL for tests, and `small_zoo`
(here rather than in tests/integration, so the browser tests in tests/e2e share its one build)."""

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


@pytest.fixture(scope="session")
def small_zoo(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A data dir with a SQLite store holding a fast subset of the built-in zoo (`zoo.SMALL_ZOO`:
    digits logistic regression, sklearn MLP and Keras MLP; breast-cancer logistic regression),
    registered through the public registration path once per test session (seconds).

    Shared by every test of the session: treat it as read-only, or copy the data dir first."""
    from infaas.store import open_store
    from profiler.process import ProcessProfiler
    from variants import zoo

    settings = Settings(data_dir=tmp_path_factory.mktemp("small-zoo") / "data", admin_key="admin-test-key")
    store = open_store(settings)
    try:
        # Quick profiles (seconds per variant, each in its own worker process) so the query path
        # finds measured latency, accuracy and cost for every variant.
        profiler = ProcessProfiler(settings, store, quick=True)
        zoo.install(settings, store, only=zoo.SMALL_ZOO, profiler=profiler)
    finally:
        store.close()
    return settings
