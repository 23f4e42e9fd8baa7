"""Each converter on a small real model: the output passes the ONNX checker and agrees with the source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests import tiny_models
from variants.converters.fp16 import to_fp16
from variants.converters.onnx_utils import dedupe_opsets, op_types
from variants.converters.quantize import NotQuantizable, quantization_method, quantize_int8
from variants.converters.sklearn import sklearn_to_onnx
from variants.converters.tensorrt import TensorRTUnavailable, prepare_tensorrt
from variants.generator import parity


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, {session.get_inputs()[0].name: x})
    return np.asarray(next(o for o in outputs if np.ndim(o) == 2), dtype=np.float32)


def test_quantization_method_is_static_for_convolutions_dynamic_for_matmul() -> None:
    assert quantization_method({"Conv", "MatMul", "Relu"}) == "static-qdq"
    assert quantization_method({"MatMul", "Add", "Softmax"}) == "dynamic"
    assert quantization_method({"Gemm"}) == "dynamic"
    with pytest.raises(NotQuantizable, match="nothing to quantize"):
        quantization_method({"TreeEnsembleClassifier", "Identity"})


def test_dedupe_opsets_keeps_the_highest_version_per_domain() -> None:
    model = onnx.load_from_string(tiny_models.linear_onnx())
    extra = model.opset_import.add()
    extra.domain, extra.version = "", 15
    dedupe_opsets(model)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]


def test_sklearn_to_onnx_matches_predict_proba(tmp_path: Path) -> None:
    x, y = tiny_models.digits()
    model = tiny_models.sklearn_logreg(x, y)
    path = sklearn_to_onnx(model, 64, tmp_path / "m.onnx")
    onnx.checker.check_model(str(path))
    p = parity(np.asarray(model.predict_proba(x), dtype=np.float32), _run(path, x))  # type: ignore[attr-defined]
    assert p.top1_agreement == 1.0 and p.max_abs_diff < 1e-4


def test_int8_dynamic_on_an_mlp_records_its_parity(tmp_path: Path) -> None:
    x, y = tiny_models.digits()
    model = tiny_models.sklearn_mlp(x, y)
    fp32 = sklearn_to_onnx(model, 64, tmp_path / "m.onnx")
    int8, method = quantize_int8(fp32, tmp_path / "m.int8.onnx", x[:64])
    assert method == "dynamic"
    quantized = onnx.load(str(int8))
    assert {"MatMulInteger", "DynamicQuantizeLinear"} & op_types(quantized)
    p = parity(_run(fp32, x), _run(int8, x))
    assert p.top1_agreement >= 0.97  # measured, then recorded by the generator
    # Some probability moves (it is quantized) but stays bounded; near a decision boundary one row
    # can move by a third (0.33 with scikit-learn 1.9 / onnxruntime 1.31): top-1 is what gates.
    assert 0.0 < p.max_abs_diff < 0.5


def test_int8_static_qdq_for_convolutions(tmp_path: Path) -> None:
    x, _ = tiny_models.digits()
    fp32 = tmp_path / "conv.onnx"
    fp32.write_bytes(tiny_models.conv_onnx())
    int8, method = quantize_int8(fp32, tmp_path / "conv.int8.onnx", x[:64])
    assert method == "static-qdq"
    ops = op_types(onnx.load(str(int8)))
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    assert "ConvInteger" not in ops  # the dynamic ConvInteger path is 4–10× slower here
    p = parity(_run(fp32, x), _run(int8, x))
    assert p.top1_agreement >= 0.9


def test_trees_are_not_quantizable(tmp_path: Path) -> None:
    from sklearn.tree import DecisionTreeClassifier

    x, y = tiny_models.digits()
    fp32 = sklearn_to_onnx(DecisionTreeClassifier(max_depth=4).fit(x, y), 64, tmp_path / "t.onnx")
    with pytest.raises(NotQuantizable):
        quantize_int8(fp32, tmp_path / "t.int8.onnx", x[:32])


def test_fp16_keeps_float32_io_and_halves_the_weights(tmp_path: Path) -> None:
    x, y = tiny_models.digits()
    fp32 = tmp_path / "m.onnx"
    fp32.write_bytes(tiny_models.linear_onnx(x=x, y=y))
    half = onnx.load(str(to_fp16(fp32, tmp_path / "m.fp16.onnx")))
    onnx.checker.check_model(half)
    assert half.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert half.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert {init.data_type for init in half.graph.initializer} == {onnx.TensorProto.FLOAT16}
    assert (tmp_path / "m.fp16.onnx").stat().st_size < fp32.stat().st_size
    # ORT's CPU provider also runs it, which lets the parity check be tested below the GPU line.
    p = parity(_run(fp32, x), _run(tmp_path / "m.fp16.onnx", x))
    assert p.top1_agreement >= 0.99 and p.max_abs_diff < 1e-2


def test_tensorrt_is_guarded_by_what_a_session_reported(tmp_path: Path) -> None:
    fp32 = tmp_path / "m.onnx"
    fp32.write_bytes(tiny_models.linear_onnx())
    with pytest.raises(TensorRTUnavailable, match="TensorRT not present"):
        prepare_tensorrt(fp32, tmp_path / "trt" / "m.onnx", {"CPUExecutionProvider"})
    assert not (tmp_path / "trt").exists()
    out = prepare_tensorrt(
        fp32, tmp_path / "trt" / "m.onnx", {"TensorrtExecutionProvider", "CPUExecutionProvider"}
    )
    assert out.read_bytes() == fp32.read_bytes()
