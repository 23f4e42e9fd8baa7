"""POST /v1/models and the listings over real HTTP (uvicorn), real ONNX Runtime and TensorFlow."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from infaas.settings import Settings
from tests import tiny_models
from tests.integration.conftest import LiveServer

MAX_UPLOAD_MB = 0.25


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # A small upload limit, so that the 413 case needs only a small body.
    return Settings(data_dir=tmp_path / "data", admin_key="admin-test-key", max_upload_mb=MAX_UPLOAD_MB)


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    return tiny_models.digits(200)


def _post(
    server: LiveServer,
    key: str,
    name: str,
    model: tuple[str, bytes],
    validation: bytes | None = None,
    task: str = "digits",
    profile: bool = False,
    trust_pickle: bool = False,
) -> tuple[int, dict[str, object]]:
    """Registration under test here, not profiling (tests/integration/profiler covers that)."""
    files = {"model": model}
    if validation is not None:
        files["validation"] = ("val.npz", validation)
    meta = {"name": name, "task": task, "profile": profile, "trust_pickle": trust_pickle}
    with server.client(key) as c:
        r = c.post("/v1/models", files=files, data={"metadata": json.dumps(meta)})
    return r.status_code, r.json()


def _nothing_left(settings: Settings) -> None:
    leftovers = [
        p
        for p in settings.data_dir.rglob("*")
        if p.is_file() and p.parent.name != "data" and p.parent != settings.journal_path
    ]
    # Only the store and the admin key sit at the top level, and the usage journal in its folder.
    assert leftovers == [], leftovers


def test_tenant_registers_onnx_then_lists_it(
    live_server: LiveServer, digits: tuple[np.ndarray, np.ndarray], settings: Settings
) -> None:
    x, y = digits
    key = live_server.new_tenant("acme", role="owner")
    model = ("lin.onnx", tiny_models.linear_onnx(x=x, y=y))
    status, body = _post(live_server, key, "lin", model, tiny_models.validation_bytes(x, y))
    assert status == 201, body
    assert body["created"] is True and body["task_created"] is True
    assert body["architecture"]["owner"] == "acme"  # type: ignore[index]
    assert body["task"]["input_shape"] == [64] and body["task"]["num_classes"] == 10  # type: ignore[index]

    with live_server.client(key) as c:
        models = c.get("/v1/models").json()
        assert [(m["name"], m["task"], m["variants"]) for m in models] == [("lin", "digits", 4)]
        listing = c.get("/v1/models/lin/variants").json()
        variants = {v["name"]: v for v in listing["variants"]}
        assert set(variants) == {
            "lin/onnx-cpu-fp32-t1",
            "lin/onnx-cpu-fp32-t2",
            "lin/onnx-cpu-int8-t1",
            "lin/onnx-cpu-int8-t2",
        }
        assert all(v["top1_agreement"] >= 0.99 and v["parity_samples"] == 200 for v in variants.values())
        assert variants["lin/onnx-cpu-int8-t1"]["max_abs_diff"] > 0
        assert all(v["max_batch"] >= 1 for v in variants.values())
        skipped = {s["name"]: s["reason"] for s in listing["skipped"]}
        assert "CUDAExecutionProvider" in skipped["lin/onnx-gpu-fp32-t1"]
        tasks = c.get("/v1/tasks").json()
        assert tasks[0]["name"] == "digits" and tasks[0]["architectures"] == ["lin"]
        missing = c.get("/v1/models/nope/variants")
        assert missing.status_code == 404 and missing.json()["error"] == "architecture_not_found"

    # The same bytes again: 200, nothing new. Other bytes under the same name: 409.
    status, body = _post(live_server, key, "lin", model)
    assert status == 200 and body["created"] is False
    status, body = _post(live_server, key, "lin", ("lin.onnx", tiny_models.linear_onnx(seed=3)))
    assert status == 409 and body["error"] == "conflict"
    assert not any((settings.data_dir / "tmp").iterdir())


def test_a_registered_model_is_warm_when_registration_answers(
    live_server: LiveServer, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    """As TF Serving loads and warms a version before serving it: the burst that often follows a
    registration finds the new model's cheapest variant loaded, not refusals while it loads."""
    x, y = digits
    key = live_server.new_tenant("acme", role="owner")
    model = ("warm.onnx", tiny_models.linear_onnx(x=x, y=y))
    status, body = _post(live_server, key, "warm", model, tiny_models.validation_bytes(x, y), profile=True)
    assert status == 201, body
    profiles = [p for p in live_server.app.state.store.list_profiles("warm") if p.status == "ok"]
    cheapest = min(profiles, key=lambda p: (p.cost_usd_per_1k(1), p.variant)).variant
    pool = live_server.app.state.placement  # the front end or a Ray replica
    assert pool.is_loaded(cheapest), (cheapest, [w.loaded for w in pool.fleet()])


