"""Scale-out (issue 14): two front ends on a two-node Ray cluster, one Redis, one fleet.

The cluster is two raylets on this machine (`ray.cluster_utils.Cluster`); each front end is
`infaas serve` in its own process joined to it (`INFAAS_RAY_ADDRESS`), with a data directory of its
own. The model is registered through the first front end, whose artifacts directory is then
deleted: from there on every load (on either node, for either front end) fetches the artifact by
hash from Redis, so no process can have read another's data directory. The fast path is off
(`INFAAS_FAST_PATH_MAX_MS=0`) so that every variant runs on the shared workers, and the autoscaler
is off so that the fleet only changes as the test makes it.

Token auth: the cluster and the front ends run as the same user on one host and read the same
``~/.ray/auth_token`` that Ray writes on first start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infaas.settings import Settings
from infaas.store.redis import RedisStore
from infaas.types import COUNTER_COST_PUSD, COUNTER_SLO_MET, COUNTER_SLO_MISSED
from tests import tiny_models
from tests.integration.conftest import Served, serve_process
from tests.integration.load import OpenLoopLoad

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def cluster() -> Iterator[tuple[Any, Any]]:
    """(cluster, the second node): a head and one more raylet, two logical CPUs each."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        second = c.add_node(num_cpus=2)
        c.wait_for_nodes()
        yield c, second
    finally:
        c.shutdown()


def _placement(fe: Served) -> dict[str, tuple[str, ...]]:
    return {w["worker_id"]: tuple(sorted(w["loaded"])) for w in fe.fleet(0)["workers"] if w["alive"]}


def _query(fe: Served, key: str, body: dict[str, Any], answered: list[dict[str, Any]]) -> httpx.Response:
    """POST a query; an answer's body goes to `answered` (what the front ends charged)."""
    with fe.client(key) as http:
        r = http.post("/v1/query", json=body)
    if r.status_code == 200:
        answered.append(r.json())
    return r


