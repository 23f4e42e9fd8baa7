"""Bearer-key authentication: the admin key, and tenant keys resolved through the store (hashed).

Resolving a tenant key costs two store reads (key → name → tenant), which on the query path cost
more than the model. A resolved key is therefore kept in a `KeyCache` for `KEY_CACHE_TTL_S`
seconds; once expired, the next request is answered from the cache while the key is revalidated
in the background (stale-while-revalidate), so no request waits on the store for a key it knows.

Revocation. A revoke drops the tenant's keys from this front end's cache at once; every other
front end on the same store reads the store's change log (`infaas.changes.ChangeFeed`, every
`change_poll_interval_s`) and drops them within that interval (measured: docs/benchmarks.md).
A front end that cannot reach the store cannot know of revocations: it keeps answering a key the
store (or the change log) confirmed within `key_grace_s`, and refuses it after that (503,
`store_error`) until the store answers again. Unknown keys are never cached, so a new key
works at once. An expired key (`Tenant.expires_at_s`) is refused like a revoked one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
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
    "PRINCIPAL_STATE",
    "TOUCH_INTERVAL_S",
    "AdminPrincipal",
    "KeyCache",
    "Principal",
    "TenantPrincipal",
    "authenticate",
    "ensure_admin_key",
    "known_principal",
    "new_api_key",
    "principal_for",
]

KEY_CACHE_TTL_S = 5.0
"""How long a resolved key is answered without asking the store again (revocations made through
the API arrive sooner, through the change log)."""

PRINCIPAL_STATE = "infaas.principal"
"""Where `infaas.api.gate.AuthGate` leaves the principal it authenticated in the request's state."""

TOUCH_INTERVAL_S = 60.0
"""A key's last use is written to the store at most this often (the admin API shows it)."""


class KeyCache:
    """Tenant keys already resolved: SHA-256 of the key → (principal, fresh until, confirmed at).
    Pure bookkeeping: the time comes in as `now_s` (monotonic seconds). Holds digests, never the
    keys themselves. A key is confirmed when the store resolved it, and all of them at once when
    the change log was read (it would have named a revocation)."""

    def __init__(
        self, ttl_s: float = KEY_CACHE_TTL_S, grace_s: float = 30.0, max_entries: int = 10_000
    ) -> None:
        self.ttl_s = min(ttl_s, grace_s)
        self.grace_s = grace_s
        self._max_entries = max_entries
        self._entries: dict[str, tuple[Principal, float, float]] = {}
        self._feed_confirmed_s = -math.inf
        self._lock = threading.Lock()  # routes run on the loop, but sync ones run in threads
        self._refreshing: set[str] = set()  # digests being revalidated (touched on the loop)
        self._tasks: set[asyncio.Task[None]] = set()
        self._touched: dict[str, float] = {}  # tenant → when its last use was written (monotonic)

    @staticmethod
    def digest(api_key: str) -> str:
        return hashlib.sha256(api_key.encode()).hexdigest()

    def get(self, digest: str, now_s: float) -> Principal | None:
        """The principal while its entry is fresh; None when unknown or expired."""
        entry = self._entries.get(digest)
        if entry is None or now_s >= entry[1]:
            return None
        return entry[0]

    def stale(self, digest: str, now_s: float) -> Principal | None:
        """The principal after its entry expired, while it was confirmed within the grace (by
        the store, or by the change log): during a store outage a known tenant keeps being
        answered for `grace_s`, not longer."""
        entry = self._entries.get(digest)
        if entry is None or now_s - max(entry[2], self._feed_confirmed_s) > self.grace_s:
            return None
        return entry[0]

    def known(self, digest: str) -> Principal | None:
        """The principal `digest` resolved to, however long ago (None: never, or forgotten)."""
        entry = self._entries.get(digest)
        return entry[0] if entry is not None else None

    def put(self, digest: str, principal: Principal, now_s: float) -> None:
        """`principal` as the store resolved it just now."""
        with self._lock:
            if len(self._entries) >= self._max_entries:
                # Many distinct live keys within one TTL: start over rather than track recency;
                # the cost is one store read per key, once.
                self._entries.clear()
            self._entries[digest] = (principal, now_s + self.ttl_s, now_s)

    def confirm_all(self, now_s: float) -> None:
        """The change log was read up to now (taken before the read): no key cached is revoked."""
        self._feed_confirmed_s = max(self._feed_confirmed_s, now_s)

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

    def due_touch(self, name: str, now_s: float) -> bool:
        """Whether `name`'s last use should be written now (and note that it is)."""
        if now_s - self._touched.get(name, -math.inf) < TOUCH_INTERVAL_S:
            return False
        self._touched[name] = now_s
        return True

    def forget(self, digest: str) -> None:
        with self._lock:
            self._entries.pop(digest, None)

    def drop_tenant(self, name: str) -> None:
        """Forget every key of tenant `name` (revoked, or its share or expiry changed)."""
        with self._lock:
            for digest in [d for d, (p, _, _) in self._entries.items() if p.name == name]:
                del self._entries[digest]

    def clear(self) -> None:
        """Forget every key (the change log lost entries this front end had not read)."""
        with self._lock:
            self._entries.clear()

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


