"""Accuracy measured by running the variant itself on the task's validation set.

Never taken from the model owner: an int8 variant and the fp32 variant it came from each carry
the accuracy they actually reach.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["load_validation", "measure_accuracy", "top1_accuracy"]


def top1_accuracy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose highest-probability class is the label."""
    if probabilities.ndim != 2:
        raise ValueError(f"probabilities must be (rows, classes), got shape {probabilities.shape}")
    if len(probabilities) != len(labels) or len(labels) == 0:
        raise ValueError(f"{len(probabilities)} predictions for {len(labels)} labels")
    predicted = np.argmax(probabilities, axis=1)
    return float(np.mean(predicted == labels.astype(np.int64)))


def measure_accuracy(
    predict: Callable[[np.ndarray], np.ndarray], x: np.ndarray, y: np.ndarray, batch: int
) -> float:
    """Top-1 accuracy of `predict` over (x, y), run in batches of at most `batch` rows (the
    variant's max batch)."""
    if batch < 1:
        raise ValueError("batch must be ≥ 1")
    outputs = [np.asarray(predict(x[start : start + batch])) for start in range(0, len(x), batch)]
    return top1_accuracy(np.concatenate(outputs, axis=0), y)


def load_validation(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) arrays of a task's validation .npz (no pickled objects allowed)."""
    with np.load(path, allow_pickle=False) as data:
        return np.asarray(data["x"]), np.asarray(data["y"])
