#!/usr/bin/env bash
# Install the gateway into .venv (first run only) and start it with the embedded defaults:
# NSQ TCP on 127.0.0.1:4150, no external services.
#   ./scripts/serve.sh [gateway serve flags...]     e.g. --nsq 127.0.0.1:0
# The gateway runs in the directory the script was called from, so relative paths in
# the flags (--config, --data-dir) mean what they say; .venv lives in the repository.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$ROOT/.venv}
if [ ! -x "$VENV/bin/gateway" ]; then
  # the first run installs the gateway into $VENV: say so, it takes a while
  echo "first run: installing the gateway into $VENV (about half a minute)..." >&2
  "$PYTHON" -m venv "$VENV"
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT" \
      > "$VENV/install.log" 2>&1; then
    grep -vE '^WARNING: Location .* is ignored' "$VENV/install.log" >&2 || true
    echo "error: installing the gateway into $VENV failed (the log above, and $VENV/install.log)" >&2
    exit 1
  fi
  echo "installed; starting: gateway serve $*" >&2
fi
exec "$VENV/bin/gateway" serve "$@"
