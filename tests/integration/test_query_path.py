"""The query path for real: `infaas serve` (uvicorn) on a free port in its own process, Ray
workers, the SQLite store, the small zoo.

One server (one Ray) for the whole module. Every decision is checked against the measured profiles in
the store: the answer is the cheapest feasible variant, an infeasible target names the right
alternatives, and usage totals equal the sum of what the responses charged, exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from infaas.client import Client
from infaas.errors import DeadlineExceeded, Forbidden, NoFeasibleVariant, Overloaded
from infaas.settings import Settings
from infaas.store import open_store
from infaas.types import Profile, Variant
from infaas.workers.placement import LONE_FAMILY
from tests.integration.conftest import Served, lone_variants, serve_process, wait_until_idle
from variants import zoo

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOL_MS = 0.01  # responses round predictions to 1e-4 ms; stay clear of boundaries by this much


@pytest.fixture(scope="module")
def server(small_zoo: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_process(small_zoo, tmp_path_factory.mktemp("query-path")) as served:
        yield served


@pytest.fixture(scope="module")
def zoo_profiles(server: Served) -> dict[str, tuple[Variant, Profile]]:
    store = open_store(server.settings)
    try:
        tasks = {a.name: a.task for a in store.list_architectures()}
        profiles = {p.variant: p for p in store.list_profiles()}
        return {
            v.name: (v, profiles[v.name])
            for v in store.list_variants()
            if tasks[v.architecture] == zoo.DIGITS and v.name in profiles and profiles[v.name].status == "ok"
        }
    finally:
        store.close()


@pytest.fixture(scope="module")
def digits_rows() -> np.ndarray:
    return zoo.load_split(zoo.DIGITS).x_test[:8]


@pytest.fixture(scope="module")
def warm(server: Served, zoo_profiles: dict[str, tuple[Variant, Profile]], digits_rows: np.ndarray) -> str:
    """A tenant key, after every digits variant answered a pinned query (and so was loaded once)."""
    key = server.new_tenant("warmup")
    with Client(server.url, key) as client:
        for name in zoo_profiles:
            result = client.query(zoo.DIGITS, digits_rows[:1], latency_ms=60_000, variant=name)
            assert result.variant == name and result.outputs.shape == (1, 10)
    return key


def p99(profile: Profile, rows: int = 1) -> float:
    return profile.latency_ms(rows, "p99")


def test_a_grid_of_targets_gets_the_cheapest_feasible_variant(
    server: Served, zoo_profiles: dict[str, tuple[Variant, Profile]], digits_rows: np.ndarray, warm: str
) -> None:
    lats = sorted(p99(p) for _, p in zoo_profiles.values())
    accs = sorted({p.accuracy for _, p in zoo_profiles.values()})
    latency_targets = sorted({0.05, *(x + 1.0 for x in lats), 5.0, 50.0})
    accuracy_targets = sorted({0.0, *accs, min(1.0, accs[-1] + 0.001)})
    chosen: set[str] = set()
    infeasible = 0
    with Client(server.url, warm) as client:
        for latency_ms in latency_targets:
            for min_accuracy in accuracy_targets:
                try:
                    result = client.query(
                        zoo.DIGITS, digits_rows[:1], latency_ms=latency_ms, min_accuracy=min_accuracy
                    )
                except NoFeasibleVariant as exc:
                    infeasible += 1
                    check_alternatives(exc, zoo_profiles, latency_ms, min_accuracy)
                    continue
                except (Overloaded, DeadlineExceeded) as exc:
                    # Once more, after a 429's Retry-After: the edge targets below drive answers
                    # late on purpose, and the path's estimate holds them for a moment; and a
                    # stall of the shared cores can expire one query anywhere (a 5 ms target
                    # predicted to wait 0 ms waited 3.4 ms on a slow 2-core host). How often
                    # answers come late on a quiet machine is bench_targets' measure, not this one.
                    time.sleep(min(1.0, float(exc.fields.get("retry_after_s") or 0.1)))
                    try:
                        result = client.query(
                            zoo.DIGITS, digits_rows[:1], latency_ms=latency_ms, min_accuracy=min_accuracy
                        )
                    except (Overloaded, DeadlineExceeded):
                        near_the_edge(zoo_profiles, latency_ms, min_accuracy)
                        continue

                chosen.add(result.variant)
                _, served = zoo_profiles[result.variant]
                # What the router added to the profile: queueing (idle here: 0), the measured
                # overhead and, for a variant that was cold, its load.
                overhead_ms = result.predicted_latency_ms - p99(served)
                if "cold" in result.reason and result.load_hint is None:
                    overhead_ms -= (served.load_time_s + served.warmup_s) * 1000.0
                assert overhead_ms >= -TOL_MS
                assert served.accuracy >= min_accuracy
                assert p99(served) + overhead_ms <= latency_ms + TOL_MS
                # served on a loaded variant while a cheaper cold one loads: the hint is the cheapest
                cheapest = result.load_hint or result.variant
                _, profile = zoo_profiles[cheapest]
                assert profile.accuracy >= min_accuracy
                assert p99(profile) + overhead_ms <= latency_ms + TOL_MS
                cost = profile.cost_usd_per_1k(1)
                runtime = zoo_profiles[cheapest][0].spec.runtime
                # Judged with the chosen one's overhead, so only against variants of its runtime:
                # each path has its own (a TensorFlow variant run in the front end pays no hop
                # that an ONNX Runtime one on a Ray worker does; on a slow 2-core host the
                # difference was ~1 ms, enough to make the cheaper one miss a tight target).
                for name, (variant, other) in zoo_profiles.items():
                    feasible = (
                        variant.spec.runtime == runtime
                        and other.accuracy >= min_accuracy
                        and p99(other) + overhead_ms <= latency_ms - TOL_MS
                    )
                    assert not (feasible and other.cost_usd_per_1k(1) < cost), (
                        f"{name} is feasible and cheaper than {cheapest} "
                        f"at latency {latency_ms} ms, accuracy {min_accuracy}: {result}"
                    )
    assert infeasible > 0 and len(chosen) >= 2, (infeasible, chosen)


def near_the_edge(
    zoo_profiles: dict[str, tuple[Variant, Profile]], latency_ms: float, min_accuracy: float
) -> None:
    """A query refused as busy (429) or expired (504): feasible on an idle fleet with the hop's
    prior overhead, but the target is within a millisecond or two of it. Only edge targets may do
    that (where none meets the accuracy it is a 422 by rights, whatever the load)."""
    fastest = min((p99(p) for _, p in zoo_profiles.values() if p.accuracy >= min_accuracy), default=math.inf)
    assert latency_ms - fastest <= 2.5, (latency_ms, min_accuracy, fastest)


def check_alternatives(
    exc: NoFeasibleVariant,
    zoo_profiles: dict[str, tuple[Variant, Profile]],
    latency_ms: float,
    min_accuracy: float,
) -> None:
    alts: dict[str, Any] = exc.fields["alternatives"]
    fastest, accurate = alts["fastest_meeting_accuracy"], alts["most_accurate_meeting_latency"]
    meets_accuracy = [p for _, p in zoo_profiles.values() if p.accuracy >= min_accuracy]
    if not meets_accuracy:
        assert fastest is None
    else:
        assert fastest is not None
        _, profile = zoo_profiles[fastest["variant"]]
        overhead_ms = fastest["predicted_latency_ms"] - p99(profile)
        assert profile.accuracy >= min_accuracy and fastest["accuracy"] == profile.accuracy
        assert p99(profile) == min(p99(p) for p in meets_accuracy)
        # it is an alternative because it misses the latency target
        assert fastest["predicted_latency_ms"] > latency_ms - TOL_MS
        if accurate is not None:
            # None of its runtime more accurate meets the target with its path's overhead (other
            # runtimes' paths have their own: not comparable here).
            variant, profile = zoo_profiles[accurate["variant"]]
            overhead_ms = accurate["predicted_latency_ms"] - p99(profile)
            within = [
                p.accuracy
                for v, p in zoo_profiles.values()
                if v.spec.runtime == variant.spec.runtime and p99(p) + overhead_ms <= latency_ms - TOL_MS
            ]
            table = {n: (p.accuracy, p99(p)) for n, (_, p) in zoo_profiles.items()}
            assert max(within, default=0.0) <= accurate["accuracy"], (latency_ms, overhead_ms, alts, table)
            assert accurate["accuracy"] < min_accuracy
    if accurate is not None:
        assert accurate["predicted_latency_ms"] <= latency_ms + TOL_MS


def test_infeasible_targets_name_the_alternatives(
    server: Served, zoo_profiles: dict[str, tuple[Variant, Profile]], digits_rows: np.ndarray, warm: str
) -> None:
    best_accuracy = max(p.accuracy for _, p in zoo_profiles.values())
    with Client(server.url, warm) as client:
        with pytest.raises(NoFeasibleVariant) as too_fast:
            client.query(zoo.DIGITS, digits_rows[:1], latency_ms=0.001, min_accuracy=0.5)
        alts = too_fast.value.fields["alternatives"]
        assert alts["most_accurate_meeting_latency"] is None
        fastest = alts["fastest_meeting_accuracy"]
        assert zoo_profiles[fastest["variant"]][1].accuracy >= 0.5
        assert too_fast.value.fields["status"] == 422
        with pytest.raises(NoFeasibleVariant) as too_accurate:
            client.query(zoo.DIGITS, digits_rows[:1], latency_ms=60_000, min_accuracy=1.0)
        alts = too_accurate.value.fields["alternatives"]
        if best_accuracy < 1.0:
            assert alts["fastest_meeting_accuracy"] is None
            assert alts["most_accurate_meeting_latency"]["accuracy"] == best_accuracy


def test_moderate_load_meets_the_slo_for_99_percent(
    server: Served, digits_rows: np.ndarray, warm: str
) -> None:
    """The prediction includes the path's measured overhead, so what the router promises holds:
    of the queries routed, at least 99 % are answered within their latency target measured at the
    server (a 504, the deadline passing in the queue, counts as a miss).
    (A target the measured overhead makes infeasible is refused with 422, one it makes
    unreachable for now with 429, not answered late: on a slow 2-core host the path's overhead
    held a 25 ms stall of the shared cores for a moment.)"""

    seen: list[object] = []
    # Not while the Ray workers the earlier tests started still start up: on a slow 2-core host
    # that took the cores for seconds, and the answers of 0.1 ms variants came 20-28 ms late.
    wait_until_idle(server.pid)

    def work(worker: int) -> tuple[list[bool], int]:
        met, refused = [], 0
        with Client(server.url, warm) as client:
            for i in range(60):
                rows = digits_rows[: 1 + (worker + i) % 4]
                try:
                    r = client.query(zoo.DIGITS, rows, latency_ms=25.0, min_accuracy=0.9)
                    met.append(r.slo_met)
                    seen.append((r.variant, r.predicted_latency_ms, r.latency_ms, r.batch_rows))
                except NoFeasibleVariant as exc:
                    refused += 1
                    seen.append(exc.fields["alternatives"]["fastest_meeting_accuracy"])
                except Overloaded as exc:  # not routed: a stall of the shared cores priced in (429)
                    refused += 1
                    seen.append(("429", str(exc)[:160]))
                except DeadlineExceeded as exc:  # dropped in the queue: a miss, answered 504
                    met.append(False)
                    seen.append(("504", exc.fields.get("waited_ms")))
        return met, refused

    with ThreadPoolExecutor(max_workers=4) as ex:
        results = [f.result() for f in [ex.submit(work, w) for w in range(4)]]
    met = [m for ms, _ in results for m in ms]
    refused = sum(r for _, r in results)
    # the router learns the overhead per runtime, so the target stays servable on the fast ones
    assert len(met) >= 0.5 * (len(met) + refused), f"{refused} refused of {len(met) + refused}: {seen[:40]}"
    assert sum(met) / len(met) >= 0.99, f"{len(met) - sum(met)} of {len(met)} answered missed: {seen[:60]}"


def test_three_tenants_concurrently_usage_equals_charged_costs_exactly(
    server: Served, digits_rows: np.ndarray, warm: str
) -> None:
    keys = {name: server.new_tenant(name) for name in ("acme", "globex", "initech")}
    # generous targets: under this load every answer must come back (and be charged)
    targets = [(200.0, 0.0), (500.0, 0.9), (300.0, 0.8)]

    def work(tenant: str, worker: int) -> list[tuple[str, int, bool]]:
        out = []
        with Client(server.url, keys[tenant]) as client:
            for i in range(15):
                latency_ms, min_accuracy = targets[(worker + i) % len(targets)]
                rows = digits_rows[: 1 + (i % 3)]
                result = client.query(zoo.DIGITS, rows, latency_ms=latency_ms, min_accuracy=min_accuracy)
                assert result.outputs.shape == (rows.shape[0], 10)
                out.append((tenant, result.cost_pusd, result.slo_met))
        return out

    with ThreadPoolExecutor(max_workers=9) as ex:
        futures = [ex.submit(work, tenant, w) for tenant in keys for w in range(3)]
        answers = [a for f in futures for a in f.result()]
    charged = {t: sum(c for tt, c, _ in answers if tt == t) for t in keys}
    assert all(c > 0 for c in charged.values())
    for tenant, key in keys.items():
        with Client(server.url, key) as client:
            deadline = time.monotonic() + 10
            while True:  # usage flushes every 0.2 s
                report = client.usage()
                totals = report["totals"]
                if totals["queries"] == 45 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        assert [t["tenant"] for t in report["tenants"]] == [tenant]
        assert totals["queries"] == 45
        assert totals["cost_pusd"] == charged[tenant]
        assert totals["slo_met"] == sum(1 for tt, _, met in answers if tt == tenant and met)


def test_tenants_are_isolated(server: Served, digits_rows: np.ndarray) -> None:
    a, b = server.new_tenant("iso-a"), server.new_tenant("iso-b")
    with Client(server.url, a) as client:
        client.query(zoo.DIGITS, digits_rows[:1], latency_ms=1000)
    with Client(server.url, b) as client:
        report = client.usage()
        assert [t["tenant"] for t in report["tenants"]] == ["iso-b"]
        assert report["totals"]["queries"] == 0
    with server.client(b) as http:
        assert http.get("/v1/admin/usage").status_code == 403
        assert http.get("/v1/admin/tenants").status_code == 403
        assert http.post("/v1/admin/tenants", json={"name": "evil"}).status_code == 403
        assert http.delete("/v1/admin/tenants/iso-a").status_code == 403
    # the forbidden error class comes back through the client too
    with Client(server.url, b) as client, pytest.raises(Forbidden):
        client._request("GET", "/v1/admin/usage")


def test_a_ray_served_variant_queried_alone_answers_from_its_lone_copy(
    server: Served, zoo_profiles: dict[str, tuple[Variant, Profile]], digits_rows: np.ndarray, warm: str
) -> None:
    """`warm` queried every digits variant one at a time: each Ray-served ONNX Runtime or
    scikit-learn variant under INFAAS_LONE_MAX_MS then got a copy in the front end, which answers
    the next query that arrives alone, as the Ray replica does, and counts as no replica."""
    lone = lone_variants(server.settings, zoo.DIGITS)
    assert lone, "the small zoo has Ray-served variants under the lone bound"
    deadline = time.monotonic() + 60
    with Client(server.url, warm) as client:
        while True:
            held = [w for w in server.fleet()["workers"] if w["family"] == LONE_FAMILY]
            if (held and lone <= set(held[0]["loaded"])) or time.monotonic() > deadline:
                break
            for name in lone:  # one at a time: each arrives alone
                client.query(zoo.DIGITS, digits_rows[:1], latency_ms=60_000, variant=name)
            time.sleep(0.2)
        assert held and lone <= set(held[0]["loaded"]), held
        labels = zoo.load_split(zoo.DIGITS).y_test[:8]
        for name in lone:
            result = client.query(zoo.DIGITS, digits_rows, latency_ms=60_000, variant=name)
            assert result.variant == name and result.outputs.shape == (8, 10)
            accuracy = zoo_profiles[name][1].accuracy
            assert np.mean(result.outputs.argmax(axis=1) == labels) >= accuracy - 0.4  # 8 rows: loose
    fleet = server.fleet()
    ray_held = {
        name: sum(1 for w in fleet["workers"] if w["family"] != LONE_FAMILY and name in w["loaded"])
        for name in lone
    }
    assert {name: fleet["replicas"].get(name, 0) for name in lone} == ray_held
    assert all(ray_held.values())
