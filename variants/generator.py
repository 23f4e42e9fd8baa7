"""plan → convert → parity check → content-addressed artifact + variant record.

The generator writes only inside a `Staging` area and publishes artifacts through it, so the
registration that calls it can undo everything on failure. A variant is kept only if, on the whole
validation set, its top-1 class agrees with the reference on at least `MIN_TOP1_AGREEMENT` of the
rows; otherwise it is recorded as a `SkippedVariant` with the measured agreement, as is every
planned variant that could not be built (and why).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from infaas.types import ModelKind, Parity, SkippedVariant, Variant, VariantSpec
from variants.artifacts import Staging
from variants.plan import BuildStep, HardwareInfo, Plan, plan_variants
from variants.reference import Reference, predict_in_batches
from variants.runtimes import runtime_for

__all__ = ["MIN_TOP1_AGREEMENT", "GenerationResult", "ProgressFn", "generate", "parity"]

MIN_TOP1_AGREEMENT = 0.99
CALIBRATION_ROWS = 256  # static int8 calibration: enough rows for stable ranges, cheap to run
_REASON_CHARS = 400

ProgressFn = Callable[[str, int, int], None]
"""progress(message, done, total): called as each planned variant is built or skipped."""

_FILENAMES: dict[BuildStep, str] = {
    "onnx": "model.onnx",
    "int8": "model.int8.onnx",
    "fp16": "model.fp16.onnx",
    "tensorrt": "model.trt.onnx",
}


@dataclass
class GenerationResult:
    variants: list[Variant] = field(default_factory=list)
    skipped: list[SkippedVariant] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)  # build step → how it was made (int8 method)


def parity(reference_probs: np.ndarray, variant_probs: np.ndarray) -> Parity:
    """Top-1 agreement and max absolute probability difference of a variant vs its reference (pure)."""
    if variant_probs.shape != reference_probs.shape:
        raise ValueError(f"output shape {variant_probs.shape}, reference {reference_probs.shape}")
    agree = float(np.mean(np.argmax(variant_probs, axis=1) == np.argmax(reference_probs, axis=1)))
    diff = float(np.max(np.abs(variant_probs.astype(np.float64) - reference_probs.astype(np.float64))))
    return Parity(top1_agreement=agree, max_abs_diff=diff, samples=len(reference_probs))


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


class _Builder:
    """Builds each step's artifact once (threads share it) and remembers failures."""

    def __init__(
        self,
        kind: ModelKind,
        source: Path,
        reference: Reference,
        input_shape: tuple[int, ...],
        calibration: np.ndarray,
        hardware: HardwareInfo,
        staging: Staging,
    ) -> None:
        self.kind = kind
        self.source = source
        self.reference = reference
        self.input_shape = input_shape
        self.calibration = calibration
        self.hardware = hardware
        self.staging = staging
        self.built: dict[BuildStep, Path] = {}
        self.failed: dict[BuildStep, str] = {}
        self.notes: dict[str, str] = {}

    def get(self, step: BuildStep) -> Path:
        if step in self.failed:
            raise _BuildFailed(self.failed[step])
        if step not in self.built:
            try:
                self.built[step] = self._build(step)
            except _BuildFailed as exc:
                self.failed[step] = str(exc)
                raise
            except Exception as exc:  # converters raise from TF, tf2onnx, skl2onnx, onnx, ORT
                self.failed[step] = _short(exc)
                raise _BuildFailed(self.failed[step]) from exc
        return self.built[step]

    def _onnx_input(self, step: str) -> Path:
        try:
            return self.get("onnx")
        except _BuildFailed as exc:
            raise _BuildFailed(f"{step} needs the ONNX fp32 model, which failed: {exc}") from exc

    def _build(self, step: BuildStep) -> Path:
        from variants.converters import fp16, quantize, sklearn, tensorflow, tensorrt

        out = self.staging.path("build", step, "model")
        if step == "native":
            if self.kind == "keras":
                return tensorflow.keras_to_savedmodel(self.source, out.parent / "saved_model")
            return self.source  # SavedModel directory or scikit-learn file, as uploaded
        if step == "onnx":
            target = out.parent / _FILENAMES["onnx"]
            if self.kind in ("keras", "savedmodel"):
                return tensorflow.savedmodel_to_onnx(self.get("native"), self.input_shape, target)
            if self.kind == "sklearn":
                n_features = int(np.prod(self.input_shape))
                return sklearn.sklearn_to_onnx(self.reference.native, n_features, target)
            import onnx

            from variants.converters.onnx_utils import save_onnx

            return save_onnx(onnx.load(str(self.source)), target)
        if step == "int8":
            fp32 = self._onnx_input("int8")
            try:
                path, method = quantize.quantize_int8(fp32, out.parent / _FILENAMES["int8"], self.calibration)
            except quantize.NotQuantizable as exc:
                raise _BuildFailed(str(exc)) from exc
            self.notes["int8"] = method
            return path
        if step == "fp16":
            return fp16.to_fp16(self._onnx_input("fp16"), out.parent / _FILENAMES["fp16"])
        try:
            return tensorrt.prepare_tensorrt(
                self._onnx_input("tensorrt"), out.parent / _FILENAMES["tensorrt"], self.hardware.providers
            )
        except tensorrt.TensorRTUnavailable as exc:
            raise _BuildFailed(str(exc)) from exc


