"""Usage metering: exact integer aggregation per tenant × task × variant × minute, atomic flushes."""

from __future__ import annotations

import asyncio

import pytest

from infaas.metering import FlakySink, Meter, MeterFlusher, MeterRecord, cost_share_pusd
from infaas.store import MemoryStore
from infaas.types import (
    COUNTER_COST_PUSD,
    COUNTER_QUERIES,
    COUNTER_ROWS,
    COUNTER_SLO_MET,
    COUNTER_SLO_MISSED,
    LatencyPoint,
    MachineInfo,
    Profile,
)


def profile(price_usd_per_s: float = 0.05 / 3600) -> Profile:
    def point(batch: int, mean_ms: float) -> LatencyPoint:
        return LatencyPoint(
            batch=batch,
            p50_ms=mean_ms,
            p95_ms=mean_ms,
            p99_ms=mean_ms,
            mean_ms=mean_ms,
            throughput_qps=1000 * batch / mean_ms,
            samples=10,
            stable=True,
            stop_reason="stable",
            cost_usd_per_1k=0.0,
        )

    return Profile(
        variant="m/onnx-cpu-fp32-t1",
        machine=MachineInfo(cpu_model="t", cores=2),
        measured_at_s=0.0,
        points=(point(1, 0.01), point(8, 0.04), point(32, 0.1)),
        fit_slope_ms=0.002,
        price_usd_per_s=price_usd_per_s,
    )


def test_cost_share_is_the_measured_batch_cost_split_by_rows() -> None:
    p = profile(price_usd_per_s=1.0)  # 1 USD per second: a 0.04 ms batch costs 4e-5 USD
    assert cost_share_pusd(p, batch_rows=8, rows=8) == 40_000_000
    assert cost_share_pusd(p, batch_rows=8, rows=2) == 10_000_000
    assert cost_share_pusd(p, batch_rows=1, rows=1) == 10_000_000
    # bigger batches are cheaper per row; interpolated between measured points
    assert cost_share_pusd(p, batch_rows=20, rows=1) == round(0.07e-3 * 1e12 / 20)
    assert cost_share_pusd(p, batch_rows=0, rows=1) == 0
    # the DESIGN.md example: 10 µs on one vCPU at 0.05 USD/h is ~1.4e-10 USD, not rounded to zero
    assert cost_share_pusd(profile(), batch_rows=1, rows=1) == 139


def answer(
    meter: Meter, *, tenant: str = "t1", variant: str = "v", now_s: float = 600.0, **kw: object
) -> MeterRecord:
    args: dict[str, object] = {
        "task": "digits",
        "rows": 1,
        "batch_rows": 4,
        "cost_pusd": 1000,
        "latency_ms": 2.5,
        "slo_met": True,
    }
    args.update(kw)
    charged = meter.charge(tenant=tenant, variant=variant, now_s=now_s, **args)  # type: ignore[arg-type]
    return meter.settle(charged, args["latency_ms"], args["slo_met"])  # type: ignore[arg-type]


def test_aggregates_per_tenant_task_variant_minute_and_flushes_exact_totals() -> None:
    store = MemoryStore()
    meter = Meter(store)
    answer(meter, now_s=600.0, cost_pusd=7, rows=3)
    answer(meter, now_s=659.9, cost_pusd=5, slo_met=False, latency_ms=40.0)
    answer(meter, now_s=660.0, cost_pusd=11)  # next minute
    answer(meter, tenant="t2", cost_pusd=13)
    answer(meter, variant="w", cost_pusd=17)
    pending = {(d.key.tenant, d.key.variant, d.key.minute): d.counters for d in meter.pending()}
    assert pending[("t1", "v", 10)] == {
        COUNTER_QUERIES: 2,
        COUNTER_ROWS: 4,
        COUNTER_COST_PUSD: 12,
        COUNTER_SLO_MET: 1,
        COUNTER_SLO_MISSED: 1,
        "lat_le_3": 1,
        "lat_le_50": 1,
    }
    assert pending[("t1", "v", 11)][COUNTER_COST_PUSD] == 11
    assert len(pending) == 4
    assert store.usage() == []  # nothing reaches the store before a flush
    assert meter.flush() == 4
    assert meter.pending() == []
    assert meter.flush() == 0
    answer(meter, now_s=601.0, cost_pusd=100)
    meter.flush()
    rows = store.usage(tenant="t1")
    assert sum(r.counters[COUNTER_COST_PUSD] for r in rows) == 7 + 5 + 11 + 17 + 100
    assert sum(r.counters[COUNTER_QUERIES] for r in rows) == 5
    assert all(r.key.tenant == "t1" for r in rows)


