"""Profiling each variant in its own worker process, and storing what comes back.

`ProcessProfiler` is the `VariantProfiler` the registry calls right after it generates variants,
and what ``infaas profile`` calls to re-measure. For each variant it writes a job file, starts
``python -m profiler.worker`` (a fresh interpreter: nothing of the caller's threads, imports or
memory), waits up to the per-variant timeout, and turns the result into a `Profile`. A worker that
raises, dies or hangs yields a profile with ``status="failed"`` and the reason; the next variant is
profiled as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from infaas.errors import ArchitectureNotFound, TaskNotFound, VariantNotFound
from infaas.settings import Settings
from infaas.types import MachineInfo, Profile, Task, Variant
from profiler.cost import PriceTable, load_price_table
from profiler.harness import MeasureConfig, Measurement, build_profile, failed_profile
from profiler.machine import is_foreign, local_machine
from variants.runtimes.base import LoadedModel

if TYPE_CHECKING:
    from infaas.store import MetadataStore

__all__ = [
    "DEFAULT_LOADER",
    "CallbackProgress",
    "NullProgress",
    "ProcessProfiler",
    "ProfileProgress",
    "WorkerJob",
    "WorkerResult",
    "needs_profile",
    "run_job",
]

DEFAULT_LOADER = "variants.runtimes:load_variant"

# Imported before the RSS baseline so that memory_mb is what one more variant costs in a worker
# that already hosts its framework, as the serving workers do.
_FRAMEWORK_MODULES: dict[str, str] = {
    "tensorflow": "tensorflow",
    "onnxruntime": "onnxruntime",
    "sklearn": "sklearn",
    "tensorrt": "tensorrt",
}

_ERROR_TAIL_CHARS = 600


class WorkerJob(BaseModel):
    """What the parent asks one worker to measure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: Variant
    artifacts_dir: str
    validation_path: str
    config: MeasureConfig
    loader: str = DEFAULT_LOADER
    input_dtype: str = "float32"


class WorkerResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["ok", "failed"]
    measurement: Measurement | None = None
    error: str | None = None


# ---- inside the worker process ----------------------------------------------------------------


def _resolve_loader(spec: str) -> Callable[[Variant, Path], LoadedModel]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"loader {spec!r} is not of the form 'module:function'")
    loader: Callable[[Variant, Path], LoadedModel] = getattr(importlib.import_module(module_name), attr)
    return loader


def _rss_mb() -> float:
    import psutil

    rss: int = psutil.Process().memory_info().rss
    return rss / (1024 * 1024)


def _measure(job: WorkerJob) -> Measurement:
    from profiler.accuracy import load_validation
    from profiler.harness import measure_loaded

    framework = _FRAMEWORK_MODULES.get(job.variant.spec.runtime)
    # A missing framework is left for the loader to report, in its own words.
    if framework is not None and importlib.util.find_spec(framework) is not None:
        importlib.import_module(framework)
    load = _resolve_loader(job.loader)
    x, y = load_validation(Path(job.validation_path))
    # Served queries arrive in the task's dtype; a validation set saved as float64 must not make
    # the measured variant convert every batch (or fail) where serving would not.
    x = np.ascontiguousarray(x, dtype=np.dtype(job.input_dtype))
    y = y.astype(np.int64)
    clock = time.perf_counter
    rss_before_mb = _rss_mb()
    t0 = clock()
    model = load(job.variant, Path(job.artifacts_dir))
    model.predict(x[:1])
    load_time_s = clock() - t0
    memory_mb = max(0.0, _rss_mb() - rss_before_mb)
    try:
        points, warmup_s, accuracy = measure_loaded(
            model.predict, x, y, job.variant.spec.max_batch, job.config, clock
        )
    finally:
        model.close()
    return Measurement(
        points=points, load_time_s=load_time_s, warmup_s=warmup_s, memory_mb=memory_mb, accuracy=accuracy
    )


def run_job(job_path: Path, result_path: Path) -> None:
    """Measure the job's variant and write the result atomically (a reader never sees half a file)."""
    job = WorkerJob.model_validate_json(job_path.read_text())
    try:
        result = WorkerResult(status="ok", measurement=_measure(job))
    except Exception as exc:
        traceback.print_exc()
        result = WorkerResult(status="failed", error=f"{type(exc).__name__}: {exc}")
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(result.model_dump_json())
    tmp.replace(result_path)


# ---- in the caller ----------------------------------------------------------------------------


class ProfileProgress(Protocol):
    """Told when each variant starts and ends (the CLI draws a progress bar from it)."""

    def started(self, variant: str, index: int, total: int) -> None: ...

    def finished(self, profile: Profile, index: int, total: int) -> None: ...


class NullProgress:
    def started(self, variant: str, index: int, total: int) -> None:
        return None

    def finished(self, profile: Profile, index: int, total: int) -> None:
        return None


class CallbackProgress:
    """Reports to a ``(message, done, total)`` callback, such as the registration progress bar,
    so profiling shows inside the bar already on screen (rich draws one live display at a time)."""

    def __init__(self, callback: Callable[[str, int, int], None]) -> None:
        self.callback = callback

    def started(self, variant: str, index: int, total: int) -> None:
        self.callback(f"profiling {variant} ({index + 1}/{total})", index, total)

    def finished(self, profile: Profile, index: int, total: int) -> None:
        outcome = "profiled" if profile.status == "ok" else "profile failed:"
        self.callback(f"{outcome} {profile.variant}", index + 1, total)


