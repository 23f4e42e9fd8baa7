"""The report: ratios in the issue's terms, and a self-contained SVG."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infaas.sim.engine import SimConfig, simulate
from infaas.sim.report import ratios, svg, table
from infaas.sim.traces import poisson
from infaas.sim.zoo import mixed_tenants, synthetic_zoo


def test_the_report_compares_modelless_with_each_baseline_and_plots_them(tmp_path: Path) -> None:
    zoo = synthetic_zoo(1, 8, seed=2)
    trace = poisson([(4.0, 200.0)], mixed_tenants(zoo), np.random.default_rng(1))
    cfg = SimConfig(workers=1, cores=8)
    results = [simulate(zoo, trace, mode, cfg) for mode in ("modelless", "static", "replicate-only")]
    lines = ratios(results)
    assert [line.split(":")[0] for line in lines] == ["model-less vs static", "model-less vs replicate-only"]
    assert table(results).row_count == 3 + 3 * len(trace.tenants)
    path = tmp_path / "sim.svg"
    svg(results, path)
    text = path.read_text()
    assert (
        text.startswith("<svg")
        and text.count("<polyline") == 9
        and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )
