"""The admin dashboard in headless Chromium (Debian's package, driven by Playwright): a real server,
real queries from two tenants, and the page's tenant table checked against `/v1/admin/usage`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, Response, sync_playwright

from infaas.settings import Settings
from tests.integration.conftest import LiveServer
from tests.integration.traffic import send_traffic, wait_for_usage, zoo_server

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def table_rows(page: Page) -> dict[str, dict[str, str]]:
    rows: dict[str, dict[str, str]] = {}
    for tr in page.locator("#tenants-table tbody tr[data-tenant]").all():
        name = tr.get_attribute("data-tenant")
        assert name is not None
        cost = tr.locator("td.cost")
        rows[name] = {
            "queries": tr.locator("td.queries").inner_text(),
            "split": ",".join(
                tr.locator(f"td.{k}").inner_text() for k in ("slo_met", "slo_missed", "refused", "failed")
            ),
            "cost_text": cost.inner_text(),
            "cost_usd": cost.get_attribute("data-cost-usd") or "",
            "reserved_usd": tr.locator("td.reserved").get_attribute("data-reserved-usd") or "",
        }
    return rows


def assert_table_matches(rows: dict[str, dict[str, str]], report: dict[str, Any]) -> None:
    assert set(rows) == {t["tenant"] for t in report["tenants"]}
    for tenant in report["tenants"]:
        shown = rows[tenant["tenant"]]
        totals = tenant["totals"]
        assert int(shown["queries"]) == totals["queries"]
        split = [totals[k] for k in ("slo_met", "slo_missed", "refused", "failed")]
        assert shown["split"] == ",".join(str(n) for n in split)
        assert float(shown["cost_usd"]) == totals["cost_usd"]
        assert float(shown["reserved_usd"]) == totals["reserved_usd"]  # the fleet's cost beyond charges
        # What a person reads: 4 significant digits of the same amount.
        assert shown["cost_text"].startswith("$")
        assert float(shown["cost_text"][1:]) == pytest.approx(totals["cost_usd"], rel=1e-3)


def assert_page_shows_usage(page: Page, reports: list[Response], timeout_s: float = 15.0) -> None:
    """The table against the usage API's answer the page itself drew it from (the last of
    `reports`, the page's `/v1/admin/usage` responses): the autoscaler attributes reserved cost
    every round, so a report read by the test even a moment after the page's differs (two suite
    runs failed that way, on `admin` appearing and on a tenant's reserved cost). Retried while a
    newer response may not be drawn yet; the last pair asserted."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows, report = table_rows(page), reports[-1].json()
        try:
            assert_table_matches(rows, report)
            return
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
            page.wait_for_timeout(500)


def test_dashboard_shows_what_the_usage_api_says(small_zoo: Settings, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (.ci/run does)")
    with zoo_server(small_zoo, tmp_path) as server, sync_playwright() as pw:
        keys = {"acme": server.new_tenant("acme"), "beta": server.new_tenant("beta")}
        with server.client(server.admin_key) as admin:  # beta's share: shown beside its usage
            r = admin.put("/v1/admin/tenants/beta/share", json={"weight": 2.5, "rate_qps": 400})
            assert r.status_code == 200 and r.json()["share"]["weight"] == 2.5, r.text
        sent = send_traffic(server, keys, {"acme": 12, "beta": 5})
        report = wait_for_usage(server, expected_queries=17)
        assert {t["tenant"]: t["totals"]["queries"] for t in report["tenants"]} == sent.queries

        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            requested: list[str] = []
            page.on("request", lambda req: requested.append(req.url))
            reports: list[Response] = []
            page.on("response", lambda r: reports.append(r) if "/v1/admin/usage?" in r.url else None)
            page.goto(f"{server.url}/dashboard")

            # A tenant key is refused with a message, and the page asks again.
            page.fill("#admin-key", keys["acme"])
            page.click("#login-button")
            page.wait_for_selector("#login-error:has-text('admin key')")
            assert page.evaluate("sessionStorage.getItem('infaas.adminKey')") is None

            page.fill("#admin-key", server.admin_key)
            page.press("#admin-key", "Enter")
            page.wait_for_selector("#tenants-table tbody tr[data-tenant='beta']")
            assert_page_shows_usage(page, reports)
            assert page.evaluate("sessionStorage.getItem('infaas.adminKey')") == server.admin_key
            share = page.locator("#tenants-table tr[data-tenant='beta'] td.share")
            assert share.get_attribute("data-weight") == "2.5" and "400/s" in share.inner_text()
            assert [
                t["share"]["weight"] for t in fetch_usage(server)["tenants"] if t["tenant"] == "beta"
            ] == [2.5]

            # The charts and the fleet view are drawn from the same data.
            assert page.locator("#cost-chart svg rect[data-tenant='acme']").count() >= 1
            assert page.locator("#variant-chart svg rect").count() >= 1
            assert page.locator("#workers-table tbody tr[data-worker='inprocess-0']").count() == 1
            assert page.locator("#events-table tbody tr[data-kind='route']").count() >= 1
            assert page.locator("#replicas-table tbody tr[data-variant]").count() >= 1
            with server.client(server.admin_key) as admin:
                lines = admin.get("/v1/admin/fleet").json()["versions"]
            assert lines and page.locator("#versions-table tbody tr[data-architecture]").count() == len(lines)

            # It refreshes itself: more traffic shows up without a reload.
            more = send_traffic(server, {"beta": keys["beta"]}, {"beta": 3})
            expected_beta = sent.queries["beta"] + more.queries["beta"]
            page.wait_for_selector(
                f"#tenants-table tr[data-tenant='beta'] td.queries[data-queries='{expected_beta}']",
                timeout=15000,
            )
            assert_page_shows_usage(page, reports)

            # The three plots of issue 36, drawn from real data: cost over time (charged, and
            # reserved once the autoscaler has attributed some), SLO attainment, and the busiest
            # tenant's what-if frontier (4 latency factors × 2 accuracy floors).
            page.wait_for_selector("#cost-chart svg rect[data-kind='reserved']", timeout=15000)
            assert page.locator("#slo-chart svg polyline[data-tenant='acme']").count() == 1
            assert page.locator("#slo-chart svg polyline[data-tenant='beta']").count() == 1
            page.wait_for_selector("#advice-chart svg circle[data-factor]", timeout=15000)
            assert page.locator("#advice-chart svg circle[data-factor]").count() == 8
            summary = page.locator("#advice-summary").inner_text()
            assert summary.startswith(("acme: ", "beta: ")) and len(summary) > 20

            # Saved where CI keeps test artefacts (test-output/, ignored by git), and here.
            shot = Path(__file__).resolve().parents[2] / "test-output" / "dashboard.png"
            shot.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000

            # The key never travels in a URL, and nothing is fetched from anywhere but the server.
            assert requested and all(url.startswith(server.url) for url in requested)
            assert not any(server.admin_key in url or keys["acme"] in url for url in requested)
        finally:
            browser.close()


def fetch_usage(server: LiveServer) -> dict[str, Any]:
    with server.client(server.admin_key) as admin:
        report: dict[str, Any] = admin.get("/v1/admin/usage", params={"from": "1h"}).json()
        return report
