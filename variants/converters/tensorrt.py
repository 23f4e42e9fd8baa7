"""TensorRT: guarded. The engine is built by ONNX Runtime's TensorRT provider from the fp32 ONNX
model when a variant loads (`variants.runtimes.tensorrt`); this converter checks the provider is
really there and writes the model that provider will compile."""

from __future__ import annotations

import shutil
from collections.abc import Set
from pathlib import Path

__all__ = ["TRT_PROVIDER", "TensorRTUnavailable", "prepare_tensorrt"]

TRT_PROVIDER = "TensorrtExecutionProvider"


class TensorRTUnavailable(Exception):
    """No session on this machine runs on TensorRT; the reason is recorded with the skipped variant."""


def prepare_tensorrt(fp32_path: Path, out_path: Path, session_providers: Set[str]) -> Path:
    """Copy the ONNX model the TensorRT provider compiles, if a real session reported that provider."""
    if TRT_PROVIDER not in session_providers:
        raise TensorRTUnavailable(
            f"TensorRT not present: a probe session ran on {sorted(session_providers)} "
            f"(onnxruntime lists {TRT_PROVIDER} as available even where its libraries are missing)"
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fp32_path, out_path)
    return out_path
