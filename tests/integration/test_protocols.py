"""The other protocols over the one data plane, against a real `infaas serve` (Ray, the small zoo):
KServe V2 driven by the unmodified `tritonclient.http`, and the request bodies of TensorFlow
Serving's REST API documentation; answers equal `/v1/query`'s for the same rows and variant, and
tenant default targets apply where a protocol carries none."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from infaas.settings import Settings
from tests.integration.conftest import Served, serve_process
from tests.integration.load import OpenLoopLoad
from variants import zoo

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TASK = zoo.DIGITS
VARIANT = "digits-logreg/onnx-cpu-fp32-t1"


@pytest.fixture(scope="module")
def served(small_zoo: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_process(small_zoo, tmp_path_factory.mktemp("protocols")) as s:
        yield s


@pytest.fixture(scope="module")
def key(served: Served) -> str:
    return served.new_tenant("proto")


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return np.asarray(zoo.load_split(zoo.DIGITS).x_test[:3], dtype=np.float32)


def v1_query(served: Served, key: str, rows: np.ndarray, **extra: Any) -> dict[str, Any]:
    with served.client(key) as http:
        r = http.post("/v1/query", json={"task": TASK, "inputs": rows.tolist(), "latency_ms": 5000, **extra})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def triton_client(served: Served) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(served.url.removeprefix("http://"), concurrency=2)


def test_tritonclient_works_unmodified(served: Served, key: str, rows: np.ndarray) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    client = triton_client(served)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(TASK, headers=auth)
        assert client.is_model_ready("digits-logreg", headers=auth)
        assert client.is_model_ready("digits-logreg", model_version="1", headers=auth)
        meta = client.get_model_metadata(TASK, headers=auth)
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
        assert meta["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]

        expected = np.asarray(v1_query(served, key, rows, variant=VARIANT)["outputs"], dtype=np.float32)
        for binary_in in (False, True):
            for binary_out in (False, True):
                inp = triton.InferInput("input", list(rows.shape), "FP32")
                inp.set_data_from_numpy(rows, binary_data=binary_in)
                out = triton.InferRequestedOutput("probabilities", binary_data=binary_out)
                result = client.infer(
                    TASK, [inp], outputs=[out], headers=auth, parameters={"variant": VARIANT}
                )
                got = result.as_numpy("probabilities")
                assert got is not None and got.shape == (3, 10)
                np.testing.assert_array_equal(got, expected)  # the same variant: the same numbers
                params = result.get_response()["parameters"]
                assert params["variant"] == VARIANT and params["slo_met"] is True

        # Model-less with targets in the parameters, and asynchronously.
        inp = triton.InferInput("input", list(rows.shape), "FP32")
        inp.set_data_from_numpy(rows)
        pending = client.async_infer(
            TASK, [inp], headers=auth, parameters={"latency_ms": 2000, "min_accuracy": 0.9}
        )
        answer = pending.get_result()
        assert answer.as_numpy("probabilities").shape == (3, 10)  # type: ignore[union-attr]
        assert answer.get_response()["parameters"]["accuracy"] >= 0.9

        # Errors: 4xx with the protocol's {"error": "..."}.
        with pytest.raises(InferenceServerException, match="no task or architecture"):
            client.infer("no-such-model", [inp], headers=auth)
        wrong = triton.InferInput("input", [3, 32], "FP32")
        wrong.set_data_from_numpy(rows[:, :32].copy())
        with pytest.raises(InferenceServerException, match="shape"):
            client.infer(TASK, [wrong], headers=auth)
        with pytest.raises(InferenceServerException, match="unauthenticated"):
            client.infer(TASK, [inp])
    finally:
        client.close()


def test_kserve_errors_map_to_4xx_with_the_protocol_body(served: Served, key: str, rows: np.ndarray) -> None:
    tensor = {"name": "input", "shape": [3, 64], "datatype": "FP32", "data": rows.reshape(-1).tolist()}
    cases = [
        ("/v2/models/nope/infer", {"inputs": [tensor]}, 404),
        (f"/v2/models/{TASK}/infer", {"inputs": [{**tensor, "datatype": "BYTES"}]}, 400),
        (f"/v2/models/{TASK}/infer", {"inputs": [{**tensor, "shape": [3, 65]}]}, 400),
        (f"/v2/models/{TASK}/infer", {"inputs": [{**tensor, "shape": [2, 64]}]}, 400),
        (f"/v2/models/{TASK}/infer", {"inputs": []}, 400),
        (f"/v2/models/{TASK}/infer", {"inputs": [tensor], "outputs": [{"name": "logits"}]}, 400),
        (f"/v2/models/{TASK}/infer", {"inputs": [tensor], "parameters": {"latency_ms": -1}}, 400),
        (f"/v2/models/{TASK}/versions/2/infer", {"inputs": [tensor]}, 404),
        ("/v2/models/digits-logreg/versions/9/infer", {"inputs": [tensor]}, 404),
    ]
    with served.client(key) as http:
        for path, body, status in cases:
            r = http.post(path, json=body)
            assert r.status_code == status, (path, body.get("parameters"), r.text)
            assert isinstance(r.json()["error"], str) and r.json()["detail"], r.text
        r = http.post(f"/v2/models/{TASK}/infer", content=b"{not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        r = http.post(
            f"/v2/models/{TASK}/infer",
            content=b'{"inputs": []}',
            headers={"Inference-Header-Content-Length": "999"},
        )
        assert r.status_code == 400


TF_ROW = [float(v) for v in zoo.load_split(zoo.DIGITS).x_test[0]]


def test_tensorflow_serving_rest_bodies_get_the_documented_shapes(
    served: Served, key: str, rows: np.ndarray
) -> None:
    """The request bodies of TF Serving's REST API documentation, with our model's input."""
    with served.client(key) as http:
        # Row format ("instances") → "predictions"; a named-input instance too.
        r = http.post(
            "/v1/models/digits-logreg:predict",
            json={"signature_name": "serving_default", "instances": [TF_ROW, TF_ROW]},
        )
        assert r.status_code == 200, r.text
        predictions = r.json()["predictions"]
        assert np.asarray(predictions).shape == (2, 10)
        r = http.post("/v1/models/digits-logreg:predict", json={"instances": [{"input": TF_ROW}]})
        assert r.status_code == 200 and np.asarray(r.json()["predictions"]).shape == (1, 10)
        # Columnar ("inputs") → "outputs".
        r = http.post("/v1/models/digits-logreg/versions/1:predict", json={"inputs": {"input": [TF_ROW]}})
        assert r.status_code == 200 and np.asarray(r.json()["outputs"]).shape == (1, 10), r.text
        r = http.post("/v1/models/digits-logreg/labels/stable:predict", json={"inputs": [TF_ROW]})
        assert r.status_code == 200, r.text
        # A task works too (model-less, the tenant's default targets).
        r = http.post(f"/v1/models/{TASK}:predict", json={"instances": [TF_ROW]})
        assert r.status_code == 200, r.text
        # classify: "examples" → "results" of [label, score] pairs.
        r = http.post("/v1/models/digits-logreg:classify", json={"examples": [{"x": TF_ROW}]})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert len(results) == 1 and len(results[0]) == 10
        assert all(isinstance(lab, str) and isinstance(score, float) for lab, score in results[0])
        assert abs(sum(score for _, score in results[0]) - 1.0) < 1e-3

        status = http.get("/v1/models/digits-logreg").json()
        assert status == {
            "model_version_status": [
                {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ]
        }
        assert http.get("/v1/models/digits-logreg/versions/1").json() == status
        meta = http.get("/v1/models/digits-logreg/metadata").json()
        assert meta["model_spec"]["name"] == "digits-logreg"
        sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert sig["inputs"]["input"]["dtype"] == "DT_FLOAT"
        assert [d["size"] for d in sig["inputs"]["input"]["tensor_shape"]["dim"]] == ["-1", "64"]
        assert [d["size"] for d in sig["outputs"]["probabilities"]["tensor_shape"]["dim"]] == ["-1", "10"]

        # Errors: TF Serving's {"error": "..."} and a 4xx.
        for path, body, code in [
            ("/v1/models/nope:predict", {"instances": [TF_ROW]}, 404),
            ("/v1/models/digits-logreg:predict", {"instances": [TF_ROW[:10]]}, 400),
            ("/v1/models/digits-logreg:predict", {"rows": [TF_ROW]}, 400),
            ("/v1/models/digits-logreg:regress", {"instances": [TF_ROW]}, 404),
            ("/v1/models/digits-logreg:predict", {"signature_name": "other", "instances": [TF_ROW]}, 400),
        ]:
            r = http.post(path, json=body)
            assert r.status_code == code and isinstance(r.json()["error"], str), (path, r.text)
        # infaas's own /v1/models routes still answer beside them.
        assert [a["name"] for a in http.get("/v1/models", params={"task": TASK}).json()]
        assert http.get("/v1/models/digits-logreg/variants").status_code == 200


def test_default_targets_apply_when_a_protocol_sends_none(served: Served, rows: np.ndarray) -> None:
    key = served.new_tenant("defaults")
    with served.client(key) as http:
        r = http.put(f"/v1/targets/{TASK}", json={"latency_ms": 2000, "min_accuracy": 0.999})
        assert r.status_code == 200, r.text
        assert http.get("/v1/targets").json() == [
            {"task": TASK, "latency_ms": 2000.0, "min_accuracy": 0.999, "max_cost_usd_per_1k": None}
        ]
        # No variant of the small zoo is 99.9 % accurate: the stored targets are what refused it.
        r = http.post(f"/v1/models/{TASK}:predict", json={"instances": [TF_ROW]})
        assert r.status_code == 422 and "0.999" in r.text, r.text
        assert (
            http.put(f"/v1/targets/{TASK}", json={"latency_ms": 2000, "min_accuracy": 0.9}).status_code == 200
        )
        tensor = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": TF_ROW}
        r = http.post(f"/v2/models/{TASK}/infer", json={"inputs": [tensor]})
        assert r.status_code == 200 and r.json()["parameters"]["accuracy"] >= 0.9, r.text
        assert http.put("/v1/targets/no-such-task", json={"latency_ms": 10}).status_code == 404
        assert http.put(f"/v1/targets/{TASK}", json={"latency_ms": -5}).status_code == 400


def test_kserve_under_open_loop_load_answers_or_refuses_cleanly(served: Served, key: str) -> None:
    """100 V2 requests/s that do not wait for answers: every one answered (or refused with 429,
    never a 5xx or a hang), each answer a 1×10 tensor with its decision."""
    tensor = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": TF_ROW}
    body = {"inputs": [tensor], "parameters": {"latency_ms": 100}}
    load = OpenLoopLoad(f"{served.url}/v2/models/{TASK}/infer", key, body, rate_per_s=100).start()
    time.sleep(3.0)
    result = load.stop()
    statuses = result.statuses()
    assert set(statuses) <= {200, 429} and statuses[200] > 0, statuses
    answered = [o.body for o in result.outcomes if o.status == 200 and o.body]
    assert all(b["outputs"][0]["shape"] == [1, 10] and "slo_met" in b["parameters"] for b in answered)
    met = sum(1 for b in answered if b["parameters"]["slo_met"])
    print(f"\nkserve at 100/s: {dict(statuses)}, {met}/{len(answered)} in SLO")
