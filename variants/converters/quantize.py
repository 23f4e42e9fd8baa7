"""int8 quantization with ONNX Runtime's quantizer.

Measured here: dynamic quantization of MatMul/Gemm is free in accuracy and a little faster, while
dynamic ConvInteger is 4–10× *slower* than fp32. So graphs with convolutions are quantized
statically (QDQ, calibrated on validation rows); graphs with only MatMul/Gemm dynamically; graphs
with neither (trees, linear classifiers) are not quantized at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from variants.converters.onnx_utils import check_onnx, dedupe_opsets, op_types

__all__ = ["NotQuantizable", "quantization_method", "quantize_int8"]

_MATMUL = {"MatMul", "Gemm"}
_CONV = {"Conv"}


class _DropPreprocessingHint(logging.Filter):
    """ORT's quantizer logs a pre-processing hint on the root logger for every dynamic quantization;
    pre-processing matters for static quantization only, where it is done."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Please consider to run pre-processing")


_HINT_FILTER = _DropPreprocessingHint()


class NotQuantizable(Exception):
    """The graph has no operator worth quantizing; the reason is recorded with the skipped variant."""


def quantization_method(ops: set[str]) -> Literal["static-qdq", "dynamic"]:
    """Static QDQ where there are convolutions, dynamic where only MatMul/Gemm (pure)."""
    if ops & _CONV:
        return "static-qdq"
    if ops & _MATMUL:
        return "dynamic"
    raise NotQuantizable(f"nothing to quantize: no MatMul, Gemm or Conv among {sorted(ops)}")


def _calibration_reader(input_name: str, rows: np.ndarray, batch: int = 32) -> Any:
    """A CalibrationDataReader feeding validation rows to the static quantizer, `batch` at a time."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._batches: Iterator[np.ndarray] = iter(())
            self.rewind()

        def get_next(self) -> dict[str, np.ndarray] | None:
            chunk = next(self._batches, None)
            return None if chunk is None else {input_name: chunk}

        def rewind(self) -> None:
            self._batches = iter([rows[i : i + batch].astype(np.float32) for i in range(0, len(rows), batch)])

    return _Reader()


def quantize_int8(fp32_path: Path, out_path: Path, calibration_rows: np.ndarray) -> tuple[Path, str]:
    """Write an int8 version of `fp32_path`; returns (path, method used)."""
    import onnx
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = dedupe_opsets(onnx.load(str(fp32_path)))
    method = quantization_method(op_types(model))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    clean = out_path.with_suffix(".fp32.onnx")
    onnx.save_model(model, str(clean))
    if method == "dynamic":
        if _HINT_FILTER not in logging.getLogger().filters:
            logging.getLogger().addFilter(_HINT_FILTER)
        quantize_dynamic(
            str(clean), str(out_path), op_types_to_quantize=sorted(_MATMUL), weight_type=QuantType.QInt8
        )
    else:
        prepared = out_path.with_suffix(".prep.onnx")
        quant_pre_process(str(clean), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(out_path),
            _calibration_reader(model.graph.input[0].name, calibration_rows),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=sorted(_CONV),
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
        prepared.unlink(missing_ok=True)
    clean.unlink(missing_ok=True)
    check_onnx(out_path)
    return out_path, method
