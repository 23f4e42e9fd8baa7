"""The TensorFlow runtime on a real SavedModel: per-variant thread pools, parity with Keras."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infaas.types import Parity, Variant, VariantSpec
from tests import tiny_models
from variants.runtimes import load_variant
from variants.runtimes.tensorflow import TensorFlowLoadedModel


def test_t1_and_t2_variants_in_one_process_keep_their_own_threads(tmp_path: Path) -> None:
    import keras

    x, _ = tiny_models.digits(100)
    keras.utils.set_random_seed(0)
    norm = keras.layers.Normalization()
    norm.adapt(x)
    inp = keras.Input((64,))
    model = keras.Model(inp, keras.layers.Dense(10, activation="softmax")(norm(inp)))
    model.export(str(tmp_path / "sm"), format="tf_saved_model", verbose=False)
    expected = np.asarray(model.predict(x, verbose=0))

    parity = Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1)
    for threads in (1, 2):
        spec = VariantSpec(architecture="k", runtime="tensorflow", threads=threads)
        loaded = load_variant(Variant(spec=spec, artifact="sm", sha256="0" * 64, parity=parity), tmp_path)
        assert isinstance(loaded, TensorFlowLoadedModel)
        assert loaded.threads == threads
        config = loaded.session._config  # the session's own ConfigProto
        assert config.intra_op_parallelism_threads == threads and config.use_per_session_threads
        out = loaded.predict(x)
        assert out.dtype == np.float32 and out.shape == (100, 10)
        np.testing.assert_allclose(out, expected, atol=1e-5)
        loaded.close()
