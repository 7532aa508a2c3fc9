"""DAG ``canary_promotion``: promote a challenger step by step through the gateway, or roll back.

Wiring only; the work is in :mod:`tritonflow.pipelines.canary`, :mod:`~tritonflow.pipelines.canary_loading`
and :mod:`~tritonflow.pipelines.canary_promotion` (imported inside the tasks so the file parses fast
and without network).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, get_current_context, task

from ground.settings import DEFAULTS
from tritonflow_plugin import params as form
from tritonflow_plugin.approval import CanaryApprovalOperator
from tritonflow_plugin.dag_defaults import CHAMPION_CHANGED, TIMEOUTS
from tritonflow_plugin.deadlines import run_deadline
from tritonflow_plugin.links import record_link_info
from tritonflow_plugin.registry_watcher import registry_asset, registry_conf_from_context
from tritonflow_plugin.step_decisions import PAUSE_TASK_ID, StepDecisionOperator
from tritonflow_plugin.wiring import data_task, tritonflow_dag
from tritonflow_plugin.xcom import limit_xcom_size

#: Largest bake time a run may ask for (seconds).
MAX_BAKE_S = 3600

DESCRIPTION = "Move a model's traffic to a challenger version step by step, with automatic rollback."

DOC_MD = """
### Canary promotion

Moves a model's live traffic from its **champion** version to a **challenger** version in steps
(for example 5 % -> 25 % -> 50 % -> 100 %), checking the challenger at every step.

**To start one by hand**, fill in **Model** and **Challenger** (a version number such as `7`, or an
alias such as `challenger`) and click *Trigger*. Tick **Dry run** to check everything without
touching traffic.

* Each step waits **Bake time** seconds while the challenger serves its share of requests, and is
  checked all along: errors, invalid or constant outputs and slow answers **roll back at once**.
  At the end of the bake the step needs at least **Fewest requests** challenger requests (fewer
  is *inconclusive*, never a pass), predictions in line with the challenger's own shadow
  evaluation, and no worse quality than the champion where labels arrived.
* **All steps passed**: alias `champion` moves to the challenger; the old champion stays loaded
  as the rollback target (alias `previous_champion`).
* **A step failed**: all traffic goes back to the champion first, then the challenger is
  unloaded; the run fails and says why.

