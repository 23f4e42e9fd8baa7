"""Keras / SavedModel conversions: Keras file → SavedModel, SavedModel → ONNX (tf2onnx).

tf2onnx's `from_keras` fails on Keras 3 with ``KeyError: 'keras_tensor_N'`` unless
`model.output_names` is set; converting the SavedModel's serving function with `from_function`
avoids the Keras layer entirely and works for uploaded SavedModels too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from variants.converters.onnx_utils import save_onnx

__all__ = ["ONNX_OPSET", "fold_captured_constants", "keras_to_savedmodel", "savedmodel_to_onnx"]

ONNX_OPSET = 17  # tf2onnx 1.17 supports opsets up to 18; 17 is what ORT's quantizer knows best


def keras_to_savedmodel(keras_path: Path, out_dir: Path) -> Path:
    """Export a `.keras` file as a SavedModel with a ``serving_default`` signature."""
    import keras

    model = keras.saving.load_model(str(keras_path), compile=False)
    model.export(str(out_dir), format="tf_saved_model", verbose=False)
    return out_dir


def savedmodel_to_onnx(savedmodel_dir: Path, input_shape: tuple[int, ...], out_path: Path) -> Path:
    """Convert the SavedModel's serving signature to ONNX with a dynamic batch dimension."""
    import tensorflow as tf
    import tf2onnx

    from variants.runtimes.tensorflow import signature_io

    loaded = tf.saved_model.load(str(savedmodel_dir))
    signature = loaded.signatures["serving_default"]
    input_name, output_name = signature_io(signature)
    spec = tf.TensorSpec((None, *input_shape), tf.float32, name="input")

    def serve(x: Any) -> Any:
        return tf.identity(signature(**{input_name: x})[output_name], name="probabilities")

    function = tf.function(serve, input_signature=[spec])
    model_proto, _ = tf2onnx.convert.from_function(function, input_signature=[spec], opset=ONNX_OPSET)
    fold_captured_constants(model_proto, function.get_concrete_function())
    return save_onnx(model_proto, out_path)


def fold_captured_constants(model_proto: Any, concrete: Any) -> None:
    """Turn graph inputs that are captured eager tensors into initializers.

    tf2onnx freezes captured variables but leaves captured *tensors* (Keras 3 keeps e.g. a
    `Normalization` layer's mean and variance as tensors) as extra graph inputs that nobody feeds."""
    import tensorflow as tf
    from onnx import numpy_helper

    constants = {
        internal.name: external.numpy()
        for external, internal in concrete.graph.captures
        if external.dtype != tf.resource and hasattr(external, "numpy")
    }
    keep = [inp for inp in model_proto.graph.input if inp.name not in constants]
    folded = [inp.name for inp in model_proto.graph.input if inp.name in constants]
    for name in folded:
        model_proto.graph.initializer.append(numpy_helper.from_array(constants[name], name))
    if folded:
        del model_proto.graph.input[:]
        model_proto.graph.input.extend(keep)
