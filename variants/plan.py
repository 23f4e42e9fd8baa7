"""Which variants to build for an architecture: a pure function of the model kind and the hardware.

Hardware is detected by a `ProviderProbe`. The real probe creates an ONNX Runtime session per
accelerator provider and reads `session.get_providers()`, because `get_available_providers()` lists
CUDA and TensorRT even on machines without a GPU (sessions then fall back to CPU silently).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from infaas.types import ModelKind, Precision, RuntimeName, VariantSpec

log = logging.getLogger(__name__)

__all__ = [
    "CPU_MAX_BATCH",
    "CUDA_PROVIDER",
    "GPU_MAX_BATCH",
    "TRT_PROVIDER",
    "BuildStep",
    "FakeProviderProbe",
    "HardwareInfo",
    "OrtProviderProbe",
    "Plan",
    "PlannedSkip",
    "PlannedVariant",
    "ProviderProbe",
    "detect_hardware",
    "plan_variants",
]

CUDA_PROVIDER = "CUDAExecutionProvider"
TRT_PROVIDER = "TensorrtExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"

# The largest batch each variant declares. One variant per runtime × precision × threads serves
# every batch size up to this; the profiler measures its latency-vs-batch curve (README, "Variants").
CPU_MAX_BATCH = 128
GPU_MAX_BATCH = 512

BuildStep = Literal["native", "onnx", "int8", "fp16", "tensorrt"]
"""How a variant's artifact is made: the native form, ONNX fp32, int8, fp16, or the TensorRT input."""


class ProviderProbe(Protocol):
    """Which accelerator providers a real ONNX Runtime session runs on here."""

    def session_providers(self) -> frozenset[str]: ...


@dataclass(frozen=True)
class HardwareInfo:
    """What a probe found; `providers` are those a real session reported using."""

    providers: frozenset[str]

    @property
    def cuda(self) -> bool:
        return CUDA_PROVIDER in self.providers

    @property
    def tensorrt(self) -> bool:
        return TRT_PROVIDER in self.providers


def detect_hardware(probe: ProviderProbe) -> HardwareInfo:
    return HardwareInfo(providers=probe.session_providers() | {CPU_PROVIDER})


class FakeProviderProbe:
    """The shipped fake: reports exactly the providers it was given."""

    def __init__(self, providers: Sequence[str] = (CPU_PROVIDER,)) -> None:
        self._providers = frozenset(providers)

    def session_providers(self) -> frozenset[str]:
        return self._providers


class OrtProviderProbe:
    """Creates a one-node ONNX session per accelerator provider and keeps those it really runs on."""

    @staticmethod
    def probe_model() -> bytes:
        """A one-node model every supported ONNX Runtime loads. The IR version is pinned: onnx
        1.23 writes IR 14 by default, which ONNX Runtime 1.31 refuses, and a probe that fails on
        every provider reads as "no GPU" (it did, on an H200)."""
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        return bytes(model.SerializeToString())

    def session_providers(self) -> frozenset[str]:
        import onnxruntime as ort

        payload = self.probe_model()
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        found = {CPU_PROVIDER}
        # A provider whose libraries are missing logs an error banner through ORT's default
        # logger before the session falls back; on a CPU machine that is every probe. The
        # cause goes to our log instead, and the logger is put back to ORT's default (warning).
        ort.set_default_logger_severity(4)
        try:
            self._probe(ort, payload, opts, found)
        finally:
            ort.set_default_logger_severity(2)
        return frozenset(found)

    @staticmethod
    def _probe(ort: Any, payload: bytes, opts: Any, found: set[str]) -> None:
        for provider in (CUDA_PROVIDER, TRT_PROVIDER):
            if provider == TRT_PROVIDER and CUDA_PROVIDER not in found:
                break  # TensorRT runs on CUDA; probing it without CUDA only prints loader errors
            try:
                session = ort.InferenceSession(payload, sess_options=opts, providers=[provider, CPU_PROVIDER])
            except Exception as exc:  # ORT raises untyped errors when a provider's libraries are missing
                log.info("%s is not usable here: %s", provider, str(exc).splitlines()[0][:300])
                continue
            if provider in session.get_providers():
                found.add(provider)


@dataclass(frozen=True)
class PlannedVariant:
    spec: VariantSpec
    build: BuildStep


@dataclass(frozen=True)
class PlannedSkip:
    name: str
    reason: str


@dataclass(frozen=True)
class Plan:
    variants: tuple[PlannedVariant, ...]
    skipped: tuple[PlannedSkip, ...]


def _spec(
    arch: str, runtime: RuntimeName, precision: Precision, threads: int, gpu: bool = False
) -> VariantSpec:
    return VariantSpec(
        architecture=arch,
        runtime=runtime,
        hardware="gpu" if gpu else "cpu",
        precision=precision,
        threads=threads,
        max_batch=GPU_MAX_BATCH if gpu else CPU_MAX_BATCH,
    )


def plan_variants(
    architecture: str, kind: ModelKind, hardware: HardwareInfo, threads: Sequence[int] = (1, 2)
) -> Plan:
    """The variants to build for `architecture` and the ones not planned here, with reasons.

    - native form: TensorFlow SavedModel (Keras / SavedModel uploads) at each thread count, or the
      scikit-learn estimator (one thread: `predict_proba` of most estimators does not parallelise);
    - ONNX Runtime CPU fp32 and int8 at each thread count (int8 may still be skipped by the
      generator when the graph has nothing quantizable);
    - ONNX Runtime CUDA fp32/fp16 and TensorRT fp32/fp16 only where a real session used them.
    """
    variants: list[PlannedVariant] = []
    skipped: list[PlannedSkip] = []
    if kind in ("keras", "savedmodel"):
        variants += [PlannedVariant(_spec(architecture, "tensorflow", "fp32", t), "native") for t in threads]
    elif kind == "sklearn":
        variants.append(PlannedVariant(_spec(architecture, "sklearn", "fp32", 1), "native"))
    variants += [PlannedVariant(_spec(architecture, "onnxruntime", "fp32", t), "onnx") for t in threads]
    variants += [PlannedVariant(_spec(architecture, "onnxruntime", "int8", t), "int8") for t in threads]

    gpu_specs: list[tuple[VariantSpec, BuildStep, bool, str]] = [
        (_spec(architecture, "onnxruntime", "fp32", 1, gpu=True), "onnx", hardware.cuda, CUDA_PROVIDER),
        (_spec(architecture, "onnxruntime", "fp16", 1, gpu=True), "fp16", hardware.cuda, CUDA_PROVIDER),
        (_spec(architecture, "tensorrt", "fp32", 1, gpu=True), "tensorrt", hardware.tensorrt, TRT_PROVIDER),
        (_spec(architecture, "tensorrt", "fp16", 1, gpu=True), "tensorrt", hardware.tensorrt, TRT_PROVIDER),
    ]
    for spec, build, present, provider in gpu_specs:
        if present:
            variants.append(PlannedVariant(spec, build))
        else:
            skipped.append(
                PlannedSkip(
                    spec.name,
                    f"no {provider}: a probe session ran on {sorted(hardware.providers)} "
                    "(get_available_providers() lists it, but no session could use it)",
                )
            )
    return Plan(variants=tuple(variants), skipped=tuple(skipped))
