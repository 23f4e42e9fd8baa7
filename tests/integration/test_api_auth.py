"""Keys, roles and error bodies over real HTTP."""

from __future__ import annotations

import time

from tests.integration.conftest import LiveServer


def test_health_needs_no_key(live_server: LiveServer) -> None:
    with live_server.client() as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        r = c.get("/readyz")
        assert r.status_code == 200 and r.json()["ready"] is True


def test_v1_routes_need_a_key_and_the_right_role(live_server: LiveServer) -> None:
    with live_server.client() as c:
        r = c.get("/v1/admin/tenants")
        assert r.status_code == 401
        assert r.json()["error"] == "unauthenticated"
        assert r.headers["www-authenticate"] == "Bearer"
    with live_server.client("not-a-key") as c:
        assert c.get("/v1/admin/tenants").status_code == 401
    for role in ("tenant", "owner"):  # an owner key manages its tasks' models, not the service
        key = live_server.new_tenant(f"acme-{role}", role=role)
        with live_server.client(key) as c:
            r = c.get("/v1/admin/tenants")
            assert r.status_code == 403
            assert set(r.json()) >= {"error", "detail"}
            assert c.post("/v1/admin/tenants", json={"name": "x", "role": "owner"}).status_code == 403


def test_tenant_key_shown_once_and_revocable(live_server: LiveServer) -> None:
    key = live_server.new_tenant("acme")
    with live_server.client(live_server.admin_key) as admin:
        listed = admin.get("/v1/admin/tenants").json()
        assert [t["name"] for t in listed] == ["acme"]
        assert key not in str(listed)
        assert admin.post("/v1/admin/tenants", json={"name": "acme"}).status_code == 409
        assert admin.delete("/v1/admin/tenants/acme").status_code == 204
        assert admin.delete("/v1/admin/tenants/acme").status_code == 404
    with live_server.client(key) as c:
        assert c.get("/v1/admin/tenants").status_code == 401


def test_bad_requests_get_json_errors(live_server: LiveServer) -> None:
    with live_server.client(live_server.admin_key) as c:
        r = c.post("/v1/admin/tenants", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"] == "invalid_input"
        r = c.post("/v1/admin/tenants", json={"name": "Bad Name!"})
        assert r.status_code == 400 and "name" in r.json()["detail"]
        r = c.get("/v1/no-such-route")
        assert r.status_code == 404 and r.json()["error"] == "not_found"
        huge = b"x" * (17 * 1024 * 1024)
        r = c.post("/v1/admin/tenants", content=huge, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    with live_server.client() as c:
        assert c.get("/healthz").status_code == 200  # still serving


def test_a_key_expires_and_its_last_use_is_shown(live_server: LiveServer) -> None:
    with live_server.client(live_server.admin_key) as admin:
        r = admin.post("/v1/admin/tenants", json={"name": "brief", "expires_in_s": 1.5})
        assert r.status_code == 201, r.text
        created = r.json()
        assert created["expires_at_s"] > time.time()
        assert admin.post("/v1/admin/tenants", json={"name": "x", "expires_in_s": -1}).status_code == 400
        with live_server.client(created["api_key"]) as c:
            assert c.get("/v1/tasks").status_code == 200
            for _ in range(50):  # the last use is written in the background, off the request
                [listed] = [t for t in admin.get("/v1/admin/tenants").json() if t["name"] == "brief"]
                if listed["last_used_s"] is not None:
                    break
                time.sleep(0.02)
            assert listed["expires_at_s"] == created["expires_at_s"]
            assert listed["last_used_s"] is not None and abs(listed["last_used_s"] - time.time()) < 60
            time.sleep(max(0.0, created["expires_at_s"] - time.time()) + 0.1)
            r = c.get("/v1/tasks")  # cached a moment ago, and refused all the same
            assert r.status_code == 401 and "expired" in r.json()["detail"]
