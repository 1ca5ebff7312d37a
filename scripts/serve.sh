#!/usr/bin/env bash
# Install the gateway into .venv (first run only) and start it with the embedded defaults:
# NSQ TCP on 127.0.0.1:4150, no external services.
#   ./scripts/serve.sh [gateway serve flags...]     e.g. --nsq 127.0.0.1:0
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/gateway" ]; then
  # the first run installs the gateway into $VENV: say so, it takes a while
  echo "first run: installing the gateway into $VENV (about half a minute)..." >&2
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e . 2>&1 \
    | grep -vE '^WARNING: Location .* is ignored' || true
  echo "installed; starting: gateway serve $*" >&2
fi
exec "$VENV/bin/gateway" serve "$@"
