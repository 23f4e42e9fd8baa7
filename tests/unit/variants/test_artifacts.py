"""Content-addressed publishing and rollback."""

from __future__ import annotations

from pathlib import Path

from variants.artifacts import Staging, sha256_path


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_same_content_is_stored_once_and_rollback_removes_only_what_this_staging_published(
    tmp_path: Path,
) -> None:
    artifacts = tmp_path / "artifacts"
    earlier = Staging(artifacts, tmp_path / "tmp")
    shared = earlier.path("a.onnx")
    shared.write_bytes(b"shared bytes")
    shared_rel, shared_sha = earlier.commit(shared, "a.onnx")
    assert shared_rel == f"{shared_sha[:2]}/{shared_sha}/a.onnx"
    assert sha256_path(artifacts / shared_rel) == shared_sha

    staging = Staging(artifacts, tmp_path / "tmp")
    same = staging.path("again.onnx")
    same.write_bytes(b"shared bytes")
    assert staging.commit(same, "a.onnx") == (shared_rel, shared_sha)  # already there: not re-published
    renamed = staging.path("model.onnx")
    renamed.write_bytes(b"shared bytes")
    other_name_rel, _ = staging.commit(renamed, "model.onnx")  # same bytes, another name: same folder
    folder = staging.path("saved_model", "variables", "v.index").parent.parent
    (folder / "variables" / "v.index").write_bytes(b"index")
    (folder / "saved_model.pb").write_bytes(b"pb")
    dir_rel, dir_sha = staging.commit(folder, "saved_model")
    assert (artifacts / dir_rel / "variables" / "v.index").read_bytes() == b"index"
    assert dir_sha == sha256_path(artifacts / dir_rel)

    staging.rollback()
    staging.cleanup()
    assert _files(artifacts) == [shared_rel]  # the earlier registration's artifact survives
    assert not (artifacts / other_name_rel).exists() and not (artifacts / dir_rel).exists()
    assert not (tmp_path / "tmp" / staging.dir.name).exists()


def test_directory_hash_depends_on_names_and_contents(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "x").write_bytes(b"1")
    assert sha256_path(a) == sha256_path(b)
    (b / "sub" / "x").rename(b / "sub" / "y")
    assert sha256_path(a) != sha256_path(b)
