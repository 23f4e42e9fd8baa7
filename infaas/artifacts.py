"""Artifact stores: where a variant's bytes live, and how a process on any node gets them.

Registration writes artifacts content-addressed under ``data_dir/artifacts`` (`variants.artifacts`)
and *publishes* each variant's artifact to the artifact store before the variant is recorded; a
process that loads a variant (a Ray worker, the front end's fast path) asks the store for a local
``root`` holding it, fetched by content hash and cached when it is not already on this node.

- `LocalArtifacts` (embedded default): the data directory itself. Not shared: on one machine the
  Ray pool reads an artifact once and hands its bytes to workers through Ray's object store.
- `RedisArtifacts` (the default whenever ``INFAAS_REDIS_URL`` is set): the blobs live in the Redis
  that every front end of a cluster already shares as its store of record, one hash per content
  hash. Chosen over Ray's object store, whose objects die with the process that put them (a front
  end that registered a model and was then stopped), and over an S3-compatible store, which would
  be one more service to run for artifacts of a few MB. Workers fetch by hash into a per-node
  cache, check the hash, and never read a front end's data directory.

The node cache is not trusted either (SECURITY.md): it is created private to the user (0700; a
directory of that name owned by another user is refused), and a process re-hashes a cached
artifact the first time it uses it; one that does not match its name is deleted and fetched again.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any, Protocol

from infaas.errors import StoreError, VariantNotFound
from infaas.settings import Settings
from infaas.types import Variant
from variants.artifacts import sha256_path

__all__ = [
    "ArtifactStore",
    "LocalArtifacts",
    "RedisArtifacts",
    "node_cache_dir",
    "open_artifacts",
    "pack",
    "unpack",
]

_REDIS_VALUE_LIMIT = 512 * 1024 * 1024  # Redis's largest string


class ArtifactStore(Protocol):
    """Where variants' artifacts are kept (see the module docstring)."""

    @property
    def shared(self) -> bool:
        """True when a process on another node can fetch from it (then workers fetch themselves)."""
        ...

    def publish(self, variant: Variant) -> None:
        """Make `variant`'s artifact (written under the local data directory) fetchable by hash."""
        ...

    def root(self, variant: Variant) -> Path:
        """A local directory holding ``variant.artifact`` (fetched and cached when needed). Raises
        `VariantNotFound` when the store does not have it."""
        ...

    def publish_path(self, rel: str, *, what: str | None = None) -> None:
        """`publish` for any artifact path ``<sha[:2]>/<sha>/<name>`` (a validation split, say)."""
        ...

    def root_path(self, rel: str, *, what: str | None = None) -> Path:
        """`root` for any artifact path."""
        ...


def pack(path: Path) -> tuple[bytes, bool]:
    """Bytes of a file artifact, or an uncompressed tar of a directory artifact (SavedModel)."""
    if path.is_dir():
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(path), arcname=".")
        return buf.getvalue(), True
    return path.read_bytes(), False