def needs_profile(existing: Profile | None, local: MachineInfo, force: bool) -> bool:
    """Re-measure when asked, when never measured, after a failure, or when measured elsewhere."""
    return force or existing is None or existing.status != "ok" or is_foreign(existing, local)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the profiling worker was killed by {name}"
    return f"the profiling worker exited with code {returncode} without a result"


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-4:])[-_ERROR_TAIL_CHARS:]


class ProcessProfiler:
    """Profiles variants one at a time, each in a fresh worker process, and stores the profiles.

    One at a time on purpose: two measuring processes on a 2-core machine disturb each other's
    latencies far more than the 10 % the stability rule tolerates.
    """

    def __init__(
        self,
        settings: Settings,
        store: MetadataStore,
        *,
        quick: bool = False,
        config: MeasureConfig | None = None,
        progress: ProfileProgress | None = None,
        loader: str = DEFAULT_LOADER,
        machine: MachineInfo | None = None,
        prices: PriceTable | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.config = config or (MeasureConfig.quick() if quick else MeasureConfig.normal())
        self.progress: ProfileProgress = progress or NullProgress()
        self.loader = loader
        self.machine = machine or local_machine()
        self.prices = prices or load_price_table(settings.price_table)
        self.wall_clock = wall_clock

    def profile_variants(self, variants: Sequence[Variant], task: Task) -> list[Profile]:
        """Measure each variant, store its profile (failed ones too) and return them in order."""
        profiles: list[Profile] = []
        total = len(variants)
        for index, variant in enumerate(variants):
            self.progress.started(variant.name, index, total)
            profile = self.profile_one(variant, task)
            self.store.put_profile(profile)
            profiles.append(profile)
            self.progress.finished(profile, index, total)
        return profiles

    def profile_architecture(
        self, architecture: str, variant: str | None = None, force: bool = False
    ) -> tuple[list[Profile], list[Profile]]:
        """(profiles measured now, stored profiles kept) for an architecture or one of its variants.

        Without `force`, a variant with a good profile from this machine keeps it.
        """
        arch = self.store.get_architecture(architecture)
        if arch is None:
            raise ArchitectureNotFound(
                f"no architecture {architecture!r}; `infaas models` lists them", architecture=architecture
            )
        task = self.store.get_task(arch.task)
        if task is None:
            raise TaskNotFound(f"task {arch.task!r} of {architecture!r} is missing", task=arch.task)
        variants = self.store.list_variants(architecture)
        if variant is not None:
            wanted = {variant, f"{architecture}/{variant}"}
            variants = [v for v in variants if v.name in wanted]
            if not variants:
                raise VariantNotFound(
                    f"{architecture!r} has no variant {variant!r}; "
                    f"`infaas variants {architecture}` lists them",
                    variant=variant,
                )
        todo: list[Variant] = []
        kept: list[Profile] = []
        for v in variants:
            existing = self.store.get_profile(v.name, self.machine)
            if needs_profile(existing, self.machine, force):
                todo.append(v)
            elif existing is not None:
                kept.append(existing)
        return self.profile_variants(todo, task), kept

    def profile_one(self, variant: Variant, task: Task) -> Profile:
        """Run one worker for `variant`; never raises for the variant's own failures."""
        with tempfile.TemporaryDirectory(prefix="infaas-profile-") as tmp:
            tmp_dir = Path(tmp)
            job = WorkerJob(
                variant=variant,
                artifacts_dir=str(self.settings.artifacts_dir),
                validation_path=str(self.settings.artifacts_dir / task.validation_artifact),
                config=self.config,
                loader=self.loader,
                input_dtype=task.input_spec.dtype,
            )
            job_path, result_path, log_path = tmp_dir / "job.json", tmp_dir / "result.json", tmp_dir / "log"
            job_path.write_text(job.model_dump_json())
            with log_path.open("wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "profiler.worker", str(job_path), str(result_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                try:
                    returncode = proc.wait(timeout=self.config.timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    return self._failed(
                        variant, f"timed out after {self.config.timeout_s:g} s (hung or too slow); killed"
                    )
            if not result_path.exists():
                tail = _tail(log_path)
                reason = _describe_exit(returncode)
                return self._failed(variant, f"{reason}: {tail}" if tail else reason)
            result = WorkerResult.model_validate_json(result_path.read_text())
        if result.status != "ok" or result.measurement is None:
            return self._failed(variant, result.error or "the profiling worker reported a failure")
        return build_profile(variant.spec, result.measurement, self.machine, self.prices, self.wall_clock())

    def _failed(self, variant: Variant, reason: str) -> Profile:
        return failed_profile(variant.spec, reason, self.machine, self.prices, self.wall_clock())


if TYPE_CHECKING:
    from infaas.registry import VariantProfiler

    def _is_a_variant_profiler(profiler: ProcessProfiler) -> VariantProfiler:
        """mypy checks here that `ProcessProfiler` satisfies the registry's protocol."""
        return profiler
