"""`infaas serve --workers 2` (issue 14): two front-end processes on one port (SO_REUSEPORT) and
one fleet, over a copy of the small zoo on SQLite. Both answer; a variant on the Ray workers is
loaded once for both; a front end SIGKILLed under open-loop load is started again by the
supervisor while the other serves on; after SIGINT every answer is billed exactly once, the killed
one's from its own usage journal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from infaas.settings import Settings
from infaas.store import open_store
from infaas.types import COUNTER_COST_PUSD, COUNTER_SLO_MET, COUNTER_SLO_MISSED
from tests.integration.conftest import Served, serve_process, tensorflow_variant
from tests.integration.load import OpenLoopLoad

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _fresh(served: Served, key: str, method: str, path: str, **kw: Any) -> httpx.Response:
    """One request on a new connection: the kernel picks the front end per connection."""
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        return c.request(method, path, **kw)


def _front_ends(served: Served) -> list[dict[str, Any]]:
    r = _fresh(served, served.admin_key, "GET", "/v1/admin/fleet", params={"events": 0})
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["front_ends"]
    return found


def test_two_front_ends_share_the_port_and_the_fleet(small_zoo: Settings, tmp_path: Path) -> None:
    variant = tensorflow_variant(small_zoo)  # always on a Ray worker, never a front end's fast path
    env = {"INFAAS_FLEET_SYNC_INTERVAL_S": "0.5"}
    answered: list[dict[str, Any]] = []
    with serve_process(small_zoo, tmp_path / "run", env=env, args=("--workers", "2")) as served:
        up_since = time.monotonic()  # the front ends were started before this
        key = served.new_tenant("acme")
        body = {
            "task": "digits-classification",
            "inputs": [[0.0] * 64],
            "latency_ms": 5000,
            "variant": variant,
        }
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            r = _fresh(served, key, "POST", "/v1/query", json=body)
            assert r.status_code == 200, r.text
            answered.append(r.json())
            seen |= {f["name"] for f in _front_ends(served) if f["this"]}
        assert len(seen) == 2, seen  # both processes answered on the one port
        # Loaded once for both. The admin's request may land on the front end that did not load
        # it, whose view is as of its last sync round (every 0.5 s): wait for the view, not the load.
        deadline = time.monotonic() + 10
        while True:
            r = _fresh(served, served.admin_key, "GET", "/v1/admin/fleet", params={"events": 0})
            replicas = r.json()["replicas"]
            if variant in replicas or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert replicas.get(variant) == 1, replicas
        # Each front end lists the others as of its last report round (every 0.5 s here).
        deadline = time.monotonic() + 10
        while len(listed := _front_ends(served)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(listed) == 2 and sum(f["leader"] for f in listed) == 1, listed
        names = [f["name"] for f in listed]

        # SIGKILL one front end under open-loop load; the supervisor starts it again (it has run
        # for more than its crash-loop guard by now, or this waits until it has).
        victim = sorted(names)[0]
        time.sleep(max(0.0, 11.0 - (time.monotonic() - up_since)))
        load = OpenLoopLoad(f"{served.url}/v1/query", key, body, rate_per_s=40).start()
        time.sleep(1.0)
        os.kill(int(victim.rsplit(":", 1)[1]), signal.SIGKILL)
        back = None
        restart_deadline = time.monotonic() + 90
        while back is None and time.monotonic() < restart_deadline:
            time.sleep(0.5)
            now = {f["name"] for f in _front_ends(served)}
            fresh = [n for n in now if n.split("@")[0] == victim.split("@")[0] and n != victim]
            back = fresh[0] if fresh else None
        result = load.stop()
        assert back is not None, f"{victim} was not started again"
        statuses = result.statuses()
        # Connections the killed process had accepted are cut; everything else is answered.
        assert set(statuses) <= {200, "cut"}, statuses
        assert statuses[200] >= 0.9 * sum(statuses.values()), statuses
        answered += result.answered()
        print(f"\n--workers 2, one front end SIGKILLed under load: {dict(statuses)}; {victim} → {back}")

    assert served.proc.returncode == 0, served.log()[-2000:]
    store = open_store(served.settings)
    try:
        rows = store.usage()
    finally:
        store.close()
    billed = sum(r.counters.get(COUNTER_SLO_MET, 0) + r.counters.get(COUNTER_SLO_MISSED, 0) for r in rows)
    # Every answer is billed, the killed front end's too (replayed from its journal at its restart);
    # a request cut in flight may have been journaled before the kill: billed at most once each.
    assert len(answered) <= billed <= len(answered) + statuses["cut"], (billed, len(answered), statuses)
    assert sum(r.counters.get(COUNTER_COST_PUSD, 0) for r in rows) >= sum(
        int(b["cost_pusd"]) for b in answered
    )
