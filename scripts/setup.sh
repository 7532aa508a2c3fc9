#!/usr/bin/env bash
# One-shot set-up of a fresh machine (Debian 12, Python 3.11): system packages, the application
# environment (.venv) and the Triton tools environment (.venv-triton). Safe to re-run: each step
# is skipped when its stamp file says it is already done for the same inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${TRITONFLOW_PYTHON:-python3.11}

stamp() { sha256sum "$@" | sha256sum | cut -c1-16; }

# ---------------------------------------------------------------- system packages
need_apt=()
for pkg in libb64-0d nginx-light chromium chromium-driver; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
# Spark (the drift engine for partitioned logs, and its tests) needs a Java 17 runtime
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
# PostgreSQL (Airflow metadata DB, MLflow backend, shared coordination/drift DB in the real-deployment
# tests) and Redis (Celery broker): a fresh Debian 12 machine has neither.
command -v pg_ctlcluster >/dev/null 2>&1 || need_apt+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# The docker-compose stack (scripts/stack.sh, tests/compose): Debian's Docker Engine and compose, and
# debootstrap for the Debian root of the stand-in images (docs/stack.md).
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
fi

# ---------------------------------------------------------------- application environment
want=$(stamp requirements.txt constraints/constraints.txt constraints/requirements-nodeps.txt pyproject.toml)
if [ "$(cat .venv/.tritonflow-stamp 2>/dev/null)" != "$want" ]; then
  echo "[setup] creating .venv (application environment)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q -U pip wheel setuptools
  .venv/bin/pip install -q -r requirements.txt -c constraints/constraints.txt
  # whylogs pins platformdirs<4 but runs with 4 (needed by model-signing): install it without deps.
  .venv/bin/pip install -q --no-deps -r constraints/requirements-nodeps.txt
  .venv/bin/pip install -q --no-deps -e .
  echo "$want" > .venv/.tritonflow-stamp
fi

# ---------------------------------------------------------------- Triton tools environment
bash scripts/setup_triton_env.sh
echo "[setup] done"
