"""DAG ``shadow_evaluation``: champion vs challenger on replayed traffic, then promote, retrain or rest.

Wiring only; the work is in :mod:`tritonflow.pipelines.shadow`, :mod:`~tritonflow.pipelines.shadow_replay`
and :mod:`~tritonflow.pipelines.shadow_compare` (imported inside the tasks so the file parses fast
and without network).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import Param, get_current_context, task

from tritonflow_plugin import params as form
from tritonflow_plugin.dag_defaults import DRIFT_ALERTS, TIMEOUTS
from tritonflow_plugin.errors import fail_fast_on_bad_data
from tritonflow_plugin.links import record_link_info
from tritonflow_plugin.wiring import data_task, fire_and_forget, tritonflow_dag
from tritonflow_plugin.xcom import limit_xcom_size

DESCRIPTION = "Compare a challenger with the champion on the same traffic, then promote, retrain or rest."

DOC_MD = """
### Shadow evaluation

Would the **challenger** version serve better than the **champion** on recent traffic? The
challenger answers the same requests as the champion, **without its answers reaching anyone**,
and the two are compared.

**To start one by hand**, fill in **Model** (and a **Challenger** if it is not the version with
alias `challenger`), then click *Trigger*.

1. **resolve** - finds the champion and the challenger (without a challenger only the champion is
   assessed);
2. **publish_challenger** - publishes the challenger to Triton first if it is not there yet;
3. **replay** - sends the requests logged in the window (by default the hours before the drift
   alert) to both versions; with **Mode** = live, mirrors a share of live requests to the
   challenger for **Live duration** seconds instead;
4. **compare** - agreement of the predictions and, where labels arrived, accuracy / AUC / F1 with
   confidence intervals. The challenger wins only when it is better by at least **Margin** with
   the chosen **Confidence**; too few labels is *inconclusive*, never a win. The decision and a
   readable report are written on both versions in MLflow;
5. **choose** - a win starts `canary_promotion`; a degraded champion without a better challenger
   starts `retrain` (unless one ran within the cooldown); otherwise the run ends.

