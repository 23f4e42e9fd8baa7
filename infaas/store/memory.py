"""In-memory store: the shipped fake for unit tests (same contract suite as the real backends)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence

from infaas.store.base import CHANGE_LOG_LENGTH, Change, ChangeKind, DocumentStore, UsageMark
from infaas.types import UsageDelta, UsageKey, UsageRecord

__all__ = ["MemoryStore"]


class MemoryStore(DocumentStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: dict[str, dict[str, str]] = defaultdict(dict)
        self._usage: dict[tuple[str, str, str, int], dict[str, int]] = {}
        self._marks: dict[str, int] = {}
        self._leases: dict[str, tuple[str, float]] = {}  # name → (holder, expires at, monotonic)
        self._changes: list[Change] = []

    def put_docs(self, docs: Iterable[tuple[str, str, str]]) -> None:
        items = list(docs)
        with self._lock:
            for kind, key, raw in items:
                self._docs[kind][key] = raw

    def get_doc(self, kind: str, key: str) -> str | None:
        with self._lock:
            return self._docs[kind].get(key)

    def list_docs(self, kind: str, prefix: str = "") -> list[str]:
        with self._lock:
            bucket = self._docs[kind]
            return [bucket[k] for k in sorted(bucket) if k.startswith(prefix)]

    def delete_docs(self, kind: str, prefix: str, exact: bool = False) -> None:
        with self._lock:
            bucket = self._docs[kind]
            for key in [k for k in bucket if (k == prefix if exact else k.startswith(prefix))]:
                del bucket[key]

    def add_usage(self, deltas: Sequence[UsageDelta], mark: UsageMark | None = None) -> bool:
        with self._lock:
            if mark is not None:
                source, seq = mark
                if self._marks.get(source, 0) >= seq:
                    return False
                self._marks[source] = seq
            for delta in deltas:
                k = delta.key
                row = self._usage.setdefault((k.tenant, k.task, k.variant, k.minute), {})
                for name, value in delta.counters.items():
                    row[name] = row.get(name, 0) + value
        return True

    def usage_mark(self, source: str) -> int:
        with self._lock:
            return self._marks.get(source, 0)

    def usage(
        self, tenant: str | None = None, from_minute: int | None = None, to_minute: int | None = None
    ) -> list[UsageRecord]:
        with self._lock:
            rows = sorted(self._usage.items())
        return [
            UsageRecord(key=UsageKey(tenant=t, task=task, variant=v, minute=m), counters=dict(c))
            for (t, task, v, m), c in rows
            if (tenant is None or t == tenant)
            and (from_minute is None or m >= from_minute)
            and (to_minute is None or m <= to_minute)
        ]

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        now = time.monotonic()
        with self._lock:
            current = self._leases.get(name)
            if current is not None and current[0] != holder and current[1] > now:
                return False
            self._leases[name] = (holder, now + ttl_s)
            return True

    def release_lease(self, name: str, holder: str) -> None:
        with self._lock:
            if self._leases.get(name, ("", 0.0))[0] == holder:
                del self._leases[name]

    def publish_change(self, kind: ChangeKind, name: str) -> int:
        with self._lock:
            seq = self._changes[-1].seq + 1 if self._changes else 1
            self._changes.append(Change(seq, kind, name))
            del self._changes[:-CHANGE_LOG_LENGTH]
            return seq

    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        with self._lock:
            return [c for c in self._changes if c.seq > seq][:limit]

    def change_cursor(self) -> int:
        with self._lock:
            return self._changes[-1].seq if self._changes else 0
