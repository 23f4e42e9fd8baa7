"""A worker killed mid-load does not lose a request silently (issue 5), through the real service.

`infaas serve` in its own process over a copy of the small zoo; concurrent ``/v1/query`` requests
pinned to the Keras variant (TensorFlow variants always run in a Ray worker, never on the front
end's fast path); the worker process hosting it is SIGKILLed while they are in flight. Every
request must come back, within the client's timeout, either with the right answer or with a 503
whose JSON body names the reason; the worker's actor restarts and the service answers again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from infaas.settings import Settings
from infaas.workers.placement import LONE_FAMILY
from tests.integration.conftest import Served, lone_variants, serve_process, tensorflow_variant
from tests.integration.test_admin_views import metric_samples
from variants import zoo

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CLIENTS = 6
REQUEST_TIMEOUT_S = 90.0  # a hung request fails the test through this timeout


@pytest.fixture(scope="module")
def server(small_zoo: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # A server of its own: killing its workers must not disturb other modules' tests.
    with serve_process(small_zoo, tmp_path_factory.mktemp("worker-crash")) as served:
        yield served


def holder(server: Served, variant: str) -> dict[str, Any]:
    """The one live Ray worker holding `variant` (a lone copy in the front end is not one)."""
    workers = [
        w
        for w in server.fleet()["workers"]
        if variant in w["loaded"] and w["alive"] and w["family"] != LONE_FAMILY
    ]
    assert len(workers) == 1, workers
    return workers[0]


def pinned_query(http: httpx.Client, variant: str, rows: np.ndarray, n: int) -> httpx.Response:
    body = {"task": zoo.DIGITS, "inputs": rows[:n].tolist(), "latency_ms": 60_000, "variant": variant}
    return http.post("/v1/query", json=body, timeout=REQUEST_TIMEOUT_S)


def keep_querying(
    server: Served,
    key: str,
    variant: str,
    rows: np.ndarray,
    worker: int,
    stop: threading.Event,
    answered: threading.Event | None = None,
    pause_s: float = 0.0,
) -> list[tuple[int, int, dict[str, Any]]]:
    """One client's queries of 1..len(rows) rows, back to back until `stop`: (rows, status, body)."""
    out = []
    with server.client(key) as http:
        i = 0
        while not stop.is_set():
            n = 1 + (worker + i) % len(rows)
            r = pinned_query(http, variant, rows, n)
            out.append((n, r.status_code, r.json()))
            if answered is not None:
                answered.set()
            i += 1
            time.sleep(pause_s)
    return out


def check_answered_or_refused_loudly(
    results: list[tuple[int, int, dict[str, Any]]], variant: str, expected: np.ndarray
) -> set[int]:
    """Every request came back right (200) or as a 503 naming the variant; the statuses seen."""
    statuses = {status for _, status, _ in results}
    assert statuses <= {200, 503}, [r for r in results if r[1] not in (200, 503)][:5]
    for n, status, body in results:
        if status == 200:
            assert body["variant"] == variant
            np.testing.assert_allclose(np.asarray(body["outputs"]), expected[:n], atol=1e-4)
        else:
            assert body["error"] == "unavailable" and variant in body["detail"], body
    return statuses


def test_killing_the_worker_mid_load_answers_or_fails_every_request_loudly(server: Served) -> None:
    variant = tensorflow_variant(server.settings)
    rows = zoo.load_split(zoo.DIGITS).x_test[:4]
    key = server.new_tenant("crash")

    with server.client(key) as http:
        first = pinned_query(http, variant, rows, len(rows))
        assert first.status_code == 200, first.text
    expected = np.asarray(first.json()["outputs"])
    victim = holder(server, variant)
    assert victim["family"] == "tensorflow" and victim["pid"] is not None

    stop = threading.Event()
    answered = threading.Event()
    with ThreadPoolExecutor(max_workers=CLIENTS) as ex:
        futures = [
            ex.submit(keep_querying, server, key, variant, rows, w, stop, answered) for w in range(CLIENTS)
        ]
        assert answered.wait(30), "no answer before the kill"
        time.sleep(0.3)  # steady load: batches are in flight on the worker
        os.kill(victim["pid"], signal.SIGKILL)
        time.sleep(3.0)  # the requests caught by the kill are retried or refused meanwhile
        stop.set()
        results = [r for f in futures for r in f.result(timeout=REQUEST_TIMEOUT_S * 2)]

    statuses = check_answered_or_refused_loudly(results, variant, expected)
    for _, status, body in results:
        if status == 503:
            assert "died" in body["detail"] or "lost" in body["detail"] or "restart" in body["detail"], body

    # The loss was noticed and recorded (not swallowed): a crash of that worker in the fleet log.
    events = server.fleet()["events"]
    crashes = [e for e in events if e["kind"] == "crash" and e["worker_id"] == victim["worker_id"]]
    assert crashes, events[:20]
    # ... and the requests it caught were sent on rather than dropped: the batch that met the dead
    # worker was retried (each later one loads the variant again on a live worker).
    retries = [e for e in events if e["kind"] == "retry" and e["variant"] == variant]
    assert retries or 503 in statuses, events[:20]

    wait_for_restart(server, victim)
    with server.client(key) as http:
        again = pinned_query(http, variant, rows, len(rows))
    assert again.status_code == 200, again.text
    np.testing.assert_allclose(np.asarray(again.json()["outputs"]), expected, atol=1e-4)
    # Every query the kill caught gave its slot under the admission limit back (a slot kept would
    # shrink the front end for good), and the limit stays at or above its floor.
    with server.client(server.admin_key) as admin:
        gauges = {n: v for n, labels, v in metric_samples(admin.get("/metrics").text) if not labels}
    assert gauges["infaas_queries_in_flight"] == 0, gauges
    assert gauges["infaas_queries_in_flight_limit"] >= server.settings.min_queries_in_flight, gauges


