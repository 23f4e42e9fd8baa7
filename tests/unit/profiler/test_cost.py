"""profiler.cost: price table × resources × time, consistent with Profile.cost_usd_per_1k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infaas.errors import InvalidInput
from infaas.types import PUSD_PER_USD, LatencyPoint, MachineInfo, Profile, VariantSpec
from profiler.cost import (
    DEFAULT_PRICE_TABLE,
    PriceTable,
    cost_pusd_per_row,
    cost_usd_per_1k,
    load_price_table,
    price_usd_per_s,
)

TABLE = PriceTable(
    provider="test", region="r", as_of="2024-01-01", source="s", vcpu_hour_usd=0.036, gpu_hour_usd=3.6
)


def test_cpu_variant_holds_one_vcpu_per_thread() -> None:
    t1 = VariantSpec(architecture="a", runtime="onnxruntime", threads=1)
    t2 = VariantSpec(architecture="a", runtime="onnxruntime", threads=2)
    assert price_usd_per_s(t1, TABLE) == pytest.approx(0.036 / 3600)
    assert price_usd_per_s(t2, TABLE) == pytest.approx(2 * 0.036 / 3600)


def test_gpu_variant_holds_a_gpu() -> None:
    gpu = VariantSpec(architecture="a", runtime="onnxruntime", hardware="gpu", threads=2)
    assert price_usd_per_s(gpu, TABLE) == pytest.approx(0.001)


def test_cost_per_thousand_rows() -> None:
    # $0.00001/s × 2 ms per batch of 8 rows = 2e-8 USD per batch = 2.5e-9 per row = 2.5e-6 per 1 000.
    assert cost_usd_per_1k(1e-5, 2.0, 8) == pytest.approx(2.5e-6)
    assert cost_pusd_per_row(1e-5, 2.0, 8) == 2500
    with pytest.raises(ValueError):
        cost_usd_per_1k(1e-5, 2.0, 0)


def test_pico_dollars_do_not_round_a_fast_query_to_zero() -> None:
    price = price_usd_per_s(VariantSpec(architecture="a", runtime="onnxruntime"), DEFAULT_PRICE_TABLE)
    pusd = cost_pusd_per_row(price, 0.01, 1)
    assert pusd > 0
    assert pusd / PUSD_PER_USD == pytest.approx(price * 0.01 / 1000.0, rel=1e-2)


def test_agrees_with_profile_cost_at_measured_points() -> None:
    price = 2e-5
    points = tuple(
        LatencyPoint(
            batch=b,
            p50_ms=m,
            p95_ms=m,
            p99_ms=m,
            mean_ms=m,
            throughput_qps=b * 1000 / m,
            samples=10,
            stable=True,
            stop_reason="stable",
            cost_usd_per_1k=cost_usd_per_1k(price, m, b),
        )
        for b, m in ((1, 0.4), (8, 1.0), (32, 3.0))
    )
    profile = Profile(
        variant="a/x",
        machine=MachineInfo(cpu_model="c", cores=2),
        measured_at_s=0.0,
        points=points,
        price_usd_per_s=price,
    )
    for p in points:
        assert profile.cost_usd_per_1k(p.batch) == pytest.approx(p.cost_usd_per_1k)


def test_default_table_names_its_source_and_date() -> None:
    assert load_price_table(None) is DEFAULT_PRICE_TABLE
    assert "cloud.google.com" in DEFAULT_PRICE_TABLE.source
    assert DEFAULT_PRICE_TABLE.as_of[:2] == "20"


def test_table_from_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(TABLE.model_dump()))
    assert load_price_table(path) == TABLE


def test_bad_table_files_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        load_price_table(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"provider": "x"}))
    with pytest.raises(InvalidInput, match="vcpu_hour_usd"):
        load_price_table(bad)
    bad.write_text("{not json")
    with pytest.raises(InvalidInput, match="not valid"):
        load_price_table(bad)
