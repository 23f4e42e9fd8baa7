"""The MLServer peer in scripts/bench_serving: an ONNX Runtime model with one thread, as an MLServer
custom runtime (MLServer 1.7 ships no ONNX runtime). Runs inside MLServer's own environment, which
imports this file from the model's folder; infaas does not import it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        uri = self.settings.parameters.uri
        self._session = ort.InferenceSession(uri, sess_options=options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        out = np.asarray(self._session.run(None, {self._input: x})[-1], dtype=np.float32)
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("probabilities", out)]
        )