def wait_for_restart(server: Served, victim: dict[str, Any]) -> None:
    """The actor restarts: a new process under the same worker id."""
    deadline = time.monotonic() + 60
    while True:
        workers = {w["worker_id"]: w for w in server.fleet()["workers"]}
        restarted = workers.get(victim["worker_id"])
        if restarted is not None and restarted["alive"] and restarted["pid"] not in (None, victim["pid"]):
            return
        assert time.monotonic() < deadline, (victim, workers, server.fleet()["events"][:12])
        time.sleep(0.5)


def test_a_worker_killed_while_a_lone_copy_answers_loses_no_request_and_leaves_no_orphan_copy(
    server: Served,
) -> None:
    """A Ray-served variant whose queries arriving alone answer from its copy in the front end:
    its worker is SIGKILLed while one client queries it sequentially (alone: the copy) and three
    concurrently (batches on the worker). Every request is answered right or refused with a 503
    that says why; the copy and the replica come back together: once the worker restarted, an
    alone query answers, and the front end holds no copy of a variant Ray does not hold."""
    lone = lone_variants(server.settings, zoo.DIGITS)
    assert lone, "the small zoo has a Ray-served digits variant under the lone bound"
    variant = sorted(lone)[0]
    rows = zoo.load_split(zoo.DIGITS).x_test[:4]
    key = server.new_tenant("lone-crash")

    def lone_held() -> set[str]:
        return {n for w in server.fleet()["workers"] if w["family"] == LONE_FAMILY for n in w["loaded"]}

    with server.client(key) as http:
        first = pinned_query(http, variant, rows, len(rows))
        assert first.status_code == 200, first.text
        deadline = time.monotonic() + 60
        while variant not in lone_held():  # the first alone queries load the copy in the background
            assert time.monotonic() < deadline, server.fleet()
            assert pinned_query(http, variant, rows, 1).status_code == 200
            time.sleep(0.1)
    expected = np.asarray(first.json()["outputs"])
    victim = holder(server, variant)

    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=4) as ex:
        alone = ex.submit(keep_querying, server, key, variant, rows, 0, stop)
        time.sleep(0.5)  # the sequential client alone first: the copy answers
        crowd = [
            ex.submit(keep_querying, server, key, variant, rows, w, stop, None, 0.005) for w in range(1, 4)
        ]
        time.sleep(0.5)
        os.kill(victim["pid"], signal.SIGKILL)
        time.sleep(3.0)
        stop.set()
        results = [r for f in [alone, *crowd] for r in f.result(timeout=REQUEST_TIMEOUT_S * 2)]

    assert len(results) > 20, len(results)
    check_answered_or_refused_loudly(results, variant, expected)
    crashes = [
        e for e in server.fleet()["events"] if e["kind"] == "crash" and e["worker_id"] == victim["worker_id"]
    ]
    assert any(variant in e["variant"] for e in crashes), crashes  # the kill took the replica with it

    wait_for_restart(server, victim)
    with server.client(key) as http:
        for _ in range(5):  # alone again, on the copy or the reloaded replica
            again = pinned_query(http, variant, rows, len(rows))
            assert again.status_code == 200, again.text
            np.testing.assert_allclose(np.asarray(again.json()["outputs"]), expected, atol=1e-4)
    fleet = server.fleet()
    ray_held = {n for w in fleet["workers"] if w["family"] != LONE_FAMILY and w["alive"] for n in w["loaded"]}
    assert lone_held() <= ray_held, (lone_held(), ray_held)
    assert variant in ray_held
    assert fleet["replicas"].get(variant, 0) == sum(
        1 for w in fleet["workers"] if w["family"] != LONE_FAMILY and variant in w["loaded"]
    )
