"""Metadata store: `MetadataStore` protocol; SQLite (embedded default), Redis, and an in-memory fake."""

from __future__ import annotations

from infaas.settings import Settings
from infaas.store.base import DocumentStore, MetadataStore, hash_key
from infaas.store.memory import MemoryStore
from infaas.store.sqlite import SQLiteStore

__all__ = ["DocumentStore", "MemoryStore", "MetadataStore", "SQLiteStore", "hash_key", "open_store"]


def open_store(settings: Settings) -> DocumentStore:
    """The store the settings name: Redis when `redis_url` is set, else SQLite under `data_dir`."""
    if settings.redis_url:
        from infaas.store.redis import RedisStore  # only this backend imports redis

        return RedisStore(settings.redis_url, timeout_s=settings.store_timeout_s)
    return SQLiteStore(settings.sqlite_path, busy_timeout_s=max(settings.store_timeout_s, 5.0))
