"""TensorFlow variants: a SavedModel's ``serving_default`` signature, run in a session of its own.

Each variant gets a `tf.compat.v1.Session` with per-session thread pools (`intra_op` = the variant's
threads, `inter_op` = 1), so t1 and t2 variants keep their own thread counts even when one worker
process hosts both — TF2's eager thread settings are process-wide and frozen at the first op. A
session call also costs about half of an eager signature call for small models at batch 1 (and the
same for compute-bound ones; `scripts/bench_zoo`). CPU variants are pinned to the CPU even where a
GPU exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from infaas.types import Variant

__all__ = ["TensorFlowLoadedModel", "TensorFlowRuntime", "signature_io"]


def signature_io(signature: Any) -> tuple[str, str]:
    """(input name, output name) of a one-input eager serving signature; the output is the first key."""
    _, kwargs = signature.structured_input_signature
    if len(kwargs) != 1:
        raise ValueError(f"expected one input in the serving signature, found {sorted(kwargs)}")
    outputs = sorted(signature.structured_outputs)
    return next(iter(kwargs)), outputs[0]


@contextlib.contextmanager
def _quiet_deprecation() -> Iterator[None]:
    """The v1 loader logs a deprecation notice; per-session threads exist only in the v1 API."""
    try:
        from tensorflow.python.util import deprecation
    except ImportError:  # a TensorFlow without the private module: the notice is only noise
        yield
        return
    with deprecation.silence():
        yield


class TensorFlowLoadedModel:
    def __init__(self, name: str, session: Any, input_name: str, output_name: str, threads: int) -> None:
        self._name = name
        self.session = session
        self._input = input_name
        self._output = output_name
        self.threads = threads

    @property
    def variant(self) -> str:
        return self._name

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = self.session.run(self._output, {self._input: np.asarray(x, dtype=np.float32)})
        return np.asarray(out, dtype=np.float32)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


class TensorFlowRuntime:
    def load(self, variant: Variant, artifact: Path) -> TensorFlowLoadedModel:
        import tensorflow as tf

        threads = variant.spec.threads
        config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=threads,
            inter_op_parallelism_threads=1,
            use_per_session_threads=True,
            allow_soft_placement=True,
            device_count={"GPU": 0} if variant.spec.hardware == "cpu" else {},
        )
        graph = tf.Graph()
        session = tf.compat.v1.Session(graph=graph, config=config)
        with graph.as_default(), _quiet_deprecation():
            meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(artifact))
        signature = meta.signature_def["serving_default"]
        if len(signature.inputs) != 1:
            session.close()
            raise ValueError(f"expected one input in the serving signature, found {sorted(signature.inputs)}")
        (input_info,) = signature.inputs.values()
        output_info = signature.outputs[sorted(signature.outputs)[0]]
        return TensorFlowLoadedModel(variant.name, session, input_info.name, output_info.name, threads)
