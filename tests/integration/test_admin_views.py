"""Admin views over real HTTP, a real SQLite store and real /v1/query traffic: roles, tenant
isolation, the usage API against the responses, /metrics against the usage API, the fleet view."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from infaas.cli import app
from infaas.metrics import OTHER
from infaas.settings import Settings
from infaas.store import open_store
from infaas.types import UsageDelta, UsageKey
from tests.integration.conftest import LiveServer
from tests.integration.traffic import send_traffic, wait_for_usage, zoo_server

ADMIN_ROUTES = ("/v1/admin/usage", "/v1/admin/fleet", "/metrics")


def test_tenant_key_gets_403_on_admin_routes_and_sees_only_its_own_usage(live_server: LiveServer) -> None:
    key_a = live_server.new_tenant("acme")
    live_server.new_tenant("beta")
    minute = int(time.time() // 60)
    store = live_server.app.state.store
    store.add_usage(
        [
            UsageDelta(
                key=UsageKey(tenant=t, task="digits", variant="v1", minute=minute - back),
                counters={"queries": q, "cost_pusd": c, "slo_met": q, "lat_le_2": q},
            )
            for t, q, c, back in [("acme", 3, 300, 0), ("acme", 2, 7, 5), ("beta", 50, 10**9, 0)]
        ]
    )
    window = {"from": str((minute - 30) * 60), "to": str((minute + 1) * 60), "step": "10m"}
    with live_server.client(key_a) as tenant:
        for path in ADMIN_ROUTES:
            r = tenant.get(path)
            assert r.status_code == 403, path
            assert r.json()["error"] == "forbidden"
        own = tenant.get("/v1/usage", params=window)
        assert own.status_code == 200, own.text
        assert tenant.get("/v1/usage", params={"step": "90s"}).status_code == 400
    mine = own.json()
    assert [t["tenant"] for t in mine["tenants"]] == ["acme"]
    assert mine["totals"]["queries"] == 5 and mine["totals"]["cost_pusd"] == 307
    assert "beta" not in own.text
    with live_server.client(live_server.admin_key) as admin:
        assert admin.get("/v1/admin/usage", params=window | {"tenant": "acme"}).json() == mine
        everyone = admin.get("/v1/admin/usage", params=window).json()
        assert [t["tenant"] for t in everyone["tenants"]] == ["acme", "beta"]
        assert everyone["totals"]["queries"] == 55
        assert admin.get("/v1/usage").status_code == 403  # the admin is not a tenant
    with live_server.client() as anonymous:
        for path in (*ADMIN_ROUTES, "/v1/usage"):
            assert anonymous.get(path).status_code == 401, path


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def test_usage_and_metrics_match_the_responses_of_real_traffic(small_zoo: Settings, tmp_path: Path) -> None:
    with zoo_server(small_zoo, tmp_path) as server:
        keys = {"acme": server.new_tenant("acme"), "beta": server.new_tenant("beta")}
        sent = send_traffic(server, keys, {"acme": 24, "beta": 9})
        report = wait_for_usage(server, expected_queries=33)
        with server.client(server.admin_key) as admin:
            metrics = admin.get("/metrics")
            fleet = admin.get("/v1/admin/fleet").json()
        cli = CliRunner()
        as_admin = cli.invoke(app, ["usage", "--url", server.url, "--key", server.admin_key, "--since", "1h"])
        as_acme = cli.invoke(app, ["usage", "--url", server.url, "--key", keys["acme"]])
        acme_asks_for_beta = cli.invoke(
            app, ["usage", "--url", server.url, "--key", keys["acme"], "--tenant", "beta"]
        )
    assert metrics.headers["content-type"].startswith("text/plain")

    # The usage API against what each response said it charged (exact integer pico-dollars).
    tenants = {t["tenant"]: t for t in report["tenants"]}
    assert set(tenants) == {"acme", "beta"}
    for name in ("acme", "beta"):
        totals = tenants[name]["totals"]
        assert totals["queries"] == sent.queries[name]
        assert totals["cost_pusd"] == sent.cost_pusd[name]
        assert totals["cost_pusd"] > 0
        assert sum(p["stats"]["queries"] for p in tenants[name]["series"]) == sent.queries[name]
        by_variant = {v["variant"]: v["stats"]["queries"] for v in tenants[name]["by_variant"]}
        assert by_variant == {v: n for (t, v), n in sent.by_variant.items() if t == name}
        assert {t["task"] for t in tenants[name]["by_task"]} == {
            "digits-classification",
            "breast-cancer-classification",
        }
        assert totals["p99_ms"] is not None and totals["slo_attainment"] is not None

    # `infaas usage` prints the same numbers: every tenant for the admin, its own for a tenant.
    assert as_admin.exit_code == 0, as_admin.output
    for name in ("acme", "beta"):
        line = next(ln for ln in as_admin.output.splitlines() if f" {name} " in ln)
        assert f" {sent.queries[name]} " in line
        assert f"{tenants[name]['totals']['cost_usd']:.3e}" in line
    assert "all tenants" in as_admin.output and "cost by variant" in as_admin.output
    assert as_acme.exit_code == 0, as_acme.output
    assert " acme " in as_acme.output and "beta" not in as_acme.output
    assert acme_asks_for_beta.exit_code == 1 and "cannot read 'beta'" in acme_asks_for_beta.output

    # /metrics parses, and its counters match the usage API.
    samples = metric_samples(metrics.text)
    answered: dict[str, float] = defaultdict(float)
    answered_by_variant: dict[tuple[str, str], float] = defaultdict(float)
    failed: dict[tuple[str, str, str], float] = defaultdict(float)
    cost_usd: dict[str, float] = {}
    for name, labels, value in samples:
        if name == "infaas_requests_total":
            if labels["outcome"] in ("ok", "slo_missed"):
                answered[labels["tenant"]] += value
                answered_by_variant[(labels["tenant"], labels["variant"])] += value
            else:
                failed[(labels["tenant"], labels["task"], labels["outcome"])] += value
        elif name == "infaas_cost_usd_total":
            cost_usd[labels["tenant"]] = value
    for name in ("acme", "beta"):
        assert answered[name] == tenants[name]["totals"]["queries"]
        assert cost_usd[name] == tenants[name]["totals"]["cost_usd"]
        for v in tenants[name]["by_variant"]:
            assert answered_by_variant[(name, v["variant"])] == v["stats"]["queries"]
        # The failed query's made-up task name became no label of its own.
        assert failed[(name, OTHER, "task_not_found")] == 1
    assert not any("no-such-task" in str(labels) for _, labels, _ in samples)
    latency_count = sum(v for n, labels, v in samples if n == "infaas_request_latency_seconds_count")
    assert latency_count == 33 + 2
    assert any(n == "infaas_worker_loaded_variants" and v >= 1 for n, _, v in samples)
    assert any(n == "infaas_batch_size_rows_count" for n, _, _ in samples)

    # The fleet view: the in-process worker, what it loaded and why, and where tasks were routed.
    assert [w["worker_id"] for w in fleet["workers"]] == ["inprocess-0"]
    loaded = set(fleet["workers"][0]["loaded"])
    assert {v for (_, v) in sent.by_variant} <= loaded
    kinds = {e["kind"] for e in fleet["events"]}
    assert {"load", "route"} <= kinds
    assert all(e["reason"] for e in fleet["events"])
    routed = {e["variant"] for e in fleet["events"] if e["kind"] == "route"}
    assert routed <= {v for (_, v) in sent.by_variant}
    assert [e["at_s"] for e in fleet["events"]] == sorted((e["at_s"] for e in fleet["events"]), reverse=True)


def test_charged_plus_reserved_is_what_the_fleet_cost(small_zoo: Settings, tmp_path: Path) -> None:
    """Through the real service: once it stops, the usage holds, over every tenant (the operator,
    `admin`, included: floors nobody's traffic explains), charges + reserved = the fleet's cost
    that its autoscaler integrated, to the pico-dollar; the tenant with more traffic carries more."""
    with zoo_server(small_zoo, tmp_path) as server:
        keys = {"acme": server.new_tenant("acme"), "beta": server.new_tenant("beta")}
        send_traffic(server, keys, {"acme": 30, "beta": 6})
        wait_for_usage(server, expected_queries=36)
        time.sleep(2.5)  # rounds close the intervals that hold the last charges
        with server.client(server.admin_key) as admin:
            live = admin.get("/v1/admin/usage").json()
            metrics = admin.get("/metrics").text
        autoscaler = server.app.state.autoscaler
    fleet_pusd = sum(autoscaler.cost.pusd.values())
    store = open_store(server.app.state.settings)
    try:
        rows = store.usage()
    finally:
        store.close()
    charged = sum(r.counters.get("cost_pusd", 0) for r in rows)
    reserved: dict[str, int] = defaultdict(int)
    for r in rows:
        reserved[r.key.tenant] += r.counters.get("reserved_pusd", 0)
    assert fleet_pusd > 0 and charged > 0
    assert charged + sum(reserved.values()) == fleet_pusd
    assert reserved["acme"] > reserved["beta"] > 0
    shown = {t["tenant"]: t["totals"]["reserved_pusd"] for t in live["tenants"]}
    assert shown["acme"] > 0 and shown["beta"] > 0  # the API shows it while the service runs
    gauges = {
        labels["tenant"]: v for n, labels, v in metric_samples(metrics) if n == "infaas_reserved_cost_usd"
    }
    assert gauges["acme"] > 0 and gauges["beta"] > 0  # and /metrics


def test_a_tenant_gets_what_other_targets_would_have_cost(small_zoo: Settings, tmp_path: Path) -> None:
    """`GET /v1/usage/advice`: the caller's own recent queries replayed at other targets."""
    with zoo_server(small_zoo, tmp_path) as server:
        keys = {"acme": server.new_tenant("acme"), "beta": server.new_tenant("beta")}
        send_traffic(server, keys, {"acme": 20, "beta": 4})
        with server.client(keys["acme"]) as acme:
            r = acme.get("/v1/usage/advice")
            again = acme.get("/v1/usage/advice")  # cached: the same answer, no new simulation
            assert acme.get("/v1/usage/advice", params={"tenant": "beta"}).status_code == 403
        with server.client(server.admin_key) as admin:
            assert admin.get("/v1/usage/advice").status_code == 403  # whose? say ?tenant=
            beta = admin.get("/v1/usage/advice", params={"tenant": "beta"})
    assert r.status_code == 200, r.text
    advice = r.json()
    assert again.json() == advice
    assert advice["tenant"] == "acme" and advice["sampled_queries"] > 0
    assert len(advice["points"]) == 8 and advice["summary"]
    base = next(p for p in advice["points"] if p["latency_factor"] == 1.0 and p["accuracy_delta"] == 0.0)
    assert base["queries"] == advice["sampled_queries"] and base["cost_change"] == 0.0
    assert sum(base["variants"].values()) > 0 and base["charged_pusd"] > 0
    assert beta.status_code == 200 and beta.json()["tenant"] == "beta"
