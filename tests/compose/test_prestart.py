"""The compose tests' head start (tests/compose/prestart.py): when the fixture uses it, when it waits."""

from __future__ import annotations

import subprocess

from tests.compose.prestart import (
    DONE,
    PRESTART_LOG_VARIABLE,
    PRESTART_PID_VARIABLE,
    prestart_succeeded,
    wait_for_prestart,
)


def test_the_stack_is_used_only_when_the_head_start_ended_with_every_service_healthy(tmp_path):
    log = tmp_path / "prestart.log"
    assert not prestart_succeeded({})  # no head start
    assert not prestart_succeeded({PRESTART_LOG_VARIABLE: str(log)})  # its log is missing
    log.write_text("[stack] building\n")
    assert not prestart_succeeded({PRESTART_LOG_VARIABLE: str(log)})  # still running or killed
    log.write_text(f"[stack] waiting\n{DONE} 1\n")
    assert not prestart_succeeded({PRESTART_LOG_VARIABLE: str(log)})  # up failed: the fixture starts it
    log.write_text(f"[stack] every service is healthy\n{DONE} 0\n")
    assert prestart_succeeded({PRESTART_LOG_VARIABLE: str(log)})


def test_the_fixture_waits_for_a_head_start_still_running_and_not_for_one_that_ended():
    proc = subprocess.Popen(["sleep", "2"])
    wait_for_prestart({PRESTART_PID_VARIABLE: str(proc.pid)})
    assert proc.poll() is not None  # it returned only once the head start had ended
    # an ended (and reaped) head start, or none at all: it returns at once (a hang fails by timeout)
    wait_for_prestart({PRESTART_PID_VARIABLE: str(proc.pid)})
    wait_for_prestart({})
