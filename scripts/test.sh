#!/usr/bin/env bash
# The test command: set up a fresh machine (idempotent), make sure PostgreSQL and Redis are up,
# then run the linters, the service-free subset and the rest of the suite against real local services.
# Extra arguments go to pytest (and skip the separate service-free step).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/ensure_services.sh
set +e
# The full run only: the compose tests' stack starts in the background while the linters and the
# service-free subset run (tests/compose/prestart.py; its fixture waits for it), about 5 minutes of
# containers starting that the run would otherwise wait for.
if [ "$#" -eq 0 ] && [ "${TF_TEST_STACK_PRESTART:-1}" = 1 ]; then
  mkdir -p "${XDG_CACHE_HOME:-$HOME/.cache}/tritonflow"
  prestart_log="${XDG_CACHE_HOME:-$HOME/.cache}/tritonflow/test-stack-prestart.log"
  .venv/bin/python -m tests.compose.prestart up > "$prestart_log" 2>&1 &
  export TF_TEST_STACK_PRESTART_PID=$! TF_TEST_STACK_PRESTART_LOG=$prestart_log
  echo "[test] the compose tests' stack is starting in the background (log $prestart_log)"
fi
# remove_test_stack: once the head start (if any) has ended, remove the stack it started.
remove_test_stack() {
  if [ -n "${TF_TEST_STACK_PRESTART_PID:-}" ]; then
    wait "$TF_TEST_STACK_PRESTART_PID"
    .venv/bin/python -m tests.compose.prestart down >/dev/null 2>&1
  fi
}
# Linters first (ruff + mypy, zero findings; configured in pyproject.toml); the tests run either way.
bash scripts/lint.sh
lint_rc=$?
# Without extra arguments, the service-free subset (-m "not integration") runs first, in a network
# namespace with only a loopback of its own where the machine allows one (unshare -n), so a test
# that needs a service fails there; its failure ends the command before the long full run.
if [ "$#" -eq 0 ]; then
  subset=(.venv/bin/python -m pytest -q -m "not integration")
  if unshare -n sh -c 'ip link set lo up' 2>/dev/null; then
    unshare -n sh -c 'ip link set lo up && exec "$@"' sh "${subset[@]}"
  else
    "${subset[@]}"
  fi
  subset_rc=$?
  if [ "$subset_rc" -ne 0 ]; then
    echo "the service-free subset (-m \"not integration\") failed (rc $subset_rc): the full run is skipped" >&2
    remove_test_stack
    exit 1
  fi
  # The subset passed: the full run takes the rest, not those tests a second time, as three pytest
  # processes side by side (scripts/test_groups.sh): most of it waits on services, not on the CPU.
  # The test marked `long` (the quick loop in a compose stack of its own) runs in the stack group
  # after the other stack tests have removed theirs; bash scripts/test.sh -m long runs it alone.
  bash scripts/test_groups.sh
  rc=$?
else
  .venv/bin/python -m pytest "$@"
  rc=$?
fi
# The compose tests remove their stack; this removes it too when they did not run (a -k filter in
# PYTEST_ADDOPTS, an interrupted run). Nothing to do on a stack already removed.
remove_test_stack
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
