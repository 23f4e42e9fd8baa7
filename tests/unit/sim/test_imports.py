"""The simulator stands apart from the service's I/O shells: it imports the pure policies and the
modules they need, never the router, the batcher or the autoscaler (nor anything that imports
them)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import infaas.sim

SHELLS = ("infaas.router", "infaas.batching", "infaas.autoscaler")
SIM_DIR = Path(infaas.sim.__file__).parent


def test_importing_the_simulator_loads_none_of_the_service_shells() -> None:
    # A fresh interpreter: this one has long imported them for other tests.
    code = (
        "import infaas.sim.engine, infaas.sim.report, infaas.sim.traces, infaas.sim.zoo, sys, json; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('infaas'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "infaas.sim.engine" in loaded
    assert not loaded.intersection(SHELLS), sorted(loaded.intersection(SHELLS))


def _imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):  # every import, lazy ones in functions too
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_simulator_module_names_a_service_shell_in_an_import() -> None:
    files = sorted(SIM_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"engine.py", "report.py", "traces.py", "zoo.py"}
    for path in files:
        imported = _imported(ast.parse(path.read_text(), filename=str(path)))
        bad = {n for n in imported if any(n == s or n.startswith(f"{s}.") for s in SHELLS)}
        assert not bad, f"{path.name} imports {sorted(bad)}"
