"""What the modes came to: a table per mode and tenant, the ratios model-less vs each baseline,
and a self-contained SVG (replicas, answered p99 and fleet cost per second, one line per mode)
drawn as `scripts/bench_loadstep.py` draws the real service's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infaas.sim.engine import ModeResult

__all__ = ["ratios", "svg", "table"]

COLORS = {"modelless": "#1f77b4", "static": "#888888", "replicate-only": "#ff7f0e"}


def table(results: Sequence[ModeResult], per_tenant: bool = True) -> Table:
    """Per mode (and, under it, per tenant): queries, in SLO, late, 429, 504, 422, goodput,
    charged and fleet cost."""
    out = Table(title="simulated: per mode and tenant")
    for name in ("mode / tenant", "queries", "in SLO", "late", "429", "504", "422", "violations"):
        out.add_column(name, justify="left" if name == "mode / tenant" else "right")
    for name in ("goodput /s", "charged USD", "fleet USD"):
        out.add_column(name, justify="right")
    for r in results:
        t = r.total
        served = max(1, t.queries - t.infeasible)
        out.add_row(
            f"[bold]{r.mode}[/]",
            f"{t.queries:,}",
            f"{t.in_slo:,}",
            f"{t.late:,}",
            f"{t.refused:,}",
            f"{t.dropped + t.failed:,}",
            f"{t.infeasible:,}",
            f"{t.violations / served:.2%}",
            f"{r.goodput:,.1f}",
            f"{t.charged_usd:.6f}",
            f"{r.fleet_usd:.6f}",
        )
        if per_tenant:
            for tr in r.tenants:
                out.add_row(
                    f"  {tr.tenant}",
                    f"{tr.queries:,}",
                    f"{tr.in_slo:,}",
                    f"{tr.late:,}",
                    f"{tr.refused:,}",
                    f"{tr.dropped + tr.failed:,}",
                    f"{tr.infeasible:,}",
                    f"{tr.violations / max(1, tr.queries - tr.infeasible):.2%}",
                    f"{tr.in_slo / r.duration_s if r.duration_s else 0.0:,.1f}",
                    f"{tr.charged_usd:.6f}",
                    "",
                )
    return out


def _ratio(num: float, den: float) -> str:
    if den == 0:
        return "n/a" if num == 0 else "∞"
    return f"{num / den:.2f}×"


def ratios(results: Sequence[ModeResult]) -> list[str]:
    """Model-less against each baseline, in the terms of issue 11's goals: how many times fewer
    violations and lower fleet cost, how many times the goodput."""
    by_mode = {r.mode: r for r in results}
    ml = by_mode.get("modelless")
    if ml is None:
        return []
    lines = []
    for base in ("static", "replicate-only"):
        b = by_mode.get(base)
        if b is None:
            continue
        lines.append(
            f"model-less vs {base}: {_ratio(b.violation_rate, ml.violation_rate)} fewer SLO violations "
            f"({b.violation_rate:.2%} → {ml.violation_rate:.2%}), "
            f"{_ratio(b.fleet_usd, ml.fleet_usd)} lower fleet cost, "
            f"{_ratio(ml.goodput, b.goodput)} the goodput"
        )
    return lines


def print_report(
    results: Sequence[ModeResult], console: Console | None = None, per_tenant: bool = True
) -> None:
    console = console or Console()
    console.print(table(results, per_tenant))
    for line in ratios(results):
        console.print(line)


def svg(results: Sequence[ModeResult], path: Path) -> None:
    """Replicas, answered p99 and fleet cost (USD/h) per second of virtual time, one line per mode."""
    charts = (
        ("replicas", "replicas (loaded or loading)"),
        ("p99_ms", "answered p99 (ms)"),
        ("usd_h", "fleet USD/h"),
    )
    w, h, pad = 720, 150, 44
    series: dict[str, list[tuple[float, dict[str, float | None]]]] = {}
    for r in results:
        series[r.mode] = [
            (
                p.t_s,
                {
                    "replicas": float(sum(p.replicas.values())),
                    "p99_ms": p.p99_ms,
                    "usd_h": p.usd_per_s * 3600.0,
                },
            )
            for p in r.timeline
        ]
    total_s = max((t for s in series.values() for t, _ in s), default=1.0) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{len(charts) * (h + 32) + 30}">']
    parts.append("<style>text{font:11px sans-serif}</style>")
    step = max(1, round(total_s / 10))
    for i, (key, title) in enumerate(charts):
        top = 20 + i * (h + 32)
        values = [v[key] for s in series.values() for _, v in s if v[key] is not None]
        vmax = max([float(x) for x in values if x is not None] + [1e-12]) * 1.1
        parts.append(f'<text x="{pad}" y="{top - 4}">{title} (max {vmax / 1.1:.3g})</text>')
        parts.append(
            f'<rect x="{pad}" y="{top}" width="{w - 2 * pad}" height="{h}" fill="none" stroke="#ccc"/>'
        )
        for t in range(0, int(total_s) + 1, step):
            x = pad + (w - 2 * pad) * t / total_s
            parts.append(f'<text x="{x:.1f}" y="{top + h + 12}" text-anchor="middle">{t} s</text>')
        for mode, s in series.items():
            points = " ".join(
                f"{pad + (w - 2 * pad) * t / total_s:.1f},{top + h - h * y / vmax:.1f}"
                for t, v in s
                if (y := v[key]) is not None
            )
            color = COLORS.get(mode, "#000")
            parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    legend_y = len(charts) * (h + 32) + 20
    for j, mode in enumerate(series):
        parts.append(
            f'<text x="{pad + j * 140}" y="{legend_y}" fill="{COLORS.get(mode, "#000")}">— {mode}</text>'
        )
    parts.append("</svg>")
    path.write_text("\n".join(parts))
