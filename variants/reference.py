"""The reference of an uploaded architecture: the model run in its own framework.

Every variant is compared with it on the whole validation set. Loading also tells the input shape
the model expects, which registration checks against the task's. Loading failures are registration
errors that name the format and what went wrong (a corrupt file, a Keras file with custom code).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from infaas.errors import RegistrationError, UnsupportedFormat
from infaas.types import ModelKind

__all__ = ["Reference", "load_reference", "predict_in_batches"]


class _Predict(Protocol):
    def __call__(self, x: np.ndarray) -> np.ndarray: ...


@dataclass
class Reference:
    kind: ModelKind
    input_shape: tuple[int, ...] | None  # None: the model does not say (dynamic dimensions)
    predict: _Predict
    native: Any  # the framework object (Keras model, SavedModel, ORT session, estimator)


def predict_in_batches(predict: _Predict, x: np.ndarray, batch: int) -> np.ndarray:
    """Run `predict` over `x` in chunks of at most `batch` rows and stack the results."""
    parts = [np.asarray(predict(x[i : i + batch]), dtype=np.float32) for i in range(0, len(x), batch)]
    return np.concatenate(parts, axis=0)


def _static_shape(dims: Any) -> tuple[int, ...] | None:
    out: list[int] = []
    for dim in dims:
        if not isinstance(dim, int) or dim <= 0:
            return None
        out.append(dim)
    return tuple(out)


def _keras(path: Path) -> Reference:
    import keras

    try:
        # safe_mode (the default) refuses to deserialise lambdas: an upload must not run code here.
        model = keras.saving.load_model(str(path), compile=False, safe_mode=True)
    except Exception as exc:  # Keras raises ValueError, OSError, zipfile errors... for bad files
        raise UnsupportedFormat(f"cannot load the Keras file: {type(exc).__name__}: {exc}") from exc
    shape = model.input_shape if not isinstance(model.input_shape, list) else None
    if shape is None:
        raise RegistrationError("the Keras model has several inputs; infaas serves one-input models")

    def predict(x: np.ndarray) -> np.ndarray:
        return np.asarray(model(x.astype(np.float32), training=False))

    return Reference("keras", _static_shape(shape[1:]), predict, model)


def _savedmodel(path: Path) -> Reference:
    import tensorflow as tf

    from variants.runtimes.tensorflow import signature_io

    try:
        loaded = tf.saved_model.load(str(path))
        signature = loaded.signatures["serving_default"]
        input_name, output_name = signature_io(signature)
    except Exception as exc:  # TensorFlow's loader raises many unrelated types for a bad directory
        raise UnsupportedFormat(f"cannot load the SavedModel: {type(exc).__name__}: {exc}") from exc
    spec = signature.structured_input_signature[1][input_name]
    dims = spec.shape.as_list()[1:]

    def predict(x: np.ndarray) -> np.ndarray:
        out = signature(**{input_name: tf.constant(x, dtype=spec.dtype)})[output_name]
        return np.asarray(out.numpy())

    return Reference("savedmodel", _static_shape(dims), predict, loaded)


def _onnx(path: Path) -> Reference:
    import onnx
    import onnxruntime as ort

    from variants.converters.onnx_utils import check_onnx
    from variants.runtimes.onnxruntime import OnnxLoadedModel, session_options

    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError and friends
        raise UnsupportedFormat(f"cannot parse the ONNX file: {type(exc).__name__}: {exc}") from exc
    check_onnx(model)
    if len(model.graph.input) != 1:
        raise RegistrationError("the ONNX model has several inputs; infaas serves one-input models")
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), sess_options=session_options(1), providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # ORT's errors are untyped
        raise UnsupportedFormat(f"ONNX Runtime cannot load the model: {exc}") from exc
    dims = session.get_inputs()[0].shape[1:]
    loaded = OnnxLoadedModel("reference", session)
    return Reference("onnx", _static_shape(dims), loaded.predict, session)


def _sklearn(path: Path) -> Reference:
    import joblib

    try:
        estimator = joblib.load(path)
    except Exception as exc:  # unpickling raises anything
        raise UnsupportedFormat(f"cannot load the joblib file: {type(exc).__name__}: {exc}") from exc
    if not hasattr(estimator, "predict_proba"):
        raise RegistrationError(
            f"{type(estimator).__name__} has no predict_proba; register a probabilistic classifier"
        )
    n_features = getattr(estimator, "n_features_in_", None)

    def predict(x: np.ndarray) -> np.ndarray:
        return np.asarray(estimator.predict_proba(x.reshape(len(x), -1).astype(np.float32)))

    return Reference("sklearn", (int(n_features),) if n_features else None, predict, estimator)


def load_reference(kind: ModelKind, path: Path) -> Reference:
    """Load an uploaded model in its own framework."""
    loaders = {"keras": _keras, "savedmodel": _savedmodel, "onnx": _onnx, "sklearn": _sklearn}
    return loaders[kind](path)
