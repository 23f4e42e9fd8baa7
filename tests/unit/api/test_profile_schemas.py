"""The profile's wire form: every measured field, and the foreign-machine flag."""

from __future__ import annotations

from infaas.api.model_schemas import variant_out
from infaas.api.profile_schemas import profile_out
from infaas.types import MachineInfo, Parity, Profile, Variant, VariantSpec
from profiler.machine import local_machine
from tests.factories import make_point, make_profile

POINT = make_point(p50_ms=0.1, p95_ms=0.2, p99_ms=0.3, mean_ms=0.12, throughput_qps=8333.0)


def _profile(machine: MachineInfo) -> Profile:
    return make_profile(
        "a/onnx-cpu-fp32-t1",
        machine,
        POINT,
        measured_at_s=5.0,
        accuracy=0.97,
        memory_mb=3.5,
        price_usd_per_s=1e-5,
    )


def test_profile_out_carries_the_measurements() -> None:
    here = MachineInfo(cpu_model="x", cores=2)
    out = profile_out(_profile(here), here)
    assert out.foreign is False
    assert out.points[0].p99_ms == 0.3 and out.points[0].stop_reason == "stable"
    assert (out.accuracy, out.memory_mb, out.price_usd_per_s) == (0.97, 3.5, 1e-5)


def test_profile_from_another_machine_is_flagged_on_the_wire() -> None:
    out = profile_out(_profile(MachineInfo(cpu_model="other", cores=64)), MachineInfo(cpu_model="x", cores=2))
    assert out.foreign is True and out.machine.cores == 64


def test_variant_out_includes_the_profile_compared_with_this_machine() -> None:
    variant = Variant(
        spec=VariantSpec(architecture="a", runtime="onnxruntime"),
        artifact="v/a.onnx",
        sha256="0",
        parity=Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=10),
    )
    out = variant_out(variant, _profile(local_machine()))
    assert out.profiled and out.profile is not None and out.profile.foreign is False
    assert variant_out(variant).profile is None