def test_the_verdict_is_counted_when_settled_not_when_charged() -> None:
    # The query handler charges an answer, waits for the journal, then settles the verdict with
    # the latency the client sees: here in time when charged (4 ms), late once the wait is in.
    meter = Meter(MemoryStore())
    seen: list[MeterRecord] = []
    meter.add_listener(seen.append)
    charged = meter.charge(
        tenant="t1", task="digits", variant="v", rows=2, batch_rows=8, cost_pusd=5,
        latency_ms=4.0, slo_met=True, now_s=600.0,
    )  # fmt: skip
    [delta] = meter.pending()
    assert delta.counters == {COUNTER_QUERIES: 1, COUNTER_ROWS: 2, COUNTER_COST_PUSD: 5}  # no verdict yet
    assert seen == []
    meter.flush()  # a flush between the two: the verdict lands in the next one
    record = meter.settle(charged, latency_ms=12.0, slo_met=False)
    assert record.outcome == "slo_missed" and record.latency_ms == 12.0 and record.cost_pusd == 5
    assert seen == [record]
    [delta] = meter.pending()
    assert delta.counters == {COUNTER_SLO_MISSED: 1, "lat_le_15": 1}


def test_a_failed_flush_keeps_the_counters_for_the_next() -> None:
    store = MemoryStore()
    meter = Meter(FlakySink(store, failures=1))
    answer(meter, cost_pusd=3)
    with pytest.raises(ConnectionError):
        meter.flush()
    answer(meter, cost_pusd=4)
    assert meter.flush() == 2  # the batch in doubt first, as it was, then the new one
    [row] = store.usage()
    assert row.counters[COUNTER_COST_PUSD] == 7 and row.counters[COUNTER_QUERIES] == 2


def test_listeners_see_answers_and_failures_and_cannot_break_the_meter() -> None:
    meter = Meter(MemoryStore())
    seen: list[MeterRecord] = []

    def broken(_: MeterRecord) -> None:
        raise RuntimeError("metrics backend down")

    meter.add_listener(broken)
    meter.add_listener(seen.append)
    rec = answer(meter, cost_pusd=9, batch_rows=6)
    missed = answer(meter, slo_met=False)
    meter.record_failure(
        tenant="t1", task="digits", variant="", rows=2, latency_ms=0.3, error="invalid_input", now_s=1.0
    )
    assert seen[0] == rec and rec.outcome == "ok" and rec.batch_rows == 6 and rec.cost_pusd == 9
    assert seen[1] == missed and missed.outcome == "slo_missed"
    assert seen[2].outcome == "invalid_input" and seen[2].error == "invalid_input" and seen[2].cost_pusd == 0
    # failures are not charged
    assert sum(d.counters[COUNTER_QUERIES] for d in meter.pending()) == 2


def test_flusher_flushes_periodically_and_at_close() -> None:
    store = MemoryStore()
    meter = Meter(store)

    async def scenario() -> tuple[int, int]:
        flusher = MeterFlusher(meter, interval_s=0.01)
        flusher.start()
        answer(meter, cost_pusd=1)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if store.usage():
                break
        periodic = len(store.usage())
        answer(meter, cost_pusd=2, now_s=6000.0)
        await flusher.close()
        return periodic, len(store.usage())

    assert asyncio.run(scenario()) == (1, 2)


def test_a_charge_offered_again_under_its_mark_counts_once() -> None:
    """An offline chunk's charge: offered again after a restart, and after a flush whose reply
    was lost (the write landed), the store counts it once."""
    store = MemoryStore()
    sink = FlakySink(store, failures=1, apply_then_fail=True)
    meter = Meter(sink)
    for _ in range(2):
        meter.charge_once(
            ("job:j1", 1),
            tenant="t",
            task="offline:d",
            variant="v",
            rows=10,
            cost_pusd=70,
            now_s=600.0,
        )
    with pytest.raises(ConnectionError):
        meter.flush_once()  # landed, reply lost: stays in the meter and is offered again
    assert meter.flush_once() == 0  # both offers skipped by the mark
    meter.charge_once(
        ("job:j1", 2), tenant="t", task="offline:d", variant="v", rows=5, cost_pusd=30, now_s=600.0
    )
    meter.flush()  # the periodic flush writes them too
    [row] = store.usage()
    assert row.counters == {"queries": 2, "rows": 15, "cost_pusd": 100, "slo_met": 2}
