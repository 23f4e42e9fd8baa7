"""SQLite store: the embedded default. WAL mode, so several processes on one machine can share it.

Writes use ``BEGIN IMMEDIATE`` (take the write lock up front, no upgrade deadlocks) with a busy
timeout; usage counters are incremented by ``INSERT ... ON CONFLICT DO UPDATE`` inside that
transaction, so concurrent processes never lose an increment.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from infaas.errors import StoreError
from infaas.store.base import CHANGE_LOG_LENGTH, Change, ChangeKind, DocumentStore, UsageMark
from infaas.types import UsageDelta, UsageKey, UsageRecord

__all__ = ["SQLiteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    kind TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage (
    tenant TEXT NOT NULL, task TEXT NOT NULL, variant TEXT NOT NULL, minute INTEGER NOT NULL,
    counter TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY (tenant, task, variant, minute, counter)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS usage_by_minute ON usage (minute);
CREATE TABLE IF NOT EXISTS usage_marks (source TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_s REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, name TEXT NOT NULL
);
"""


def _escape_like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _use_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch the file to write-ahead logging, retrying while another process holds it: the
    switch needs the file to itself and SQLite answers "database is locked" at once instead of
    waiting in its busy handler (seen with 4 processes opening a new file together)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                return  # the mode is the file's: another process already switched it
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class SQLiteStore(DocumentStore):
    def __init__(self, path: Path, busy_timeout_s: float = 30.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # One connection shared by the threads of this process, serialised by a lock;
        # other processes coordinate through SQLite's own file locks.
        self._conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._lock = threading.Lock()
        with self._lock:
            _use_wal(self._conn, busy_timeout_s)
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite write failed: {exc}", path=str(self.path)) from exc

    def _read(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite read failed: {exc}", path=str(self.path)) from exc

    def put_docs(self, docs: Iterable[tuple[str, str, str]]) -> None:
        items = list(docs)
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO docs (kind, key, body) VALUES (?, ?, ?) "
                "ON CONFLICT (kind, key) DO UPDATE SET body = excluded.body",
                items,
            )

    def get_doc(self, kind: str, key: str) -> str | None:
        rows = self._read("SELECT body FROM docs WHERE kind = ? AND key = ?", (kind, key))
        return str(rows[0][0]) if rows else None

    def list_docs(self, kind: str, prefix: str = "") -> list[str]:
        rows = self._read(
            "SELECT body FROM docs WHERE kind = ? AND key LIKE ? ESCAPE '\\' ORDER BY key",
            (kind, _escape_like(prefix)),
        )
        return [str(r[0]) for r in rows]

    def delete_docs(self, kind: str, prefix: str, exact: bool = False) -> None:
        with self._write() as conn:
            if exact:
                conn.execute("DELETE FROM docs WHERE kind = ? AND key = ?", (kind, prefix))
            else:
                conn.execute(
                    "DELETE FROM docs WHERE kind = ? AND key LIKE ? ESCAPE '\\'", (kind, _escape_like(prefix))
                )

    def add_usage(self, deltas: Sequence[UsageDelta], mark: UsageMark | None = None) -> bool:
        rows = [
            (d.key.tenant, d.key.task, d.key.variant, d.key.minute, name, value)
            for d in deltas
            for name, value in d.counters.items()
        ]
        with self._write() as conn:
            if mark is not None:
                source, seq = mark
                found = conn.execute("SELECT seq FROM usage_marks WHERE source = ?", (source,)).fetchone()
                if found is not None and int(found[0]) >= seq:
                    return False
                conn.execute(
                    "INSERT INTO usage_marks (source, seq) VALUES (?, ?) "
                    "ON CONFLICT (source) DO UPDATE SET seq = excluded.seq",
                    (source, seq),
                )
            conn.executemany(
                "INSERT INTO usage (tenant, task, variant, minute, counter, value) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, task, variant, minute, counter) "
                "DO UPDATE SET value = value + excluded.value",
                rows,
            )
        return True

    def usage_mark(self, source: str) -> int:
        rows = self._read("SELECT seq FROM usage_marks WHERE source = ?", (source,))
        return int(rows[0][0]) if rows else 0  # type: ignore[call-overload]

    def usage(
        self, tenant: str | None = None, from_minute: int | None = None, to_minute: int | None = None
    ) -> list[UsageRecord]:
        clauses: list[str] = ["1 = 1"]
        params: list[object] = []
        if tenant is not None:
            clauses.append("tenant = ?")
            params.append(tenant)
        if from_minute is not None:
            clauses.append("minute >= ?")
            params.append(from_minute)
        if to_minute is not None:
            clauses.append("minute <= ?")
            params.append(to_minute)
        rows = self._read(
            "SELECT tenant, task, variant, minute, counter, value FROM usage WHERE "
            + " AND ".join(clauses)
            + " ORDER BY tenant, task, variant, minute",
            params,
        )
        grouped: dict[tuple[str, str, str, int], dict[str, int]] = {}
        for t, task, v, m, counter, value in rows:
            key = (str(t), str(task), str(v), int(m))  # type: ignore[call-overload]
            grouped.setdefault(key, {})[str(counter)] = int(value)  # type: ignore[call-overload]
        return [
            UsageRecord(key=UsageKey(tenant=t, task=task, variant=v, minute=m), counters=c)
            for (t, task, v, m), c in grouped.items()
        ]

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        # Wall clock: the processes sharing a SQLite file share the machine's clock.
        now = time.time()
        with self._write() as conn:
            row = conn.execute("SELECT holder, expires_s FROM leases WHERE name = ?", (name,)).fetchone()
            if row is not None and row[0] != holder and float(row[1]) > now:
                return False
            conn.execute(
                "INSERT OR REPLACE INTO leases (name, holder, expires_s) VALUES (?, ?, ?)",
                (name, holder, now + ttl_s),
            )
            return True

    def release_lease(self, name: str, holder: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))

    def publish_change(self, kind: ChangeKind, name: str) -> int:
        with self._write() as conn:
            cur = conn.execute("INSERT INTO changes (kind, name) VALUES (?, ?)", (kind, name))
            seq = int(cur.lastrowid or 0)
            if seq % 100 == 0:  # trim now and then, not on every write
                conn.execute("DELETE FROM changes WHERE seq <= ?", (seq - CHANGE_LOG_LENGTH,))
            return seq

    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        rows = self._read(
            "SELECT seq, kind, name FROM changes WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
        )
        return [Change(int(r[0]), r[1], str(r[2])) for r in rows]  # type: ignore[call-overload, arg-type]

    def change_cursor(self) -> int:
        # AUTOINCREMENT numbers on from the largest ever used, also after a trim emptied the table.
        rows = self._read("SELECT seq FROM sqlite_sequence WHERE name = 'changes'", ())
        return int(rows[0][0]) if rows else 0  # type: ignore[call-overload]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
