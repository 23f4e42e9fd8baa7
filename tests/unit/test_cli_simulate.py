"""`infaas simulate`: the command's options reach the simulation (no service, no store)."""

from __future__ import annotations

from typer.testing import CliRunner

from infaas.cli import app


def test_a_mixed_fleet_simulates_with_gpu_variants_and_bad_counts_are_refused() -> None:
    runner = CliRunner()
    args = ["simulate", "--synthetic", "2x10", "--trace", "bursty", "--seconds", "5", "--rate", "100"]
    result = runner.invoke(
        app, [*args, "--workers", "2", "--gpu-workers", "1", "--totals", "--mode", "modelless"]
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # rich wraps lines at the terminal's width
    assert "2 GPU variants per architecture" in said and "1 of them with 1 GPU(s)" in said
    refused = runner.invoke(app, [*args, "--workers", "2", "--gpu-workers", "3"])
    assert refused.exit_code == 2 and "--gpu-workers" in refused.output
