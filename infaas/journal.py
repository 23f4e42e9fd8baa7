"""The usage journal: every charge on local disk before its answer leaves the server.

The meter aggregates charges in memory and flushes them to the store every second; a crash (SIGKILL,
OOM kill, power cut) between an answer and the next flush would lose those charges, and a store
outage would hold them in memory only. The journal closes that gap: each answered query appends one
record (a sequence number and what its usage counters are made of), and the query handler waits
until its record is durable before it replies.

Layout and cost. The journal is a directory of append-only segment files (``seg-<first seq>.log``)
of length-prefixed, CRC-checked records. With ``fsync=True`` the records appended during one
event-loop iteration go to the file in one ``write`` from the loop thread, and a helper *process* then
``fdatasync``s the file while the next group accumulates (group commit: one sync in flight at a
time), and its acknowledgement, read by the loop like any socket, wakes the waiting handlers.
A process, not a thread: a thread needs the GIL after it wakes and again after the sync, and on a
busy loop each of those waits for the interpreter's switch interval (5 ms). Under overload that
chain made the journal the largest part of an admitted answer's latency (13-25 ms p50 against a
0.2 ms ``fdatasync``; docs/benchmarks.md, "The journal's sync in a process of its own"). A sync on
the loop itself blocks it for the sync's duration (~30 % of the closed-loop throughput, measured).
A first version wrote through SQLite from a writer thread: its per-row GIL hand-offs cost 20 % of
the service's throughput here (docs/benchmarks.md, "Usage journal").

Exactly once. At start the meter replays the records the store has not counted: the store keeps,
per journal (`source`, a UUID kept in the directory), the highest sequence number it has counted
and skips a batch at or below it (`MetadataStore.add_usage(..., mark=...)`). A torn record at the
end of a segment (the process died mid-write) fails its CRC and ends that segment: its answer was
never sent. Each process starts a new segment, so earlier segments are read-only; a segment whose
records the store has all counted is deleted (`trim`).

With ``fsync=False`` (``INFAAS_USAGE_JOURNAL=os``, the default) an answer waits only for its
record to reach the OS: it survives the process's death (SIGKILL, OOM kill), and costs no sync on
the answer's path (~1 ms p50 at c=1 here, docs/benchmarks.md "The query tax"). The meter's flush
thread makes the records durable in the background (`sync`, an ``fdatasync`` of a duplicate of
the segment's descriptor) before every flush, and before the store may count them: like a
database's asynchronous commit, a power cut loses at most the charges of the last flush interval
(`INFAAS_USAGE_FLUSH_INTERVAL_S`, 1 s) plus one sync, never more, and the store's mark never passes
what is on disk (a restart after a power cut numbers on from what survived; a mark past it would
make the store skip new charges as already counted).

One process owns a journal at a time (an exclusive `flock`): two front ends on one data dir would
otherwise interleave sequence numbers under one source.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import itertools
import os
import select
import socket
import struct
import subprocess
import sys
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


_SEQ = struct.Struct("<q")

_SYNC_CHILD = """
import os, socket, struct, sys
sock = socket.socket(fileno=int(sys.argv[1]))
seq_of = struct.Struct("<q")
fd = -1
sock.send(seq_of.pack(0))  # ready
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 8, 1)
    except OSError:
        break
    if not msg:
        break  # the front end closed its end, or died
    if fds:
        if fd >= 0:
            os.close(fd)
        fd = fds[0]
    (seq,) = seq_of.unpack(msg)
    try:
        os.fdatasync(fd)
    except OSError as exc:
        seq = -(exc.errno or 5)
    sock.send(seq_of.pack(seq))
