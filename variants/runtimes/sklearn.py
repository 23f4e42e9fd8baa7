"""scikit-learn variants: the estimator itself, loaded with joblib.

Unpickling runs arbitrary code, which is why only the admin may register scikit-learn uploads; the
artifacts loaded here were written by infaas itself from such an upload or by the zoo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from infaas.types import Variant

__all__ = ["SklearnLoadedModel", "SklearnRuntime"]


class SklearnLoadedModel:
    def __init__(self, name: str, estimator: Any) -> None:
        self._name = name
        self.estimator = estimator

    @property
    def variant(self) -> str:
        return self._name

    def predict(self, x: np.ndarray) -> np.ndarray:
        rows = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
        return np.asarray(self.estimator.predict_proba(rows), dtype=np.float32)

    def close(self) -> None:
        self.estimator = None


class SklearnRuntime:
    def load(self, variant: Variant, artifact: Path) -> SklearnLoadedModel:
        import joblib

        estimator = joblib.load(artifact)
        # Ensembles parallelise over n_jobs; pin it to the variant's threads like every runtime.
        if hasattr(estimator, "n_jobs"):
            estimator.n_jobs = variant.spec.threads
        return SklearnLoadedModel(variant.name, estimator)
