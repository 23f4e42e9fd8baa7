"""The usage journal: every charge on local disk before its answer leaves the server.

The meter aggregates charges in memory and flushes them to the store every second; a crash (SIGKILL,
OOM kill, power cut) between an answer and the next flush would lose those charges, and a store
outage would hold them in memory only. The journal closes that gap: each answered query appends one
entry (a sequence number and its counters' inputs) to a SQLite file in WAL mode with
``synchronous=FULL``, and the query handler waits until its entry is on disk before it replies.

Entries are written by one thread in groups (group commit): while one group's fsync runs, the next
accumulates, so the cost is one small transaction per group, not per query (~0.3 ms per fsync on the
reference machine). At start the meter replays the entries the store has not counted; the store
keeps, per journal (`source`, a UUID kept in the file), the highest sequence number it has counted
and skips a batch at or below it (`MetadataStore.add_usage(..., mark=...)`), so a replay never
counts anything twice. Entries the store has counted are deleted after each flush.

With ``fsync=False`` (``INFAAS_USAGE_JOURNAL=os``) a commit reaches the OS but is not fsync'd: it
survives the process's death, not a power cut, and costs less latency.

One process owns a journal file at a time (an exclusive `flock` on a side file): two front ends on
one data dir would otherwise interleave sequence numbers under one source.
"""

from __future__ import annotations

import asyncio
import fcntl
import sqlite3
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from infaas.errors import StoreError

__all__ = ["JournalEntry", "UsageJournal"]


class JournalEntry(NamedTuple):
    """One answered query's charge (a tuple: one is built per query)."""

    seq: int
    tenant: str
    task: str
    variant: str
    minute: int
    rows: int
    cost_pusd: int
    slo_met: bool
    latency_ms: float


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS charges (
    seq INTEGER PRIMARY KEY, tenant TEXT NOT NULL, task TEXT NOT NULL, variant TEXT NOT NULL,
    minute INTEGER NOT NULL, rows INTEGER NOT NULL, cost_pusd INTEGER NOT NULL,
    slo_met INTEGER NOT NULL, latency_ms REAL NOT NULL
);
"""


class UsageJournal:
    """An append-only, fsync'd file of charges with a background group-commit writer.

    `append` is cheap and never blocks on disk (it queues); `durable()` waits until everything
    appended so far is on disk; `wait_durable(seq)` is its blocking form for threads."""

    def __init__(self, path: Path, fsync: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_file = open(path.with_suffix(".lock"), "w")  # noqa: SIM115 - held for our lifetime
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreError(
                f"the usage journal {path} is held by another infaas process on this data dir; "
                "stop it, or give this one its own INFAAS_DATA_DIR",
                path=str(path),
            ) from None
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db_lock = threading.Lock()  # the writer thread and flushes share the connection
        with self._db_lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk when it returns. OFF: it is in the OS's page cache, which
            # outlives this process (a SIGKILL, an OOM kill) but not the machine.
            self._conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
            self._conn.executescript(_SCHEMA)
            found = self._conn.execute("SELECT value FROM meta WHERE key = 'source'").fetchone()
            if found is None:
                self.source = str(uuid.uuid4())
                self._conn.execute("INSERT INTO meta VALUES ('source', ?), ('last_seq', '0')", (self.source,))
            else:
                self.source = str(found[0])
            self._last_seq = int(
                self._conn.execute("SELECT value FROM meta WHERE key = 'last_seq'").fetchone()[0]
            )
        self.first_seq = self._last_seq + 1
        """Entries below this were written by an earlier process (what `replay` looks at)."""
        self._cond = threading.Condition()
        self._queue: list[JournalEntry] = []
        self._durable_seq = self._last_seq
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._error: BaseException | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._write_loop, name="usage-journal", daemon=True)
        self._thread.start()

    # ---- appending ------------------------------------------------------------------------------
    def next_seq(self) -> int:
        """Reserve the next sequence number (call under the caller's own ordering lock)."""
        self._last_seq += 1
        return self._last_seq

    def append(self, entry: JournalEntry) -> None:
        """Queue `entry` for the writer (entries must come in `seq` order)."""
        with self._cond:
            self._queue.append(entry)
            self._cond.notify()

    async def durable(self) -> None:
        """Return once every entry appended so far is on disk (raises if the disk write failed)."""
        target = self._last_seq
        if target <= self._durable_seq:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._cond:
            self._loop = loop
            if self._error is not None:
                raise StoreError(f"usage journal write failed: {self._error}", path=str(self.path))
            if target <= self._durable_seq:
                return
            self._waiters.append((target, fut))
        await fut

    def wait_durable(self, seq: int, timeout_s: float = 10.0) -> None:
        """Block until entries up to `seq` are on disk (for the flush thread)."""
        with self._cond:
            self._cond.wait_for(lambda: self._durable_seq >= seq or self._error is not None, timeout_s)
            if self._error is not None:
                raise StoreError(f"usage journal write failed: {self._error}", path=str(self.path))
            if self._durable_seq < seq:
                raise StoreError(
                    f"usage journal: entry {seq} not on disk after {timeout_s} s", path=str(self.path)
                )

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._closing)
                batch, self._queue = self._queue, []
                if not batch and self._closing:
                    return
            try:
                with self._db_lock:
                    self._conn.execute("BEGIN")
                    self._conn.executemany("INSERT INTO charges VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
                    self._conn.execute(
                        "UPDATE meta SET value = ? WHERE key = 'last_seq'", (str(batch[-1].seq),)
                    )
                    self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with self._db_lock:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                self._fail(exc)
                return
            with self._cond:
                self._durable_seq = batch[-1].seq
                ready = [f for seq, f in self._waiters if seq <= self._durable_seq]
                self._waiters = [(seq, f) for seq, f in self._waiters if seq > self._durable_seq]
                self._cond.notify_all()
                loop = self._loop
            if ready and loop is not None:
                loop.call_soon_threadsafe(_resolve, ready, None)

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
            loop = self._loop
        if waiters and loop is not None:
            loop.call_soon_threadsafe(_resolve, [f for _, f in waiters], exc)

    # ---- replay and trimming --------------------------------------------------------------------
    def entries(self, after_seq: int, before_seq: int) -> list[JournalEntry]:
        """Entries with ``after_seq < seq < before_seq``, in order."""
        with self._db_lock:
            rows = self._conn.execute(
                "SELECT * FROM charges WHERE seq > ? AND seq < ? ORDER BY seq", (after_seq, before_seq)
            ).fetchall()
        return [JournalEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8]) for r in rows]

    def trim(self, upto_seq: int) -> None:
        """Delete the entries the store has counted (seq ≤ `upto_seq`)."""
        with self._db_lock:
            self._conn.execute("DELETE FROM charges WHERE seq <= ?", (upto_seq,))

    def __len__(self) -> int:
        with self._db_lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0])

    def close(self) -> None:
        """Write what is queued, stop the writer, release the file."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        with self._db_lock:
            self._conn.close()
        # The lock file stays behind on purpose: unlinking it would race a process taking it.
        self._lock_file.close()


def _resolve(futures: Sequence[asyncio.Future[None]], exc: BaseException | None) -> None:
    for fut in futures:
        if fut.done():  # its request was cancelled (client gone): nothing to wake
            continue
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(StoreError(f"usage journal write failed: {exc}"))
