"""`infaas usage` tables rendered from a report (no server)."""

from __future__ import annotations

from rich.console import Console

from infaas.types import UsageKey, UsageRecord
from infaas.usage import UsageWindow, build_report
from infaas.usage_table import tenants_table, variants_table, window_line


def render(*tables: object) -> str:
    console = Console(record=True, width=120)
    for t in tables:
        console.print(t)
    return console.export_text()


def test_tables_show_the_report() -> None:
    rows = [
        UsageRecord(
            key=UsageKey(tenant=t, task="digits", variant=v, minute=29_450_000),
            counters={"queries": q, "cost_pusd": c, "slo_met": q - 1, "slo_missed": 1, "lat_le_5": q},
        )
        for t, v, q, c in [
            ("acme", "digits-lr/onnx-cpu-int8-t1", 40, 1_234_000),
            ("beta", "digits-lr/sk", 2, 10**12),
        ]
    ]
    report = build_report(rows, UsageWindow(from_s=29_450_000 * 60, to_s=29_450_060 * 60, step_s=600))
    text = render(tenants_table(report), variants_table(report))
    acme = next(line for line in text.splitlines() if " acme " in line)
    assert "40" in acme and "1.234e-06" in acme and "97.5 %" in acme
    beta = next(line for line in text.splitlines() if " beta " in line)
    assert "1.00" in beta and "50.0 %" in beta
    total = next(line for line in text.splitlines() if "total" in line)
    assert " 42 " in total
    assert text.index("digits-lr/sk") < text.index("digits-lr/onnx-cpu-int8-t1")  # costliest first
    assert window_line(report) == "2025-12-29 09:20 – 2025-12-29 10:20 UTC, 6 buckets of 10 min"
