"""The usage journal: every charge on local disk before its answer leaves the server.

The meter aggregates charges in memory and flushes them to the store every second; a crash (SIGKILL,
OOM kill, power cut) between an answer and the next flush would lose those charges, and a store
outage would hold them in memory only. The journal closes that gap: each answered query appends one
record (a sequence number and what its usage counters are made of), and the query handler waits
until its record is durable before it replies.

Layout and cost. The journal is a directory of append-only segment files (``seg-<first seq>.log``)
of length-prefixed, CRC-checked records. Records appended during one event-loop iteration go to the
file in one ``write`` from the loop thread; with ``fsync=True`` a helper thread then fsyncs the file
(``os.fsync`` releases the GIL for its whole duration) while the next group accumulates (group
commit), and wakes the waiting handlers with one loop callback per fsync. A first version wrote
through SQLite from a writer thread: its per-row GIL hand-offs cost 20 % of the service's
throughput here (docs/benchmarks.md, "Usage journal").

Exactly once. At start the meter replays the records the store has not counted: the store keeps,
per journal (`source`, a UUID kept in the directory), the highest sequence number it has counted
and skips a batch at or below it (`MetadataStore.add_usage(..., mark=...)`). A torn record at the
end of a segment (the process died mid-write) fails its CRC and ends that segment: its answer was
never sent. Each process starts a new segment, so earlier segments are read-only; a segment whose
records the store has all counted is deleted (`trim`).

With ``fsync=False`` (``INFAAS_USAGE_JOURNAL=os``) a write reaches the OS but is not fsync'd: it
survives the process's death, not a power cut, and costs less latency.

One process owns a journal at a time (an exclusive `flock`): two front ends on one data dir would
otherwise interleave sequence numbers under one source.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Iterator
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


_HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
_FIXED = struct.Struct("<qqqq?dHHH")  # seq, minute, rows, cost, slo_met, latency, 3 string lengths
_SEGMENT_BYTES = 8 * 1024 * 1024


def _pack(e: JournalEntry) -> bytes:
    tenant, task, variant = e.tenant.encode(), e.task.encode(), e.variant.encode()
    payload = (
        _FIXED.pack(
            e.seq,
            e.minute,
            e.rows,
            e.cost_pusd,
            e.slo_met,
            e.latency_ms,
            len(tenant),
            len(task),
            len(variant),
        )
        + tenant
        + task
        + variant
    )
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _unpack_all(data: bytes) -> Iterator[JournalEntry]:
    """The records of one segment, up to the first torn or corrupt one."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, offset)
        payload = data[offset + _HEADER.size : offset + _HEADER.size + length]
        if len(payload) < length or zlib.crc32(payload) != crc or length < _FIXED.size:
            return
        seq, minute, rows, cost, slo_met, latency_ms, n1, n2, n3 = _FIXED.unpack_from(payload)
        names = payload[_FIXED.size :]
        yield JournalEntry(
            seq,
            names[:n1].decode(),
            names[n1 : n1 + n2].decode(),
            names[n1 + n2 : n1 + n2 + n3].decode(),
            minute,
            rows,
            cost,
            slo_met,
            latency_ms,
        )
        offset += _HEADER.size + length


def _segment_name(first_seq: int) -> str:
    return f"seg-{first_seq:020d}.log"


