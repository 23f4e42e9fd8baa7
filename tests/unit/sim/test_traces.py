"""Trace generators and the CSV format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infaas.sim.traces import TenantSpec, Trace, bursty, diurnal, poisson, read_csv, write_csv
from infaas.sim.zoo import mixed_tenants, synthetic_zoo

MIX = [
    TenantSpec("fast", "digits", latency_ms=10.0, min_accuracy=0.9, rows=1, share=3.0),
    TenantSpec("bulk", "iris", latency_ms=200.0, min_accuracy=0.5, rows=8, share=1.0),
]


def test_poisson_follows_its_rate_schedule_and_the_tenant_mix() -> None:
    trace = poisson([(10.0, 100.0), (10.0, 1000.0)], MIX, np.random.default_rng(0))
    first = int((trace.time_s < 10.0).sum())
    second = len(trace) - first
    assert 800 < first < 1200 and 9000 < second < 11000
    assert np.all(np.diff(trace.time_s) >= 0)
    fast = trace.tenants.index("fast")
    assert 0.7 < float((trace.tenant == fast).mean()) < 0.8
    assert set(trace.rows[trace.tenant == fast].tolist()) == {1}
    assert {trace.tasks[i] for i in trace.task[trace.tenant == fast].tolist()} == {"digits"}


def test_diurnal_peaks_in_the_first_half_of_its_period() -> None:
    trace = diurnal(100.0, 200.0, MIX, np.random.default_rng(1), amplitude=0.9)
    assert 18000 < len(trace) < 22000
    assert int((trace.time_s < 50.0).sum()) > 2.5 * int((trace.time_s >= 50.0).sum())


def test_bursty_keeps_its_mean_rate_with_bursts_above_it() -> None:
    trace = bursty(400.0, 100.0, MIX, np.random.default_rng(2), mean_calm_s=4.0, mean_burst_s=1.0)
    assert 30000 < len(trace) < 50000
    per_s = np.bincount(trace.time_s.astype(np.int64))
    assert per_s.max() > 4 * np.median(per_s)


def test_a_seed_gives_the_same_trace() -> None:
    a = bursty(20.0, 50.0, MIX, np.random.default_rng(9))
    b = bursty(20.0, 50.0, MIX, np.random.default_rng(9))
    assert list(a.queries()) == list(b.queries())


def test_csv_round_trip(tmp_path: Path) -> None:
    trace = poisson([(2.0, 50.0)], MIX, np.random.default_rng(3))
    path = tmp_path / "trace.csv"
    write_csv(trace, path)
    assert path.read_text().splitlines()[0] == "time_s,tenant,task,rows,latency_ms,min_accuracy"
    again = read_csv(path)
    assert list(again.queries()) == list(trace.queries())


def test_csv_without_a_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("time_s,tenant,task,rows\n0.1,a,t,1\n")
    with pytest.raises(ValueError, match="latency_ms"):
        read_csv(path)


def test_head_and_from_queries() -> None:
    trace = poisson([(1.0, 100.0)], MIX, np.random.default_rng(4))
    head = trace.head(5)
    assert len(head) == 5 and list(head.queries()) == list(trace.queries())[:5]
    assert list(Trace.from_queries(list(reversed(list(head.queries())))).queries()) == list(head.queries())


def test_the_synthetic_zoo_is_reproducible_and_its_tenant_mix_is_feasible_idle() -> None:
    zoo = synthetic_zoo(3, 25, seed=1)
    assert len(zoo.variants) == 75
    assert sorted(zoo.variants) == sorted(synthetic_zoo(3, 25, seed=1).variants)
    for v, p in zoo.variants.values():
        assert v.name == p.variant and p.latency_ms(8, "p50") > p.latency_ms(1, "p50") > 0
    mix = mixed_tenants(zoo)
    assert len(mix) == 9
    by_task = zoo.by_task()
    for tenant in mix:
        assert any(
            p.accuracy >= tenant.min_accuracy and p.latency_ms(tenant.rows, "p99") < tenant.latency_ms
            for _, p in by_task[tenant.task]
        )