The run is skipped when a retraining or a promotion of the model is in progress. Runs also start
by themselves on every drift alert and after `model_publish` published a challenger. A
challenger tagged `rejected` is never published or promoted. Fields left empty use the
deployment's settings.
"""

PARAMS = {
    "model": form.text("Model", "Registered MLflow model to evaluate. Empty: the model of the drift alert "
                       "that started the run.", max_length=256),
    "challenger": form.text("Challenger", "Version number (e.g. 7) or alias. Empty: alias challenger.",
                            max_length=256),
    "window_start": form.text("Window start", "Start of the traffic replayed, ISO 8601. Empty: window end minus "
                              "Window hours."),
    "window_end": form.text("Window end", "End of the traffic replayed, ISO 8601. Empty: the drift alert's end, "
                            "else now."),
    "window_hours": Param(None, type=["null", "number"], exclusiveMinimum=0, maximum=24 * 90, title="Window hours",
                          description="Hours of traffic replayed. Empty: TRITONFLOW_SHADOW_WINDOW_HOURS."),
    "min_labels": Param(None, type=["null", "integer"], minimum=2, title="Fewest labels",
                        description="Labelled rows needed to decide. Empty: TRITONFLOW_SHADOW_MIN_LABELS."),
    "confidence": Param(None, type=["null", "number"], exclusiveMinimum=0, exclusiveMaximum=1, title="Confidence",
                        description="Confidence of the comparison, between 0 and 1 (e.g. 0.95). "
                                    "Empty: TRITONFLOW_SHADOW_CONFIDENCE."),
    "margin": Param(None, type=["null", "number"], minimum=0, title="Margin",
                    description="How much better the challenger must be, at the low end of the confidence "
                                "interval. Empty: TRITONFLOW_SHADOW_MARGIN."),
    "label_column": form.text("Label column", "Column of the labels. Empty: the labels' only column."),
    "mode": form.choice("Mode", "Replay logged requests through both versions, or mirror live requests to the "
                        "challenger.", ["replay", "live"], default="replay",
                        labels={"replay": "Replay logged traffic", "live": "Mirror live traffic"}),
    "live_duration_s": Param(None, type=["null", "number"], exclusiveMinimum=0, maximum=1500,
                             title="Live duration (s)",
                             description="Live mode: seconds of mirrored traffic. "
                                         "Empty: TRITONFLOW_SHADOW_LIVE_DURATION_S."),
    "drift_event": form.text("Drift event (JSON)", "A drift alert to evaluate again, as JSON. Empty: none."),
    "loop": form.loop_param(),
}


@contextlib.contextmanager
def _decided_if_rejected(request: dict) -> Iterator[None]:
    """A refused rejected challenger still gets its alert decision (``challenger_rejected``), then fails the task."""
    from ground.exceptions import RejectedVersionError

    try:
        yield
    except RejectedVersionError as exc:
        from tritonflow.pipelines.alert_decision import XCOM_KEY, record_decision, rejected_challenger_decision

        made = rejected_challenger_decision(request["model"], request["hour"], request["features"], exc)
        get_current_context()["ti"].xcom_push(key=XCOM_KEY, value=made)
        record_decision(made)
        raise


def _plan_request(context) -> dict:
    """Params plus the drift event that started the run (asset event), if any."""
    import json

    from ground.exceptions import DataError
    from tritonflow.pipelines.shadow import drift_event_json, evaluation_window, latest_drift_event
    from tritonflow_plugin.loop import loop_context

    params = context["params"]
    loop = loop_context(context)  # validated first: a bad conf fails before any work
    events = []
    for asset_events in (context.get("triggering_asset_events") or {}).values():
        events.extend(asset_events)
    model = (params.get("model") or (loop.model if loop else "") or "").strip()
    event = latest_drift_event(events, model or None)
    if event is None and params.get("drift_event"):
        event = json.loads(drift_event_json(params["drift_event"]))
    if event is None and loop is not None and loop.drift_event:
        event = dict(loop.drift_event)
    model = model or (event or {}).get("model") or ""
    if not model:
        raise DataError("model='' and no drift event names a model; expected the 'model' param "
                        "or a drift alert")
    dag_run = context.get("dag_run")
    now = context.get("logical_date") or getattr(dag_run, "run_after", None)  # never the wall clock
    window = evaluation_window(window_start=params.get("window_start") or (loop.window_start if loop else None),
                               window_end=params.get("window_end") or (loop.window_end if loop else None),
                               window_hours=params.get("window_hours"), drift_event=event, now=now)
    challenger = (params.get("challenger") or (loop.version if loop else "") or "").strip()
    return {"model": model, "challenger": challenger, **window, "drift_event": drift_event_json(event),
            "hour": (event or {}).get("window_start") or window["window_start"],
            "features": list((event or {}).get("features") or []),
            "loop": loop.model_dump(mode="json", exclude_none=True) if loop else None}


@data_task(execution_timeout=TIMEOUTS.short)
def plan() -> dict:
    """Model, challenger and replay window from the params and the drift event."""
    return _plan_request(get_current_context())


@task.short_circuit(execution_timeout=TIMEOUTS.short)
@fail_fast_on_bad_data
@limit_xcom_size
def admit(request: dict) -> bool:
    """Skip the run (decision recorded): handed-over version already champion, retraining running, lock held."""
    from tritonflow.pipelines.alert_decision import XCOM_KEY, admission, record_decision

    handed_over = request["challenger"] if request.get("loop") else None  # from model_publish/retrain
    skip = admission(request["model"], request["hour"], request["features"], handed_over=handed_over)
    if skip is None:
        return True
    get_current_context()["ti"].xcom_push(key=XCOM_KEY, value=skip)
    record_decision(skip)
    return False


@data_task(execution_timeout=TIMEOUTS.short)
def resolve(request: dict) -> dict:
    """Champion and challenger versions in the MLflow registry."""
    from tritonflow.pipelines.shadow import resolve_versions

    with _decided_if_rejected(request):
        return resolve_versions(request["model"], request["challenger"] or None)


@data_task(links=True, execution_timeout=TIMEOUTS.publish)
def publish_challenger(request: dict, resolved: dict) -> dict:
    """Publish the challenger through the publish pipeline unless it is in the repository."""
    from tritonflow.pipelines.shadow import ensure_challenger_published

    with _decided_if_rejected(request):
        out = ensure_challenger_published(resolved)
    if out.get("version") is not None:
        record_link_info(model_name=out["model"], model_version=str(out["version"]),
                         triton_model=out["triton_model_name"], triton_version=str(out["triton_model_version"]))
    return out


@data_task(execution_timeout=TIMEOUTS.replay)
def replay(request: dict, resolved: dict, published: dict) -> dict:
    """Replay the window's logged inputs through both versions, or mirror live traffic."""
    context = get_current_context()
    if context["params"].get("mode") == "live":
        from tritonflow.pipelines.shadow_live import live

        ti = context["ti"]
        return live(resolved["model"], resolved["champion"], resolved["challenger"],
                    duration_s=context["params"].get("live_duration_s"),
                    holder=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}")
    from tritonflow.pipelines.shadow_replay import replay as run_replay

    return run_replay(resolved["model"], resolved["champion"], resolved["challenger"],
                      request["window_start"], request["window_end"])


