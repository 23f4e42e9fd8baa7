"""scikit-learn → ONNX with skl2onnx, with a plain probability tensor instead of a ZipMap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from infaas.errors import RegistrationError
from variants.converters.onnx_utils import save_onnx

__all__ = ["sklearn_to_onnx"]


def sklearn_to_onnx(estimator: Any, n_features: int, out_path: Path) -> Path:
    """Convert a fitted classifier; `zipmap` off gives a (n, classes) float tensor."""
    from skl2onnx import to_onnx

    sample = np.zeros((1, n_features), dtype=np.float32)
    try:
        model = to_onnx(estimator, sample, options={id(estimator): {"zipmap": False}}, target_opset=17)
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
        raise RegistrationError(f"skl2onnx cannot convert {type(estimator).__name__}: {exc}") from exc
    return save_onnx(model, out_path)
