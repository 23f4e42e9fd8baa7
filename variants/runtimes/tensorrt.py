"""TensorRT variants, run through ONNX Runtime's TensorRT execution provider.

The artifact is the fp32 ONNX model; TensorRT builds its engine when the session is created (fp16
when the variant's precision says so). Guarded: where the provider is not really present the load
fails with `Unavailable`, and the planner never plans these variants on such a machine.
"""

from __future__ import annotations

from pathlib import Path

from infaas.errors import Unavailable
from infaas.types import Variant
from variants.runtimes.onnxruntime import OnnxLoadedModel, session_options

__all__ = ["TensorRTRuntime", "trt_provider_options"]


def trt_provider_options(variant: Variant, cache_dir: Path) -> dict[str, str]:
    """Options of the TensorRT provider for a variant: precision, engine cache, max batch profile."""
    return {
        "trt_fp16_enable": "True" if variant.spec.precision == "fp16" else "False",
        "trt_int8_enable": "False",
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(cache_dir),
    }


class TensorRTRuntime:
    def load(self, variant: Variant, artifact: Path) -> OnnxLoadedModel:
        import onnxruntime as ort

        cache_dir = artifact.parent / "trt-cache"
        cache_dir.mkdir(exist_ok=True)
        providers: list[str | tuple[str, dict[str, str]]] = [
            ("TensorrtExecutionProvider", trt_provider_options(variant, cache_dir)),
            "CUDAExecutionProvider",
        ]
        try:
            session = ort.InferenceSession(
                str(artifact), sess_options=session_options(variant.spec.threads), providers=providers
            )
        except Exception as exc:  # ORT raises its own untyped errors when TensorRT's libraries are absent
            raise Unavailable(f"TensorRT cannot load {variant.name}: {exc}", variant=variant.name) from exc
        if "TensorrtExecutionProvider" not in session.get_providers():
            raise Unavailable(
                f"variant {variant.name} needs TensorRT, but the session runs on {session.get_providers()}",
                variant=variant.name,
            )
        return OnnxLoadedModel(variant.name, session)