The grid shows one **canary_step** box per traffic step, labelled with its percent: *success*
when the step passed, *failed* when it failed (its log says why) or when the promotion stopped
before its first step (e.g. a refused pre-flight: that task's log says why), *skipped* when the
canary never reached it. The boxes get their state when the promotion ends. Every
analysis is also kept in MLflow (experiment `tritonflow-canary`) and on the challenger's model
version.

**Approval.** When the model's promotion policy is *approve* or *approve-steps* (set on the
registered model in MLflow, else the deployment's default), task **approval** waits on the
*Required Actions* page for a person to approve the canary before any traffic moves; no answer in
time (24 hours by default) rejects the challenger. Under the policy *auto* it passes at once.

**Decisions at each step (policy *approve-steps*).** At the end of each step's bake the canary
pauses, traffic staying at the step's split and the checks still running, and a **step_decision**
box (*pause 1*, *pause 2*, ...) asks on the *Required Actions* page, showing the automatic verdict
and its checks: **Continue** (next step; at 100 %: promote), **Hold** (bake this step once more,
then decide again; while the step has an extension left) or **Roll back** (now). With no answer in
time (10 minutes by default) a passed step continues and an inconclusive one is held. A failed
step, or a check failing while waiting, rolls back at once without asking. Pauses never reached
are skipped. Each decision, who took it and when are kept on the challenger's model version.

Only one promotion per model runs at a time: a second one fails at once and names the run that
holds the model. Runs also start by themselves after a successful shadow evaluation and when
alias `champion` is set in MLflow. Fields left empty use the deployment's settings.
"""

PARAMS = {
    "model": form.text("Model", "Registered MLflow model to promote (required for a run you start here).",
                       max_length=256),
    "challenger": form.text("Challenger", "Version number (e.g. 7) or alias (e.g. challenger) to promote. "
                            "Empty: alias challenger.", max_length=256),
    "champion": Param(None, type=["null", "integer"], minimum=1, title="Champion version",
                      description="Version that serves now. Empty: the version the gateway serves, else alias "
                                  "champion."),
    "steps": Param(
        None, type=["null", "array"], items={"type": "integer", "minimum": 1, "maximum": 100},
        minItems=1, maxItems=10, contains={"const": 100}, title="Traffic steps (%)",
        description="Challenger's share of traffic at each step, increasing whole percents ending at 100, "
                    "e.g. 5, 25, 50, 100. Empty: TRITONFLOW_CANARY_STEPS.",
    ),
    "bake_s": Param(None, type=["null", "number"], minimum=0, maximum=MAX_BAKE_S, title="Bake time (s)",
                    description=f"Seconds each step runs before it is judged, 0 to {MAX_BAKE_S}. "
                                "Empty: TRITONFLOW_CANARY_BAKE_S."),
    "min_requests": Param(None, type=["null", "integer"], minimum=1, maximum=1_000_000, title="Fewest requests",
                          description="Challenger requests a step needs before it can pass. "
                                      "Empty: TRITONFLOW_CANARY_MIN_REQUESTS."),
    "use_stages": Param(False, type="boolean", title="Move MLflow stages too",
                        description="Also set the legacy MLflow stages (Production / Archived) on promotion."),
    "expected_predictions": form.text(
        "Expected predictions", "Where the challenger's expected predictions are (URI). Empty: the ones its "
        "shadow evaluation recorded."),
    "dry_run": Param(False, type="boolean", title="Dry run",
                     description="Check versions, memory and the steps; change nothing."),
    "loop": form.loop_param(),
}


def _holder(context) -> str:
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}"


def _pause_key(context) -> str:
    from tritonflow.pipelines.canary_pauses import pause_key

    return pause_key(context["ti"].dag_id, context["ti"].run_id)


def _request(params: dict, context) -> dict:
    """Params (empty ones: the settings in effect now), the loop context, else the registry event."""
    from ground.settings import get_settings
    from tritonflow_plugin.loop import loop_context, param_or_setting

    loop = loop_context(context)  # validated first: a bad conf fails before any work
    settings = get_settings()
    req = {k: params.get(k) for k in PARAMS}
    req["model"] = (req.get("model") or "").strip()
    req["challenger"] = (req.get("challenger") or "").strip() or "challenger"
    req["steps"] = param_or_setting(params, "steps", "canary_steps", settings)
    req["bake_s"] = float(param_or_setting(params, "bake_s", "canary_bake_s", settings))
    req["min_requests"] = int(param_or_setting(params, "min_requests", "canary_min_requests", settings))
    if loop is not None:
        req["model"] = (params.get("model") or "").strip() or loop.model
        if loop.version:
            req["challenger"] = loop.version
        req["expected_predictions"] = req.get("expected_predictions") or loop.expected_predictions
    event = registry_conf_from_context(context)
    if event:
        req["model"] = event.get("model_name") or req["model"]
        if event.get("model_version"):
            req["challenger"] = str(event["model_version"])
        if event.get("stage") == "Production":
            req["use_stages"] = True
        req["registry_event"] = event.get("registry_event")
    return req


@data_task(execution_timeout=TIMEOUTS.promotion_step)
def resolve_versions() -> dict:
    """Resolve challenger/champion; refuse a schedule the promotion task cannot hold."""
    from ground.exceptions import SettingsError
    from ground.settings import get_settings
    from ground.values import parse_steps
    from tritonflow.pipelines.canary import resolve
    from tritonflow.pipelines.promotion_policy import promotion_policy
    from tritonflow.pipelines.run_deadlines import canary_time_budget_s

    context = get_current_context()
    req = _request(context["params"], context)
    steps = list(parse_steps(req["steps"], "steps"))
    settings = get_settings()
    res = resolve(req["model"], req["challenger"], req["champion"])
    paused = promotion_policy(req["model"], settings=settings) == "approve-steps"
    pause_s = settings.canary_pause_timeout_s if paused else 0.0
    budget = canary_time_budget_s(steps, req["bake_s"], settings.canary_max_extensions, pause_s)
    if budget > TIMEOUTS.canary.total_seconds():
        raise SettingsError(
            f"steps={steps} with bake_s={req['bake_s']}" + (f" and pauses of {pause_s:g} s" if paused else "")
            + f" may take {budget:.0f} s, more than the promotion task's execution_timeout of "
            f"{TIMEOUTS.canary.total_seconds():.0f} s; use fewer steps or a shorter bake"
            + (" (or a shorter TRITONFLOW_CANARY_PAUSE_TIMEOUT_S)" if paused else "")
        )
    return {**res, "steps": steps, "bake_s": req["bake_s"], "min_requests": req["min_requests"],
            "use_stages": bool(req["use_stages"]), "dry_run": bool(req["dry_run"]),
            "expected_predictions": req.get("expected_predictions") or None}


@data_task(execution_timeout=TIMEOUTS.promotion_step)
def preflight(plan: dict) -> dict:
    """Enough GPU/host memory for the challenger beside the champion; traffic untouched."""
    if plan["noop"] or plan["champion"] == plan["challenger"]:
        return {"skipped": plan["reason"]}
    from tritonflow.pipelines.canary_loading import preflight as check

    return check(plan["model"], plan["champion"], plan["challenger"], triton_model=plan["triton_model"])


@data_task(execution_timeout=TIMEOUTS.promotion_step)
def load_side_by_side(plan: dict, memory: dict) -> dict:
    """Signatures re-verified, champion and challenger loaded side by side."""
    if plan["noop"] or plan["dry_run"] or plan["champion"] == plan["challenger"]:
        return {"skipped": "no-op or dry run"}
    from tritonflow.pipelines.canary_loading import ensure_loaded

    return ensure_loaded(plan["model"], [plan["champion"], plan["challenger"]],
                         triton_model=plan["triton_model"])


# One retry: a worker lost mid-canary (killed, its host gone) leaves the gateway on a step's split
# and the promotion lease held until its TTL. The retry, on any worker once the scheduler has
# failed the lost attempt (its heartbeat timeout, longer than the lease's TTL), takes the lease
# and runs the canary again from its first step, whose plan replaces what the lost attempt left.
# A verdict (rollback) is final: it raises AirflowFailException, which is never retried. Under
# approve-steps the retry numbers its pauses after those the lost attempt asked (step_decision).
@data_task(links=True, when_locked="fail", execution_timeout=TIMEOUTS.canary, retries=1, outlets=[CHAMPION_CHANGED])
def canary(plan: dict, loaded: dict) -> dict:
    """Steps with analysis under the promotion lock; promote at 100 % or roll back."""
    from tritonflow.pipelines.canary_promotion import PromotionRequest, run_promotion
    from tritonflow_plugin.canary_grid import push_step_results

    if plan["noop"]:
        push_step_results(get_current_context(), {"outcome": "noop", "reason": plan["reason"]})
        return {"outcome": "noop", "reason": plan["reason"]}
    record_link_info(model_name=plan["model"], model_version=str(plan["challenger"]),
                     triton_model=plan["triton_model"], triton_version=str(plan["challenger"]))
    result = run_promotion(PromotionRequest(
        model=plan["model"], champion=plan["champion"], challenger=str(plan["challenger"]),
        steps=plan["steps"], bake_s=plan["bake_s"], min_requests=plan["min_requests"],
        use_stages=plan["use_stages"], dry_run=plan["dry_run"], holder=_holder(get_current_context()),
        expected_predictions=plan.get("expected_predictions"), pause_key=_pause_key(get_current_context()),
    ))
    push_step_results(get_current_context(), result)  # before a rollback fails this task
    record_link_info(mlflow_run_id=(result.get("canary_run") or {}).get("run_id"))  # analyses and plot
    if result["outcome"] in ("rolled_back", "rollback_failed"):
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(
            f"canary of model {plan['model']!r} version {plan['challenger']} {result['outcome']}: "
            f"{result['reason']}" + (f"; rollback: {result['rollback'].get('error')}"
                                     if result.get("rollback", {}) and result["rollback"].get("error") else "")
        )
    # champion_sentinel restarts the model's sentinel on this event (only when it changed)
    get_current_context()["outlet_events"][CHAMPION_CHANGED].extra = {
        "model": plan["model"], "champion": result.get("challenger"),
        "changed": result["outcome"] == "promoted"}
    return {k: result.get(k) for k in ("outcome", "reason", "model", "champion", "challenger",
                                       "canary_id", "steps", "decisions", "promotion", "gc", "rollback_target",
                                       "canary_run")}


@task(execution_timeout=TIMEOUTS.promotion_step, trigger_rule="all_done", retries=0, on_failure_callback=None,
      map_index_template="{{ task.op_kwargs['percent'] }} %")
@limit_xcom_size
def canary_step(percent: int) -> dict:
    """One box per traffic step in the grid: passed (success), failed, or never reached (skipped)."""
    from tritonflow_plugin.canary_grid import show_step, step_results

    return show_step(percent, step_results(get_current_context()))


@task(execution_timeout=TIMEOUTS.promotion_step)
@limit_xcom_size
def traffic_steps(plan: dict) -> list[int]:
    """The challenger's traffic percents, one ``canary_step`` box each."""
    return [int(p) for p in plan["steps"]]


@task(execution_timeout=TIMEOUTS.promotion_step)
@limit_xcom_size
def pause_numbers(plan: dict) -> list[int]:
    """One ``step_decision`` task per pause the canary may reach under policy approve-steps; none otherwise."""
    from ground.settings import get_settings
    from tritonflow.pipelines.promotion_policy import promotion_policy
    from tritonflow_plugin.step_decisions import pause_numbers as numbers

    settings = get_settings()
    return numbers(plan, promotion_policy(plan["model"], settings=settings), len(plan["steps"]),
                   settings.canary_max_extensions)


@tritonflow_dag("canary_promotion", schedule=[registry_asset("canary_promotion")], topics=["canary"],
                description=DESCRIPTION, doc_md=DOC_MD, params=PARAMS, deadline=run_deadline("canary"))
def canary_promotion():
    """Canary-promote a challenger through the gateway, with automatic rollback."""
    plan = resolve_versions()
    # a person approves here under the model's promotion policy approve; at once under auto
    approval = CanaryApprovalOperator(task_id="approval", execution_timeout=TIMEOUTS.short,
                                      response_timeout=timedelta(hours=DEFAULTS.approval_timeout_h))
    memory = preflight(plan)
    plan >> approval >> memory
    loaded = load_side_by_side(plan, memory)
    canary(plan, loaded) >> canary_step.expand(percent=traffic_steps(plan))
    # under approve-steps a person decides at each pause of the canary, one task per pause
    pauses = pause_numbers(plan)
    loaded >> pauses
    StepDecisionOperator.partial(
        task_id=PAUSE_TASK_ID, execution_timeout=TIMEOUTS.short, retries=0,
        wait_until_s=TIMEOUTS.canary.total_seconds(), response_timeout=TIMEOUTS.canary,
        map_index_template="pause {{ task.number }}",
    ).expand(number=pauses)


canary_promotion()
