"""A burst right after registration, through the real service (issue 10's first finding): a
3×1024 MLP registered through `POST /v1/models`, then 3 000 queries from 64 concurrent clients at
once with a 500 ms target. The cold load must not poison the overhead estimate (it once made the
service refuse 98 % of this feasible work): at most 1 % refused, nothing failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from infaas.settings import Settings
from tests import tiny_models
from tests.integration.conftest import serve_process
from tests.integration.load import closed_loop

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_burst_right_after_registration_is_served_not_refused(tmp_path: Path) -> None:
    empty = Settings(data_dir=tmp_path / "empty")
    empty.data_dir.mkdir()
    x, _ = tiny_models.digits(200)
    with serve_process(empty, tmp_path / "run", env={"INFAAS_PROFILE_QUICK": "1"}) as served:
        key = served.new_tenant("acme", role="owner")
        served.register_mlp(key)
        body = {"task": "digits", "inputs": [x[0].tolist()], "latency_ms": 500}
        result = closed_loop(f"{served.url}/v1/query", key, body, concurrency=64, total=3000)
        with served.client(served.admin_key) as admin:
            events = admin.get("/v1/admin/fleet", params={"events": 100}).json()["events"]
    statuses = result.statuses()
    refused = statuses[429] + statuses[422]
    actions = [(e["kind"], e["variant"], e["reason"][:120]) for e in events if e["kind"] != "route"]
    assert set(statuses) <= {200, 422, 429}, (statuses, actions)
    assert refused <= 30, (statuses, actions)
    answered = result.answered()
    in_slo = sum(1 for b in answered if b["slo_met"])
    print(f"\nburst after registration: {dict(statuses)}; in SLO {in_slo}/{len(answered)}")
