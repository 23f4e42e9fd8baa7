from __future__ import annotations

import stat

from infaas.api.auth import KeyCache, Principal, ensure_admin_key
from infaas.settings import Settings


def test_admin_key_generated_once_owner_readable(tmp_path: object) -> None:
    s = Settings(data_dir=tmp_path)  # type: ignore[arg-type]
    key = ensure_admin_key(s)
    assert len(key) >= 32
    assert ensure_admin_key(s) == key
    assert stat.S_IMODE(s.admin_key_path.stat().st_mode) == 0o600
    assert ensure_admin_key(Settings(data_dir=tmp_path, admin_key="given")) == "given"  # type: ignore[arg-type]


def test_key_cache_expires_and_drops_a_revoked_tenant() -> None:
    cache = KeyCache(ttl_s=5.0, grace_s=30.0)
    acme, other = Principal(name="acme", role="tenant"), Principal(name="other", role="tenant")
    d1, d2, d3 = (KeyCache.digest(k) for k in ("key-1", "key-2", "key-3"))
    assert d1 != "key-1" and len(d1) == 64  # digests, never the keys
    cache.put(d1, acme, now_s=100.0)
    cache.put(d2, acme, now_s=100.0)
    cache.put(d3, other, now_s=100.0)
    assert cache.get(d1, now_s=104.9) == acme
    assert cache.get(d1, now_s=105.0) is None  # expired: the next request asks the store
    assert cache.stale(d1, now_s=105.0) == acme  # still known, for when the store cannot answer
    cache.drop_tenant("acme")
    assert cache.get(d2, now_s=101.0) is None
    assert cache.stale(d1, 101.0) is None and cache.stale(d2, 101.0) is None  # a revoke forgets for good
    assert cache.get(d3, now_s=101.0) == other


def test_key_cache_is_bounded() -> None:
    cache = KeyCache(ttl_s=5.0, max_entries=3)
    for i in range(3):
        cache.put(KeyCache.digest(f"k{i}"), Principal(name=f"t{i}", role="tenant"), now_s=0.0)
    assert len(cache) == 3
    cache.put(KeyCache.digest("k3"), Principal(name="t3", role="tenant"), now_s=0.0)
    assert len(cache) == 1 and cache.get(KeyCache.digest("k3"), now_s=1.0) is not None


def test_a_key_nothing_confirmed_within_the_grace_is_refused() -> None:
    """While the store is down a known key is answered for the grace, counted from the last
    confirmation: the store's own answer, or a read of the change log (no revocation in it)."""
    cache = KeyCache(ttl_s=5.0, grace_s=30.0)
    acme = Principal(name="acme", role="tenant")
    d = KeyCache.digest("key")
    cache.put(d, acme, now_s=100.0)
    assert cache.stale(d, now_s=130.0) == acme
    assert cache.stale(d, now_s=130.1) is None  # the store never answered again: refused
    cache.confirm_all(now_s=128.0)  # the change log was read at 128 s
    assert cache.stale(d, now_s=158.0) == acme
    assert cache.stale(d, now_s=158.1) is None
    assert KeyCache(ttl_s=5.0, grace_s=2.0).ttl_s == 2.0  # never fresher than the grace allows


def test_last_use_is_written_once_a_minute() -> None:
    cache = KeyCache()
    assert cache.due_touch("acme", 10.0)
    assert not cache.due_touch("acme", 69.9)
    assert cache.due_touch("other", 11.0)
    assert cache.due_touch("acme", 70.0)
