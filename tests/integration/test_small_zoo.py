"""The `small_zoo` fixture: a subset of the zoo registered through the public path."""

from __future__ import annotations

import numpy as np

from infaas.settings import Settings
from infaas.store import open_store
from variants import zoo
from variants.runtimes import load_variant


def test_small_zoo_registers_each_runtime_with_parity(small_zoo: Settings) -> None:
    store = open_store(small_zoo)
    try:
        archs = {a.name for a in store.list_architectures()}
        assert archs == set(zoo.SMALL_ZOO)
        assert {t.name for t in store.list_tasks()} == {zoo.DIGITS, zoo.BREAST_CANCER}
        variants = store.list_variants()
        runtimes = {(v.spec.runtime, v.spec.precision) for v in variants}
        expected = {
            ("tensorflow", "fp32"),
            ("onnxruntime", "fp32"),
            ("onnxruntime", "int8"),
            ("sklearn", "fp32"),
        }
        assert expected <= runtimes
        assert all(v.parity.top1_agreement >= 0.99 for v in variants)
        assert all(v.spec.max_batch >= 1 for v in variants)
        # Every variant loads through the one runtime entry point and answers like its siblings.
        split = zoo.load_split(zoo.DIGITS)
        rows = split.x_test[:32]
        outputs = {
            v.name: load_variant(v, small_zoo.artifacts_dir).predict(rows)
            for v in store.list_variants("digits-keras-mlp")
        }
        reference = outputs["digits-keras-mlp/tf-cpu-fp32-t1"]
        for name, out in outputs.items():
            assert out.shape == (32, 10) and out.dtype == np.float32, name
            assert np.mean(out.argmax(1) == reference.argmax(1)) >= 0.9, name
    finally:
        store.close()