def known_principal(cache: KeyCache, authorization: bytes, now_s: float) -> Principal | None:
    """The tenant a raw ``Authorization`` header names, if the cache holds its key fresh (None
    for an unknown or expired key, a malformed header, or the admin key, which is never cached)."""
    token = _token(authorization.decode("latin-1"))
    return None if token is None else cache.get(KeyCache.digest(token), now_s)


async def authenticate(request: Request) -> Principal:
    """Any valid key: the admin's or an active tenant's. Async: FastAPI runs a plain `def`
    dependency in its thread pool, a thread hop per request that cost more than the rest of the
    check. A cache miss reads the store in a thread (once per key and TTL); when the store fails,
    a key confirmed within the grace is still accepted (`KeyCache.stale`), any other gets 503."""
    passed = request.scope.get("state", {}).get(PRINCIPAL_STATE)
    if passed is not None:  # the gate authenticated this request before its body was read
        return passed  # type: ignore[no-any-return]
    return await principal_for(request.app.state, request.headers.get("authorization", ""))


async def principal_for(state: Any, authorization: str) -> Principal:
    """`authenticate` on an ``Authorization`` header's value, with the app's `state` (its admin
    key, key cache and store): the query's lane calls it on the header as parsed, with no
    `Request` built."""
    token = _token(authorization)
    if token is None:
        raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
    admin_key: str = state.admin_key
    if hmac.compare_digest(token.encode(), admin_key.encode()):
        return Principal(name="admin", role="admin")
    cache: KeyCache = state.key_cache
    digest = KeyCache.digest(token)
    now_s = time.monotonic()
    principal = cache.get(digest, now_s)
    store: MetadataStore = state.store
    if principal is None:
        known = cache.known(digest)
        if known is not None:
            # Expired: ask the store again in the background, once per key, and meanwhile answer
            # with what the key resolved to while that was confirmed within the grace. A request
            # never waits for the store on a key it knows, so a store that hangs costs no
            # latency, and no herd of requests piles onto it.
            cache.revalidate(digest, lambda: _resolve(store, token, digest, cache))
            if cache.stale(digest, now_s) is None:
                raise StoreError(
                    f"the store could not confirm this key for {cache.grace_s:g} s "
                    "(INFAAS_KEY_GRACE_S); retry once it answers"
                )
            principal = known
        else:
            tenant = await _lookup(store, token)
            if tenant is None:
                raise Unauthenticated("unknown, revoked or expired API key")
            principal = Principal.of(tenant)
            cache.put(digest, principal, now_s)
            if cache.due_touch(principal.name, now_s):  # in the background, as a revalidation is
                cache.revalidate(digest, lambda: _touch(store, principal.name))
    if principal.expires_at_s is not None and time.time() >= principal.expires_at_s:
        cache.forget(digest)
        raise Unauthenticated("unknown, revoked or expired API key")
    return principal


async def _lookup(store: MetadataStore, token: str) -> Tenant | None:
    # In a thread: a store that hangs (up to its timeout) must not stall the event loop.
    return await asyncio.to_thread(store.tenant_for_key, token)


async def _touch(store: MetadataStore, name: str) -> None:
    with contextlib.suppress(StoreError):  # a last-used time is a hint: the next touch writes it
        await asyncio.to_thread(store.touch_tenant, name, time.time())


async def _resolve(store: MetadataStore, token: str, digest: str, cache: KeyCache) -> None:
    """Revalidate an expired key: refresh it, or forget it (revoked or expired). While the store
    cannot answer the entry stays as it is, confirmed when it last was (`KeyCache.stale`)."""
    try:
        tenant = await _lookup(store, token)
    except StoreError:
        return
    if tenant is None:
        cache.forget(digest)
        return
    now_s = time.monotonic()
    cache.put(digest, Principal.of(tenant), now_s)
    if cache.due_touch(tenant.name, now_s):
        await _touch(store, tenant.name)


async def require_admin(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if principal.role != "admin":
        raise Forbidden("this route needs the admin key", role=principal.role)
    return principal


TenantPrincipal = Annotated[Principal, Depends(authenticate)]
AdminPrincipal = Annotated[Principal, Depends(require_admin)]
