"""The generator: builds the plan, checks parity on the whole validation set, publishes artifacts."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pytest

from tests import tiny_models
from variants.artifacts import Staging, sha256_path
from variants.generator import MIN_TOP1_AGREEMENT, generate, parity
from variants.plan import FakeProviderProbe, detect_hardware
from variants.reference import load_reference, predict_in_batches

CPU = detect_hardware(FakeProviderProbe())


def test_parity_is_top1_agreement_and_max_abs_diff() -> None:
    ref = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.5, 0.5]], dtype=np.float32)
    other = np.array([[0.8, 0.2], [0.3, 0.7], [0.4, 0.6], [0.5, 0.5]], dtype=np.float32)
    p = parity(ref, other)
    assert p.top1_agreement == 0.75 and p.samples == 4
    assert p.max_abs_diff == pytest.approx(0.2, abs=1e-6)
    with pytest.raises(ValueError, match="shape"):
        parity(ref, other[:, :1])


def _sklearn_setup(tmp_path: Path, model: object) -> tuple[Path, np.ndarray, np.ndarray, Staging]:
    x, _ = tiny_models.digits()
    src = tmp_path / "m.joblib"
    joblib.dump(model, src)
    ref = load_reference("sklearn", src)
    return src, x, predict_in_batches(ref.predict, x, 128), Staging(tmp_path / "artifacts", tmp_path / "tmp")


def test_sklearn_mlp_gives_native_onnx_and_int8_variants_with_recorded_parity(tmp_path: Path) -> None:
    x, y = tiny_models.digits()
    src, x, ref_probs, staging = _sklearn_setup(tmp_path, tiny_models.sklearn_mlp(x, y))
    result = generate(
        architecture="mlp",
        kind="sklearn",
        source=src,
        reference=load_reference("sklearn", src),
        input_shape=(64,),
        validation_x=x,
        reference_probs=ref_probs,
        hardware=CPU,
        staging=staging,
        now_s=123.0,
    )
    names = {v.name for v in result.variants}
    assert names == {
        "mlp/sklearn-cpu-fp32-t1",
        "mlp/onnx-cpu-fp32-t1",
        "mlp/onnx-cpu-fp32-t2",
        "mlp/onnx-cpu-int8-t1",
        "mlp/onnx-cpu-int8-t2",
    }
    assert result.notes == {"int8": "dynamic"}
    by_name = {v.name: v for v in result.variants}
    for v in result.variants:
        assert v.parity.samples == len(x)  # the whole validation set
        assert v.parity.top1_agreement >= MIN_TOP1_AGREEMENT
        path = tmp_path / "artifacts" / v.artifact
        assert sha256_path(path) == v.sha256 and v.sha256 in v.artifact  # content-addressed
        assert v.created_at_s == 123.0
    assert (
        by_name["mlp/onnx-cpu-int8-t1"].parity.max_abs_diff > 0.0
    )  # int8 really differs, and it is recorded
    assert by_name["mlp/onnx-cpu-fp32-t1"].artifact == by_name["mlp/onnx-cpu-fp32-t2"].artifact
    assert {s.name for s in result.skipped} == {
        "mlp/onnx-gpu-fp32-t1",
        "mlp/onnx-gpu-fp16-t1",
        "mlp/trt-gpu-fp32-t1",
        "mlp/trt-gpu-fp16-t1",
    }


def test_tree_model_records_why_there_is_no_int8(tmp_path: Path) -> None:
    from sklearn.ensemble import RandomForestClassifier

    x, y = tiny_models.digits()
    src, x, ref_probs, staging = _sklearn_setup(tmp_path, RandomForestClassifier(5, random_state=0).fit(x, y))
    result = generate(
        architecture="rf",
        kind="sklearn",
        source=src,
        reference=load_reference("sklearn", src),
        input_shape=(64,),
        validation_x=x,
        reference_probs=ref_probs,
        hardware=CPU,
        staging=staging,
        now_s=0.0,
    )
    skipped = {s.name: s.reason for s in result.skipped}
    assert "nothing to quantize" in skipped["rf/onnx-cpu-int8-t1"]
    assert {v.spec.runtime for v in result.variants} == {"sklearn", "onnxruntime"}


def test_variants_that_disagree_with_the_reference_are_not_kept_and_nothing_is_published(
    tmp_path: Path,
) -> None:
    x, y = tiny_models.digits()
    src, x, ref_probs, staging = _sklearn_setup(tmp_path, tiny_models.sklearn_logreg(x, y))
    wrong = np.roll(ref_probs, 1, axis=1)  # a reference every build disagrees with
    result = generate(
        architecture="lr",
        kind="sklearn",
        source=src,
        reference=load_reference("sklearn", src),
        input_shape=(64,),
        validation_x=x,
        reference_probs=wrong,
        hardware=CPU,
        staging=staging,
        now_s=0.0,
    )
    assert result.variants == []
    reasons = {s.name: s.reason for s in result.skipped}
    assert reasons["lr/onnx-cpu-fp32-t1"].startswith("parity failed: top-1 agreement")
    assert reasons["lr/sklearn-cpu-fp32-t1"].startswith("parity failed")
    assert not any((tmp_path / "artifacts").rglob("*.onnx"))


def test_gpu_variants_planned_from_a_lying_probe_are_skipped_not_served_on_cpu(tmp_path: Path) -> None:
    """A probe that claims CUDA on a CPU-only machine (what get_available_providers() does): the
    GPU variants are built (fp16 included) but fail to load on CUDA, and are recorded as skipped
    rather than silently measured on the CPU."""
    from variants.plan import CUDA_PROVIDER, OrtProviderProbe

    x, y = tiny_models.digits()
    src, x, ref_probs, staging = _sklearn_setup(tmp_path, tiny_models.sklearn_mlp(x, y))
    claims_cuda = detect_hardware(FakeProviderProbe([CUDA_PROVIDER]))
    result = generate(
        architecture="mlp",
        kind="sklearn",
        source=src,
        reference=load_reference("sklearn", src),
        input_shape=(64,),
        validation_x=x,
        reference_probs=ref_probs,
        hardware=claims_cuda,
        staging=staging,
        now_s=0.0,
    )
    gpu_kept = {v.name for v in result.variants if v.spec.hardware == "gpu"}
    gpu_skipped = {s.name: s.reason for s in result.skipped if "-gpu-" in s.name}
    if CUDA_PROVIDER in OrtProviderProbe().session_providers():  # a lent GPU machine: they run
        assert gpu_kept == {"mlp/onnx-gpu-fp32-t1", "mlp/onnx-gpu-fp16-t1"}
    else:
        assert gpu_kept == set()
        assert "needs CUDAExecutionProvider" in gpu_skipped["mlp/onnx-gpu-fp32-t1"]
        assert "needs CUDAExecutionProvider" in gpu_skipped["mlp/onnx-gpu-fp16-t1"]
    assert "TensorrtExecutionProvider" in gpu_skipped["mlp/trt-gpu-fp32-t1"]  # not claimed: not planned
    assert {v.name for v in result.variants if v.spec.hardware == "cpu"} >= {"mlp/onnx-cpu-fp32-t1"}
