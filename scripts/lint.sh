#!/usr/bin/env bash
# Linters: ruff (pycodestyle, pyflakes, bugbear, isort, Airflow AIR and Google-style docstring
# rules) on the whole tree, then mypy on the packages. Both are configured in pyproject.toml.
# Exits non-zero when either reports a finding. Extra arguments go to ruff (e.g. --statistics).
set -uo pipefail
cd "$(dirname "$0")/.."
rc=0
echo "ruff check ." >&2
.venv/bin/ruff check . "$@" || rc=1
# mypy reads its files (the packages and the Airflow plugin) from [tool.mypy] in pyproject.toml.
echo "mypy (packages: ground tritonflow model_registry drift_checks repository_sync plugins/tritonflow_plugin)" >&2
.venv/bin/mypy || rc=1
# tests/README.md maps the shared cases to tests: every test it cites must exist.
echo "tests/README.md case map (scripts/check_test_map.py)" >&2
.venv/bin/python scripts/check_test_map.py || rc=1
exit "$rc"
