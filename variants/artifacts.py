"""Content-addressed artifacts under ``data_dir/artifacts`` and the staging area that makes
registration atomic.

An artifact (a file or a SavedModel directory) lives at ``<sha[:2]>/<sha>/<filename>``, where `sha`
is the SHA-256 of its content (for a directory: of its relative paths and file contents in sorted
order). Everything is built in a staging directory on the same filesystem and moved into place with
`os.rename`; `Staging.rollback` removes exactly what this staging moved in, nothing that existed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from pathlib import Path

__all__ = ["Staging", "sha256_path", "tree_size_bytes"]

_CHUNK = 1 << 20


def _hash_file(path: Path, digest: hashlib._Hash) -> None:
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)


def sha256_path(path: Path) -> str:
    """SHA-256 of a file's bytes, or of a directory's sorted (relative path, bytes) pairs."""
    digest = hashlib.sha256()
    if path.is_file():
        _hash_file(path, digest)
        return digest.hexdigest()
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = item.relative_to(path).as_posix().encode()
        digest.update(len(rel).to_bytes(4, "big") + rel)
        _hash_file(item, digest)
    return digest.hexdigest()


def tree_size_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Staging:
    """A private work directory under ``data_dir/tmp`` plus the list of artifacts it committed."""

    def __init__(self, artifacts_dir: Path, tmp_root: Path) -> None:
        self.artifacts_dir = artifacts_dir
        tmp_root.mkdir(parents=True, exist_ok=True)
        artifacts_dir.mkdir(parents=True, exist_ok=True)
        self.dir = tmp_root / f"stage-{uuid.uuid4().hex}"
        self.dir.mkdir()
        self._committed: list[Path] = []

    def path(self, *parts: str) -> Path:
        """A fresh path inside the staging directory (its parent exists)."""
        target = self.dir.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def commit(self, source: Path, filename: str, *, copy: bool = False) -> tuple[str, str]:
        """Move (or copy) `source` into the content-addressed store; returns (relative path, sha).

        The same content committed twice lands on the same path and is stored once."""
        sha = sha256_path(source)
        folder = self.artifacts_dir / sha[:2] / sha
        target = folder / filename
        rel = target.relative_to(self.artifacts_dir).as_posix()
        if target.exists():
            return rel, sha
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.exists():
            # The same bytes are already stored under another name (an uploaded ONNX file and its
            # fp32 variant): add this name next to them with one rename.
            self._place(source, target, copy)
            self._committed.append(target)
            return rel, sha
        # Assemble next to the target, then one rename publishes the whole folder.
        pending = folder.parent / f".{sha}.{uuid.uuid4().hex}"
        pending.mkdir()
        try:
            self._place(source, pending / filename, copy)
            os.rename(pending, folder)
        except OSError:
            shutil.rmtree(pending, ignore_errors=True)
            if target.exists():  # another registration published the same content first
                return rel, sha
            raise
        self._committed.append(folder)
        return rel, sha

    @staticmethod
    def _place(source: Path, target: Path, copy: bool) -> None:
        if not copy:
            os.rename(source, target)
        elif source.is_dir():
            shutil.copytree(source, target, symlinks=False)
        else:
            shutil.copyfile(source, target)

    def rollback(self) -> None:
        """Remove every artifact this staging published (registration failed after publishing)."""
        for path in reversed(self._committed):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            # Folders left empty go too; ones holding other artifacts stay.
            for folder in (path.parent, path.parent.parent):
                if folder != self.artifacts_dir:
                    with contextlib.suppress(OSError):
                        folder.rmdir()
        self._committed.clear()

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
