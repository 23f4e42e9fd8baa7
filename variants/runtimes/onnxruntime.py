"""ONNX Runtime: CPU (fp32, int8) and CUDA (fp32, fp16) variants.

Sessions are created with explicit intra-op threads and one inter-op thread: two default-threaded
runtimes on 2 cores measured 20× worse p99 than one thread each (DESIGN.md, "Threads"). Spinning is
off because a spinning thread burns a core that a neighbouring worker needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from infaas.errors import Unavailable
from infaas.types import Variant

__all__ = ["OnnxLoadedModel", "OnnxRuntime", "provider_options_for", "providers_for", "session_options"]

_ORT_FLOAT = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def providers_for(variant: Variant) -> list[str]:
    """The execution providers a variant's hardware asks for, most specific first."""
    if variant.spec.runtime == "tensorrt":
        return ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    if variant.spec.hardware == "gpu":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def provider_options_for(variant: Variant) -> list[dict[str, str]]:
    """Options for each provider of `providers_for`, in its order. A CUDA fp32 variant turns TF32
    off: ONNX Runtime's default (`use_tf32=1`) runs fp32 MatMuls in TF32 (10-bit mantissa) on
    Ampere and later GPUs, so a variant named fp32 was not fp32 (max |diff| against the CPU fp32
    variant 3e-4 on an H200, where fp32 differs by ~1e-6)."""
    options: list[dict[str, str]] = [{} for _ in providers_for(variant)]
    if (
        variant.spec.runtime == "onnxruntime"
        and variant.spec.hardware == "gpu"
        and variant.spec.precision == "fp32"
    ):
        options[0] = {"use_tf32": "0"}
    return options


def session_options(threads: int) -> Any:
    """SessionOptions with `threads` intra-op threads, sequential execution, spinning off."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


def _probability_output(session: Any) -> tuple[str, int]:
    """Name and index of the class-probability output: the first rank-2 float output.

    skl2onnx classifiers also emit an int64 label output first; uploaded ONNX models may name
    their outputs anything."""
    outputs = session.get_outputs()
    for i, out in enumerate(outputs):
        if out.type in _ORT_FLOAT and len(out.shape) == 2:
            return out.name, i
    return outputs[-1].name, len(outputs) - 1


class OnnxLoadedModel:
    def __init__(self, name: str, session: Any) -> None:
        self._name = name
        self.session = session
        inp = session.get_inputs()[0]
        self._input_name: str = inp.name
        self._input_dtype = _ORT_FLOAT.get(inp.type, np.float32)
        self._output_name, _ = _probability_output(session)

    @property
    def variant(self) -> str:
        return self._name

    @property
    def providers(self) -> list[str]:
        """What the session really runs on (it silently falls back to CPU when a provider fails)."""
        providers: list[str] = self.session.get_providers()
        return providers

    def predict(self, x: np.ndarray) -> np.ndarray:
        feed = {self._input_name: np.ascontiguousarray(x, dtype=self._input_dtype)}
        (out,) = self.session.run([self._output_name], feed)
        return np.asarray(out, dtype=np.float32)

    def close(self) -> None:
        self.session = None


class OnnxRuntime:
    """Loads `.onnx` artifacts into an ORT InferenceSession."""

    def load(self, variant: Variant, artifact: Path) -> OnnxLoadedModel:
        import onnxruntime as ort

        wanted = providers_for(variant)
        session = ort.InferenceSession(
            str(artifact),
            sess_options=session_options(variant.spec.threads),
            providers=wanted,
            provider_options=provider_options_for(variant),
        )
        got = session.get_providers()
        if wanted[0] not in got:
            # The provider list lies (CUDA is "available" on CPU-only machines); refuse to serve a
            # GPU variant on CPU, where its profile would be wrong.
            raise Unavailable(
                f"variant {variant.name} needs {wanted[0]}, but the session runs on {got}",
                variant=variant.name,
            )
        return OnnxLoadedModel(variant.name, session)
