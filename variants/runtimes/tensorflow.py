"""TensorFlow variants: a SavedModel's ``serving_default`` signature.

TensorFlow's thread pools are per process and fixed at its first op, so the first TF variant loaded
in a process sets them; the profiler measures each variant in its own process, and the worker pool
keeps TF variants of different thread counts in different processes. `TensorFlowLoadedModel.threads`
reports what the process really uses. CPU variants are pinned to the CPU even where a GPU exists.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from infaas.types import Variant

__all__ = ["TensorFlowLoadedModel", "TensorFlowRuntime", "configure_threads", "signature_io"]


def configure_threads(threads: int) -> int:
    """Set TF's intra-op threads (inter-op 1) if TF has not started yet; returns the threads in use."""
    import tensorflow as tf

    # RuntimeError: already initialised by an earlier variant in this process; its setting stays.
    with contextlib.suppress(RuntimeError):
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    current = int(tf.config.threading.get_intra_op_parallelism_threads())
    return current or threads


def signature_io(signature: Any) -> tuple[str, str]:
    """(input name, output name) of a one-input serving signature; the output is the first key."""
    _, kwargs = signature.structured_input_signature
    if len(kwargs) != 1:
        raise ValueError(f"expected one input in the serving signature, found {sorted(kwargs)}")
    outputs = sorted(signature.structured_outputs)
    return next(iter(kwargs)), outputs[0]


class TensorFlowLoadedModel:
    def __init__(self, name: str, loaded: Any, device: str, threads: int) -> None:
        self._name = name
        self._loaded = loaded  # keeps the signature's variables alive
        self._fn = loaded.signatures["serving_default"]
        self._input_name, self._output_name = signature_io(self._fn)
        spec = self._fn.structured_input_signature[1][self._input_name]
        self._dtype = spec.dtype
        self._device = device
        self.threads = threads

    @property
    def variant(self) -> str:
        return self._name

    def predict(self, x: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        with tf.device(self._device):
            out = self._fn(**{self._input_name: tf.constant(x, dtype=self._dtype)})
        return np.asarray(out[self._output_name].numpy(), dtype=np.float32)

    def close(self) -> None:
        self._fn = None
        self._loaded = None


class TensorFlowRuntime:
    def load(self, variant: Variant, artifact: Path) -> TensorFlowLoadedModel:
        threads = configure_threads(variant.spec.threads)
        import tensorflow as tf

        device = "/GPU:0" if variant.spec.hardware == "gpu" else "/CPU:0"
        with tf.device(device):
            loaded = tf.saved_model.load(str(artifact))
        return TensorFlowLoadedModel(variant.name, loaded, device, threads)