"""
"""The helper's whole program: for each request (a sequence number, with the segment's file
descriptor when it changed), ``fdatasync`` the segment and answer the number (or ``-errno``)."""


class _SyncProcess:
    """``fdatasync`` of the journal's current segment in a child process, over a SEQPACKET socket
    pair: `request` sends a sequence number (and the segment's fd when it changed, passed with
    SCM_RIGHTS), `acks` reads the numbers made durable. The child exits when the socket closes,
    also when the front end is killed."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _SYNC_CHILD, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self._sent_fd = -1
        # Started once the helper answers: a sync asked of a helper still starting would wait
        # for the interpreter's start (~30 ms here).
        if self.wait(30.0) is None:
            self.close()
            raise OSError(errno.ETIMEDOUT, "the journal's fsync helper did not start within 30 s")

    def request(self, seq: int, fd: int) -> None:
        try:
            if fd != self._sent_fd:
                socket.send_fds(self.sock, [_SEQ.pack(seq)], [fd])
                self._sent_fd = fd
            else:
                self.sock.send(_SEQ.pack(seq))
        except OSError as exc:
            raise OSError(exc.errno, f"the journal's fsync helper exited ({exc.strerror})") from None

    def acks(self) -> int | None:
        """The highest sequence number acknowledged since the last call (None: none yet); raises
        `OSError` for a failed sync or a helper that exited."""
        durable = None
        while True:
            try:
                msg = self.sock.recv(8)
            except BlockingIOError:
                return durable
            if not msg:
                raise OSError(errno.EPIPE, f"the journal's fsync helper exited ({self._proc.poll()})")
            (seq,) = _SEQ.unpack(msg)
            if seq < 0:
                raise OSError(-seq, os.strerror(-seq))
            durable = seq

    def wait(self, timeout_s: float) -> int | None:
        """`acks`, after waiting up to `timeout_s` for one (off the event loop)."""
        select.select([self.sock], [], [], timeout_s)
        return self.acks()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        self.sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def _segment_name(first_seq: int) -> str:
    return f"seg-{first_seq:020d}.log"


