"""The Python client: requests it sends, answers it parses, and server errors as infaas errors."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from infaas import Client
from infaas.errors import InfaasError, NoFeasibleVariant, TaskNotFound, Unavailable

ANSWER = {
    "outputs": [[0.1, 0.9]],
    "variant": "m/onnx-cpu-fp32-t1",
    "architecture": "m",
    "accuracy": 0.97,
    "predicted_latency_ms": 1.2,
    "latency_ms": 0.8,
    "cost_usd": 7e-11,
    "cost_pusd": 70,
    "slo_met": True,
    "batch_rows": 1,
    "reason": "cheapest feasible variant",
    "load_hint": None,
}


def test_query_sends_the_targets_and_parses_the_answer() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=ANSWER)

    with Client("http://infaas", "key-1", transport=httpx.MockTransport(handler)) as client:
        result = client.query(
            "digits", np.array([[1.0, 2.0]], dtype=np.float32), latency_ms=20, min_accuracy=0.9
        )
    body = json.loads(sent[0].content)
    assert sent[0].url.path == "/v1/query" and sent[0].headers["authorization"] == "Bearer key-1"
    assert body == {
        "task": "digits",
        "inputs": [[1.0, 2.0]],
        "latency_ms": 20,
        "min_accuracy": 0.9,
        "max_cost_usd_per_1k": None,
        "architecture": None,
        "variant": None,
    }
    assert result.variant == "m/onnx-cpu-fp32-t1" and result.cost_pusd == 70 and result.slo_met
    np.testing.assert_array_equal(result.outputs, np.array([[0.1, 0.9]], dtype=np.float32))


def test_server_errors_come_back_as_their_classes_with_fields() -> None:
    alternatives = {"fastest_meeting_accuracy": {"variant": "m/x", "predicted_latency_ms": 3.0}}

    def handler(request: httpx.Request) -> httpx.Response:
        task = json.loads(request.content)["task"]
        if task == "slow":
            body = {"error": "no_feasible_variant", "detail": "nothing meets", "alternatives": alternatives}
            return httpx.Response(422, json=body)
        if task == "gone":
            return httpx.Response(404, json={"error": "task_not_found", "detail": "no task 'gone'"})
        return httpx.Response(502, text="<html>bad gateway</html>")

    with Client("http://infaas", "k", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(NoFeasibleVariant) as infeasible:
            client.query("slow", [[0.0]], latency_ms=1)
        assert infeasible.value.fields["alternatives"] == alternatives
        assert infeasible.value.fields["status"] == 422
        with pytest.raises(TaskNotFound, match="no task 'gone'"):
            client.query("gone", [[0.0]], latency_ms=1)
        with pytest.raises(InfaasError, match="HTTP 502"):
            client.query("proxy", [[0.0]], latency_ms=1)


def test_an_unreachable_server_says_what_to_do() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = Client("http://infaas", "k", transport=httpx.MockTransport(handler))
    with client, pytest.raises(Unavailable, match="infaas serve"):
        client.query("t", [[0.0]], latency_ms=1)
