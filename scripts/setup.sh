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
# A checkout without environments gets them from a per-user cache keyed by their inputs
# (TRITONFLOW_ENV_CACHE, default ~/.cache/tritonflow/envs; "off" builds them in the checkout):
# .venv and .venv-triton become links to environments built there once, so a fresh clone on the
# same machine (CI's) sets up in seconds instead of minutes. A checkout that has its own keeps them.
ENV_CACHE=${TRITONFLOW_ENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tritonflow/envs}
# link_cached NAME KIND KEY: when ./NAME is missing, link it to the cached environment KIND-KEY.
# Environments are built at their cached path (their scripts' #! lines name it), never via the link.
link_cached() {
  [ "$ENV_CACHE" != off ] && [ ! -e "$1" ] && [ ! -L "$1" ] || return 0
  mkdir -p "$ENV_CACHE"
  ln -s "$(realpath -m "$ENV_CACHE/$2-$3")" "$1"
  # keep the two newest of each kind: older inputs' environments are only disk
  { ls -dt "$ENV_CACHE/$2"-* 2>/dev/null || true; } | tail -n +3 | xargs -r rm -rf
}
want=$(stamp requirements.txt constraints/constraints.txt constraints/requirements-nodeps.txt pyproject.toml)
link_cached .venv app "$want"
VENV=$(realpath -m .venv)
if [ "$(cat .venv/.tritonflow-stamp 2>/dev/null)" != "$want" ]; then
  echo "[setup] creating .venv (application environment)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q -U pip wheel setuptools
  "$VENV/bin/python" -m pip install -q -r requirements.txt -c constraints/constraints.txt
  # whylogs pins platformdirs<4 but runs with 4 (needed by model-signing): install it without deps.
  "$VENV/bin/python" -m pip install -q --no-deps -r constraints/requirements-nodeps.txt
  rm -f .venv/.tritonflow-checkout
  echo "$want" > .venv/.tritonflow-stamp
fi
# tritonflow itself, editable from this checkout (again when the environment was built for another).
if [ "$(cat .venv/.tritonflow-checkout 2>/dev/null)" != "$ROOT" ]; then
  "$VENV/bin/python" -m pip install -q --no-deps -e .
  echo "$ROOT" > .venv/.tritonflow-checkout
fi

# ---------------------------------------------------------------- Triton tools environment
link_cached .venv-triton triton "$(stamp requirements-triton.txt scripts/setup_triton_env.sh)"
bash scripts/setup_triton_env.sh
echo "[setup] done"