class _BuildFailed(Exception):
    """A build step could not produce its artifact; the message becomes the skipped variant's reason."""


def _stub(spec: VariantSpec) -> Variant:
    """A record to load an unpublished artifact with (parity is filled in after the check)."""
    return Variant(
        spec=spec, artifact="", sha256="", parity=Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1)
    )


def _run(spec: VariantSpec, path: Path, x: np.ndarray) -> np.ndarray:
    loaded = runtime_for(spec.runtime).load(_stub(spec), path)
    try:
        return predict_in_batches(loaded.predict, x, spec.max_batch)
    finally:
        loaded.close()


def _artifact_name(step: BuildStep, kind: ModelKind) -> str:
    if step == "native":
        return "saved_model" if kind in ("keras", "savedmodel") else "model.joblib"
    return _FILENAMES[step]


def generate(
    *,
    architecture: str,
    kind: ModelKind,
    source: Path,
    reference: Reference,
    input_shape: tuple[int, ...],
    validation_x: np.ndarray,
    reference_probs: np.ndarray,
    hardware: HardwareInfo,
    staging: Staging,
    now_s: float,
    plan: Plan | None = None,
    progress: ProgressFn | None = None,
) -> GenerationResult:
    """Build, check and publish the variants of one architecture (see the module docstring).

    `source` is the staged upload (Keras file, SavedModel directory, ONNX or joblib file);
    `reference_probs` is the reference's output on `validation_x`."""
    the_plan = plan or plan_variants(architecture, kind, hardware)
    result = GenerationResult(
        skipped=[
            SkippedVariant(architecture=architecture, name=s.name, reason=s.reason) for s in the_plan.skipped
        ]
    )
    builder = _Builder(
        kind, source, reference, input_shape, validation_x[:CALIBRATION_ROWS], hardware, staging
    )
    checked: dict[tuple[BuildStep, str, str, str], Parity | str] = {}
    published: dict[BuildStep, tuple[str, str]] = {}
    total = len(the_plan.variants)
    for done, planned in enumerate(the_plan.variants):
        spec = planned.spec
        if progress is not None:
            progress(f"{spec.name}", done, total)
        try:
            path = builder.get(planned.build)
        except _BuildFailed as exc:
            result.skipped.append(SkippedVariant(architecture=architecture, name=spec.name, reason=str(exc)))
            continue
        # Threads do not change the numbers: one parity run per artifact × runtime × device × precision.
        key = (planned.build, spec.runtime, spec.hardware, spec.precision)
        if key not in checked:
            try:
                checked[key] = parity(reference_probs, _run(spec, path, validation_x))
            except Exception as exc:  # a runtime refusing the converted model is a skip, not a crash
                checked[key] = f"failed to run: {_short(exc)}"
        outcome = checked[key]
        if isinstance(outcome, str):
            result.skipped.append(SkippedVariant(architecture=architecture, name=spec.name, reason=outcome))
            continue
        if outcome.top1_agreement < MIN_TOP1_AGREEMENT:
            reason = (
                f"parity failed: top-1 agreement {outcome.top1_agreement:.2%} < {MIN_TOP1_AGREEMENT:.0%} "
                f"on {outcome.samples} validation rows (max abs diff {outcome.max_abs_diff:.3g})"
            )
            result.skipped.append(SkippedVariant(architecture=architecture, name=spec.name, reason=reason))
            continue
        if planned.build not in published:
            published[planned.build] = staging.commit(path, _artifact_name(planned.build, kind))
            # The published path replaces the staged one for later steps built from it.
            builder.built[planned.build] = staging.artifacts_dir / published[planned.build][0]
        rel, sha = published[planned.build]
        result.variants.append(
            Variant(spec=spec, artifact=rel, sha256=sha, parity=outcome, created_at_s=now_s)
        )
    if progress is not None:
        progress("done", total, total)
    result.notes = dict(builder.notes)
    return result