def _wait(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def _usage(url: str) -> tuple[int, int]:
    """(answered queries, their cost) as the store has them."""
    store = RedisStore(url)
    try:
        rows = store.usage()
    finally:
        store.close()
    return (
        sum(r.counters.get(COUNTER_SLO_MET, 0) + r.counters.get(COUNTER_SLO_MISSED, 0) for r in rows),
        sum(r.counters.get(COUNTER_COST_PUSD, 0) for r in rows),
    )


def _revoke_across(fe1: Served, fe2: Served) -> float:
    """Revoke a key on `fe1` that `fe2` has cached; seconds until `fe2` refuses it (the change
    log, not the key cache's TTL)."""
    key = fe1.new_tenant("leaving")
    with fe2.client(key) as http:
        assert http.get("/v1/tasks").status_code == 200  # resolved and cached there
        with fe1.client(fe1.admin_key) as admin:
            assert admin.delete("/v1/admin/tenants/leaving").status_code == 204
        revoked_s = time.monotonic()
        while (status := http.get("/v1/tasks").status_code) == 200:
            assert time.monotonic() - revoked_s < 10, "never refused"
        assert status == 401
        return time.monotonic() - revoked_s


def _charged(answered: list[dict[str, Any]]) -> tuple[int, int]:
    return len(answered), sum(int(b["cost_pusd"]) for b in answered)


def test_two_front_ends_share_one_fleet_across_two_nodes(
    cluster: tuple[Any, Any], own_redis: tuple[str, Any], tmp_path: Path
) -> None:
    the_cluster, second = cluster
    redis_url, _ = own_redis
    env = {
        "INFAAS_RAY_ADDRESS": the_cluster.address,
        "INFAAS_REDIS_URL": redis_url,
        "INFAAS_PROFILE_QUICK": "1",
        "INFAAS_FAST_PATH_MAX_MS": "0",
        "INFAAS_AUTOSCALE": "false",
        "INFAAS_MAX_WORKERS_PER_FAMILY": "4",
        "INFAAS_FLEET_SYNC_INTERVAL_S": "0.5",
        "INFAAS_WORKER_CALL_TIMEOUT_S": "20",
    }
    empty = Settings(data_dir=tmp_path / "empty")
    empty.data_dir.mkdir()
    answered: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        fe1 = stack.enter_context(
            serve_process(empty, tmp_path / "fe1", env={**env, "INFAAS_FRONT_END_NAME": "a"})
        )
        fe2 = stack.enter_context(
            serve_process(empty, tmp_path / "fe2", env={**env, "INFAAS_FRONT_END_NAME": "b"})
        )

        # Registered through the first front end; the second one's data dir never gets it.
        owner = fe1.new_tenant("acme", role="owner")
        variants = fe1.register_mlp(owner)
        x, _ = tiny_models.digits(200)
        shutil.rmtree(tmp_path / "fe1" / "data" / "artifacts")
        assert not any((tmp_path / "fe2" / "data").glob("artifacts/**/*.onnx"))
        assert len(variants) >= 2, variants

        # Each variant, pinned, through both front ends: loaded once, serving both.
        row = [x[0].tolist()]
        modelless = {"task": "digits", "inputs": row, "latency_ms": 2000}
        # Read-your-writes: the second front end answers at once (it looks in the store before
        # a 422), not after its next sync.
        r = _query(fe2, owner, modelless, answered)
        assert r.status_code == 200, r.text
        revoked_within_s = _revoke_across(fe1, fe2)
        print(f"\na key revoked on one front end refused by the other after {revoked_within_s:.3f} s")
        assert revoked_within_s <= 1.0
        for name in variants:
            for fe in (fe1, fe2, fe1, fe2):
                pinned = {"task": "digits", "inputs": row, "latency_ms": 5000, "variant": name}
                r = _query(fe, owner, pinned, answered)
                assert r.status_code == 200, (fe.url, r.text)
                assert r.json()["variant"] == name
        one = fe1.fleet(0)
        assert one["replicas"] == {name: 1 for name in variants}, one["replicas"]
        _wait("both front ends to show the same fleet", lambda: _placement(fe1) == _placement(fe2))
        leaders = [f["name"] for f in one["front_ends"] if f["leader"]]
        assert len(one["front_ends"]) == 2 and len(leaders) == 1, one["front_ends"]

        # Usage over both front ends is the sum of their charges, exactly.
        assert _wait("usage to be flushed", lambda: _settled(redis_url)) == _charged(answered)

        # The first front end dies; the second serves on, and takes the autoscaler lease.
        os.kill(fe1.pid, signal.SIGKILL)
        fe1.proc.wait()
        r = _query(fe2, owner, {"task": "digits", "inputs": row, "latency_ms": 5000}, answered)
        assert r.status_code == 200, r.text
        _wait(
            "the second front end to lead alone",
            lambda: (
                [(f["name"].split("@")[0], f["leader"]) for f in fe2.fleet(0)["front_ends"]] == [("b", True)]
            ),
        )

        # The second node dies under open-loop load on a variant it hosts: no request is lost
        # silently, and the variant is placed again on the node that is left.
        on_second = [w for w in fe2.fleet(0)["workers"] if w["node"] == second.node_id and w["loaded"]]
        assert on_second, f"no worker was placed on the second node: {fe2.fleet(0)['workers']}"
        victim = on_second[0]["loaded"][0]
        body = {"task": "digits", "inputs": row, "latency_ms": 10_000, "variant": victim}
        load = OpenLoopLoad(f"{fe2.url}/v1/query", owner, body, rate_per_s=20, timeout_s=60).start()
        time.sleep(1.0)
        the_cluster.remove_node(second)
        time.sleep(4.0)
        result = load.stop()
        statuses = result.statuses()
        assert set(statuses) <= {200, 503}, statuses  # answered, or refused with a reason
        assert statuses[200] >= 0.8 * sum(statuses.values()), statuses
        assert result.outcomes[-1].status == 200, statuses
        answered += result.answered()
        moved = _wait(
            f"{victim} to be placed on the node left",
            lambda: [w for w in fe2.fleet(0)["workers"] if w["alive"] and victim in w["loaded"]],
        )
        assert all(w["node"] != second.node_id for w in moved), moved
        late = [o for o in result.outcomes if o.status == 200 and o.body and not o.body["slo_met"]]
        print(f"\nsecond node killed under load: {dict(statuses)}, {len(late)} answered late; {victim} moved")

    # Every answer is billed once: the first front end's before its kill (flushed, checked
    # above), the second's at its stop.
    assert _usage(redis_url) == _charged(answered)

    # The workers outlive the front ends (detached) until the operator stops the fleet.
    down = [sys.executable, "-c", "from infaas.cli import main; main()", "fleet-down"]
    cluster_env = {**os.environ, "INFAAS_RAY_ADDRESS": the_cluster.address}
    first = subprocess.run(down, env=cluster_env, capture_output=True, text=True, timeout=120)
    again = subprocess.run(down, env=cluster_env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and "stopped 0 worker(s)" not in first.stdout, first.stdout + first.stderr
    assert "stopped 0 worker(s)" in again.stdout, again.stdout + again.stderr


def _settled(redis_url: str) -> tuple[int, int] | None:
    """Usage once two reads a flush interval apart agree (both front ends flushed)."""
    first = _usage(redis_url)
    time.sleep(0.6)
    return first if first == _usage(redis_url) and first[0] > 0 else None
