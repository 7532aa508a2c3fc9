#!/usr/bin/env bash
# The test command: set up a fresh machine (idempotent), make sure PostgreSQL and Redis are up,
# then run the linters and the whole test suite against real local services. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/ensure_services.sh
set +e
# Linters first (ruff + mypy, zero findings; configured in pyproject.toml); the tests run either way.
bash scripts/lint.sh
lint_rc=$?
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
if [ "$lint_rc" -ne 0 ] && [ "$rc" -eq 0 ]; then
  echo "the linters reported findings (scripts/lint.sh): that is a failure" >&2
  exit 1
fi
exit "$rc"