class UsageJournal:
    """Append-only segments of charges with group-committed durability; see the module docstring.

    `append` never blocks on disk; `durable()` waits until everything appended so far is durable;
    `wait_durable(seq)` is its blocking form for the flush thread."""

    def __init__(self, directory: Path, fsync: bool = True) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory
        self._fsync = fsync
        self._lock_file = open(directory / "lock", "w")  # noqa: SIM115 - held for our lifetime
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreError(
                f"the usage journal {directory} is held by another infaas process on this data dir; "
                "stop it, or give this one its own INFAAS_DATA_DIR",
                path=str(directory),
            ) from None
        source_file = directory / "source"
        if not source_file.exists():
            tmp = directory / "source.tmp"
            tmp.write_text(str(uuid.uuid4()))
            os.replace(tmp, source_file)
        self.source = source_file.read_text().strip()
        last = 0
        for first, path in self._segments():
            last = max(last, first - 1, *(e.seq for e in _unpack_all(path.read_bytes())))
        self._last_seq = last
        self._trimmed_upto = 0
        self.first_seq = last + 1
        """Records below this were written by an earlier process (what the meter replays)."""
        self._fd = self._open_segment(self.first_seq)
        self._segment_bytes = 0
        self._buf = bytearray()
        self._buffered_seq = last
        self._write_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []  # touched on the loop only
        self._cond = threading.Condition()
        self._written_seq = last
        self._durable_seq = last
        self._error: OSError | None = None
        self._closing = False
        self._syncer: threading.Thread | None = None
        if fsync:
            self._syncer = threading.Thread(target=self._sync_loop, name="usage-journal-fsync", daemon=True)
            self._syncer.start()

    # ---- files ----------------------------------------------------------------------------------
    def _segments(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.path.glob("seg-*.log"):
            try:
                found.append((int(path.stem[4:]), path))
            except ValueError:
                continue
        return sorted(found)

    def _open_segment(self, first_seq: int) -> int:
        fd = os.open(self.path / _segment_name(first_seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if self._fsync:
            # The new file's name must be durable too, or a power cut could lose the whole segment.
            dir_fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return fd

    # ---- appending (event-loop thread) ----------------------------------------------------------
    def next_seq(self) -> int:
        """Reserve the next sequence number (call under the caller's own ordering lock)."""
        self._last_seq += 1
        return self._last_seq

    def append(self, entry: JournalEntry) -> None:
        """Buffer `entry` (entries must come in `seq` order); it is written at the end of this
        event-loop iteration, together with the others appended in it (at once without a loop)."""
        self._buf += _pack(entry)
        self._buffered_seq = entry.seq
        if self._write_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write()
            return
        self._loop = loop
        self._write_scheduled = True
        loop.call_soon(self._write)

    def _write(self) -> None:
        self._write_scheduled = False
        if not self._buf:
            return
        data, self._buf = bytes(self._buf), bytearray()
        seq = self._buffered_seq
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self._fail(exc)
            return
        self._segment_bytes += len(data)
        with self._cond:
            self._written_seq = seq
            if self._segment_bytes >= _SEGMENT_BYTES:
                self._rotate()
            if not self._fsync:
                self._durable_seq = seq
            self._cond.notify_all()
        if not self._fsync:
            self._wake(seq)

    def _rotate(self) -> None:
        """Start the next segment (under `_cond`; rare: every few MB)."""
        old = self._fd
        if self._fsync:
            os.fsync(old)  # the syncer may hold a dup of it; this makes its records durable now
        self._fd = self._open_segment(self._written_seq + 1)
        self._segment_bytes = 0
        os.close(old)

    async def durable(self) -> None:
        """Return once every entry appended so far is durable (raises if writing failed)."""
        target = self._last_seq
        if target <= self._durable_seq:
            return
        if self._error is not None:
            raise StoreError(f"usage journal write failed: {self._error}", path=str(self.path))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, fut))
        await fut

    def _wake(self, durable_seq: int) -> None:
        """Resolve the waiters whose records are durable now (on the loop)."""
        if not self._waiters:
            return
        ready = [f for seq, f in self._waiters if seq <= durable_seq]
        if not ready:
            return
        self._waiters = [(seq, f) for seq, f in self._waiters if seq > durable_seq]
        for fut in ready:
            if not fut.done():  # its request was cancelled (client gone): nothing to wake
                fut.set_result(None)

    def _fail(self, exc: OSError) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(StoreError(f"usage journal write failed: {exc}", path=str(self.path)))

    # ---- durability (fsync thread) --------------------------------------------------------------
    def _sync_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._written_seq > self._durable_seq or self._closing)
                if self._written_seq <= self._durable_seq:
                    return  # closing, and everything written is durable
                target = self._written_seq
                fd = os.dup(self._fd)  # `_rotate` may close the original meanwhile
            try:
                # fdatasync: the records and the file's new length, not its timestamps.
                os.fdatasync(fd)
            except OSError as exc:
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                loop = self._loop
                if loop is not None:
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(self._fail, exc)
                return
            finally:
                os.close(fd)
            with self._cond:
                self._durable_seq = target
                self._cond.notify_all()
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                    loop.call_soon_threadsafe(self._wake, target)

    def wait_durable(self, seq: int, timeout_s: float = 10.0) -> None:
        """Block until entries up to `seq` are durable (for the flush thread)."""
        with self._cond:
            self._cond.wait_for(lambda: self._durable_seq >= seq or self._error is not None, timeout_s)
            if self._error is not None:
                raise StoreError(f"usage journal write failed: {self._error}", path=str(self.path))
            if self._durable_seq < seq:
                raise StoreError(
                    f"usage journal: entry {seq} not durable after {timeout_s} s", path=str(self.path)
                )

    # ---- replay and trimming (flush thread) -----------------------------------------------------
    def entries(self, after_seq: int, before_seq: int) -> list[JournalEntry]:
        """Records with ``after_seq < seq < before_seq``, in order (earlier processes' segments)."""
        out: list[JournalEntry] = []
        for first, path in self._segments():
            if first >= before_seq:
                break
            out += [e for e in _unpack_all(path.read_bytes()) if after_seq < e.seq < before_seq]
        return out

    def trim(self, upto_seq: int) -> None:
        """Delete the segments whose records the store has all counted (seq ≤ `upto_seq`); the one
        being written stays."""
        self._trimmed_upto = max(self._trimmed_upto, upto_seq)
        segments = self._segments()
        for (_, path), (next_first, _) in itertools.pairwise(segments):
            if next_first - 1 <= upto_seq:
                path.unlink(missing_ok=True)

    def __len__(self) -> int:
        """Records not yet trimmed (those the store may not have counted): for logs and tests."""
        return sum(
            1
            for _, path in self._segments()
            for e in _unpack_all(path.read_bytes())
            if e.seq > self._trimmed_upto
        )

    def close(self) -> None:
        """Write what is buffered, make it durable, stop the fsync thread, release the directory."""
        self._write()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._syncer is not None:
            self._syncer.join(timeout=30)
        os.close(self._fd)
        # The lock file stays behind on purpose: unlinking it would race a process taking it.
        self._lock_file.close()
