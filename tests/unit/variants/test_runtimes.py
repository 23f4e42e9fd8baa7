"""`load_variant`: dispatch on the runtime, explicit threads, float32 probabilities out."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pytest

from infaas.errors import Unavailable, VariantNotFound
from infaas.types import Parity, RuntimeName, Variant, VariantSpec
from tests import tiny_models
from variants.runtimes import load_variant
from variants.runtimes.onnxruntime import OnnxLoadedModel, provider_options_for, providers_for

PARITY = Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1)


def _variant(runtime: RuntimeName, artifact: str, threads: int = 1, hardware: str = "cpu") -> Variant:
    spec = VariantSpec(architecture="m", runtime=runtime, threads=threads, hardware=hardware)  # type: ignore[arg-type]
    return Variant(spec=spec, artifact=artifact, sha256="0" * 64, parity=PARITY)


def test_onnx_variant_runs_with_its_declared_threads(tmp_path: Path) -> None:
    x, y = tiny_models.digits()
    (tmp_path / "m.onnx").write_bytes(tiny_models.linear_onnx(x=x, y=y))
    for threads in (1, 2):
        loaded = load_variant(_variant("onnxruntime", "m.onnx", threads), tmp_path)
        assert isinstance(loaded, OnnxLoadedModel)
        assert loaded.session.get_session_options().intra_op_num_threads == threads
        assert loaded.session.get_session_options().inter_op_num_threads == 1
        out = loaded.predict(x[:7].astype(np.float64))  # any float rows are accepted
        assert out.shape == (7, 10) and out.dtype == np.float32
        np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-5)
        assert loaded.variant == "m/onnx-cpu-fp32-t" + str(threads)
        loaded.close()


def test_onnx_runtime_picks_the_probability_output_of_skl2onnx_models(tmp_path: Path) -> None:
    from variants.converters.sklearn import sklearn_to_onnx

    x, y = tiny_models.digits()
    model = tiny_models.sklearn_logreg(x, y)
    sklearn_to_onnx(model, 64, tmp_path / "lr.onnx")  # outputs: label (int64), probabilities
    out = load_variant(_variant("onnxruntime", "lr.onnx"), tmp_path).predict(x)
    np.testing.assert_allclose(out, model.predict_proba(x), atol=1e-4)  # type: ignore[attr-defined]


def test_sklearn_variant(tmp_path: Path) -> None:
    x, y = tiny_models.digits()
    model = tiny_models.sklearn_logreg(x, y)
    joblib.dump(model, tmp_path / "m.joblib")
    out = load_variant(_variant("sklearn", "m.joblib"), tmp_path).predict(x[:5])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, model.predict_proba(x[:5]), atol=1e-6)  # type: ignore[attr-defined]


def test_missing_artifact_says_to_re_register(tmp_path: Path) -> None:
    with pytest.raises(VariantNotFound, match="re-register"):
        load_variant(_variant("onnxruntime", "nope.onnx"), tmp_path)


def test_gpu_variants_run_only_where_a_session_really_uses_the_provider(tmp_path: Path) -> None:
    from variants.plan import OrtProviderProbe

    (tmp_path / "m.onnx").write_bytes(tiny_models.linear_onnx())
    present = OrtProviderProbe().session_providers()
    for runtime, provider in (
        ("onnxruntime", "CUDAExecutionProvider"),
        ("tensorrt", "TensorrtExecutionProvider"),
    ):
        variant = _variant(runtime, "m.onnx", hardware="gpu")  # type: ignore[arg-type]
        assert providers_for(variant)[0] == provider
        if provider in present:  # a lent GPU machine
            loaded = load_variant(variant, tmp_path)
            assert isinstance(loaded, OnnxLoadedModel) and loaded.providers[0] == provider
            assert loaded.predict(np.zeros((3, 64), np.float32)).shape == (3, 10)
        else:  # get_available_providers() lists it anyway; the runtime must not fall back silently
            with pytest.raises(Unavailable):
                load_variant(variant, tmp_path)


def test_cuda_fp32_variants_turn_tf32_off_and_nothing_else_is_touched() -> None:
    gpu = _variant("onnxruntime", "m.onnx", hardware="gpu")
    assert provider_options_for(gpu) == [{"use_tf32": "0"}, {}]
    fp16 = gpu.model_copy(update={"spec": gpu.spec.model_copy(update={"precision": "fp16"})})
    assert provider_options_for(fp16) == [{}, {}]  # fp16 is fp16 whatever TF32 says
    assert provider_options_for(_variant("onnxruntime", "m.onnx")) == [{}]
    assert len(provider_options_for(_variant("tensorrt", "m.onnx", hardware="gpu"))) == 3
