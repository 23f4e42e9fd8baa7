"""Format detection and safe archive extraction."""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from infaas.errors import PayloadTooLarge, UnsafeArchive, UnsupportedFormat
from variants.upload import detect_kind, prepare_upload


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("m.keras", "keras"),
        ("M.ONNX", "onnx"),
        ("m.joblib", "sklearn"),
        ("m.pkl", "sklearn"),
        ("m.tar.gz", None),
    ],
)
def test_detect_kind(name: str, kind: str | None) -> None:
    assert detect_kind(name) == kind


def test_unknown_format_names_the_accepted_ones() -> None:
    with pytest.raises(UnsupportedFormat, match=r"accepted: Keras \.keras"):
        detect_kind("model.h5")


def _savedmodel_members() -> dict[str, bytes]:
    return {"sm/saved_model.pb": b"\x08\x01", "sm/variables/variables.index": b"idx"}


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _tar(path: Path, members: dict[str, bytes], extra: Sequence[tarfile.TarInfo] = ()) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for info in extra:
            tf.addfile(info)
    return path


def test_zip_and_tar_of_a_savedmodel_unpack(tmp_path: Path) -> None:
    z = prepare_upload(_zip(tmp_path / "a.zip", _savedmodel_members()), "a.zip", tmp_path / "w1", 10_000)
    assert z.kind == "savedmodel" and (z.path / "saved_model.pb").is_file()
    t = prepare_upload(
        _tar(tmp_path / "a.tar.gz", _savedmodel_members()), "a.tar.gz", tmp_path / "w2", 10_000
    )
    assert t.kind == "savedmodel" and (t.path / "variables" / "variables.index").is_file()


@pytest.mark.parametrize("bad", ["../evil.pb", "sm/../../evil.pb", "/abs/evil.pb"])
def test_zip_escaping_members_are_refused_before_writing(tmp_path: Path, bad: str) -> None:
    archive = _zip(tmp_path / "a.zip", {**_savedmodel_members(), bad: b"x"})
    with pytest.raises(UnsafeArchive):
        prepare_upload(archive, "a.zip", tmp_path / "w", 10_000)
    assert not (tmp_path / "w" / "unpacked" / "sm").exists()
    assert not (tmp_path / "evil.pb").exists()


@pytest.mark.parametrize("bad", ["../evil.pb", "/abs/evil.pb"])
def test_tar_escaping_members_are_refused(tmp_path: Path, bad: str) -> None:
    archive = _tar(tmp_path / "a.tar.gz", {**_savedmodel_members(), bad: b"x"})
    with pytest.raises(UnsafeArchive):
        prepare_upload(archive, "a.tar.gz", tmp_path / "w", 10_000)


@pytest.mark.parametrize("link_type", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_tar_links_are_refused(tmp_path: Path, link_type: bytes) -> None:
    link = tarfile.TarInfo("sm/variables/link")
    link.type = link_type
    link.linkname = "/etc/passwd"
    archive = _tar(tmp_path / "a.tar.gz", _savedmodel_members(), [link])
    with pytest.raises(UnsafeArchive, match="link"):
        prepare_upload(archive, "a.tar.gz", tmp_path / "w", 10_000)


def test_zip_symlink_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in _savedmodel_members().items():
            zf.writestr(name, data)
        info = zipfile.ZipInfo("sm/link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="link"):
        prepare_upload(archive, "a.zip", tmp_path / "w", 10_000)


def test_archive_unpacking_over_the_limit_is_refused(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "a.zip", {**_savedmodel_members(), "sm/big": b"0" * 50_000})
    with pytest.raises(PayloadTooLarge):
        prepare_upload(archive, "a.zip", tmp_path / "w", 10_000)


def test_corrupt_archive_and_archive_without_savedmodel(tmp_path: Path) -> None:
    (tmp_path / "bad.zip").write_bytes(b"not a zip at all")
    with pytest.raises(UnsupportedFormat, match="corrupt"):
        prepare_upload(tmp_path / "bad.zip", "bad.zip", tmp_path / "w1", 10_000)
    (tmp_path / "bad.tar.gz").write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(UnsupportedFormat, match="corrupt"):
        prepare_upload(tmp_path / "bad.tar.gz", "bad.tar.gz", tmp_path / "w2", 10_000)
    archive = _zip(tmp_path / "none.zip", {"readme.txt": b"hi"})
    with pytest.raises(UnsupportedFormat, match="no TensorFlow SavedModel"):
        prepare_upload(archive, "none.zip", tmp_path / "w3", 10_000)


def test_savedmodel_directory_with_a_link_is_refused(tmp_path: Path) -> None:
    sm = tmp_path / "sm"
    (sm / "variables").mkdir(parents=True)
    (sm / "saved_model.pb").write_bytes(b"\x08\x01")
    (sm / "variables" / "leak").symlink_to("/etc/passwd")
    with pytest.raises(UnsafeArchive):
        prepare_upload(sm, "sm", tmp_path / "w", 10_000)
