"""The usage journal: charges survive a crash between answer and flush, and count exactly once.

Real SQLite files under tmp_path (the journal is a file format, not a boundary to fake); the
store is the in-memory fake, which runs the same contract suite as SQLite and Redis.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import psutil
import pytest

from infaas.errors import StoreError
from infaas.journal import UsageJournal
from infaas.metering import FlakySink, Meter
from infaas.store import MemoryStore
from infaas.types import COUNTER_COST_PUSD, COUNTER_QUERIES


def charge(meter: Meter, cost_pusd: int, tenant: str = "t1") -> None:
    charged = meter.charge(
        tenant=tenant,
        task="digits",
        variant="v",
        rows=1,
        batch_rows=1,
        cost_pusd=cost_pusd,
        latency_ms=1.0,
        slo_met=True,
        now_s=600.0,
    )
    meter.settle(charged, 1.0, True)


def totals(store: MemoryStore) -> tuple[int, int]:
    rows = store.usage()
    return sum(r.counters[COUNTER_QUERIES] for r in rows), sum(r.counters[COUNTER_COST_PUSD] for r in rows)


def answered(meter: Meter, costs: list[int]) -> None:
    """Charge each cost and wait for the journal, as the query handler does before replying."""

    async def go() -> None:
        for cost in costs:
            charge(meter, cost)
            await meter.durable()

    asyncio.run(go())


def test_a_crash_before_the_flush_loses_nothing(tmp_path: Path) -> None:
    store = MemoryStore()
    path = tmp_path / "journal"
    journal = UsageJournal(path)
    meter = Meter(store, journal)
    answered(meter, [3, 5])
    meter.flush()
    answered(meter, [7, 11, 13])  # answered, never flushed: the process dies here
    journal.close()  # what the OS does for a killed process: the file stays, the lock goes
    assert totals(store) == (2, 8)

    again = UsageJournal(path)
    assert again.source == journal.source and again.first_seq == 6
    restarted = Meter(store, again)
    assert restarted.flush() == 1  # the replay
    assert totals(store) == (5, 39)
    assert len(again) == 0
    answered(restarted, [17])
    restarted.flush()
    assert totals(store) == (6, 56)
    again.close()


def test_a_flush_whose_reply_was_lost_is_not_counted_twice(tmp_path: Path) -> None:
    store = MemoryStore()
    journal = UsageJournal(tmp_path / "journal")
    sink = FlakySink(store, failures=0, apply_then_fail=True)
    meter = Meter(sink, journal)
    meter.flush()  # the replay check, while the store answers
    answered(meter, [3])
    sink.failures = 1
    with pytest.raises(ConnectionError):
        meter.flush()  # the write landed; the caller cannot know
    answered(meter, [4])
    meter.flush()
    assert totals(store) == (2, 7)
    journal.close()


def test_a_replay_the_store_already_counted_is_skipped(tmp_path: Path) -> None:
    """The process died after the store counted a flush but before it trimmed the journal."""
    store = MemoryStore()
    path = tmp_path / "journal"
    journal = UsageJournal(path)
    answered(Meter(store, journal), [3, 5])
    store.add_usage(Meter(MemoryStore()).pending(), mark=(journal.source, 2))  # counted elsewhere: 0 rows
    journal.close()
    again = UsageJournal(path)
    Meter(store, again).flush()
    assert totals(store) == (0, 0)  # the mark covered both entries: nothing replayed
    assert len(again) == 0
    again.close()


def test_one_process_per_journal(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path / "journal")
    with pytest.raises(StoreError, match="held by another infaas process"):
        UsageJournal(tmp_path / "journal")
    journal.close()
    UsageJournal(tmp_path / "journal").close()


def test_a_store_outage_buffers_in_the_journal_and_lands_once(tmp_path: Path) -> None:
    store = MemoryStore()
    journal = UsageJournal(tmp_path / "journal")
    meter = Meter(FlakySink(store, failures=3), journal)
    answered(meter, [1, 2])
    for _ in range(3):  # the replay check, then two flushes, all while the store is down
        with pytest.raises(ConnectionError):
            meter.flush()
    answered(meter, [4])
    assert len(journal) == 3
    meter.flush()
    assert totals(store) == (3, 7)
    assert len(journal) == 0
    journal.close()


def test_a_torn_record_at_the_end_of_a_segment_is_ignored(tmp_path: Path) -> None:
    """The process died in the middle of a write: that answer was never sent, so that charge and
    nothing after it in the segment is replayed."""
    store = MemoryStore()
    path = tmp_path / "journal"
    journal = UsageJournal(path)
    answered(Meter(store, journal), [3, 5])
    journal.close()
    [segment] = sorted(path.glob("seg-*.log"))
    data = segment.read_bytes()
    segment.write_bytes(data + data[: len(data) // 2 - 3])  # a torn copy of the records after them
    again = UsageJournal(path)
    assert again.first_seq == 3
    Meter(store, again).flush()
    assert totals(store) == (2, 8)
    again.close()


def test_counted_segments_are_deleted_and_numbering_survives_it(tmp_path: Path) -> None:
    store = MemoryStore()
    path = tmp_path / "journal"
    for costs in ([1], [2, 3], [4]):  # three processes, one after the other
        journal = UsageJournal(path)
        meter = Meter(store, journal)
        meter.flush()
        answered(meter, costs)
        meter.flush()
        journal.close()
    assert totals(store) == (4, 10)
    segments = sorted(path.glob("seg-*.log"))
    assert len(segments) == 1  # the last process's; the earlier ones were counted and deleted
    last = UsageJournal(path)
    assert last.first_seq == 5 and len(last) == 1  # its record stays until the next trim
    last.close()


def test_os_mode_is_durable_once_written(tmp_path: Path) -> None:
    store = MemoryStore()
    journal = UsageJournal(tmp_path / "journal", fsync=False)
    meter = Meter(store, journal)
    answered(meter, [3, 4])
    journal.close()
    again = UsageJournal(tmp_path / "journal", fsync=False)
    Meter(store, again).flush()
    assert totals(store) == (2, 7)
    again.close()


def test_os_mode_syncs_in_the_background_before_the_store_counts(tmp_path: Path) -> None:
    """Answers wait only for the OS; the flush syncs first, so the store's mark never passes what
    is on disk (a power cut would otherwise make a restart reuse counted sequence numbers)."""
    store = MemoryStore()
    journal = UsageJournal(tmp_path / "journal", fsync=False)
    meter = Meter(store, journal)
    answered(meter, [3, 4])
    assert journal.synced_seq == 0  # nothing synced on the answers' path
    meter.flush()
    assert journal.synced_seq == 2 and store.usage_mark(journal.source) == 2
    journal.close()


def test_os_mode_syncs_while_the_store_is_down(tmp_path: Path) -> None:
    """The loss window on a power cut stays one flush interval during a store outage too."""
    store = MemoryStore()
    journal = UsageJournal(tmp_path / "journal", fsync=False)
    meter = Meter(FlakySink(store, failures=5), journal)
    answered(meter, [3])
    with pytest.raises(ConnectionError):
        meter.flush()
    answered(meter, [4])
    with pytest.raises(ConnectionError):
        meter.flush()
    assert journal.synced_seq == 2 and store.usage_mark(journal.source) == 0
    journal.close()


def test_refusals_and_failures_land_even_in_a_flush_with_no_new_charge(tmp_path: Path) -> None:
    """They are counted (SLO attainment is over every query sent) but not journaled (not money):
    a flush holding only them carries no mark, so the store must not skip it as a replay."""
    store = MemoryStore()
    journal = UsageJournal(tmp_path / "journal")
    meter = Meter(store, journal)
    answered(meter, [3])
    meter.flush()
    for counted in ("refused", "failed", "refused"):
        meter.record_failure(
            tenant="t1", task="digits", variant="v", rows=1, latency_ms=1.0, error="x", now_s=600.0,
            counted=counted,  # type: ignore[arg-type]
        )  # fmt: skip
    meter.record_failure(
        tenant="t1", task="digits", variant="v", rows=1, latency_ms=1.0, error="bad", now_s=600.0
    )
    meter.flush()
    [row] = store.usage()
    assert (row.counters["queries"], row.counters["refused"], row.counters["failed"]) == (1, 2, 1)
    journal.close()


def test_records_stay_durable_across_segments(tmp_path: Path) -> None:
    """The fsync helper is handed each new segment: every answer of a run that rotates segments
    many times is replayed by the next process."""
    store = MemoryStore()
    path = tmp_path / "journal"
    journal = UsageJournal(path, segment_bytes=256)  # a record is ~60 bytes: a segment each few
    answered(Meter(store, journal), list(range(1, 41)))
    journal.close()
    assert len(list(path.glob("seg-*.log"))) >= 8
    again = UsageJournal(path)
    Meter(store, again).flush()
    assert totals(store) == (40, sum(range(1, 41)))
    again.close()


def test_a_dead_fsync_helper_fails_the_waiting_answers_instead_of_hanging(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path / "journal")
    meter = Meter(MemoryStore(), journal)
    pid = journal.helper_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)  # reaped here, as the journal's own Popen would see it

    async def go() -> None:
        charge(meter, 3)
        await asyncio.wait_for(meter.durable(), timeout=10)

    with pytest.raises(StoreError, match="fsync helper exited"):
        asyncio.run(go())
    journal.close()


def test_closing_the_journal_ends_its_fsync_helper(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path / "journal")
    pid = journal.helper_pid
    assert pid is not None and psutil.pid_exists(pid)
    answered(Meter(MemoryStore(), journal), [1])
    journal.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    unsynced = UsageJournal(tmp_path / "journal", fsync=False)
    assert unsynced.helper_pid is None
    unsynced.close()
