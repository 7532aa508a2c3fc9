"""One grid box per canary traffic step: the promotion's step verdicts shown as task states.

The promotion itself stays one task (``canary``) because it holds the model's promotion lease
from the first step to the promotion or rollback; splitting it would let another promotion in
between steps. So the grid can still show each step, ``canary`` pushes its step verdicts to XCom
(:func:`push_step_results`, also when it then fails on a rollback) and a mapped task with one
instance per step percent (:func:`show_step`) turns each into a state:

* **success** -- the step passed (its last attempt, after any extensions), or a person continued
  it at its pause (promotion policy ``approve-steps``) after an inconclusive verdict;
* **failed** -- the step failed or stayed inconclusive (the reason is the task's error), or the
  promotion failed without any step verdict saying so: it stopped before it recorded anything
  (``canary`` failed, e.g. a refused pre-flight or a held lock, or never ran) or ended
  rolled back with no failed step (e.g. the gateway never served the first step's plan). The
  boxes are the run's last tasks, so Airflow marks the run *failed* only when one of them fails;
* **skipped** -- the canary never reached the step (an earlier step failed, a no-op or dry run).

Nothing here touches traffic, the lease or the registry.
"""

from __future__ import annotations

from typing import Any, Mapping

#: XCom key of the step verdicts pushed by the ``canary`` task.
STEP_RESULTS_KEY = "canary_steps"
#: Task id of the promotion task whose verdicts are shown.
CANARY_TASK_ID = "canary"
#: Outcomes of a promotion that ended without failing (``run_promotion``'s other outcomes fail it).
SUCCESS_OUTCOMES = frozenset({"promoted", "noop", "routed", "dry_run"})


def push_step_results(context: Mapping[str, Any], result: Mapping[str, Any]) -> None:
    """Push ``{"outcome", "reason", "steps", "decisions"}`` of a promotion result for the step boxes."""
    context["ti"].xcom_push(key=STEP_RESULTS_KEY, value={
        "outcome": result.get("outcome"), "reason": result.get("reason") or "",
        "steps": list(result.get("steps") or []),
        "decisions": [{k: d.get(k) for k in ("percent", "attempt", "decision", "by", "source")}
                      for d in result.get("decisions") or []]})


def step_results(context: Mapping[str, Any]) -> dict[str, Any] | None:
    """The step verdicts the ``canary`` task of this run pushed (``None`` when it pushed none)."""
    return context["ti"].xcom_pull(task_ids=CANARY_TASK_ID, key=STEP_RESULTS_KEY)


def _last(steps: list[Mapping[str, Any]], percent: Any) -> Mapping[str, Any]:
    """The last attempt recorded for the step of ``percent`` (one exists)."""
    attempts = [s for s in steps if int(s.get("percent", -1)) == int(percent)]
    return max(attempts, key=lambda s: int(s.get("attempt") or 0))


def step_verdict(percent: int, results: Mapping[str, Any] | None) -> tuple[str, str]:
    """The state of the box of step ``percent`` and why.

    Args:
        percent: Challenger traffic share of the step, percent.
        results: What :func:`push_step_results` pushed, or ``None``.

    Returns:
        ``("passed" | "failed" | "not_reached", reason)``; ``failed`` covers the verdicts ``fail``
        and ``inconclusive`` of the step's last attempt, and no ``results`` at all (the ``canary``
        task pushes them whenever it ends normally or after a rollback, so none means it failed
        before its first step or never ran), and a step without a verdict of a promotion that
        failed (not one of :data:`SUCCESS_OUTCOMES`) with no failed step.
    """
    if not results:
        return "failed", (f"not run: the promotion stopped before its first step (task {CANARY_TASK_ID!r} "
                          "failed or did not run; its log, or its upstream task's, says why)")
    steps = list(results.get("steps") or [])
    attempts = [s for s in steps if int(s.get("percent", -1)) == int(percent)]
    if not attempts:
        outcome, reason = results.get("outcome"), results.get("reason") or ""
        if outcome not in SUCCESS_OUTCOMES and not any(_last(steps, s.get("percent")).get("verdict") != "pass"
                                                       for s in steps):
            return "failed", f"not run: the canary ended with {outcome!r} before any step verdict ({reason})"
        return "not_reached", f"not reached: the canary ended with {outcome!r} before this step ({reason})"
    last = _last(steps, percent)
    verdict = str(last.get("verdict") or "")
    detail = (f"{last.get('canary_requests')} challenger requests, attempt {last.get('attempt')}: "
              f"{last.get('reason') or verdict}")
    if verdict == "pass":
        return "passed", detail
    continued = [d for d in results.get("decisions") or [] if int(d.get("percent", -1)) == int(percent)
                 and d.get("attempt") == last.get("attempt") and d.get("decision") == "continue"]
    if verdict == "inconclusive" and continued:
        who = continued[-1].get("by") or f"nobody ({continued[-1].get('source')})"
        return "passed", f"continued by {who} at its pause after an inconclusive verdict: {detail}"
    return "failed", f"{verdict}: {detail}"


def show_step(percent: int, results: Mapping[str, Any] | None) -> dict[str, Any]:
    """End the step's task in the state of its verdict (see the module docstring).

    Returns:
        ``{"percent", "state": "passed", "reason"}`` for a passed step.

    Raises:
        AirflowFailException: The step failed, or the promotion stopped before its first step
            (no retry: the verdict is final).
        AirflowSkipException: The canary never reached the step.
    """
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    state, reason = step_verdict(percent, results)
    if state == "failed":
        raise AirflowFailException(f"canary step {percent} %: {reason}")
    if state == "not_reached":
        raise AirflowSkipException(f"canary step {percent} %: {reason}")
    return {"percent": int(percent), "state": state, "reason": reason}


__all__ = ["CANARY_TASK_ID", "STEP_RESULTS_KEY", "SUCCESS_OUTCOMES", "push_step_results", "show_step", "step_results",
           "step_verdict"]
