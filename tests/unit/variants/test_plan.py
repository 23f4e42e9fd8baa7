"""Planning is a pure function of the model kind and the hardware a provider probe found."""

from __future__ import annotations

import pytest

from infaas.types import ModelKind
from variants.plan import (
    CPU_MAX_BATCH,
    CUDA_PROVIDER,
    TRT_PROVIDER,
    FakeProviderProbe,
    HardwareInfo,
    detect_hardware,
    plan_variants,
)

CPU_ONLY = detect_hardware(FakeProviderProbe())
WITH_CUDA = detect_hardware(FakeProviderProbe([CUDA_PROVIDER]))
WITH_TRT = detect_hardware(FakeProviderProbe([CUDA_PROVIDER, TRT_PROVIDER]))


def _names(kind: ModelKind, hw: HardwareInfo) -> set[str]:
    return {p.spec.name for p in plan_variants("m", kind, hw).variants}


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (
            "keras",
            {"m/tf-cpu-fp32-t1", "m/tf-cpu-fp32-t2", "m/onnx-cpu-fp32-t1", "m/onnx-cpu-fp32-t2"}
            | {"m/onnx-cpu-int8-t1", "m/onnx-cpu-int8-t2"},
        ),
        (
            "savedmodel",
            {"m/tf-cpu-fp32-t1", "m/tf-cpu-fp32-t2", "m/onnx-cpu-fp32-t1", "m/onnx-cpu-fp32-t2"}
            | {"m/onnx-cpu-int8-t1", "m/onnx-cpu-int8-t2"},
        ),
        ("onnx", {"m/onnx-cpu-fp32-t1", "m/onnx-cpu-fp32-t2", "m/onnx-cpu-int8-t1", "m/onnx-cpu-int8-t2"}),
        (
            "sklearn",
            {"m/sklearn-cpu-fp32-t1", "m/onnx-cpu-fp32-t1", "m/onnx-cpu-fp32-t2"}
            | {"m/onnx-cpu-int8-t1", "m/onnx-cpu-int8-t2"},
        ),
    ],
)
def test_cpu_plan_per_kind(kind: ModelKind, expected: set[str]) -> None:
    assert _names(kind, CPU_ONLY) == expected


def test_cpu_only_machine_records_why_gpu_variants_are_not_planned() -> None:
    plan = plan_variants("m", "keras", CPU_ONLY)
    skipped = {s.name: s.reason for s in plan.skipped}
    assert set(skipped) == {
        "m/onnx-gpu-fp32-t1",
        "m/onnx-gpu-fp16-t1",
        "m/trt-gpu-fp32-t1",
        "m/trt-gpu-fp16-t1",
    }
    assert all("CPUExecutionProvider" in reason for reason in skipped.values())
    assert CUDA_PROVIDER in skipped["m/onnx-gpu-fp16-t1"]
    assert TRT_PROVIDER in skipped["m/trt-gpu-fp32-t1"]


def test_cuda_plans_onnx_gpu_fp32_and_fp16_but_not_tensorrt() -> None:
    plan = plan_variants("m", "onnx", WITH_CUDA)
    gpu = {p.spec.name: p.build for p in plan.variants if p.spec.hardware == "gpu"}
    assert gpu == {"m/onnx-gpu-fp32-t1": "onnx", "m/onnx-gpu-fp16-t1": "fp16"}
    assert {s.name for s in plan.skipped} == {"m/trt-gpu-fp32-t1", "m/trt-gpu-fp16-t1"}


def test_tensorrt_planned_where_a_session_reports_it() -> None:
    plan = plan_variants("m", "sklearn", WITH_TRT)
    assert plan.skipped == ()
    trt = [p for p in plan.variants if p.spec.runtime == "tensorrt"]
    assert {p.spec.precision for p in trt} == {"fp32", "fp16"}
    assert all(p.build == "tensorrt" and p.spec.hardware == "gpu" for p in trt)


def test_every_variant_declares_a_max_batch_and_threads_are_a_dimension() -> None:
    for kind in ("keras", "savedmodel", "onnx", "sklearn"):
        plan = plan_variants("m", kind, WITH_TRT)
        names = [p.spec.name for p in plan.variants]
        assert len(names) == len(set(names)), "variant names are unique"
        for p in plan.variants:
            assert p.spec.max_batch >= CPU_MAX_BATCH
            assert p.spec.threads in (1, 2)
    threads = {
        p.spec.threads for p in plan_variants("m", "keras", CPU_ONLY).variants if p.spec.runtime != "sklearn"
    }
    assert threads == {1, 2}


def test_detect_hardware_always_has_cpu_and_reads_only_the_probe() -> None:
    assert not CPU_ONLY.cuda and not CPU_ONLY.tensorrt
    assert WITH_CUDA.cuda and not WITH_CUDA.tensorrt
    assert WITH_TRT.cuda and WITH_TRT.tensorrt
    assert "CPUExecutionProvider" in CPU_ONLY.providers


def test_the_provider_probe_model_loads_in_this_onnx_runtime() -> None:
    # The probe's model must load on the CPU provider, or every accelerator probe fails too and a
    # GPU machine plans no GPU variant (onnx's default IR version outran ONNX Runtime's once).
    import onnxruntime as ort

    from variants.plan import OrtProviderProbe

    session = ort.InferenceSession(OrtProviderProbe.probe_model(), providers=["CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert "CPUExecutionProvider" in OrtProviderProbe().session_providers()
