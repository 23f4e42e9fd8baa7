"""The registration use case: an upload becomes an architecture, its variants and (first time) its task.

Transport-independent: the REST route and the CLI both call `Registry.register`. Steps, in order:

1. refuse what must not be opened (a tenant's scikit-learn pickle → `Forbidden`; too large →
   `PayloadTooLarge`; unknown suffix → `UnsupportedFormat`);
2. ownership: a tenant key registers nothing, an owner key only into tasks it owns (or a new task,
   which it then owns) → `Forbidden`;
3. idempotence: the same name with the same bytes returns the stored version; different bytes →
   `Conflict`, unless `new_version`: then they become version N+1 (``name@N+1``, its own variants
   and profiles), `loading` while built, then `ready` (routable when labelled: `infaas.versions`)
   or `failed` with the reason;
4. in a staging directory: unpack safely, load the reference, check the input spec against the task
   (`SpecMismatch`) and that the output is a probability vector on the validation set;
5. generate the variants (`variants.generator`), publishing content-addressed artifacts;
6. write the task (if new), the architecture, its variants, skipped variants and labels in **one**
   `store.register_architecture` call, last. Any failure before that removes every artifact this
   registration published, so nothing is left half-registered;
7. when a profiler is given and `profile=True`, measure the new variants and store their profiles.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from infaas.artifacts import open_artifacts
from infaas.errors import (
    Conflict,
    Forbidden,
    InfaasError,
    InvalidInput,
    PayloadTooLarge,
    RegistrationError,
    SpecMismatch,
)
from infaas.settings import Settings
from infaas.store import MetadataStore
from infaas.types import (
    Architecture,
    InputSpec,
    Labels,
    Profile,
    Role,
    SkippedVariant,
    Task,
    Variant,
    VersionState,
    version_name,
)
from variants.plan import HardwareInfo, OrtProviderProbe, ProviderProbe, detect_hardware

__all__ = [
    "NAME_RE",
    "RegistrationResult",
    "Registry",
    "VariantProfiler",
    "build_registry",
    "check_probabilities",
    "load_validation",
    "may_manage",
    "versions_of",
]

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_PROB_TOLERANCE = 1e-3
_MB = 1024 * 1024

ProgressFn = Callable[[str, int, int], None]


class VariantProfiler(Protocol):
    """Measures variants on this machine (implemented in `profiler/`)."""

    def profile_variants(self, variants: Sequence[Variant], task: Task) -> list[Profile]: ...


@dataclass(frozen=True)
class RegistrationResult:
    architecture: Architecture
    task: Task
    variants: list[Variant]
    skipped: list[SkippedVariant]
    created: bool  # False: the same bytes were already registered under this name
    task_created: bool = False
    profiles: list[Profile] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)


def check_probabilities(probs: np.ndarray, rows: int) -> None:
    """Raise `SpecMismatch` unless `probs` is (rows, k≥2), in [0, 1], each row summing to 1 (pure)."""
    if probs.ndim != 2 or probs.shape[0] != rows or probs.shape[1] < 2:
        raise SpecMismatch(
            f"the model's output has shape {tuple(probs.shape)}; expected class probabilities "
            f"({rows}, classes ≥ 2)",
            found=list(probs.shape),
        )
    if not np.all(np.isfinite(probs)):
        raise SpecMismatch("the model's output holds NaN or infinite values")
    sums = probs.astype(np.float64).sum(axis=1)
    worst = float(np.max(np.abs(sums - 1.0)))
    low, high = float(probs.min()), float(probs.max())
    if worst > _PROB_TOLERANCE or low < -_PROB_TOLERANCE or high > 1.0 + _PROB_TOLERANCE:
        raise SpecMismatch(
            "the model's output is not a probability vector (rows must lie in [0, 1] and sum to 1; "
            f"found values in [{low:.3g}, {high:.3g}], row sums off by up to {worst:.3g}): end the "
            "model with a softmax",
            max_row_sum_error=worst,
        )


def load_validation(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read `x` (rows × input shape) and integer labels `y` from an .npz, without unpickling."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if "x" not in data or "y" not in data:
                raise RegistrationError(
                    f"the validation file must hold arrays 'x' and 'y'; found {sorted(data.files)}"
                )
            x, y = np.asarray(data["x"]), np.asarray(data["y"])
    except (OSError, ValueError) as exc:
        raise RegistrationError(f"cannot read the validation .npz: {exc}") from exc
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y) or len(x) == 0:
        raise RegistrationError(
            f"validation arrays must be x (n, ...) and y (n,) with n ≥ 1; found x {x.shape}, y {y.shape}"
        )
    if not np.issubdtype(x.dtype, np.number) or not np.issubdtype(y.dtype, np.integer):
        raise RegistrationError(
            f"validation x must be numeric and y integer labels; found {x.dtype}, {y.dtype}"
        )
    return x.astype(np.float32), y.astype(np.int64)


def versions_of(store: MetadataStore, name: str) -> list[Architecture]:
    """Every stored version of architecture `name`, oldest first."""
    return sorted((a for a in store.list_architectures() if a.line == name), key=lambda a: a.version)


def may_manage(task: Task | None, principal: str, role: Role) -> bool:
    """Whether a key may register into, and manage the architectures of, `task` (None: a new task,
    which its creator will own)."""
    if role == "admin":
        return True
    return role == "owner" and (task is None or principal in task.owners)


class Registry:
    """Registers architectures (see the module docstring). Thread-safe: one registration at a time."""

    def __init__(
        self,
        settings: Settings,
        store: MetadataStore,
        profiler: VariantProfiler | None = None,
        probe: ProviderProbe | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.profiler = profiler
        self.artifacts = open_artifacts(settings)
        self._probe: ProviderProbe = probe if probe is not None else OrtProviderProbe()
        self._clock = clock
        self._lock = threading.Lock()
        self.labels_lock = threading.Lock()
        """Held for every read-modify-write of a `Labels` document (short: never across a build)."""
        self._hardware: HardwareInfo | None = None

    @property
    def tmp_dir(self) -> Path:
        return self.settings.data_dir / "tmp"

    def hardware(self) -> HardwareInfo:
        """What the provider probe found (probed once per registry)."""
        if self._hardware is None:
            self._hardware = detect_hardware(self._probe)
        return self._hardware

    def register(
        self,
        upload: Path,
        *,
        name: str,
        task: str,
        validation: Path | None = None,
        description: str = "",
        filename: str | None = None,
        owner: str = "admin",
        role: Role = "admin",
        profile: bool = True,
        progress: ProgressFn | None = None,
        new_version: bool = False,
        trust_pickle: bool = True,
    ) -> RegistrationResult:
        """Register the model at `upload` (file or SavedModel directory) as architecture `name`.

        `filename` is the name the sender gave the upload (its suffix announces the format)."""
        from variants.artifacts import sha256_path, tree_size_bytes
        from variants.upload import detect_kind

        for label, value in (("name", name), ("task", task)):
            if not NAME_RE.match(value):
                raise InvalidInput(
                    f"{label} {value!r} is not valid: use lowercase letters, digits, '.', '_', '-' "
                    "(at most 63, starting with a letter or digit)",
                    field=label,
                )
        if not upload.exists():
            raise InvalidInput(f"no such file or directory: {upload}")
        if not may_manage(self.store.get_task(task), owner, role):
            raise Forbidden(
                "tenant keys query; registering needs an owner key (the admin creates them)"
                if role == "tenant"
                else f"task {task!r} belongs to other owners: ask the admin to grant it to {owner!r}",
                task=task,
                role=role,
            )
        fname = filename or upload.name
        kind = detect_kind(fname, is_dir=upload.is_dir())
        if kind == "sklearn" and role != "admin":
            raise Forbidden(
                "scikit-learn uploads are unpickled, which runs arbitrary code, so only the admin may "
                "register them; convert the model to ONNX (skl2onnx) and upload the .onnx instead",
                kind="sklearn",
            )
        if kind == "sklearn" and not trust_pickle:
            raise InvalidInput(
                "a scikit-learn upload is a pickle: loading it runs any code it holds, in the front "
                'end and on every worker. Set "trust_pickle": true in the metadata if you trust '
                "its source, or convert it to ONNX (skl2onnx) and upload the .onnx",
                kind="sklearn",
            )
        limit = int(self.settings.max_upload_mb * _MB)
        if tree_size_bytes(upload) > limit:
            raise PayloadTooLarge(
                f"the upload is over the {self.settings.max_upload_mb:g} MB limit (INFAAS_MAX_UPLOAD_MB)",
                limit_bytes=limit,
            )
        source_sha = sha256_path(upload)
        with self._lock:
            versions = versions_of(self.store, name)
            if not versions:
                return self._register_new(
                    upload, fname, source_sha, name, task, validation, description, owner, profile, progress
                )
            same = next((a for a in versions if a.source_sha256 == source_sha), None)
            if same is not None or versions[0].task != task or not new_version:
                return self._existing(same or versions[-1], source_sha, task)
            version = versions[-1].version + 1
            self._set_state(name, version, "loading")
            try:
                return self._register_new(
                    upload,
                    fname,
                    source_sha,
                    name,
                    task,
                    None,
                    description,
                    owner,
                    profile,
                    progress,
                    version=version,
                )
            except InfaasError as exc:
                self._set_state(name, version, "failed", exc.message)
                raise
            except BaseException as exc:
                self._set_state(name, version, "failed", f"{type(exc).__name__}: {exc}")
                raise

    def _set_state(self, name: str, version: int, state: VersionState, error: str = "") -> Labels:
        with self.labels_lock:
            labels = self.store.get_labels(name) or Labels(architecture=name)
            errors = {**labels.errors, version: error[:500]} if error else labels.errors
            labels = labels.model_copy(update={"states": {**labels.states, version: state}, "errors": errors})
            self.store.put_labels(labels)
            return labels

    def _existing(self, arch: Architecture, source_sha: str, task: str) -> RegistrationResult:
        if arch.task != task:
            raise Conflict(
                f"architecture {arch.line!r} is registered in task {arch.task!r}, not {task!r}; "
                "choose another name",
                architecture=arch.line,
            )
        if arch.source_sha256 != source_sha:
            raise Conflict(
                f"architecture {arch.line!r} is already registered with different bytes: send "
                '"new_version": true (CLI --new-version) to register them as version '
                f"{arch.version + 1}, or choose another name",
                architecture=arch.line,
            )
        stored_task = self.store.get_task(arch.task)
        assert stored_task is not None, "an architecture's task is written in the same step"
        return RegistrationResult(
            architecture=arch,
            task=stored_task,
            variants=self.store.list_variants(arch.name),
            skipped=self.store.list_skipped(arch.name),
            created=False,
        )

    def _register_new(
        self,
        upload: Path,
        filename: str,
        source_sha: str,
        name: str,
        task_name: str,
        validation: Path | None,
        description: str,
        owner: str,
        profile: bool,
        progress: ProgressFn | None,
        version: int = 1,
    ) -> RegistrationResult:
        from variants.artifacts import Staging, sha256_path
        from variants.generator import generate
        from variants.reference import load_reference, predict_in_batches
        from variants.upload import prepare_upload

        now_s = self._clock()
        staging = Staging(self.settings.artifacts_dir, self.tmp_dir)
        try:
            existing_task = self.store.get_task(task_name)
            if existing_task is None and validation is None:
                raise RegistrationError(
                    f"task {task_name!r} is new: send its labelled validation set "
                    "(an .npz with arrays x and y; CLI --validation FILE.npz, REST part 'validation')",
                    task=task_name,
                )
            if (
                existing_task is not None
                and validation is not None
                and sha256_path(validation) != Path(existing_task.validation_artifact).parent.name
            ):
                raise Conflict(
                    f"task {task_name!r} already has a different validation set; omit the validation "
                    "file to be measured on the task's own",
                    task=task_name,
                )
            # Another front end may have registered the task: its split comes from the artifact store.
            val_path = (
                self.artifacts.root_path(existing_task.validation_artifact)
                / existing_task.validation_artifact
                if existing_task is not None
                else validation
            )
            assert val_path is not None
            x_val, y_val = load_validation(val_path)

            # Work on a private copy: publishing moves files, and the caller's upload stays theirs.
            staged_upload = staging.path("upload", Path(filename).name or "model")
            if upload.is_dir():
                shutil.copytree(upload, staged_upload, symlinks=True)
            else:
                shutil.copyfile(upload, staged_upload)
            detected = prepare_upload(
                staged_upload, filename, staging.path("unpacked"), int(self.settings.max_upload_mb * _MB)
            )
            reference = load_reference(detected.kind, detected.path)
            found_shape = tuple(int(d) for d in x_val.shape[1:])
            if existing_task is not None and existing_task.input_spec.shape != found_shape:
                raise SpecMismatch(
                    f"validation rows have shape {found_shape}, task expects {existing_task.input_spec.shape}"
                )
            if reference.input_shape is not None and reference.input_shape != found_shape:
                raise SpecMismatch(
                    f"the model takes inputs of shape {reference.input_shape}, but task {task_name!r} "
                    f"has inputs of shape {found_shape}",
                    expected=list(found_shape),
                    found=list(reference.input_shape),
                )
            try:
                reference_probs = predict_in_batches(reference.predict, x_val, 256)
            except Exception as exc:  # the framework's own error for an input it cannot take
                raise SpecMismatch(
                    f"the model failed on the task's validation rows of shape {found_shape}: "
                    f"{type(exc).__name__}: {str(exc)[:300]}",
                    expected=list(found_shape),
                ) from exc
            check_probabilities(reference_probs, len(x_val))
            num_classes = int(reference_probs.shape[1])
            if existing_task is not None and existing_task.num_classes != num_classes:
                raise SpecMismatch(
                    f"the model outputs {num_classes} classes; task {task_name!r} has "
                    f"{existing_task.num_classes}",
                    expected=existing_task.num_classes,
                    found=num_classes,
                )
            if int(y_val.max()) >= num_classes or int(y_val.min()) < 0:
                raise SpecMismatch(
                    f"validation labels range over [{y_val.min()}, {y_val.max()}] but the model outputs "
                    f"{num_classes} classes"
                )

            new_task: Task | None = None
            if existing_task is None:
                assert validation is not None
                val_rel, _ = staging.commit(validation, "validation.npz", copy=True)
                new_task = Task(
                    name=task_name,
                    input_spec=InputSpec(shape=found_shape, dtype="float32"),
                    num_classes=num_classes,
                    validation_artifact=val_rel,
                    validation_size=len(x_val),
                    description=f"created by {name}",
                    created_at_s=now_s,
                    owners=() if owner == "admin" else (owner,),
                )
            task = existing_task or new_task
            assert task is not None

            source_name = "saved_model" if detected.kind == "savedmodel" else Path(filename).name
            source_rel, _ = staging.commit(detected.path, source_name)
            hardware = self.hardware()
            stored_name = version_name(name, version)
            result = generate(
                architecture=stored_name,
                kind=detected.kind,
                source=self.settings.artifacts_dir / source_rel,
                reference=reference,
                input_shape=found_shape,
                validation_x=x_val,
                reference_probs=reference_probs,
                hardware=hardware,
                staging=staging,
                now_s=now_s,
                progress=progress,
            )
            if not result.variants:
                reasons = "; ".join(f"{s.name}: {s.reason}" for s in result.skipped[:4])
                raise RegistrationError(
                    f"no variant of {name!r} could be built: {reasons}", architecture=name
                )
            arch = Architecture(
                name=stored_name,
                task=task_name,
                kind=detected.kind,
                source_sha256=source_sha,
                artifact=source_rel,
                description=description,
                owner=owner,
                created_at_s=now_s,
                version=version,
            )
            # Every node can fetch what the store lists: the variants, and the validation split a
            # node profiles them with (a no-op for the local artifact store).
            for built in result.variants:
                self.artifacts.publish(built)
            self.artifacts.publish_path(task.validation_artifact)
            with self.labels_lock:
                labels = self.store.get_labels(name) or Labels(architecture=name)
                labels = labels.model_copy(update={"states": {**labels.states, version: "ready"}})
                self.store.register_architecture(
                    arch, result.variants, result.skipped, task=new_task, labels=labels
                )
        except BaseException:
            staging.rollback()
            raise
        finally:
            staging.cleanup()

        profiles: list[Profile] = []
        if profile and self.profiler is not None:
            profiles = self.profiler.profile_variants(result.variants, task)
            for prof in profiles:
                self.store.put_profile(prof)
        return RegistrationResult(
            architecture=arch,
            task=task,
            variants=result.variants,
            skipped=result.skipped,
            created=True,
            task_created=new_task is not None,
            profiles=profiles,
            notes=result.notes,
        )

    def publish_artifacts(self) -> int:
        """Publish every stored variant's artifact and task's validation split that this data
        directory holds (what was registered before the artifact store was shared); returns how
        many were checked."""
        rels = {v.artifact for v in self.store.list_variants()}
        rels |= {t.validation_artifact for t in self.store.list_tasks()}
        found = [rel for rel in sorted(rels) if (self.settings.artifacts_dir / rel).exists()]
        for rel in found:
            self.artifacts.publish_path(rel)
        return len(found)

    def remove_artifacts(self, candidates: Sequence[str]) -> int:
        """Delete the content-addressed folders of `candidates` (artifact paths) that no stored
        task, architecture or variant still uses; returns how many went."""

        def folder(rel: str) -> Path:
            return Path(*Path(rel).parts[:2])

        used = {folder(t.validation_artifact) for t in self.store.list_tasks()}
        used |= {folder(a.artifact) for a in self.store.list_architectures()}
        used |= {folder(v.artifact) for v in self.store.list_variants()}
        removed = 0
        for rel in {folder(c) for c in candidates} - used:
            path = self.settings.artifacts_dir / rel
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        return removed


def build_registry(
    settings: Settings,
    store: MetadataStore,
    profiler: VariantProfiler | None = None,
    probe: ProviderProbe | None = None,
) -> Registry:
    """The one way the CLI, the app factory and the zoo build a registry; `probe` defaults to a real
    ONNX Runtime provider probe (tests pass `variants.plan.FakeProviderProbe`)."""
    return Registry(settings, store, profiler, probe=probe)
