"""The registration use case on the in-memory store: idempotent, atomic, and strict about uploads."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from infaas.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    PayloadTooLarge,
    RegistrationError,
    SpecMismatch,
    UnsupportedFormat,
)
from infaas.registry import Registry, build_registry, check_probabilities
from infaas.settings import Settings
from infaas.store import MemoryStore
from tests import tiny_models
from variants.plan import FakeProviderProbe


@pytest.fixture
def digits() -> tuple[np.ndarray, np.ndarray]:
    return tiny_models.digits(200)


@pytest.fixture
def registry(settings: Settings) -> Registry:
    return build_registry(settings, MemoryStore(), probe=FakeProviderProbe())


@pytest.fixture
def files(tmp_path: Path, digits: tuple[np.ndarray, np.ndarray]) -> dict[str, Path]:
    x, y = digits
    up = tmp_path / "uploads"
    up.mkdir()
    paths = {
        "model": up / "lin.onnx",
        "other": up / "other.onnx",
        "logits": up / "logits.onnx",
        "narrow": up / "narrow.onnx",
        "val": up / "val.npz",
    }
    paths["model"].write_bytes(tiny_models.linear_onnx(x=x, y=y))
    paths["other"].write_bytes(tiny_models.linear_onnx(x=x[:100], y=y[:100]))
    paths["logits"].write_bytes(tiny_models.linear_onnx(softmax=False))
    paths["narrow"].write_bytes(tiny_models.linear_onnx(in_dim=32))
    tiny_models.validation_npz(paths["val"], x, y)
    return paths


def _leftovers(settings: Settings) -> list[Path]:
    """Files under the data dir that a failed registration must not leave (the store is in memory)."""
    return [p for p in settings.data_dir.rglob("*") if p.is_file() and p.name != "admin_key"]


def test_register_creates_task_architecture_and_variants(registry: Registry, files: dict[str, Path]) -> None:
    result = registry.register(
        files["model"], name="lin", task="digits", validation=files["val"], role="tenant", owner="acme"
    )
    assert result.created and result.task_created
    assert result.task.input_spec.shape == (64,) and result.task.num_classes == 10
    assert result.task.validation_size == 200
    assert result.architecture.kind == "onnx" and result.architecture.owner == "acme"
    assert {v.name for v in result.variants} == {
        "lin/onnx-cpu-fp32-t1",
        "lin/onnx-cpu-fp32-t2",
        "lin/onnx-cpu-int8-t1",
        "lin/onnx-cpu-int8-t2",
    }
    store = registry.store
    assert {v.name for v in store.list_variants("lin")} == {v.name for v in result.variants}
    assert len(store.list_skipped("lin")) == 4  # GPU variants, with reasons
    assert not any((registry.settings.data_dir / "tmp").iterdir())


def test_same_bytes_again_is_idempotent_and_different_bytes_conflict(
    registry: Registry, files: dict[str, Path]
) -> None:
    first = registry.register(files["model"], name="lin", task="digits", validation=files["val"])
    artifacts_before = sorted(registry.settings.artifacts_dir.rglob("*"))
    again = registry.register(files["model"], name="lin", task="digits", validation=files["val"])
    assert not again.created
    assert again.architecture == first.architecture
    assert {v.name for v in again.variants} == {v.name for v in first.variants}
    assert sorted(registry.settings.artifacts_dir.rglob("*")) == artifacts_before
    with pytest.raises(Conflict, match="different bytes"):
        registry.register(files["other"], name="lin", task="digits")
    with pytest.raises(Conflict, match="different task"):
        registry.register(files["model"], name="lin", task="other-task", validation=files["val"])


def test_second_architecture_reuses_the_task_and_its_validation_set(
    registry: Registry, files: dict[str, Path], tmp_path: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    registry.register(files["model"], name="lin", task="digits", validation=files["val"])
    second = registry.register(files["other"], name="lin2", task="digits")
    assert not second.task_created and second.variants
    x, y = digits
    different = tiny_models.validation_npz(tmp_path / "v2.npz", x[:50], y[:50])
    with pytest.raises(Conflict, match="different validation set"):
        registry.register(files["other"], name="lin3", task="digits", validation=different)


def test_sklearn_upload_from_a_tenant_is_refused_before_unpickling(
    registry: Registry, tmp_path: Path, files: dict[str, Path]
) -> None:
    sentinel = tmp_path / "unpickled"
    upload = tmp_path / "model.joblib"
    upload.write_bytes(tiny_models.tripwire_pickle(sentinel))
    with pytest.raises(Forbidden, match=r"upload the \.onnx instead"):
        registry.register(
            upload, name="sk", task="digits", validation=files["val"], role="tenant", owner="acme"
        )
    assert not sentinel.exists()
    assert registry.store.get_architecture("sk") is None


def test_admin_may_register_sklearn(
    registry: Registry, files: dict[str, Path], digits: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    import joblib

    x, y = digits
    joblib.dump(tiny_models.sklearn_logreg(x, y), tmp_path / "lr.joblib")
    result = registry.register(tmp_path / "lr.joblib", name="lr", task="digits", validation=files["val"])
    assert "lr/sklearn-cpu-fp32-t1" in {v.name for v in result.variants}
    assert any("nothing to quantize" in s.reason for s in result.skipped)


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [
        ("corrupt", UnsupportedFormat, "cannot parse the ONNX file"),
        ("unknown", UnsupportedFormat, "unknown model format"),
        ("narrow", SpecMismatch, r"inputs of shape \(32,\)"),
        ("logits", SpecMismatch, "not a probability vector"),
        ("no-validation", RegistrationError, "is new: send its labelled validation set"),
        ("bad-validation", RegistrationError, "arrays 'x' and 'y'"),
        ("bad-name", InvalidInput, "is not valid"),
    ],
)
def test_bad_uploads_fail_clearly_and_leave_nothing_behind(
    registry: Registry, files: dict[str, Path], tmp_path: Path, case: str, error: type[Exception], match: str
) -> None:
    upload, validation, name = files["model"], files["val"], "bad"
    if case == "corrupt":
        upload = tmp_path / "corrupt.onnx"
        upload.write_bytes(b"\x00\x01 definitely not protobuf" * 10)
    elif case == "unknown":
        upload = tmp_path / "model.h5"
        shutil.copyfile(files["model"], upload)
    elif case in ("narrow", "logits"):
        upload = files[case]
    elif case == "bad-validation":
        validation = tmp_path / "wrong.npz"
        np.savez(validation, inputs=np.zeros((3, 64)), labels=np.zeros(3))
    elif case == "bad-name":
        name = "Bad Name!"
    with pytest.raises(error, match=match):
        registry.register(
            upload, name=name, task="digits", validation=None if case == "no-validation" else validation
        )
    assert _leftovers(registry.settings) == []
    assert registry.store.list_architectures() == [] and registry.store.list_tasks() == []
    # and the registry keeps working
    assert registry.register(files["model"], name="ok", task="digits", validation=files["val"]).created


def test_wrong_number_of_classes_for_an_existing_task(
    registry: Registry, files: dict[str, Path], tmp_path: Path
) -> None:
    registry.register(files["model"], name="lin", task="digits", validation=files["val"])
    three = tmp_path / "three.onnx"
    three.write_bytes(tiny_models.linear_onnx(classes=3))
    with pytest.raises(SpecMismatch, match="3 classes"):
        registry.register(three, name="three", task="digits")


def test_upload_over_the_size_limit(tmp_path: Path, files: dict[str, Path]) -> None:
    settings = Settings(data_dir=tmp_path / "small", admin_key="k", max_upload_mb=0.001)
    registry = build_registry(settings, MemoryStore(), probe=FakeProviderProbe())
    with pytest.raises(PayloadTooLarge, match="INFAAS_MAX_UPLOAD_MB"):
        registry.register(files["model"], name="lin", task="digits", validation=files["val"])


def test_a_failure_midway_removes_every_published_artifact(
    registry: Registry, files: dict[str, Path]
) -> None:
    class Interrupted(Exception):
        """What a Ctrl-C in the middle of a long registration looks like to the registry."""

    def interrupt(message: str, done: int, total: int) -> None:
        if done == 3:  # three variants built and their artifacts published by now
            raise Interrupted

    with pytest.raises(Interrupted):
        registry.register(
            files["model"], name="lin", task="digits", validation=files["val"], progress=interrupt
        )
    assert _leftovers(registry.settings) == []
    assert registry.store.get_architecture("lin") is None and registry.store.list_variants() == []
    assert registry.store.list_tasks() == []


def test_check_probabilities() -> None:
    check_probabilities(np.array([[0.25, 0.75], [1.0, 0.0]], dtype=np.float32), 2)
    with pytest.raises(SpecMismatch, match="not a probability vector"):
        check_probabilities(np.array([[2.0, -1.0]], dtype=np.float32), 1)
    with pytest.raises(SpecMismatch, match="classes ≥ 2"):
        check_probabilities(np.ones((4, 1), dtype=np.float32), 4)
    with pytest.raises(SpecMismatch, match="NaN"):
        check_probabilities(np.array([[np.nan, 1.0]], dtype=np.float32), 1)
