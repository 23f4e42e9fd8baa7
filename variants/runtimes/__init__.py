"""Load a variant by its record and run batches: one module per runtime, frameworks imported lazily.

`load_variant` is the single entry point the profiler and the workers use, so a variant is measured
through exactly the code path that serves it.
"""

from __future__ import annotations

from pathlib import Path

from infaas.errors import VariantNotFound
from infaas.types import RuntimeName, Variant
from variants.runtimes.base import LoadedModel, Runtime

__all__ = ["LoadedModel", "Runtime", "artifact_path", "load_variant", "runtime_for"]


def runtime_for(name: RuntimeName) -> Runtime:
    """The runtime that loads variants of `name`; importing it does not import its framework."""
    if name == "onnxruntime":
        from variants.runtimes.onnxruntime import OnnxRuntime

        return OnnxRuntime()
    if name == "tensorflow":
        from variants.runtimes.tensorflow import TensorFlowRuntime

        return TensorFlowRuntime()
    if name == "sklearn":
        from variants.runtimes.sklearn import SklearnRuntime

        return SklearnRuntime()
    from variants.runtimes.tensorrt import TensorRTRuntime

    return TensorRTRuntime()


def artifact_path(variant: Variant, artifacts_dir: Path) -> Path:
    """Where a variant's artifact lies: `Variant.artifact` is relative to the artifacts dir."""
    return artifacts_dir / variant.artifact


def load_variant(variant: Variant, artifacts_dir: Path) -> LoadedModel:
    """Load `variant` in this process with its declared threads and hardware.

    `predict` on the result takes float32 rows (n, *input_shape), n ≤ `variant.spec.max_batch`, and
    returns float32 class probabilities (n, num_classes)."""
    path = artifact_path(variant, artifacts_dir)
    if not path.exists():
        raise VariantNotFound(
            f"artifact of {variant.name} is missing at {path}; re-register the architecture",
            variant=variant.name,
        )
    return runtime_for(variant.spec.runtime).load(variant, path)
