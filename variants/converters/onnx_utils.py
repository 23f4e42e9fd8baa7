"""Small ONNX helpers shared by the converters: checking, opset de-duplication, op inventory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infaas.errors import RegistrationError

__all__ = ["check_onnx", "dedupe_opsets", "op_types", "save_onnx"]


def dedupe_opsets(model: Any) -> Any:
    """Keep one `opset_import` entry per domain (the highest version).

    skl2onnx can list the default domain twice, which makes `quantize_dynamic` fail."""
    best: dict[str, int] = {}
    for entry in model.opset_import:
        best[entry.domain] = max(best.get(entry.domain, 0), int(entry.version))
    if len(best) != len(model.opset_import):
        del model.opset_import[:]
        for domain, version in sorted(best.items()):
            entry = model.opset_import.add()
            entry.domain = domain
            entry.version = version
    return model


def check_onnx(model_or_path: Any) -> None:
    """Run the ONNX checker; a failure is a registration error naming what the checker said."""
    import onnx

    try:
        onnx.checker.check_model(str(model_or_path) if isinstance(model_or_path, Path) else model_or_path)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise RegistrationError(f"the ONNX checker rejected the model: {exc}") from exc


def op_types(model: Any) -> set[str]:
    """Operator types used anywhere in the main graph."""
    return {node.op_type for node in model.graph.node}


def save_onnx(model: Any, path: Path) -> Path:
    import onnx

    dedupe_opsets(model)
    check_onnx(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path
