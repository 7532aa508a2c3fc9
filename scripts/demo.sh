#!/usr/bin/env bash
# The README's first command: set up this machine (idempotent), then run tritonflow's whole loop
# on the NOAA weather data on a real local Airflow deployment (scheduler, dag-processor, triggerer,
# api-server, LocalExecutor, SQLite) beside MLflow, Triton and the NGINX gateway, and write an
# HTML report. The last line printed is one JSON object with the benchmarks.
#
#   bash scripts/demo.sh            # the full replay (docs/main-job.md: the time it takes)
#   bash scripts/demo.sh --quick    # the smallest sweep (a few minutes)
#   bash scripts/demo.sh --keep-running   # leave the Airflow UI, MLflow UI and gateway up
#   bash scripts/demo.sh --help     # every option
#
# Re-runnable: services left by a previous run are stopped and the demo's state folder
# (TRITONFLOW_HOME, default .tritonflow/demo) is wiped before anything starts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITONFLOW_HOME="${TRITONFLOW_DEMO_HOME:-$PWD/.tritonflow/demo}"
if [ -d "$TRITONFLOW_HOME/run" ]; then
  # Leftovers of an interrupted run: stop them by their pid files (never by name).
  .venv/bin/python -m tritonflow.cli runtime stop >/dev/null 2>&1 || true
fi
exec .venv/bin/python -m tritonflow.demo --home "$TRITONFLOW_HOME" "$@"
