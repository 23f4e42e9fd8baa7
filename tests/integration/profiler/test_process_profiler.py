"""ProcessProfiler end to end: real variants (scikit-learn and ONNX Runtime) loaded through
`variants.runtimes` in worker processes, next to variants that crash, hang or raise."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

from infaas.errors import ArchitectureNotFound, VariantNotFound
from infaas.settings import Settings
from infaas.store.memory import MemoryStore
from infaas.types import Architecture, InputSpec, MachineInfo, Parity, Profile, Task, Variant, VariantSpec
from profiler.fakes import FAULT_CRASH, FAULT_HANG, FAULT_RAISE
from profiler.harness import MeasureConfig
from profiler.process import ProcessProfiler

pytestmark = pytest.mark.slow

PARITY = Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1)


@dataclass
class Setup:
    settings: Settings
    task: Task
    arch: Architecture
    sklearn_variant: Variant
    onnx_variant: Variant
    estimator: LogisticRegression
    x_val: np.ndarray
    y_val: np.ndarray


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    settings = Settings(data_dir=tmp_path_factory.mktemp("profiler") / "data", admin_key="k")
    art = settings.artifacts_dir
    (art / "models").mkdir(parents=True)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.25, random_state=0)
    est = LogisticRegression(max_iter=500).fit(x_train, y_train)
    joblib.dump(est, art / "models" / "lr.joblib")
    onx = convert_sklearn(
        est, initial_types=[("x", FloatTensorType([None, 64]))], options={id(est): {"zipmap": False}}
    )
    (art / "models" / "lr.onnx").write_bytes(onx.SerializeToString())
    # Saved as float64 on purpose: the profiler feeds variants the task's dtype (float32).
    np.savez(art / "val.npz", x=x_val.astype(np.float64), y=y_val)
    task = Task(
        name="digits-test",
        input_spec=InputSpec(shape=(64,)),
        num_classes=10,
        validation_artifact="val.npz",
        validation_size=len(y_val),
    )
    arch = Architecture(
        name="digits-lr", task=task.name, kind="sklearn", source_sha256="0", artifact="models/lr.joblib"
    )
    sk = Variant(
        spec=VariantSpec(architecture="digits-lr", runtime="sklearn", max_batch=32),
        artifact="models/lr.joblib",
        sha256="0",
        parity=PARITY,
    )
    ort = Variant(
        spec=VariantSpec(architecture="digits-lr", runtime="onnxruntime", max_batch=128),
        artifact="models/lr.onnx",
        sha256="1",
        parity=PARITY,
    )
    yield Setup(settings, task, arch, sk, ort, est, x_val, y_val)


def _faulty(variant: Variant, fault: str) -> Variant:
    return variant.model_copy(update={"spec": variant.spec.model_copy(update={"architecture": fault})})


def _check_complete(profile: Profile, max_batch: int) -> None:
    assert profile.status == "ok", profile.error
    expected = [b for b in (1, 8, 32, 128) if b <= max_batch]
    assert [p.batch for p in profile.points] == expected
    for p in profile.points:
        assert 0 < p.p50_ms <= p.p95_ms <= p.p99_ms
        assert p.mean_ms > 0 and p.throughput_qps > 0 and p.cost_usd_per_1k > 0
        assert p.stop_reason in ("stable", "max_iterations", "max_time")
        assert p.stable == (p.stop_reason == "stable")
    assert profile.load_time_s > 0 and profile.warmup_s > 0
    assert profile.memory_mb >= 0 and profile.price_usd_per_s > 0
    assert profile.fit_error >= 0


def test_real_variants_profile_and_faulty_ones_fail_alone(setup: Setup) -> None:
    store = MemoryStore()
    config = MeasureConfig.quick().model_copy(update={"timeout_s": 15.0})
    profiler = ProcessProfiler(setup.settings, store, config=config, loader="profiler.fakes:load_with_faults")
    variants = [
        _faulty(setup.onnx_variant, FAULT_CRASH),
        setup.sklearn_variant,
        _faulty(setup.onnx_variant, FAULT_HANG),
        _faulty(setup.onnx_variant, FAULT_RAISE),
        setup.onnx_variant,
    ]
    profiles = profiler.profile_variants(variants, setup.task)
    by_name = {p.variant: p for p in profiles}
    assert [p.variant for p in profiles] == [v.name for v in variants]

    crashed = by_name[f"{FAULT_CRASH}/onnx-cpu-fp32-t1"]
    assert crashed.status == "failed" and crashed.error is not None and "SIGABRT" in crashed.error
    hung = by_name[f"{FAULT_HANG}/onnx-cpu-fp32-t1"]
    assert hung.status == "failed" and hung.error is not None and "timed out after 15 s" in hung.error
    raised = by_name[f"{FAULT_RAISE}/onnx-cpu-fp32-t1"]
    assert raised.status == "failed" and raised.error is not None and "injected load failure" in raised.error
    for failed in (crashed, hung, raised):
        assert failed.points == () and store.get_profile(failed.variant) == failed

    _check_complete(by_name[setup.sklearn_variant.name], 32)
    _check_complete(by_name[setup.onnx_variant.name], 128)
    assert store.get_profile(setup.onnx_variant.name) == by_name[setup.onnx_variant.name]

    # Accuracy measured by the variants themselves equals an independent computation on the split.
    independent = float(np.mean(setup.estimator.predict(setup.x_val) == setup.y_val))
    assert by_name[setup.sklearn_variant.name].accuracy == pytest.approx(independent)
    assert by_name[setup.onnx_variant.name].accuracy == pytest.approx(independent, abs=1.5 / len(setup.y_val))


def test_profile_architecture_skips_good_local_profiles_and_redoes_foreign_ones(setup: Setup) -> None:
    store = MemoryStore()
    store.register_architecture(setup.arch, [setup.sklearn_variant, setup.onnx_variant], [], task=setup.task)
    profiler = ProcessProfiler(setup.settings, store, quick=True)
    foreign = Profile(
        variant=setup.onnx_variant.name,
        machine=MachineInfo(cpu_model="elsewhere", cores=96),
        measured_at_s=1.0,
    )
    store.put_profile(foreign)
    fresh, kept = profiler.profile_architecture("digits-lr")
    assert sorted(p.variant for p in fresh) == sorted([setup.sklearn_variant.name, setup.onnx_variant.name])
    assert kept == []
    onnx = store.get_profile(setup.onnx_variant.name)
    assert onnx is not None and onnx.machine == profiler.machine

    fresh, kept = profiler.profile_architecture("digits-lr")
    assert fresh == [] and len(kept) == 2
    fresh, kept = profiler.profile_architecture("digits-lr", variant="sklearn-cpu-fp32-t1", force=True)
    assert [p.variant for p in fresh] == [setup.sklearn_variant.name] and kept == []

    with pytest.raises(ArchitectureNotFound):
        profiler.profile_architecture("nope")
    with pytest.raises(VariantNotFound):
        profiler.profile_architecture("digits-lr", variant="tf-cpu-fp32-t9")


def test_bad_validation_path_fails_the_variant_with_the_reason(setup: Setup, tmp_path: Path) -> None:
    task = setup.task.model_copy(update={"validation_artifact": "missing.npz"})
    profiler = ProcessProfiler(setup.settings, MemoryStore(), quick=True)
    [profile] = profiler.profile_variants([setup.onnx_variant], task)
    assert profile.status == "failed" and profile.error is not None and "missing.npz" in profile.error


def test_cli_profile_prints_a_table_and_stores_profiles(setup: Setup) -> None:
    from typer.testing import CliRunner

    from infaas.cli import app
    from infaas.store import open_store

    store = open_store(setup.settings)
    try:
        store.register_architecture(setup.arch, [setup.onnx_variant], [], task=setup.task)
    finally:
        store.close()
    env = {"INFAAS_DATA_DIR": str(setup.settings.data_dir), "COLUMNS": "250"}
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "digits-lr", "--quick"], env=env)
    assert result.exit_code == 0, result.output
    assert "digits-lr/onnx-cpu-fp32-t1" in result.output and "measured 1 variant" in result.output
    again = runner.invoke(app, ["profile", "digits-lr", "--quick"], env=env)
    assert again.exit_code == 0 and "kept 1 existing" in again.output
    missing = runner.invoke(app, ["profile", "nope"], env=env)
    assert missing.exit_code == 1 and "infaas models" in missing.output
    store = open_store(setup.settings)
    try:
        profile = store.get_profile(setup.onnx_variant.name)
    finally:
        store.close()
    assert profile is not None and profile.status == "ok"
