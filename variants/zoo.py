"""The built-in model zoo: architectures trained here on data that ships with scikit-learn.

Every model is trained with fixed seeds on a fixed, stratified train / validation / test split
(60 / 20 / 20) and registered through the same public path a model owner uses
(`Registry.register`), so the zoo exercises registration, conversion and parity like any upload.

Tasks:

- ``digits-classification``: 8×8 grey-level images flattened to 64 values scaled to [0, 1],
  10 classes (1 797 images);
- ``breast-cancer-classification``: the 30 raw Wisconsin features, 2 classes (569 samples);
  models scale inputs themselves (a scikit-learn pipeline, a Keras `Normalization` layer).

The architectures span cheap linear models to a residual CNN on images upsampled to 32×32 whose
single-row latency is milliseconds, so that SLOs really choose between them.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from infaas.errors import Conflict, InvalidInput
from infaas.registry import RegistrationResult, Registry, VariantProfiler, build_registry
from infaas.settings import Settings
from infaas.store import MetadataStore
from variants.plan import ProviderProbe

__all__ = [
    "DIGITS",
    "SEED",
    "SMALL_ZOO",
    "TASKS",
    "ZOO",
    "Split",
    "ZooModel",
    "ZooResult",
    "install",
    "load_split",
]

SEED = 0
DIGITS = "digits-classification"
BREAST_CANCER = "breast-cancer-classification"
TASKS = (DIGITS, BREAST_CANCER)
_RESNET_BLOCKS = 4
_RESNET_HEAD_EPOCHS = 30


@dataclass(frozen=True)
class Split:
    """A task's fixed split; `x_*` are float32 rows in the task's input spec, `y_*` int64 labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_split(task: str) -> Split:
    """The fixed 60/20/20 stratified split of a zoo task (deterministic)."""
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split

    if task == DIGITS:
        x, y = load_digits(return_X_y=True)
        x = x / 16.0
    elif task == BREAST_CANCER:
        x, y = load_breast_cancer(return_X_y=True)
    else:
        raise InvalidInput(f"unknown zoo task {task!r}; zoo tasks: {', '.join(TASKS)}")
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, test_size=0.4, random_state=SEED, stratify=y)
    x_val, x_test, y_val, y_test = train_test_split(
        x_rest, y_rest, test_size=0.5, random_state=SEED, stratify=y_rest
    )
    return Split(x_train, y_train, x_val, y_val, x_test, y_test)


# ---- trainers: each fits on the split's training rows and writes the model file -----------------


def _save_sklearn(model: Any, out_dir: Path) -> Path:
    import joblib

    path = out_dir / "model.joblib"
    joblib.dump(model, path)
    return path


def _sk_logreg(split: Split, out_dir: Path) -> Path:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # C small on digits: a deliberately cheap, less accurate end of the accuracy range.
    c = 0.02 if split.x_train.shape[1] == 64 else 1.0
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=1000))
    return _save_sklearn(model.fit(split.x_train, split.y_train), out_dir)


def _sk_forest(split: Split, out_dir: Path) -> Path:
    from sklearn.ensemble import RandomForestClassifier

    model = RandomForestClassifier(n_estimators=40, max_depth=12, random_state=SEED, n_jobs=1)
    return _save_sklearn(model.fit(split.x_train, split.y_train), out_dir)


def _sk_mlp(split: Split, out_dir: Path) -> Path:
    from sklearn.neural_network import MLPClassifier

    model = MLPClassifier(hidden_layer_sizes=(64,), max_iter=400, random_state=SEED, early_stopping=False)
    return _save_sklearn(model.fit(split.x_train, split.y_train), out_dir)


def _sk_gboost(split: Split, out_dir: Path) -> Path:
    from sklearn.ensemble import GradientBoostingClassifier

    model = GradientBoostingClassifier(n_estimators=60, max_depth=3, random_state=SEED)
    return _save_sklearn(model.fit(split.x_train, split.y_train), out_dir)


def _fit_keras(
    model: Any, split: Split, out_dir: Path, epochs: int, batch: int = 32, lr: float = 1e-3
) -> Path:
    import keras

    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=lr),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(split.x_train, split.y_train, epochs=epochs, batch_size=batch, verbose=0, shuffle=True)
    path = out_dir / "model.keras"
    model.save(path)
    return path


