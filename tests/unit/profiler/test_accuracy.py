"""profiler.accuracy: top-1 over batches equals the direct computation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiler.accuracy import load_validation, measure_accuracy, top1_accuracy
from profiler.fakes import ManualClock, SimulatedModel


def test_top1_of_known_predictions() -> None:
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]], dtype=np.float32)
    assert top1_accuracy(probs, np.array([0, 1, 1, 0])) == 0.5


def test_top1_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError):
        top1_accuracy(np.zeros((3, 2)), np.zeros(2))
    with pytest.raises(ValueError):
        top1_accuracy(np.zeros(3), np.zeros(3))


@pytest.mark.parametrize("batch", [1, 7, 32, 1000])
def test_batched_accuracy_equals_whole_set_accuracy(batch: int) -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 10, size=(101, 4)).astype(np.float32)
    y = rng.integers(0, 10, size=101)
    model = SimulatedModel(ManualClock(), lambda b, i: 1.0)
    expected = float(np.mean((x[:, 0].astype(np.int64) % 10) == y))
    assert measure_accuracy(model.predict, x, y, batch) == pytest.approx(expected)
    assert model.calls == -(-101 // batch)


def test_validation_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "val.npz"
    np.savez(path, x=np.ones((3, 2), dtype=np.float32), y=np.array([0, 1, 0]))
    x, y = load_validation(path)
    assert x.shape == (3, 2) and list(y) == [0, 1, 0]
