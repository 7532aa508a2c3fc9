#!/usr/bin/env bash
# Linters: ruff (pycodestyle, pyflakes, bugbear, isort, Airflow AIR, Google-style docstrings, and the
# complexity/statement caps C901/PLR0915) on the whole tree; mypy on the packages; import-linter's
# contracts (every import points down: docs/architecture.md); scripts/check_code_shape.py (no use of
# another module's underscore names, no function over 80 lines); the case map of tests/README.md.
# All are configured in pyproject.toml. Exits non-zero when any reports a finding; each runs either
# way. Extra arguments go to ruff (e.g. --statistics).
set -uo pipefail
cd "$(dirname "$0")/.."
rc=0
echo "ruff check ." >&2
.venv/bin/ruff check . "$@" || rc=1
# mypy reads its files (the packages and the Airflow plugin) from [tool.mypy] in pyproject.toml.
# Its cache lives in the user's cache folder, not the checkout: a fresh clone on the same machine
# (CI's) reuses it, since mypy accepts a cached module whose path moved when its hash is unchanged.
# A cold cache costs about 14 minutes on 2 cores, a warm one about 2.
export MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tritonflow/mypy}
echo "mypy (packages: ground tritonflow model_registry drift_checks repository_sync plugins/tritonflow_plugin)" >&2
.venv/bin/mypy || rc=1
# The plugin package lives under plugins/ (Airflow's plugins folder), so it goes on the path.
echo "lint-imports (layers and acyclic siblings: [tool.importlinter] in pyproject.toml)" >&2
PYTHONPATH="plugins:.${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/lint-imports --no-cache || rc=1
echo "scripts/check_code_shape.py (public seams, functions <= 80 lines)" >&2
.venv/bin/python scripts/check_code_shape.py || rc=1
# tests/README.md maps the shared cases to tests: every test it cites must exist.
echo "tests/README.md case map (scripts/check_test_map.py)" >&2
.venv/bin/python scripts/check_test_map.py || rc=1
exit "$rc"
