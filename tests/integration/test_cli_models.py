"""`infaas zoo install`, `register`, `models`, `variants` against a real SQLite data dir."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from infaas.cli import app
from tests import tiny_models


def test_zoo_register_models_variants(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"INFAAS_DATA_DIR": str(tmp_path / "data"), "INFAAS_ADMIN_KEY": "k", "COLUMNS": "200"}

    r = runner.invoke(app, ["zoo", "install", "--only", "digits-logreg", "--no-profile"], env=env)
    assert r.exit_code == 0, r.output
    assert "digits-logreg" in r.output and "installed 1 architecture(s), 3 variant(s)" in r.output

    # Installing again is refused with the way out; --if-missing is a no-op.
    r = runner.invoke(app, ["zoo", "install", "--only", "digits-logreg", "--no-profile"], env=env)
    assert r.exit_code == 1 and "--if-missing" in r.output
    r = runner.invoke(app, ["zoo", "install", "--only", "digits-logreg", "--if-missing"], env=env)
    assert r.exit_code == 0 and "nothing to install" in r.output

    # A second architecture of the zoo's task: no validation file needed.
    x, y = tiny_models.digits(200)
    model = tmp_path / "lin.onnx"
    model.write_bytes(tiny_models.linear_onnx(x=x, y=y))
    args = ["register", str(model), "--name", "lin", "--task", "digits-classification", "--no-profile"]
    r = runner.invoke(app, args, env=env)
    assert r.exit_code == 0, r.output
    assert "lin/onnx-cpu-fp32-t1" in r.output and "variant(s) kept" in r.output
    assert "lin/onnx-cpu-int8-t1" in r.output  # kept, or listed as not built with its parity

    r = runner.invoke(app, ["models"], env=env)
    assert r.exit_code == 0 and "digits-logreg" in r.output and "lin" in r.output

    r = runner.invoke(app, ["variants", "digits-logreg"], env=env)
    assert r.exit_code == 0
    assert "digits-logreg/sklearn-cpu-fp32-t1" in r.output
    assert "nothing to quantize" in r.output  # the not-built table gives reasons

    r = runner.invoke(app, ["variants", "nope"], env=env)
    assert r.exit_code == 1 and "infaas models" in r.output

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    r = runner.invoke(
        app, ["register", str(bad), "--name", "bad", "--task", "digits-classification"], env=env
    )
    assert r.exit_code == 1 and "error:" in r.output and "ONNX" in r.output
