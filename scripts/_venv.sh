# Sourced by scripts/demo and scripts/test: make .venv (Python >= 3.11) and install the project into it.
# Usage: ensure_venv [extra]   e.g. ensure_venv dev
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

find_python() {
  for py in python3.11 python3.12 python3.13 python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      echo "$py"; return 0
    fi
  done
  echo "error: Python >= 3.11 is needed; install it and run this again." >&2
  return 1
}

ensure_venv() {
  local extra="${1:-}"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "==> creating $VENV"
    "$(find_python)" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
  fi
  local target="$ROOT"
  [ -n "$extra" ] && target="$ROOT[$extra]"
  # Re-install only when pyproject.toml changed since the last install of this extra.
  local stamp="$VENV/.installed-${extra:-base}"
  if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    echo "==> installing infaas${extra:+[$extra]} into .venv (first time: a few minutes)"
    local log="$VENV/pip-install.log"
    if ! "$VENV/bin/python" -m pip install -q -e "$target" >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "error: pip install failed (full log: $log). Check the network access to the package index." >&2
      return 1
    fi
    touch "$stamp"
  fi
}