class UsageJournal:
    """Append-only segments of charges with group-committed durability; see the module docstring.

    `append` never blocks on disk; `durable()` waits until everything appended so far is durable;
    `wait_durable(seq)` is its blocking form for the flush thread."""

    def __init__(self, directory: Path, fsync: bool = True, segment_bytes: int = _SEGMENT_BYTES) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory
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
        self._max_segment_bytes = segment_bytes
        self._buf = bytearray()
        self._buffered_seq = last
        self._write_scheduled = False
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []  # touched on the loop only
        self._cond = threading.Condition()
        self._written_seq = last
        self._durable_seq = last  # what answers wait for: on disk with fsync, in the OS without
        self._synced_seq = last  # on disk (fdatasync'd), in either mode
        self._error: OSError | None = None
        try:
            self._syncer = _SyncProcess() if fsync else None
        except OSError as exc:
            os.close(self._fd)
            self._lock_file.close()
            raise StoreError(
                f"the usage journal's fsync helper could not start ({exc}); INFAAS_USAGE_JOURNAL=os "
                "journals without it",
                path=str(directory),
            ) from None
        self._sync_in_flight = False  # one sync at a time: the records of its wait make the next group
        self._reader_loop: asyncio.AbstractEventLoop | None = None  # where the syncer's acks are read

    @property
    def helper_pid(self) -> int | None:
        """The fsync helper's process id (None with ``fsync=False``)."""
        return self._syncer.pid if self._syncer is not None else None

    @property
    def synced_seq(self) -> int:
        """The last sequence number on disk (fdatasync'd): what a power cut cannot lose."""
        with self._cond:
            return self._synced_seq

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
        """Buffer `entry` (entries must come in `seq` order). With fsync it is written at the end
        of this event-loop iteration, together with the others appended in it (one write and one
        sync for the group); without, at once: a ``write`` to the page cache costs a few µs, less
        than the future and the two loop iterations an answer would wait for the group's."""
        self._buf += _pack(entry)
        self._buffered_seq = entry.seq
        if self._syncer is None:
            self._write()
            return
        if self._write_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write()
            return
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
            if self._segment_bytes >= self._max_segment_bytes:
                self._rotate()
            if self._syncer is None:
                self._durable_seq = seq
            self._cond.notify_all()
        if self._syncer is None:
            self._wake(seq)
            return
        self._request_sync()
        if self._reader_loop is None:  # no event loop: this caller waits for its sync
            self._drain_syncs()

    def _request_sync(self) -> None:
        """Ask the helper to sync what is written, unless a sync is in flight (its
        acknowledgement asks for the next one). The acknowledgements are read by the running
        event loop; without one, `_write` waits for them itself."""
        assert self._syncer is not None
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._reader_loop:  # a loop of its own per `asyncio.run` (tests, tools)
            if self._reader_loop is not None and not self._reader_loop.is_closed():
                self._reader_loop.remove_reader(self._syncer.sock)
            self._reader_loop = loop
            if loop is not None:
                loop.add_reader(self._syncer.sock, self._on_acks)
        if self._sync_in_flight or self._written_seq <= self._durable_seq or self._error is not None:
            return
        try:
            self._syncer.request(self._written_seq, self._fd)
        except OSError as exc:
            self._fail(exc)
            return
        self._sync_in_flight = True

    def _on_acks(self) -> None:
        """The helper acknowledged a sync (read on the loop, in its I/O phase)."""
        assert self._syncer is not None
        try:
            durable = self._syncer.acks()
        except OSError as exc:
            self._fail(exc)
            return
        if durable is not None:
            self._synced(durable)

    def _synced(self, durable: int) -> None:
        self._sync_in_flight = False
        with self._cond:
            self._durable_seq = max(self._durable_seq, durable)
            self._synced_seq = max(self._synced_seq, durable)
            self._cond.notify_all()
        self._wake(durable)
        self._request_sync()

    def _drain_syncs(self, timeout_s: float = 10.0) -> None:
        """Block until no sync is in flight (no loop reads the helper: close, or no loop at all)."""
        assert self._syncer is not None
        if self._reader_loop is not None:
            if not self._reader_loop.is_closed():
                self._reader_loop.remove_reader(self._syncer.sock)
            self._reader_loop = None
        while self._sync_in_flight and self._error is None:
            try:
                durable = self._syncer.wait(timeout_s)
            except OSError as exc:
                self._fail(exc)
                return
            if durable is None:
                self._fail(OSError(errno.ETIMEDOUT, f"no fsync within {timeout_s} s"))
                return
            self._synced(durable)

    def _rotate(self) -> None:
        """Start the next segment (under `_cond`; rare: every few MB)."""
        old = self._fd
        os.fsync(old)  # later syncs see only the current segment: this one's records, now
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
        self._sync_in_flight = False
        with self._cond:
            self._error = exc
            self._cond.notify_all()
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(StoreError(f"usage journal write failed: {exc}", path=str(self.path)))

    # ---- durability (flush thread) -------------------------------------------------------------
    def sync(self) -> None:
        """Make every record written so far durable on disk (for the flush thread; the
        background sync of ``fsync=False``). Syncs a duplicate of the segment's descriptor outside
        the lock, so the loop's writes and a rotation never wait for the disk."""
        if self._syncer is not None:
            return  # the helper syncs every write; `wait_durable` waits for it
        with self._cond:
            seq = self._written_seq
            if seq <= self._synced_seq or self._error is not None:
                return
            fd = os.dup(self._fd)  # records of an older segment were fsync'd when it rotated
        try:
            os.fdatasync(fd)
        except OSError as exc:
            with self._cond:
                self._error = exc
            raise StoreError(f"usage journal sync failed: {exc}", path=str(self.path)) from None
        finally:
            os.close(fd)
        with self._cond:
            self._synced_seq = max(self._synced_seq, seq)

    def wait_durable(self, seq: int, timeout_s: float = 10.0) -> None:
        """Block until entries up to `seq` are on disk (for the flush thread, before the store
        may count them)."""
        with self._cond:
            # Without the helper `_durable_seq` is what the loop has written: wait for that, sync.
            self._cond.wait_for(lambda: self._durable_seq >= seq or self._error is not None, timeout_s)
            if self._error is not None:
                raise StoreError(f"usage journal write failed: {self._error}", path=str(self.path))
            if self._durable_seq < seq:
                raise StoreError(
                    f"usage journal: entry {seq} not durable after {timeout_s} s", path=str(self.path)
                )
        self.sync()

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
        """Write what is buffered, make it durable, stop the fsync helper, release the directory."""
        self._write()
        if self._syncer is not None:
            self._drain_syncs()
            self._syncer.close()
        os.close(self._fd)
        # The lock file stays behind on purpose: unlinking it would race a process taking it.
        self._lock_file.close()