def unpack(data: bytes, is_dir: bool, target: Path) -> None:
    """Write what `pack` made to `target` (a file, or a directory for a tar)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        target.mkdir(exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(target, filter="data")
    else:
        target.write_bytes(data)


def node_cache_dir() -> Path:
    """Where workers on this node cache fetched artifacts (shared by the node's workers)."""
    return Path(tempfile.gettempdir()) / "infaas-artifacts"


class LocalArtifacts:
    """The data directory's artifacts, read in place (one machine)."""

    shared = False

    def __init__(self, artifacts_dir: Path) -> None:
        self.artifacts_dir = artifacts_dir

    def publish(self, variant: Variant) -> None:
        """Nothing to do: the artifact is already where `root` looks."""

    def publish_path(self, rel: str, *, what: str | None = None) -> None:
        """Nothing to do, as `publish`."""

    def root(self, variant: Variant) -> Path:
        return self.root_path(variant.artifact, what=variant.name)

    def root_path(self, rel: str, *, what: str | None = None) -> Path:
        if not (self.artifacts_dir / rel).exists():
            raise VariantNotFound(
                f"artifact of {what or rel} is missing at {self.artifacts_dir / rel}; "
                "re-register the architecture"
            )
        return self.artifacts_dir


class RedisArtifacts:
    """Artifacts as Redis hashes ``<namespace>:artifact:<sha256>`` (fields ``data``, ``dir``).
    `cache_dir` mirrors the data directory's content-addressed layout (``<sha[:2]>/<sha>/<name>``),
    so it is itself a root for any artifact fetched into it; `local_dir` (a front end's data
    directory) is used in place when it holds the artifact. Picklable: a worker gets a copy."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        cache_dir: Path | None = None,
        local_dir: Path | None = None,
        namespace: str = "infaas",
        timeout_s: float = 10.0,
    ) -> None:
        self.url = url
        self.cache_dir = cache_dir or node_cache_dir()
        self.local_dir = local_dir
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._client: Any = None
        self.fetched: list[str] = []  # content hashes this object fetched from Redis (tests, describe)
        self._verified: set[str] = set()  # cached artifacts this process has re-hashed

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "fetched": [], "_verified": set()}

    def for_nodes(self) -> RedisArtifacts:
        """A copy for processes on any node (workers, node profilers): it never reads this front
        end's data directory, only Redis and the node's own cache."""
        return RedisArtifacts(self.url, namespace=self.namespace, timeout_s=self.timeout_s)

    def _redis(self) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
            )
        return self._client

    def _key(self, sha256: str) -> str:
        return f"{self.namespace}:artifact:{sha256}"

    def publish(self, variant: Variant) -> None:
        self.publish_path(variant.artifact, what=variant.name)

    def root(self, variant: Variant) -> Path:
        return self.root_path(variant.artifact, what=variant.name)

    def publish_path(self, rel: str, *, what: str | None = None) -> None:
        """Publish the artifact at `rel` (``<sha[:2]>/<sha>/<name>``) under the data directory."""
        import redis

        if self.local_dir is None:
            raise ValueError("publishing needs the data directory the artifact was written to")
        what = what or rel
        key = self._key(_sha_of(rel))
        try:
            if self._redis().exists(key):
                return  # content-addressed: what is there is this
            if not (self.local_dir / rel).exists():
                raise VariantNotFound(
                    f"artifact of {what} is neither in the artifact store nor at {self.local_dir / rel}; "
                    "re-register the architecture"
                )
            data, is_dir = pack(self.local_dir / rel)
            if len(data) >= _REDIS_VALUE_LIMIT:
                raise StoreError(
                    f"artifact of {what} is {len(data) >> 20} MB, over Redis's 512 MB value limit; "
                    "serve it from one machine (unset INFAAS_REDIS_URL)"
                )
            self._redis().hset(key, mapping={"data": data, "dir": b"1" if is_dir else b"0"})
        except redis.RedisError as exc:
            raise StoreError(f"cannot publish the artifact of {what} to Redis: {exc}") from exc

    def root_path(self, rel: str, *, what: str | None = None) -> Path:
        """A local directory holding `rel`: the data directory, else this node's cache (fetched
        into it first when missing)."""
        if self.local_dir is not None and (self.local_dir / rel).exists():
            return self.local_dir
        _private_dir(self.cache_dir)
        cached = self.cache_dir / rel
        if cached.exists() and rel not in self._verified and sha256_path(cached) != _sha_of(rel):
            # Changed since it was fetched (the disk, or someone with this user's access to the
            # node): fetch it again rather than load what its name does not promise.
            shutil.rmtree(cached.parent, ignore_errors=True)
        if not cached.exists():
            self._fetch(rel, what or rel)
        self._verified.add(rel)
        return self.cache_dir

    def _fetch(self, rel: str, what: str) -> None:
        """Fetch into a private directory, check the hash, then rename into place (atomic: a
        concurrent fetch of the same artifact on this node either wins or finds it there)."""
        import redis

        sha = _sha_of(rel)
        try:
            data, is_dir = self._redis().hmget(self._key(sha), ["data", "dir"])
        except redis.RedisError as exc:
            raise StoreError(f"cannot fetch the artifact of {what} from Redis: {exc}") from exc
        if data is None:
            raise VariantNotFound(
                f"artifact of {what} ({sha[:12]}) is not in the artifact store at {self.url}; "
                "re-register the architecture"
            )
        staging = self.cache_dir / f".fetch-{uuid.uuid4().hex}"
        try:
            fetched = staging / Path(rel).name
            unpack(data, is_dir == b"1", fetched)
            got = sha256_path(fetched)
            if got != sha:
                raise StoreError(
                    f"artifact of {what} fetched from Redis hashes to {got[:12]}, not {sha[:12]}: "
                    "the store holds corrupt bytes; re-register it"
                )
            target = self.cache_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(fetched, target)
            except OSError:
                if not target.exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.fetched.append(sha)


def _private_dir(path: Path) -> None:
    """Create `path` private to this user, or check that it is: a node's temporary directory is
    shared by its users, and a cache another one owns could hand this one's workers any bytes."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise StoreError(
            f"the artifact cache {path} is owned by another user or writable by others; remove it "
            "(it is rebuilt from the artifact store)",
            path=str(path),
        )


def _sha_of(rel: str) -> str:
    """The content hash in a content-addressed artifact path ``<sha[:2]>/<sha>/<name>``."""
    parts = Path(rel).parts
    if len(parts) < 3 or len(parts[1]) != 64 or not parts[1].startswith(parts[0]):
        raise ValueError(f"{rel!r} is not a content-addressed artifact path")
    return parts[1]


def open_artifacts(settings: Settings) -> ArtifactStore:
    """The artifact store the settings name (`Settings.artifact_store`; ``auto``: Redis when a
    Redis URL is set, else the data directory)."""
    kind = settings.artifact_store
    if kind == "redis" or (kind == "auto" and settings.redis_url):
        if not settings.redis_url:
            raise ValueError("INFAAS_ARTIFACT_STORE=redis needs INFAAS_REDIS_URL")
        return RedisArtifacts(
            settings.redis_url,
            cache_dir=settings.data_dir / "artifact-cache",
            local_dir=settings.artifacts_dir,
            timeout_s=max(settings.store_timeout_s, 10.0),
        )
    return LocalArtifacts(settings.artifacts_dir)
