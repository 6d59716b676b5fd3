# Sourced by the scripts: make sure the virtual environment exists and holds the project.
# TRACESTORE_VENV chooses where (default: .venv in the checkout); CI points it at a new
# folder so every run builds from the project's files alone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRACESTORE_VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3}"
EXTRAS="${1:-}"
stamp="$VENV/.tracestore-installed$EXTRAS"
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtual environment in $VENV" >&2
  "$PYTHON_BIN" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
# Reinstall when pyproject.toml (the server's or the client's) changed since the last install.
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] \
  || [ "$ROOT/client/pyproject.toml" -nt "$stamp" ]; then
  echo "installing tracestore-client and tracestore${EXTRAS} into $VENV" >&2
  # The server depends on tracestore-client (client/): both in one pip run, the client
  # first, so that dependency is this checkout's client and no index is asked for it.
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT/client" -e "$ROOT$EXTRAS"
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
