"""One suite over both artifact stores: the data directory (one machine) and Redis (a cluster)."""

from __future__ import annotations

import pickle
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infaas.artifacts import ArtifactStore, LocalArtifacts, RedisArtifacts, pack, unpack
from infaas.errors import StoreError, VariantNotFound
from infaas.types import Parity, Variant, VariantSpec
from variants.artifacts import sha256_path


def write_variant(artifacts_dir: Path, as_dir: bool) -> Variant:
    """An artifact (a file, or a directory like a SavedModel) written as registration does."""
    staged = artifacts_dir / "staged"
    if as_dir:
        (staged / "variables").mkdir(parents=True)
        (staged / "saved_model.pb").write_bytes(b"graph" * 100)
        (staged / "variables" / "data").write_bytes(uuid.uuid4().bytes * 50)
    else:
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_bytes(uuid.uuid4().bytes * 50)
    sha = sha256_path(staged)
    rel = f"{sha[:2]}/{sha}/model"
    (artifacts_dir / rel).parent.mkdir(parents=True)
    staged.rename(artifacts_dir / rel)
    spec = VariantSpec(architecture="m", runtime="onnxruntime")
    parity = Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1)
    return Variant(spec=spec, artifact=rel, sha256=sha, parity=parity)


@pytest.fixture(params=["local", pytest.param("redis", marks=pytest.mark.redis)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ArtifactStore, ArtifactStore]]:
    """(the registering front end's store, another node's store): for the local store, the same
    data directory (one machine); for Redis, a node with a data directory of its own."""
    data = tmp_path / "a" / "artifacts"
    data.mkdir(parents=True)
    if request.param == "local":
        store = LocalArtifacts(data)
        yield store, store
        return
    url = request.getfixturevalue("redis_url")
    ns = f"test-{uuid.uuid4().hex[:8]}"
    here = RedisArtifacts(url, local_dir=data, cache_dir=tmp_path / "a" / "cache", namespace=ns)
    there = RedisArtifacts(url, cache_dir=tmp_path / "b" / "cache", namespace=ns)
    yield here, there
    for key in here._redis().scan_iter(f"{ns}:*"):
        here._redis().delete(key)


@pytest.mark.parametrize("as_dir", [False, True])
def test_a_published_artifact_is_readable_where_it_is_needed(
    stores: tuple[ArtifactStore, ArtifactStore], as_dir: bool
) -> None:
    here, there = stores
    assert isinstance(here, LocalArtifacts | RedisArtifacts)
    local_dir = here.artifacts_dir if isinstance(here, LocalArtifacts) else here.local_dir
    assert local_dir is not None
    variant = write_variant(local_dir, as_dir)
    here.publish(variant)
    here.publish(variant)  # idempotent
    root = there.root(variant)
    assert sha256_path(root / variant.artifact) == variant.sha256
    assert there.root(variant) == root  # cached by hash: fetched once
    if there.shared:
        assert not root.is_relative_to(local_dir.parent)  # another node: never the data dir
        assert isinstance(there, RedisArtifacts) and there.fetched == [variant.sha256]


def test_an_artifact_never_published_is_not_found(
    stores: tuple[ArtifactStore, ArtifactStore], tmp_path: Path
) -> None:
    _, there = stores
    variant = write_variant(tmp_path / "elsewhere", as_dir=False)
    with pytest.raises(VariantNotFound, match="re-register"):
        there.root(variant)


@pytest.mark.redis
def test_corrupt_bytes_are_refused_not_loaded(redis_url: str, tmp_path: Path) -> None:
    ns = f"test-{uuid.uuid4().hex[:8]}"
    here = RedisArtifacts(redis_url, local_dir=tmp_path / "data", namespace=ns)
    there = RedisArtifacts(redis_url, cache_dir=tmp_path / "cache", namespace=ns)
    variant = write_variant(tmp_path / "data", as_dir=False)
    here.publish(variant)
    try:
        here._redis().hset(f"{ns}:artifact:{variant.sha256}", "data", b"tampered")
        with pytest.raises(StoreError, match="corrupt"):
            there.root(variant)
        assert not (tmp_path / "cache" / variant.artifact).exists()
        clone = pickle.loads(pickle.dumps(here.for_nodes()))  # what a Ray worker receives
        assert clone._client is None and clone.url == redis_url and clone.namespace == ns
        assert clone.local_dir is None  # never the front end's data directory
    finally:
        here._redis().delete(f"{ns}:artifact:{variant.sha256}")


def test_pack_and_unpack_round_trip_a_directory(tmp_path: Path) -> None:
    variant = write_variant(tmp_path / "data", as_dir=True)
    data, is_dir = pack(tmp_path / "data" / variant.artifact)
    unpack(data, is_dir, tmp_path / "copy" / "model")
    assert is_dir and sha256_path(tmp_path / "copy" / "model") == variant.sha256


@pytest.mark.redis
def test_a_cached_artifact_changed_on_disk_is_fetched_again(redis_url: str, tmp_path: Path) -> None:
    ns = f"test-{uuid.uuid4().hex[:8]}"
    here = RedisArtifacts(redis_url, local_dir=tmp_path / "data", namespace=ns)
    variant = write_variant(tmp_path / "data", as_dir=False)
    here.publish(variant)
    try:
        first = RedisArtifacts(redis_url, cache_dir=tmp_path / "cache", namespace=ns)
        cached = first.root(variant) / variant.artifact
        assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700
        cached.write_bytes(b"swapped by someone with access to the node")
        later = RedisArtifacts(redis_url, cache_dir=tmp_path / "cache", namespace=ns)  # a new worker
        assert sha256_path(later.root(variant) / variant.artifact) == variant.sha256
        assert later.fetched == [variant.sha256]
        (tmp_path / "open").mkdir(mode=0o777)
        (tmp_path / "open").chmod(0o777)
        with pytest.raises(StoreError, match="writable by others"):
            RedisArtifacts(redis_url, cache_dir=tmp_path / "open", namespace=ns).root(variant)
    finally:
        here._redis().delete(f"{ns}:artifact:{variant.sha256}")