def _keras_mlp(split: Split, out_dir: Path) -> Path:
    import keras

    keras.utils.set_random_seed(SEED)
    classes = int(split.y_train.max()) + 1
    inp = keras.Input(shape=(split.x_train.shape[1],), name="x")
    h = inp
    if split.x_train.shape[1] != 64:  # raw tabular features: learn their scale
        norm = keras.layers.Normalization()
        norm.adapt(split.x_train)
        h = norm(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    out = keras.layers.Dense(classes, activation="softmax")(h)
    return _fit_keras(keras.Model(inp, out), split, out_dir, epochs=30, batch=64, lr=3e-3)


def _keras_cnn(split: Split, out_dir: Path) -> Path:
    import keras
    from keras import layers

    keras.utils.set_random_seed(SEED)
    inp = keras.Input(shape=(64,), name="x")
    h = layers.Reshape((8, 8, 1))(inp)
    h = layers.Conv2D(16, 3, padding="same", activation="relu")(h)
    h = layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = layers.MaxPooling2D()(h)
    h = layers.Flatten()(h)
    h = layers.Dense(64, activation="relu")(h)
    out = layers.Dense(10, activation="softmax")(h)
    return _fit_keras(keras.Model(inp, out), split, out_dir, epochs=20, batch=64, lr=2e-3)


def _keras_resnet(split: Split, out_dir: Path) -> Path:
    """Heavy on purpose: images upsampled to 32×32 through a residual trunk of 64-channel 3×3
    convolutions at full resolution (~230 M multiply-adds per image, milliseconds per row here).

    Training all of it would take minutes on 2 cores, so the trunk is a fixed random-feature
    extractor (seeded He-initialised weights, frozen): its features are computed once for the
    training rows and only the head (normalisation + softmax layer) is trained. Inference runs the
    whole network, which is the point: compute capacity, not the HTTP path, is at stake under load."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(SEED)
    width = 64
    inp = keras.Input(shape=(64,), name="x")
    h = layers.Reshape((8, 8, 1))(inp)
    h = layers.UpSampling2D(size=4, interpolation="bilinear")(h)
    h = layers.Conv2D(width, 3, padding="same", activation="relu", kernel_initializer="he_normal")(h)
    for _ in range(_RESNET_BLOCKS):
        r = layers.Conv2D(width, 3, padding="same", activation="relu", kernel_initializer="he_normal")(h)
        # Half the variance on the residual branch keeps activations bounded through the blocks.
        r = layers.Conv2D(
            width, 3, padding="same", kernel_initializer=keras.initializers.VarianceScaling(0.5)
        )(r)
        h = layers.Activation("relu")(layers.Add()([h, r]))
    h = layers.AveragePooling2D(4)(h)
    trunk = keras.Model(inp, layers.Flatten()(h), name="trunk")
    trunk.trainable = False
    features = trunk.predict(split.x_train, batch_size=128, verbose=0)

    # One scale for all features, not one per feature: dividing near-constant features by their tiny
    # spread would amplify rounding noise, and int8 variants could not agree with the reference.
    mean, std = float(features.mean()), float(features.std()) or 1.0
    head_in = keras.Input(shape=(features.shape[1],))
    scaled = layers.Rescaling(scale=1.0 / std, offset=-mean / std)(head_in)
    regularizer = keras.regularizers.l2(1e-3)
    head_out = layers.Dense(10, activation="softmax", kernel_regularizer=regularizer)(scaled)
    head = keras.Model(head_in, head_out, name="head")
    head.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    head.fit(features, split.y_train, epochs=_RESNET_HEAD_EPOCHS, batch_size=64, verbose=0)

    model = keras.Model(inp, head(trunk(inp)), name="digits_resnet")
    path = out_dir / "model.keras"
    model.save(path)
    return path


@dataclass(frozen=True)
class ZooModel:
    name: str
    task: str
    kind: Literal["sklearn", "keras"]
    description: str
    train: Callable[[Split, Path], Path]


ZOO: tuple[ZooModel, ...] = (
    ZooModel("digits-logreg", DIGITS, "sklearn", "logistic regression (strongly regularised)", _sk_logreg),
    ZooModel("digits-forest", DIGITS, "sklearn", "random forest, 40 trees", _sk_forest),
    ZooModel("digits-sklearn-mlp", DIGITS, "sklearn", "scikit-learn MLP, one hidden layer of 64", _sk_mlp),
    ZooModel("digits-keras-mlp", DIGITS, "keras", "Keras MLP, one hidden layer of 64", _keras_mlp),
    ZooModel("digits-cnn", DIGITS, "keras", "Keras CNN, two 3×3 convolutions", _keras_cnn),
    ZooModel(
        "digits-resnet",
        DIGITS,
        "keras",
        "residual CNN on images upsampled to 32×32 (random-feature trunk, trained head)",
        _keras_resnet,
    ),
    ZooModel("breast-cancer-logreg", BREAST_CANCER, "sklearn", "scaled logistic regression", _sk_logreg),
    ZooModel("breast-cancer-gboost", BREAST_CANCER, "sklearn", "gradient boosting, 60 trees", _sk_gboost),
    ZooModel(
        "breast-cancer-keras-mlp", BREAST_CANCER, "keras", "Keras MLP with input normalisation", _keras_mlp
    ),
)

SMALL_ZOO: tuple[str, ...] = (
    "digits-logreg",
    "digits-sklearn-mlp",
    "digits-keras-mlp",
    "breast-cancer-logreg",
)
"""A fast subset (seconds) that still covers sklearn, TF, ORT fp32 and ORT int8 over both tasks."""


@dataclass(frozen=True)
class ZooResult:
    model: ZooModel
    status: Literal["installed", "present"]
    result: RegistrationResult | None
    accuracy: float | None  # reference top-1 accuracy on the validation split
    seconds: float  # training + registration (conversion, parity, publishing; profiling if given)
    train_s: float = 0.0


ZooProgress = Callable[[str, int, int], None]
"""progress(message, done, total) over the zoo's architectures."""


def _accuracy(path: Path, kind: str, split: Split) -> float:
    from variants.reference import load_reference, predict_in_batches

    ref = load_reference("keras" if kind == "keras" else "sklearn", path)
    probs = predict_in_batches(ref.predict, split.x_val, 512)
    return float(np.mean(np.argmax(probs, axis=1) == split.y_val))


def install(
    settings: Settings,
    store: MetadataStore,
    *,
    only: Sequence[str] | None = None,
    if_missing: bool = False,
    profiler: VariantProfiler | None = None,
    probe: ProviderProbe | None = None,
    registry: Registry | None = None,
    progress: ZooProgress | None = None,
) -> list[ZooResult]:
    """Train and register the zoo (or the architectures named in `only`).

    An architecture already registered under its name is an error (`Conflict`) unless `if_missing`,
    in which case it is left as it is and reported "present"."""
    names = {m.name for m in ZOO}
    unknown = sorted(set(only or ()) - names)
    if unknown:
        raise InvalidInput(f"not in the zoo: {', '.join(unknown)}; zoo: {', '.join(sorted(names))}")
    chosen = [m for m in ZOO if only is None or m.name in set(only)]
    reg = registry or build_registry(settings, store, profiler=profiler, probe=probe)
    results: list[ZooResult] = []
    splits: dict[str, Split] = {}
    with tempfile.TemporaryDirectory(prefix="infaas-zoo-", dir=_tmp_root(settings)) as tmp:
        work = Path(tmp)
        for done, model in enumerate(chosen):
            start = time.perf_counter()
            if store.get_architecture(model.name) is not None:
                if not if_missing:
                    raise Conflict(
                        f"zoo architecture {model.name!r} is already registered; "
                        "run `infaas zoo install --if-missing` to install only the missing ones",
                        architecture=model.name,
                    )
                results.append(ZooResult(model, "present", None, None, 0.0))
                continue
            split = splits.get(model.task) or load_split(model.task)
            splits[model.task] = split
            validation = work / f"{model.task}-validation.npz"
            if not validation.exists():
                np.savez(validation, x=split.x_val, y=split.y_val)
            if progress is not None:
                progress(f"{model.name}: training", done, len(chosen))
            out_dir = work / model.name
            out_dir.mkdir()
            path = model.train(split, out_dir)
            train_s = time.perf_counter() - start
            accuracy = _accuracy(path, model.kind, split)

            def on_variant(message: str, i: int, n: int, _name: str = model.name, _done: int = done) -> None:
                if progress is not None:
                    progress(f"{_name}: {message} ({i}/{n})", _done, len(chosen))

            result = reg.register(
                path,
                name=model.name,
                task=model.task,
                validation=validation,
                description=model.description,
                progress=on_variant,
            )
            results.append(
                ZooResult(model, "installed", result, accuracy, time.perf_counter() - start, train_s)
            )
    if progress is not None:
        progress("done", len(chosen), len(chosen))
    return results


def _tmp_root(settings: Settings) -> Path:
    root = settings.data_dir / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    return root
