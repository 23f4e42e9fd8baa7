"""Bearer-key authentication: the admin key, and tenant keys resolved through the store (hashed).

Resolving a tenant key costs two store reads (key → name → tenant), which on the query path cost
more than the model. A resolved key is therefore kept in a `KeyCache` for `KEY_CACHE_TTL_S`
seconds; once expired, the next request is answered from the cache while the key is revalidated
in the background (stale-while-revalidate), so no request waits on the store for a key it knows.
A revoke made through this front end drops the tenant's keys from its cache at once; a revoke
made elsewhere (another front end on the same store, or the store directly) takes effect here
within `KEY_CACHE_TTL_S` and one more request (while the store is reachable: during an outage,
keys resolved before keep working). Unknown keys are never cached, so a new key works at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request

from infaas.errors import Forbidden, StoreError, Unauthenticated
from infaas.settings import Settings
from infaas.store import MetadataStore
from infaas.types import Principal, Tenant

__all__ = [
    "KEY_CACHE_TTL_S",
    "AdminPrincipal",
    "KeyCache",
    "Principal",
    "TenantPrincipal",
    "ensure_admin_key",
    "known_principal",
    "new_api_key",
]

KEY_CACHE_TTL_S = 5.0
"""The longest a tenant key revoked on another front end (or in the store directly) still works here."""


class KeyCache:
    """Tenant keys already resolved: SHA-256 of the key → (principal, expiry). Pure bookkeeping:
    the time comes in as `now_s` (monotonic seconds). Holds digests, never the keys themselves."""

    def __init__(self, ttl_s: float = KEY_CACHE_TTL_S, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()  # routes run on the loop, but sync ones run in threads
        self._refreshing: set[str] = set()  # digests being revalidated (touched on the loop)
        self._tasks: set[asyncio.Task[None]] = set()

    @staticmethod
    def digest(api_key: str) -> str:
        return hashlib.sha256(api_key.encode()).hexdigest()

    def get(self, digest: str, now_s: float) -> Principal | None:
        """The principal while its entry is fresh; None when unknown or expired."""
        entry = self._entries.get(digest)
        if entry is None or now_s >= entry[1]:
            return None
        return entry[0]

    def stale(self, digest: str) -> Principal | None:
        """The principal even after its entry expired (kept until the cache is full or the tenant
        revoked here): during a store outage a known tenant keeps being answered."""
        entry = self._entries.get(digest)
        return entry[0] if entry is not None else None

    def put(self, digest: str, principal: Principal, now_s: float) -> None:
        with self._lock:
            if len(self._entries) >= self._max_entries:
                # Many distinct live keys within one TTL: start over rather than track recency;
                # the cost is one store read per key, once.
                self._entries.clear()
            self._entries[digest] = (principal, now_s + self.ttl_s)

    def revalidate(self, digest: str, refresh: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `refresh()` in the background unless one for `digest` is already running (call
        from the event loop)."""
        if digest in self._refreshing:
            return
        self._refreshing.add(digest)
        task = asyncio.get_running_loop().create_task(refresh())
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            self._refreshing.discard(digest)

        task.add_done_callback(done)

    def forget(self, digest: str) -> None:
        with self._lock:
            self._entries.pop(digest, None)

    def drop_tenant(self, name: str) -> None:
        """Forget every key of tenant `name` (called when it is revoked here)."""
        with self._lock:
            for digest in [d for d, (p, _) in self._entries.items() if p.name == name]:
                del self._entries[digest]

    def __len__(self) -> int:
        return len(self._entries)


def new_api_key() -> str:
    return secrets.token_urlsafe(32)


def ensure_admin_key(settings: Settings) -> str:
    """The admin key: from settings, else read from data_dir, else generated there (mode 0600)."""
    if settings.admin_key:
        return settings.admin_key
    path = settings.admin_key_path
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = new_api_key()
    # O_EXCL: two processes starting at once cannot both write different keys.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


def _token(header: str) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header (None if it is not one)."""
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _bearer(request: Request) -> str:
    token = _token(request.headers.get("authorization", ""))
    if token is None:
        raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
    return token


def known_principal(cache: KeyCache, authorization: bytes, now_s: float) -> Principal | None:
    """The tenant a raw ``Authorization`` header names, if the cache holds its key fresh (None
    for an unknown or expired key, a malformed header, or the admin key, which is never cached)."""
    token = _token(authorization.decode("latin-1"))
    return None if token is None else cache.get(KeyCache.digest(token), now_s)


async def authenticate(request: Request) -> Principal:
    """Any valid key: the admin's or an active tenant's. Async: FastAPI runs a plain `def`
    dependency in its thread pool, a thread hop per request that cost more than the rest of the
    check. A cache miss reads the store in a thread (once per key and TTL); when the store fails,
    a key resolved before is still accepted (`KeyCache.stale`), an unknown one gets 503."""
    token = _bearer(request)
    admin_key: str = request.app.state.admin_key
    if hmac.compare_digest(token.encode(), admin_key.encode()):
        return Principal(name="admin", role="admin")
    cache: KeyCache = request.app.state.key_cache
    digest = KeyCache.digest(token)
    now_s = time.monotonic()
    principal = cache.get(digest, now_s)
    if principal is not None:
        return principal
    store: MetadataStore = request.app.state.store
    known = cache.stale(digest)
    if known is not None:
        # Expired: answer with what the key resolved to, and ask the store again in the
        # background, once per key. A request never waits for the store on a key it knows, so a
        # store that hangs costs no latency, and no herd of requests piles onto it.
        cache.revalidate(digest, lambda: _resolve(store, token, digest, cache, known))
        return known
    tenant = await _lookup(store, token)
    if tenant is None:
        raise Unauthenticated("unknown or revoked API key")
    principal = Principal.of(tenant)
    cache.put(digest, principal, now_s)
    return principal


async def _lookup(store: MetadataStore, token: str) -> Tenant | None:
    # In a thread: a store that hangs (up to its timeout) must not stall the event loop.
    return await asyncio.to_thread(store.tenant_for_key, token)


async def _resolve(store: MetadataStore, token: str, digest: str, cache: KeyCache, known: Principal) -> None:
    """Revalidate an expired key: refresh it, forget it (revoked), or keep it another TTL while
    the store cannot answer."""
    try:
        tenant = await _lookup(store, token)
    except StoreError:
        cache.put(digest, known, time.monotonic())
        return
    if tenant is None:
        cache.forget(digest)
    else:
        cache.put(digest, Principal.of(tenant), time.monotonic())


async def require_admin(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if principal.role != "admin":
        raise Forbidden("this route needs the admin key", role=principal.role)
    return principal


TenantPrincipal = Annotated[Principal, Depends(authenticate)]
AdminPrincipal = Annotated[Principal, Depends(require_admin)]
