"""The registration use case on the in-memory store: idempotent, atomic, and strict about uploads."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from infaas.errors import (
    Conflict,
    Forbidden,
    InfaasError,
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
        files["model"], name="lin", task="digits", validation=files["val"], role="owner", owner="acme"
    )
    assert result.created and result.task_created
    assert result.task.owners == ("acme",)  # its creator owns the new task
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
    with pytest.raises(Conflict, match="registered in task 'digits'"):
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
            upload, name="sk", task="digits", validation=files["val"], role="owner", owner="acme"
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


def test_only_owners_of_a_task_register_into_it(registry: Registry, files: dict[str, Path]) -> None:
    with pytest.raises(Forbidden, match="tenant keys query"):
        registry.register(
            files["model"], name="lin", task="digits", validation=files["val"], role="tenant", owner="t"
        )
    registry.register(
        files["model"], name="lin", task="digits", validation=files["val"], role="owner", owner="acme"
    )
    with pytest.raises(Forbidden, match="belongs to other owners"):
        registry.register(files["other"], name="cheap", task="digits", role="owner", owner="mallory")
    assert registry.store.get_architecture("cheap") is None
    registry.register(files["other"], name="lin2", task="digits", role="owner", owner="acme")
    registry.register(files["other"], name="lin3", task="digits")  # the admin always may


def test_new_bytes_with_new_version_become_the_next_version(
    registry: Registry, files: dict[str, Path]
) -> None:
    first = registry.register(files["model"], name="lin", task="digits", validation=files["val"])
    second = registry.register(files["other"], name="lin", task="digits", new_version=True)
    assert second.created and second.architecture.name == "lin@2" and second.architecture.version == 2
    assert second.variants and all(v.name.startswith("lin@2/") for v in second.variants)
    assert {v.name for v in registry.store.list_variants("lin")} == {v.name for v in first.variants}
    labels = registry.store.get_labels("lin")
    assert labels is not None and labels.stable == 1 and labels.state(2) == "ready"
    # Either version's bytes again: that version, nothing new.
    again = registry.register(files["model"], name="lin", task="digits", new_version=True)
    assert not again.created and again.architecture.name == "lin"
    assert not registry.register(files["other"], name="lin", task="digits").created
    assert {a.name for a in registry.store.list_architectures()} == {"lin", "lin@2"}


def test_a_version_that_fails_to_build_is_recorded_failed(
    registry: Registry, files: dict[str, Path], tmp_path: Path
) -> None:
    registry.register(files["model"], name="lin", task="digits", validation=files["val"])
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    with pytest.raises(InfaasError):
        registry.register(broken, name="lin", task="digits", new_version=True)
    labels = registry.store.get_labels("lin")
    assert labels is not None and labels.state(2) == "failed" and labels.errors[2]
    assert registry.store.get_architecture("lin@2") is None


def test_remove_artifacts_keeps_what_another_version_uses(registry: Registry, files: dict[str, Path]) -> None:
    registry.register(files["model"], name="lin", task="digits", validation=files["val"])
    registry.register(files["other"], name="lin", task="digits", new_version=True)
    store = registry.store
    gone = store.get_architecture("lin@2")
    assert gone is not None
    rels = [gone.artifact] + [v.artifact for v in store.list_variants("lin@2")]
    shared = store.get_architecture("lin")
    assert shared is not None
    store.delete_architecture("lin@2")
    removed = registry.remove_artifacts([*rels, shared.artifact])
    assert removed == len({Path(*Path(r).parts[:2]) for r in rels})
    assert not any((registry.settings.artifacts_dir / r).exists() for r in rels)
    assert all((registry.settings.artifacts_dir / v.artifact).exists() for v in store.list_variants("lin"))
    assert (registry.settings.artifacts_dir / shared.artifact).exists()