@data_task(links=True, execution_timeout=TIMEOUTS.compare)
def compare(request: dict, replayed: dict) -> dict:
    """Decide with confidence and record the decision on both model versions."""
    from tritonflow.pipelines.loop_context import shadow_handoffs
    from tritonflow.pipelines.shadow_compare import compare as run_compare

    context = get_current_context()
    params = context["params"]
    overrides = {k: params.get(k) for k in ("min_labels", "confidence", "margin")}
    out = run_compare(replayed, label_column=params.get("label_column") or None,
                      rule_overrides=overrides, drift_event=request["drift_event"])
    out["canary_conf"], out["retrain_conf"] = shadow_handoffs(request, out, run_id=context["run_id"])
    role = "challenger" if out.get("challenger") is not None else "champion"  # whose record holds the report
    record_link_info(model_name=out["model"], model_version=str(out[role]),
                     mlflow_run_id=(out.get("recorded") or {}).get(role, {}).get("run_id"))
    return out


@task.branch(execution_timeout=TIMEOUTS.short)
@limit_xcom_size
def choose(request: dict, decision: dict) -> str:
    """The alert's decision (recorded under XCom key ``alert_decision``): canary, retraining, or nothing."""
    from tritonflow.pipelines.alert_decision import XCOM_KEY, record_decision, shadow_decision

    made = shadow_decision(request["model"], request["hour"], request["features"], decision["outcome"],
                           decision.get("reasons") or [])
    get_current_context()["ti"].xcom_push(key=XCOM_KEY, value=made)
    record_decision(made)
    return {"promote": "trigger_canary", "retrain": "trigger_retrain"}.get(made["decision"], "no_action")


@tritonflow_dag("shadow_evaluation", schedule=DRIFT_ALERTS, topics=["shadow"], description=DESCRIPTION,
                doc_md=DOC_MD, render_template_as_native_obj=True, params=PARAMS)
def shadow_evaluation():
    """Compare the challenger with the champion on the same inputs and decide what follows."""
    trigger_canary = fire_and_forget(
        "trigger_canary", trigger_dag_id="canary_promotion",
        conf="{{ ti.xcom_pull(task_ids='compare')['canary_conf'] }}",
    )
    trigger_retrain = fire_and_forget(
        "trigger_retrain", trigger_dag_id="retrain",
        conf="{{ ti.xcom_pull(task_ids='compare')['retrain_conf'] }}",
    )
    no_action = EmptyOperator(task_id="no_action", execution_timeout=TIMEOUTS.short)
    request = plan()
    resolved = resolve(request)
    admit(request) >> resolved
    published = publish_challenger(request, resolved)
    replayed = replay(request, resolved, published)
    decision = compare(request, replayed)
    choose(request, decision) >> [trigger_canary, trigger_retrain, no_action]


shadow_evaluation()
