"""profiler.report: the progress bar spans several batches of variants; the table flags foreign
and failed profiles."""

from __future__ import annotations

import io

from rich.console import Console

from infaas.types import MachineInfo, Profile
from profiler.report import RichProgress, profile_table
from tests.factories import make_point, make_profile

HERE = MachineInfo(cpu_model="AMD EPYC", cores=2)


def _ok(name: str, machine: MachineInfo) -> Profile:
    point = make_point(
        p50_ms=0.25,
        p95_ms=0.3,
        p99_ms=0.5,
        mean_ms=0.26,
        throughput_qps=3846.0,
        samples=90,
        cost_usd_per_1k=2e-6,
    )
    return make_profile(name, machine, point, accuracy=0.9612)


def test_table_flags_foreign_and_failed_profiles() -> None:
    failed = Profile(
        variant="a/tf-cpu-fp32-t1", status="failed", error="timed out", machine=HERE, measured_at_s=0
    )
    profiles = [
        _ok("a/onnx-cpu-fp32-t1", HERE),
        _ok("a/onnx-cpu-int8-t1", MachineInfo(cpu_model="Xeon", cores=64)),
        failed,
    ]
    out = io.StringIO()
    Console(file=out, width=250).print(profile_table(profiles, HERE))
    lines = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines() if line.count("│") > 3}
    assert "here" in lines["a/onnx-cpu-fp32-t1"] and "0.9612" in lines["a/onnx-cpu-fp32-t1"]
    assert "other: Xeon|64|-" in lines["a/onnx-cpu-int8-t1"]
    assert "failed" in lines["a/tf-cpu-fp32-t1"] and "timed out" in lines["a/tf-cpu-fp32-t1"]


def test_progress_adds_up_batches_of_variants() -> None:
    out = io.StringIO()
    with RichProgress(Console(file=out, width=120)) as bar:
        for batch in (["a/x", "a/y"], ["b/x"]):
            for i, name in enumerate(batch):
                bar.started(name, i, len(batch))
                bar.finished(_ok(name, HERE), i, len(batch))
    assert bar.failures == 0
    assert "3/3" in out.getvalue()


def test_progress_prints_failures_with_their_reason() -> None:
    out = io.StringIO()
    failed = Profile(variant="c/x", status="failed", error="boom", machine=HERE, measured_at_s=0)
    with RichProgress(Console(file=out, width=120), total=1) as bar:
        bar.started("c/x", 0, 1)
        bar.finished(failed, 0, 1)
    assert bar.failures == 1
    assert "failed c/x: boom" in out.getvalue() and "1/1" in out.getvalue()
