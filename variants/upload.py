"""What an upload is: format detection and safe archive extraction, before anything is loaded.

Archives are checked member by member before a single byte is written: absolute paths, ``..``
components, symbolic or hard links and device files are refused (`UnsafeArchive`), and the total
unpacked size is bounded (`PayloadTooLarge`), so a crafted archive can neither escape the staging
directory nor fill the disk.
"""

from __future__ import annotations

import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from infaas.errors import PayloadTooLarge, UnsafeArchive, UnsupportedFormat
from infaas.types import ModelKind

__all__ = ["ACCEPTED_FORMATS", "SKLEARN_SUFFIXES", "DetectedModel", "detect_kind", "prepare_upload"]

SKLEARN_SUFFIXES = (".joblib", ".pkl", ".pickle")
_ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
ACCEPTED_FORMATS = (
    "Keras .keras, TensorFlow SavedModel (a directory, or a .zip / .tar.gz of one), ONNX .onnx, "
    "scikit-learn saved with joblib (.joblib / .pkl, admin only)"
)


@dataclass(frozen=True)
class DetectedModel:
    kind: ModelKind
    path: Path  # the model file, or the SavedModel directory


def _suffix(filename: str) -> str:
    name = filename.lower()
    for suffix in (".tar.gz", *_ARCHIVE_SUFFIXES, ".keras", ".onnx", *SKLEARN_SUFFIXES):
        if name.endswith(suffix):
            return suffix
    return PurePosixPath(name).suffix


def detect_kind(filename: str, is_dir: bool = False) -> ModelKind | None:
    """The model kind a name announces (None for archives, which are opened first; pure)."""
    if is_dir:
        return "savedmodel"
    suffix = _suffix(filename)
    if suffix == ".keras":
        return "keras"
    if suffix == ".onnx":
        return "onnx"
    if suffix in SKLEARN_SUFFIXES:
        return "sklearn"
    if suffix in _ARCHIVE_SUFFIXES:
        return None
    raise UnsupportedFormat(
        f"unknown model format {filename!r}; accepted: {ACCEPTED_FORMATS}", filename=filename
    )


def _check_member(name: str) -> None:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"archive member {name!r} has an absolute path", member=name)
    if ".." in path.parts:
        raise UnsafeArchive(f"archive member {name!r} escapes the archive with '..'", member=name)


def _check_total(total: int, limit: int) -> None:
    if total > limit:
        raise PayloadTooLarge(f"archive unpacks to more than {limit} bytes", limit_bytes=limit)


def _extract_zip(archive: Path, dest: Path, limit: int) -> None:
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnsupportedFormat(f"corrupt .zip archive: {exc}") from exc
    with zf:
        total = 0
        for info in zf.infolist():
            _check_member(info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise UnsafeArchive(f"archive member {info.filename!r} is a link", member=info.filename)
            total += info.file_size
            _check_total(total, limit)
        try:
            zf.extractall(dest)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise UnsupportedFormat(f"corrupt .zip archive: {exc}") from exc


def _extract_tar(archive: Path, dest: Path, limit: int) -> None:
    try:
        tf = tarfile.open(archive)  # noqa: SIM115 - closed by the `with` below; opened here to map errors
    except (tarfile.TarError, OSError) as exc:
        raise UnsupportedFormat(f"corrupt tar archive: {exc}") from exc
    with tf:
        try:
            members = tf.getmembers()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise UnsupportedFormat(f"corrupt tar archive: {exc}") from exc
        total = 0
        for member in members:
            _check_member(member.name)
            if member.issym() or member.islnk():
                raise UnsafeArchive(f"archive member {member.name!r} is a link", member=member.name)
            if not (member.isfile() or member.isdir()):
                raise UnsafeArchive(
                    f"archive member {member.name!r} is not a regular file", member=member.name
                )
            total += member.size
            _check_total(total, limit)
        try:
            tf.extractall(dest, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise UnsupportedFormat(f"corrupt tar archive: {exc}") from exc


def _find_savedmodel(root: Path) -> Path:
    found = sorted(p.parent for p in root.rglob("saved_model.pb"))
    if not found:
        raise UnsupportedFormat(
            f"the archive holds no TensorFlow SavedModel (no saved_model.pb); accepted: {ACCEPTED_FORMATS}"
        )
    if len(found) > 1:
        raise UnsupportedFormat(f"the archive holds {len(found)} SavedModels; upload one")
    return found[0]


def prepare_upload(upload: Path, filename: str, work_dir: Path, max_unpacked_bytes: int) -> DetectedModel:
    """Detect the kind of `upload` (named `filename` by its sender) and unpack archives into `work_dir`."""
    if upload.is_dir():
        for item in upload.rglob("*"):
            if item.is_symlink():
                raise UnsafeArchive(f"the SavedModel directory holds a link: {item.name}", member=item.name)
        model_dir = work_dir / "savedmodel"
        shutil.copytree(upload, model_dir)
        return DetectedModel("savedmodel", _find_savedmodel(model_dir))
    kind = detect_kind(filename)
    if kind is not None:
        return DetectedModel(kind, upload)
    dest = work_dir / "unpacked"
    dest.mkdir(parents=True)
    if _suffix(filename) == ".zip":
        _extract_zip(upload, dest, max_unpacked_bytes)
    else:
        _extract_tar(upload, dest, max_unpacked_bytes)
    return DetectedModel("savedmodel", _find_savedmodel(dest))
