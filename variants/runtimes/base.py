"""The runtime boundary: load a variant by its record and run a batch on it.

`runtimes/` is the only way the profiler and the workers run a variant, so a variant measured by
the profiler is the same code path that serves it. Each runtime module imports its framework lazily
(TensorFlow alone costs ~530 MB per process) and creates its session with explicit thread counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from infaas.types import Variant

__all__ = ["LoadedModel", "Runtime"]


class LoadedModel(Protocol):
    """A variant loaded in this process."""

    @property
    def variant(self) -> str: ...

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Rows of inputs (n, *input_shape) → class probabilities (n, num_classes), float32."""
        ...

    def close(self) -> None: ...


class Runtime(Protocol):
    """Loads variants of one runtime family (onnxruntime, tensorflow, sklearn, tensorrt)."""

    def load(self, variant: Variant, artifact: Path) -> LoadedModel: ...
