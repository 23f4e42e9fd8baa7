"""Tiny real models for tests, built in milliseconds: ONNX graphs written with `onnx.helper`,
scikit-learn classifiers on a slice of digits, and an .npz validation set."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def digits(rows: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """The first `rows` digits, inputs scaled to [0, 1] (64 features), labels 0–9."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x[:rows] / 16.0).astype(np.float32), y[:rows].astype(np.int64)


def validation_npz(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    np.savez(path, x=x, y=y)
    return path


def validation_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    return buf.getvalue()


def _serialized(graph: onnx.GraphProto) -> bytes:
    """The checked model of `graph` at opset 17 and IR 8 (what every supported ONNX Runtime reads)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def linear_onnx(
    in_dim: int = 64,
    classes: int = 10,
    softmax: bool = True,
    seed: int = 0,
    x: np.ndarray | None = None,
    y: np.ndarray | None = None,
) -> bytes:
    """softmax(x·W + b) as ONNX (MatMul + Add + Softmax). With `x, y`, W is a least-squares fit of
    one-hot labels so the model is a real (if crude) classifier; else random."""
    rng = np.random.default_rng(seed)
    if x is not None and y is not None:
        onehot = np.eye(classes, dtype=np.float32)[y]
        w, *_ = np.linalg.lstsq(np.c_[x, np.ones(len(x))], onehot * 8.0, rcond=None)
        weight, bias = w[:-1].astype(np.float32), w[-1].astype(np.float32)
    else:
        weight = rng.normal(size=(in_dim, classes)).astype(np.float32)
        bias = rng.normal(size=(classes,)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["logits"]),
    ]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1))
    out = "probabilities" if softmax else "logits"
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", in_dim])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["n", classes])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")],
    )
    return _serialized(graph)


def mlp_onnx(
    in_dim: int = 64,
    hidden: int = 1024,
    layers: int = 3,
    classes: int = 10,
    seed: int = 0,
    x: np.ndarray | None = None,
    y: np.ndarray | None = None,
) -> bytes:
    """`layers` dense ReLU layers of `hidden` units, then softmax: random weights (He-scaled), a
    compute-bound model (~0.1 ms per row at 3×1024 on one core here). With `x, y`, the output
    layer is a least-squares fit of one-hot labels on the last hidden layer (random features),
    so the model is a real classifier."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev, width = [], [], "x", in_dim
    features = x
    for i in range(layers):
        weight = rng.normal(scale=(2 / width) ** 0.5, size=(width, hidden)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        if features is not None:
            features = np.maximum(features @ weight, 0.0)
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"h{i}"]),
        ]
        prev, width = f"h{i}", hidden
    if features is not None and y is not None:
        onehot = np.eye(classes, dtype=np.float32)[y] * 8.0
        wout = np.linalg.lstsq(features, onehot, rcond=None)[0].astype(np.float32)
    else:
        wout = rng.normal(scale=(1 / width) ** 0.5, size=(width, classes)).astype(np.float32)
    inits.append(numpy_helper.from_array(wout, "wout"))
    nodes += [
        helper.make_node("MatMul", [prev, "wout"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", in_dim])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["n", classes])],
        inits,
    )
    return _serialized(graph)


def deep_conv_onnx(channels: int = 64, layers: int = 8, classes: int = 10, seed: int = 0) -> bytes:
    """The 8×8 image through `layers` 3×3 convolutions of `channels` channels (ReLU), global
    average pooling, dense, softmax: compute-bound with few weights (~2 ms per row at 64×8 on one
    core here), so that one replica's capacity is small enough for a test to exceed."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["h_in"])]
    inits = [numpy_helper.from_array(np.array([-1, 1, 8, 8], dtype=np.int64), "shape")]
    prev, width = "h_in", 1
    for i in range(layers):
        w = rng.normal(scale=(2 / (9 * width)) ** 0.5, size=(channels, width, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"c{i}"))
        nodes += [
            helper.make_node("Conv", [prev, f"c{i}"], [f"v{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"v{i}"], [f"r{i}"]),
        ]
        prev, width = f"r{i}", channels
    inits.append(
        numpy_helper.from_array(rng.normal(scale=0.1, size=(channels, classes)).astype(np.float32), "dw")
    )
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "dw"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "deep_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["n", classes])],
        inits,
    )
    return _serialized(graph)


def conv_onnx(classes: int = 10, seed: int = 0) -> bytes:
    """Reshape(64 → 1×8×8) → Conv 3×3 (4 channels) → Relu → Flatten → MatMul → Softmax."""
    rng = np.random.default_rng(seed)
    conv_w = rng.normal(scale=0.5, size=(4, 1, 3, 3)).astype(np.float32)
    dense_w = rng.normal(scale=0.2, size=(4 * 8 * 8, classes)).astype(np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["img"]),
        helper.make_node("Conv", ["img", "cw"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "dw"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["n", classes])],
        [
            numpy_helper.from_array(np.array([-1, 1, 8, 8], dtype=np.int64), "shape"),
            numpy_helper.from_array(conv_w, "cw"),
            numpy_helper.from_array(dense_w, "dw"),
        ],
    )
    return _serialized(graph)


def sklearn_logreg(x: np.ndarray, y: np.ndarray) -> object:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=300).fit(x, y)


def sklearn_mlp(x: np.ndarray, y: np.ndarray) -> object:
    from sklearn.neural_network import MLPClassifier

    return MLPClassifier(hidden_layer_sizes=(16,), max_iter=1000, tol=1e-3, random_state=0).fit(x, y)


class _Tripwire:
    """Unpickling this touches a file: proof that a refused upload was never unpickled."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.target,))


def tripwire_pickle(target: Path) -> bytes:
    return pickle.dumps(_Tripwire(target))
