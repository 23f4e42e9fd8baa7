"""The model lifecycle through the real service (`infaas serve` with Ray, over HTTP): who may
register and manage what, versions, a canary's exact share, rollback, the accuracy guard, a promote
under steady open-loop load, and delete."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from infaas import cli
from infaas.settings import Settings
from infaas.store import open_store
from tests import tiny_models
from tests.integration.conftest import Served, serve_process
from tests.integration.load import OpenLoopLoad

pytestmark = [pytest.mark.ray, pytest.mark.slow]

X, Y = tiny_models.digits(300)
ROW = X[0].tolist()


def good_model(seed: int, hidden: int = 512, layers: int = 2) -> bytes:
    """A real classifier (fitted output layer on random ReLU features)."""
    return tiny_models.mlp_onnx(hidden=hidden, layers=layers, seed=seed, x=X, y=Y)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("versions")
    empty = Settings(data_dir=root / "empty")
    empty.data_dir.mkdir()
    with serve_process(empty, root / "run", env={"INFAAS_PROFILE_QUICK": "1"}) as s:
        yield s


def register(
    served: Served, key: str, name: str, task: str, model: bytes, *, new_version: bool = False
) -> httpx.Response:
    files: dict[str, Any] = {
        "model": (f"{name}.onnx", model),
        "validation": ("val.npz", tiny_models.validation_bytes(X, Y)),
    }
    meta = {"name": name, "task": task, "new_version": new_version}
    with served.client(key) as http:
        return http.post("/v1/models", files=files, data={"metadata": json.dumps(meta)}, timeout=600)


def query(http: httpx.Client, task: str, **pins: str) -> dict[str, Any]:
    r = http.post("/v1/query", json={"task": task, "inputs": [ROW], "latency_ms": 1000, **pins})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_only_the_admin_and_the_task_owners_register_and_manage(served: Served) -> None:
    alice = served.new_tenant("alice", role="owner")
    bob = served.new_tenant("bob", role="owner")
    tina = served.new_tenant("tina")
    assert register(served, tina, "net", "roles", good_model(0)).status_code == 403  # tenants query
    r = register(served, alice, "net", "roles", good_model(0))
    assert r.status_code == 201, r.text
    assert r.json()["task"]["owners"] == ["alice"]
    # Another owner may not slip a model into alice's task (it would answer her tenants' queries).
    r = register(served, bob, "cheap", "roles", tiny_models.linear_onnx(x=X, y=Y))
    assert r.status_code == 403 and "belongs to other owners" in r.json()["detail"]
    r = register(served, alice, "net", "roles", good_model(1))
    assert r.status_code == 409 and "new_version" in r.json()["detail"]
    assert register(served, alice, "net", "roles", good_model(1), new_version=True).status_code == 201
    changes = [
        ("PUT", "/v1/models/net/canary", {"version": 2, "share": 0.5}),
        ("POST", "/v1/models/net/promote", {}),
        ("POST", "/v1/models/net/rollback", None),
        ("DELETE", "/v1/models/net/canary", None),
        ("DELETE", "/v1/models/net/versions/2", None),
        ("DELETE", "/v1/models/net", None),
    ]
    for key in (tina, bob):
        with served.client(key) as http:
            assert query(http, "roles")["variant"].startswith("net/")  # both may query
            assert http.get("/v1/models/net/versions").status_code == 200
            for method, path, body in changes:
                r = http.request(method, path, json=body)
                assert r.status_code == 403, (method, path, r.text)
            assert http.post("/v1/admin/tasks/roles/owners", json={"owner": "bob"}).status_code == 403
    with served.client(served.admin_key) as admin:
        r = admin.post("/v1/admin/tasks/roles/owners", json={"owner": "bob"})
        assert r.status_code == 200 and r.json()["owners"] == ["alice", "bob"]
    assert register(served, bob, "cheap", "roles", tiny_models.linear_onnx(x=X, y=Y)).status_code == 201
    with served.client(bob) as http:  # granted: bob manages the task's architectures too
        r = http.put("/v1/models/net/canary", json={"version": 2, "share": 0.5})
        assert r.status_code == 200, r.text


def test_canary_share_rollback_and_the_accuracy_guard(served: Served) -> None:
    owner = served.new_tenant("carol", role="owner")
    assert register(served, owner, "clf", "canary", good_model(0)).status_code == 201
    r = register(served, owner, "clf", "canary", good_model(1), new_version=True)
    assert r.status_code == 201 and r.json()["architecture"]["name"] == "clf@2"
    with served.client(owner) as http:
        view = http.get("/v1/models/clf/versions").json()
        assert [(v["version"], v["state"]) for v in view["versions"]] == [(1, "serving"), (2, "ready")]
        assert {query(http, "canary")["variant"].split("/")[0] for _ in range(20)} == {"clf"}
        r = http.put("/v1/models/clf/canary", json={"version": 2, "share": 0.2})
        assert r.status_code == 200, r.text
        assert r.json()["versions"][1]["loaded"]  # warmed before it takes traffic
        picks = [query(http, "canary")["variant"].split("/")[0] for _ in range(1000)]
        share = picks.count("clf@2") / len(picks)
        assert 0.17 <= share <= 0.23, share
        view = http.get("/v1/models/clf/versions").json()
        assert view["observed_queries"] == 1000 and view["observed_canary_share"] == pytest.approx(share)
        assert query(http, "canary", architecture="clf@canary")["variant"].startswith("clf@2/")
        assert query(http, "canary", architecture="clf@1")["variant"].startswith("clf/")

        r = http.post("/v1/models/clf/promote", json={})
        assert r.status_code == 200 and r.json()["stable"] == 2, r.text
        assert query(http, "canary")["variant"].startswith("clf@2/")  # the very next query
        r = http.post("/v1/models/clf/rollback")
        assert r.status_code == 200 and r.json()["stable"] == 1, r.text
        assert query(http, "canary")["variant"].startswith("clf/")  # the very next query
        states = {v["version"]: v["state"] for v in r.json()["versions"]}
        assert states == {1: "serving", 2: "retired"}

        # A much less accurate version cannot be promoted without the admin's force.
        bad = tiny_models.linear_onnx(seed=5)  # random weights: ~10 % accurate
        assert register(served, owner, "clf", "canary", bad, new_version=True).status_code == 201
        assert http.put("/v1/models/clf/canary", json={"version": 3, "share": 0.1}).status_code == 200
        r = http.post("/v1/models/clf/promote", json={})
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["candidate_accuracy"] < body["stable_accuracy"] - body["tolerance"]
        assert "accuracy" in body["detail"]
        assert http.post("/v1/models/clf/promote", json={"force": True}).status_code == 403
    with served.client(served.admin_key) as admin:
        r = admin.post("/v1/models/clf/promote", json={"force": True})
        assert r.status_code == 200 and r.json()["stable"] == 3, r.text


def test_promote_under_steady_load_has_no_error_and_holds_the_slo(served: Served) -> None:
    owner = served.new_tenant("dave", role="owner")
    # 3×1024: compute-bound (~0.1 ms a row), so its variants run on Ray workers, where a swap
    # means loading the new version on a worker process while the old one serves.
    big = {"hidden": 1024, "layers": 3}
    assert register(served, owner, "live", "steady", good_model(2, **big)).status_code == 201
    v2 = good_model(3, **big)
    assert register(served, owner, "live", "steady", v2, new_version=True).status_code == 201
    slo_ms = 250.0
    body = {"task": "steady", "inputs": [ROW], "latency_ms": slo_ms}
    load = OpenLoopLoad(f"{served.url}/v1/query", owner, body, rate_per_s=40).start()
    try:
        time.sleep(4.0)
        with served.client(owner) as http:
            switch_s = time.monotonic()
            r = http.post("/v1/models/live/promote", json={"version": 2}, timeout=120)
            switched_s = time.monotonic()
            assert r.status_code == 200, r.text
        time.sleep(5.0)
    finally:
        result = load.stop()
    around = [o for o in result.outcomes if switch_s - 5.0 <= o.sent_s <= switched_s + 5.0]
    statuses = {o.status for o in around}
    latencies = [float(o.body["latency_ms"]) for o in around if o.status == 200 and o.body]
    p99 = float(np.percentile(latencies, 99))
    after = [o.body["variant"] for o in result.outcomes if o.sent_s > switched_s + 0.5 and o.status == 200]
    print(f"\npromote under load: {len(around)} queries around the switch, p99 {p99:.1f} ms, {statuses}")
    assert statuses == {200}, [o.body for o in around if o.status != 200][:3]
    assert p99 <= slo_ms
    assert after and all(v.startswith("live@2/") for v in after)
    # The old version drains, then leaves the workers; the new one is on Ray workers.
    deadline = time.monotonic() + 15.0
    with served.client(served.admin_key) as admin:
        while True:
            loaded = [v for w in admin.get("/v1/admin/fleet").json()["workers"] for v in w["loaded"]]
            if not any(v.startswith("live/") for v in loaded) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert not any(v.startswith("live/") for v in loaded), loaded
    assert any(v.startswith("live@2/") for v in loaded), loaded

    # A rollback under the same load, to a version that is no longer loaded: it is loaded and
    # warmed before the switch, so nobody waits on the load.
    load = OpenLoopLoad(f"{served.url}/v1/query", owner, body, rate_per_s=40).start()
    try:
        time.sleep(2.0)
        with served.client(owner) as http:
            back_s = time.monotonic()
            r = http.post("/v1/models/live/rollback", timeout=120)
            back_done_s = time.monotonic()
            assert r.status_code == 200 and r.json()["stable"] == 1, r.text
        time.sleep(3.0)
    finally:
        result = load.stop()
    around = [o for o in result.outcomes if o.sent_s >= back_s - 2.0]
    latencies = [float(o.body["latency_ms"]) for o in around if o.status == 200 and o.body]
    p99 = float(np.percentile(latencies, 99))
    print(f"rollback under load ({back_done_s - back_s:.2f} s to reload and switch): p99 {p99:.1f} ms")
    assert {o.status for o in around} == {200}, [o.body for o in around if o.status != 200][:3]
    assert p99 <= slo_ms
    after = [o.body["variant"] for o in result.outcomes if o.sent_s > back_done_s + 0.5 and o.status == 200]
    assert after and all(v.startswith("live/") for v in after)


def test_delete_makes_a_version_unroutable_removes_its_artifacts_and_keeps_usage(served: Served) -> None:
    owner = served.new_tenant("erin", role="owner")
    assert register(served, owner, "gone", "deleting", good_model(4)).status_code == 201
    assert register(served, owner, "gone", "deleting", good_model(5), new_version=True).status_code == 201
    with served.client(owner) as http:
        answered = query(http, "deleting", architecture="gone@2")["variant"]
        assert http.delete("/v1/models/gone/versions/1").status_code == 409  # the stable one
        store = open_store(served.settings)
        try:
            doomed = [served.settings.artifacts_dir / v.artifact for v in store.list_variants("gone@2")]
        finally:
            store.close()
        assert doomed and all(p.exists() for p in doomed)
        r = http.delete("/v1/models/gone/versions/2")
        assert r.status_code == 200 and r.json()["versions"] == [2], r.text
        for pins in ({"architecture": "gone@2"}, {"variant": answered}):
            r = http.post("/v1/query", json={"task": "deleting", "inputs": [ROW], "latency_ms": 1000, **pins})
            assert r.status_code == 404, r.text
        assert not any(p.exists() for p in doomed)
        assert query(http, "deleting")["variant"].startswith("gone/")  # v1 still serves
        assert [v["version"] for v in http.get("/v1/models/gone/versions").json()["versions"]] == [1]
    # The CLI speaks to the same routes.
    runner = CliRunner()
    shown = runner.invoke(cli.app, ["versions", "gone", "--url", served.url, "--key", owner])
    assert shown.exit_code == 0 and "versions of gone" in shown.output and "serving" in shown.output
    refused = runner.invoke(cli.app, ["rollback", "gone", "--url", served.url, "--key", owner])
    assert refused.exit_code == 1 and "no earlier stable version" in refused.output
    # Usage stays (flushed to the store every 0.2 s here: wait for the flush, not for luck).
    deadline = time.monotonic() + 10.0
    with served.client(served.admin_key) as admin:
        while True:
            usage = admin.get("/v1/admin/usage").json()
            used = {v["variant"] for v in usage["by_variant"]}
            if answered in used or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert answered in used, sorted(used)
