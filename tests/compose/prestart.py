"""The compose tests' own stack, and starting it ahead of them while the linters run.

``tests/compose/test_stack_running.py`` runs against one stack of its own (project
:data:`PROJECT`, host ports :data:`PORTS`, the settings of :func:`stack_env`). Bringing it up takes
about 5 minutes on 2 cores, mostly containers starting and waiting on each other, so the README's
test command (``scripts/test.sh``, full run only) starts it in the background with
``python -m tests.compose.prestart up`` while the linters and the service-free subset run, and
passes the process id on as ``TF_TEST_STACK_PRESTART_PID`` and its log as
``TF_TEST_STACK_PRESTART_LOG``. The test module's fixture waits for that process
(:func:`wait_for_prestart`) and uses the stack when the head start ended well
(:func:`prestart_succeeded`); otherwise it runs ``scripts/stack.sh up`` itself (``up`` again on a
healthy stack would run its one-shot ``airflow-init`` once more: minutes on 2 cores).
``python -m tests.compose.prestart down`` removes the stack (scripts/test.sh does at its end).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Mapping

from tests.compose.stack import ROOT
from tritonflow.demo.stack import shifted_ports

#: Host ports of the tests' stack (published on 127.0.0.1 only), away from the compose defaults.
PORTS = shifted_ports(10000)
PROJECT = "tritonflow-test"
#: The receiver's secret in the tests' stack (the compose file's default is empty: no delivery passes).
WEBHOOK_SECRET = "stack-test-webhook-secret"
#: The environment variable naming the background ``prestart up`` process.
PRESTART_PID_VARIABLE = "TF_TEST_STACK_PRESTART_PID"
#: The environment variable naming the head start's log, whose last line is :data:`DONE` and its status.
PRESTART_LOG_VARIABLE = "TF_TEST_STACK_PRESTART_LOG"
DONE = "prestart: scripts/stack.sh up exited with"
#: Seconds the fixture waits for a head start still running (a cold image build included).
PRESTART_WAIT_S = 3600


def stack_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` plus what the tests' stack runs with: project, ports, short bakes and timeouts."""
    return {**base, "COMPOSE_PROJECT_NAME": PROJECT, **{k: str(v) for k, v in PORTS.items()},
            "TRITONFLOW_STACK_WORKERS": "2", "TRITONFLOW_CANARY_BAKE_S": "5",
            # a lost worker's task is failed after 90 s: above the promotion lease's 60 s TTL
            "AIRFLOW_TASK_HEARTBEAT_TIMEOUT_S": "90",
            "TRITONFLOW_WEBHOOK_SECRET": WEBHOOK_SECRET}


def stack_sh(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``scripts/stack.sh ARGS`` for the tests' stack (output captured)."""
    return subprocess.run(["bash", str(ROOT / "scripts/stack.sh"), *args], cwd=ROOT, env=stack_env(os.environ),
                          capture_output=True, text=True, timeout=timeout)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_for_prestart(env: Mapping[str, str], timeout_s: float = PRESTART_WAIT_S) -> None:
    """Return once the head start named by ``TF_TEST_STACK_PRESTART_PID`` (if any) has ended."""
    pid = env.get(PRESTART_PID_VARIABLE, "")
    if not pid.isdigit():
        return
    deadline = time.monotonic() + timeout_s
    while _running(int(pid)) and time.monotonic() < deadline:
        time.sleep(2)


def prestart_succeeded(env: Mapping[str, str]) -> bool:
    """Whether a head start ran and ``scripts/stack.sh up`` ended with status 0 (every service healthy)."""
    log = env.get(PRESTART_LOG_VARIABLE, "")
    try:
        lines = open(log).read().strip().splitlines() if log else []
    except OSError:
        return False
    return bool(lines) and lines[-1] == f"{DONE} 0"


def main(argv: list[str]) -> int:
    """``up`` or ``down`` the tests' stack; the output of ``scripts/stack.sh`` goes to standard error."""
    if argv not in (["up"], ["down"]):
        print("usage: python -m tests.compose.prestart up|down", file=sys.stderr)
        return 2
    args = ("up",) if argv == ["up"] else ("down", "--volumes")
    proc = stack_sh(*args, timeout=PRESTART_WAIT_S)
    sys.stderr.write(proc.stdout + proc.stderr)
    sys.stderr.flush()
    print(f"{DONE} {proc.returncode}", flush=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
