"""fp16 for GPU variants: weights and activations in half precision, inputs and outputs kept fp32."""

from __future__ import annotations

from pathlib import Path

from variants.converters.onnx_utils import save_onnx

__all__ = ["to_fp16"]


def to_fp16(fp32_path: Path, out_path: Path) -> Path:
    """Convert an fp32 ONNX model to fp16, keeping float32 I/O so callers need not change."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = convert_float_to_float16(onnx.load(str(fp32_path)), keep_io_types=True)
    # The converter appends the input casts after the nodes that read them; the checker (and some
    # runtimes) need nodes in topological order.
    wrapped = OnnxModel(model)
    wrapped.topological_sort()
    return save_onnx(wrapped.model, out_path)