def test_sklearn_upload_is_admin_only(
    live_server: LiveServer, digits: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    import joblib

    x, y = digits
    buf = io.BytesIO()
    joblib.dump(tiny_models.sklearn_logreg(x, y), buf)
    val = tiny_models.validation_bytes(x, y)
    key = live_server.new_tenant("acme", role="owner")
    status, body = _post(live_server, key, "lr", ("lr.joblib", buf.getvalue()), val)
    assert status == 403 and body["error"] == "forbidden"
    assert "ONNX" in str(body["detail"])
    status, body = _post(live_server, live_server.admin_key, "lr", ("lr.joblib", buf.getvalue()), val)
    assert status == 400 and "trust_pickle" in str(body["detail"])  # code execution, said out loud
    admin = live_server.admin_key
    status, body = _post(live_server, admin, "lr", ("lr.joblib", buf.getvalue()), val, trust_pickle=True)
    assert status == 201, body
    assert "lr/sklearn-cpu-fp32-t1" in {v["name"] for v in body["variants"]}  # type: ignore[union-attr]


@pytest.mark.parametrize("as_file", [False, True], ids=["form-field", "file-part"])
def test_metadata_is_read_from_a_form_field_or_a_file_part(
    live_server: LiveServer, digits: tuple[np.ndarray, np.ndarray], as_file: bool
) -> None:
    """`-F metadata='{...}'` and `-F metadata=@meta.json` register alike."""
    x, y = digits
    meta = json.dumps({"name": "lin", "task": "digits", "profile": False})
    files: dict[str, tuple[str, bytes] | tuple[str, bytes, str]] = {
        "model": ("lin.onnx", tiny_models.linear_onnx(x=x, y=y)),
        "validation": ("val.npz", tiny_models.validation_bytes(x, y)),
    }
    data: dict[str, str] = {}
    if as_file:
        files["metadata"] = ("meta.json", meta.encode(), "application/json")
    else:
        data["metadata"] = meta
    with live_server.client(live_server.new_tenant("acme", role="owner")) as c:
        r = c.post("/v1/models", files=files, data=data)
    assert r.status_code == 201, r.text
    assert r.json()["architecture"]["name"] == "lin" and r.json()["task"]["name"] == "digits"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"name": "lin", "task": "digits", "description": "%s"}' % (b"x" * 70_000), "over 65536 bytes"),
        (b'{"name": "Not A Name", "task": "digits"}', "name"),
    ],
    ids=["not-json", "not-utf8", "too-long", "invalid-name"],
)
def test_bad_metadata_file_part_gets_a_400_that_says_why(
    live_server: LiveServer, settings: Settings, content: bytes, says: str
) -> None:
    files = {"model": ("m.onnx", tiny_models.linear_onnx()), "metadata": ("meta.json", content)}
    with live_server.client(live_server.admin_key) as c:
        r = c.post("/v1/models", files=files)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid_input" and says in r.json()["detail"]
    _nothing_left(settings)


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _tar(members: dict[str, bytes], link: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tf.addfile(info)
    return buf.getvalue()


_SM = {"sm/saved_model.pb": b"\x08\x01", "sm/variables/variables.index": b"x"}


_BAD_CASES = [
    ("corrupt", 422, "unsupported_format"),
    ("unknown-format", 422, "unsupported_format"),
    ("zip-dotdot", 422, "unsafe_archive"),
    ("tar-absolute", 422, "unsafe_archive"),
    ("tar-symlink", 422, "unsafe_archive"),
    ("too-large", 413, "payload_too_large"),
    ("wrong-input-shape", 422, "spec_mismatch"),
    ("not-probabilities", 422, "spec_mismatch"),
    ("bad-metadata", 400, "invalid_input"),
]


def test_bad_uploads_get_a_clear_4xx_leave_nothing_and_the_service_keeps_serving(
    live_server: LiveServer, settings: Settings, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = digits
    val = tiny_models.validation_bytes(x, y)
    uploads: dict[str, tuple[str, bytes]] = {
        "corrupt": ("m.onnx", b"\x00garbage, not protobuf" * 20),
        "unknown-format": ("m.h5", tiny_models.linear_onnx()),
        "zip-dotdot": ("m.zip", _zip({**_SM, "sm/../../escape.pb": b"x"})),
        "tar-absolute": ("m.tar.gz", _tar({**_SM, "/tmp/infaas-escape.pb": b"x"})),
        "tar-symlink": ("m.tar.gz", _tar(_SM, link="sm/variables/leak")),
        "too-large": ("m.onnx", b"\x00" * int(MAX_UPLOAD_MB * 1024 * 1024 + 1024)),
        "wrong-input-shape": ("m.onnx", tiny_models.linear_onnx(in_dim=32)),
        "not-probabilities": ("m.onnx", tiny_models.linear_onnx(softmax=False)),
        "bad-metadata": ("m.onnx", tiny_models.linear_onnx()),
    }
    key = live_server.new_tenant("acme", role="owner")
    with live_server.client(key) as c:
        for case, status, error in _BAD_CASES:
            meta = "{not json" if case == "bad-metadata" else json.dumps({"name": "bad", "task": "digits"})
            r = c.post(
                "/v1/models",
                files={"model": uploads[case], "validation": ("val.npz", val)},
                data={"metadata": meta},
            )
            assert r.status_code == status, (case, r.text)
            body = r.json()
            assert body["error"] == error and body["detail"], case
            assert c.get("/v1/models").json() == [] and c.get("/v1/tasks").json() == [], case
            _nothing_left(settings)
            assert c.get("/healthz").status_code == 200
    assert not Path("/tmp/infaas-escape.pb").exists()
    good = ("lin.onnx", tiny_models.linear_onnx(x=x, y=y))
    assert _post(live_server, key, "lin", good, val)[0] == 201


@pytest.mark.slow
def test_keras_file_and_savedmodel_archive_uploads(
    live_server: LiveServer, tmp_path: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    """Real TensorFlow: a `.keras` file (with a Normalization layer, whose captured mean/variance
    tf2onnx leaves as graph inputs unless folded) and a `.tar.gz` of a SavedModel."""
    import keras

    x, y = digits
    keras.utils.set_random_seed(0)
    norm = keras.layers.Normalization()
    norm.adapt(x)
    inp = keras.Input((64,))
    out = keras.layers.Dense(10, activation="softmax")(keras.layers.Dense(16, activation="relu")(norm(inp)))
    model = keras.Model(inp, out)
    model.save(tmp_path / "m.keras")
    status, body = _post(
        live_server,
        live_server.admin_key,
        "k-mlp",
        ("m.keras", (tmp_path / "m.keras").read_bytes()),
        tiny_models.validation_bytes(x, y),
    )
    assert status == 201, body
    variants = {v["name"]: v for v in body["variants"]}  # type: ignore[union-attr]
    assert {"k-mlp/tf-cpu-fp32-t1", "k-mlp/tf-cpu-fp32-t2", "k-mlp/onnx-cpu-fp32-t1"} <= set(variants)
    # int8 was built and checked: kept when it agrees with the reference, else skipped saying so
    # (this 16-unit MLP sits at the 99 % threshold: 98.5 % with onnxruntime 1.31).
    skipped = {s["name"]: s["reason"] for s in body["skipped"]}  # type: ignore[union-attr]
    assert "k-mlp/onnx-cpu-int8-t1" in variants or "parity failed" in skipped["k-mlp/onnx-cpu-int8-t1"]
    assert variants["k-mlp/onnx-cpu-fp32-t1"]["top1_agreement"] == 1.0
    assert variants["k-mlp/onnx-cpu-fp32-t1"]["max_abs_diff"] < 1e-4

    model.export(str(tmp_path / "sm"), format="tf_saved_model", verbose=False)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(tmp_path / "sm", arcname="exported")
    status, body = _post(live_server, live_server.admin_key, "sm-mlp", ("sm.tar.gz", buf.getvalue()))
    assert status == 201, body
    assert body["architecture"]["kind"] == "savedmodel"  # type: ignore[index]
    assert {"sm-mlp/tf-cpu-fp32-t1", "sm-mlp/onnx-cpu-fp32-t1"} <= {v["name"] for v in body["variants"]}  # type: ignore[union-attr]
