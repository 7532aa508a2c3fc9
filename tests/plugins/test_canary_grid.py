"""Canary step boxes in the grid: each traffic step's verdict becomes its task's state.

Guards: a failed step shown green, a step never reached shown as passed or failed, an extended
step judged on its first attempt instead of its last, and a promotion that stopped before any
step (a refused pre-flight) leaving the boxes skipped, so that the run, whose last tasks they are,
ended green.
"""

from __future__ import annotations

import pytest

from tritonflow_plugin.canary_grid import STEP_RESULTS_KEY, push_step_results, show_step, step_results, step_verdict


def _step(percent, verdict, attempt=1, reason="", requests=120):
    return {"step": 1, "percent": percent, "attempt": attempt, "verdict": verdict, "reason": reason,
            "canary_requests": requests}


ROLLED_BACK = {"outcome": "rolled_back", "reason": "step 25 %: error rate 4 % > 1 %",
               "steps": [_step(5, "pass"), _step(25, "fail", reason="error rate 4 % > 1 %")]}


def test_passed_failed_and_unreached_steps_get_their_own_state():
    assert step_verdict(5, ROLLED_BACK)[0] == "passed"
    state, reason = step_verdict(25, ROLLED_BACK)
    assert state == "failed" and "error rate 4 % > 1 %" in reason and "120 challenger requests" in reason
    state, reason = step_verdict(50, ROLLED_BACK)
    assert state == "not_reached" and "'rolled_back'" in reason


def test_an_extended_step_is_judged_on_its_last_attempt():
    results = {"outcome": "promoted", "reason": "", "steps": [
        _step(50, "inconclusive", attempt=1, requests=3), _step(50, "pass", attempt=2), _step(100, "pass")]}
    assert step_verdict(50, results)[0] == "passed"
    results["steps"][1]["verdict"] = "inconclusive"
    state, reason = step_verdict(50, results)
    assert state == "failed" and reason.startswith("inconclusive")


def test_a_step_a_person_continued_after_an_inconclusive_verdict_is_shown_passed():
    results = {"outcome": "promoted", "reason": "every step passed", "steps": [_step(50, "pass"),
                                                                              _step(100, "inconclusive", requests=3)],
               "decisions": [{"percent": 50, "attempt": 1, "decision": "continue", "by": "alice", "source": "person"},
                             {"percent": 100, "attempt": 1, "decision": "continue", "by": "bob", "source": "person"}]}
    state, reason = step_verdict(100, results)
    assert state == "passed" and reason.startswith("continued by bob at its pause after an inconclusive verdict")
    results["decisions"][1]["decision"] = "hold"  # held, never continued: still not a pass
    assert step_verdict(100, results)[0] == "failed"


@pytest.mark.parametrize("results", [{"outcome": "noop", "reason": "already champion", "steps": []},
                                     {"outcome": "dry_run", "reason": "dry run", "steps": []}])
def test_a_noop_or_dry_run_skips_every_box(results):
    from airflow.sdk.exceptions import AirflowSkipException

    assert step_verdict(100, results)[0] == "not_reached"
    with pytest.raises(AirflowSkipException, match="canary step 100 %"):
        show_step(100, results)


@pytest.mark.parametrize("results", [None, {}])
def test_a_promotion_that_stopped_before_its_first_step_fails_every_box_so_the_run_fails(results):
    """``canary`` failed (pre-flight refused, lock held) or never ran: it pushed no results."""
    from airflow.sdk.exceptions import AirflowFailException

    state, reason = step_verdict(100, results)
    assert state == "failed" and "stopped before its first step" in reason
    with pytest.raises(AirflowFailException, match="canary step 100 %: not run"):
        show_step(100, results)


def test_a_promotion_rolled_back_without_a_failed_step_fails_the_steps_without_a_verdict():
    """E.g. the gateway never served the first step's plan: rolled back before any analysis."""
    from airflow.sdk.exceptions import AirflowFailException

    unserved = {"outcome": "rollback_failed", "reason": "step 1 (25%): plan not live after 15 s", "steps": []}
    for percent in (25, 100):
        state, reason = step_verdict(percent, unserved)
        assert state == "failed" and "'rollback_failed' before any step verdict" in reason and "not live" in reason
    with pytest.raises(AirflowFailException, match="canary step 25 %: not run"):
        show_step(25, unserved)
    later = {"outcome": "rolled_back", "reason": "step 2 (100%): plan not live", "steps": [_step(25, "pass")]}
    assert step_verdict(25, later)[0] == "passed" and step_verdict(100, later)[0] == "failed"


def test_show_step_fails_a_failed_step_without_retry_and_returns_a_passed_one():
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match=r"canary step 25 %: fail: .*error rate"):
        show_step(25, ROLLED_BACK)
    assert show_step(5, ROLLED_BACK) == {"percent": 5, "state": "passed", "reason": step_verdict(5, ROLLED_BACK)[1]}


def test_the_promotion_result_round_trips_through_xcom():
    class Ti:
        def __init__(self):
            self.store = {}

        def xcom_push(self, key, value):
            self.store[key] = value

        def xcom_pull(self, task_ids, key):
            assert task_ids == "canary"
            return self.store.get(key)

    ti = Ti()
    push_step_results({"ti": ti}, {**ROLLED_BACK, "model": "m", "promotion": None})
    assert set(ti.store[STEP_RESULTS_KEY]) == {"outcome", "reason", "steps", "decisions"}
    assert step_results({"ti": ti}) == {**ROLLED_BACK, "decisions": []}
