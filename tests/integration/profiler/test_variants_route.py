"""Over real HTTP: a model registered through `POST /v1/models` returns already profiled, and
`GET /v1/models/{arch}/variants` carries each variant's measured profile."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import tiny_models
from tests.integration.conftest import LiveServer

pytestmark = pytest.mark.slow


def test_registration_returns_profiled_variants_and_the_listing_shows_them(live_server: LiveServer) -> None:
    x, y = tiny_models.digits(200)
    files = {
        "model": ("lin.onnx", tiny_models.linear_onnx(x=x, y=y)),
        "validation": ("val.npz", tiny_models.validation_bytes(x, y)),
    }
    with live_server.client(live_server.admin_key) as c:
        r = c.post(
            "/v1/models", files=files, data={"metadata": json.dumps({"name": "lin", "task": "digits"})}
        )
        assert r.status_code == 201, r.text
        registered = r.json()["variants"]
        listing = c.get("/v1/models/lin/variants")
    assert listing.status_code == 200, listing.text
    variants = listing.json()["variants"]
    assert variants and {v["name"] for v in variants} == {v["name"] for v in registered}
    for v in [*registered, *variants]:
        profile = v["profile"]
        assert v["profiled"] is True and profile["status"] == "ok", v
        assert profile["foreign"] is False
        batches = [p["batch"] for p in profile["points"]]
        assert batches == [b for b in (1, 8, 32, 128) if b <= v["max_batch"]]
        assert all(p["p50_ms"] > 0 and p["cost_usd_per_1k"] > 0 for p in profile["points"])
        # Accuracy is the variant's own on the uploaded validation set, not a number anyone supplied.
        assert 0.0 <= profile["accuracy"] <= 1.0
    fp32 = next(v for v in variants if v["precision"] == "fp32")
    expected = _reference_accuracy(x, y)
    assert fp32["profile"]["accuracy"] == pytest.approx(expected, abs=1.5 / len(y))


def _reference_accuracy(x: np.ndarray, y: np.ndarray) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(tiny_models.linear_onnx(x=x, y=y), providers=["CPUExecutionProvider"])
    outputs = session.run(None, {session.get_inputs()[0].name: x.astype(np.float32)})
    probs = next(o for o in outputs if getattr(o, "ndim", 0) == 2)
    return float(np.mean(np.argmax(probs, axis=1) == y))
