"""DAG ``shadow_evaluation``: champion vs challenger on replayed traffic, then promote, retrain or rest.

Wiring only; the work is in :mod:`tritonflow.pipelines.shadow` (imported inside the tasks so the
file parses fast and without network).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, get_current_context, task

from tritonflow_plugin.dag_defaults import DEFAULT_ARGS, DRIFT_ALERTS, TAG, START_DATE
from tritonflow_plugin.errors import fail_fast_on_bad_data
from tritonflow_plugin.xcom import limit_xcom_size

#: Timeout of the short tasks (planning, registry reads, the branch, the triggers).
SHORT_TASK_TIMEOUT = timedelta(minutes=10)
#: Timeout of publishing a challenger (conversion, parity gate, signing, verified load).
PUBLISH_TASK_TIMEOUT = timedelta(minutes=45)
#: Timeout of the replay through both versions.
REPLAY_TASK_TIMEOUT = timedelta(minutes=30)
#: Timeout of the comparison (bootstrap) and its recording in MLflow.
COMPARE_TASK_TIMEOUT = timedelta(minutes=20)

DOC_MD = """
### Shadow evaluation

Would the **challenger** serve better than the **champion** on the traffic that just drifted?

Runs on every drift alert (asset `tritonflow_drift_alerts`, emitted by `drift_monitor`), after
`model_publish` published a challenger, and on manual triggers. One model per run: the `model`
param, else the model of the most recent alert that started the run (`drift_event` replays an
alert by hand).

1. **resolve**: the champion (alias `champion`) and the challenger (alias `challenger`, or the
   version/alias in `challenger`); without a challenger only the champion is assessed;
2. **publish_challenger**: a challenger missing from the Triton repository is published through
   the publish pipeline (converted, parity-gated, signed, verified, loaded);
3. **replay**: the logged inputs of the window (by default the `shadow_window_hours` before the
   drifted hour's end, covering that hour) are sent to both versions on Triton, batched and
   concurrent; a challenger that fails to load or answer leaves the champion untouched and fails
   the run with the reason. With `mode` = `live` the gateway instead mirrors
   `TRITONFLOW_SHADOW_MIRROR_PERCENT` % of the champion's live requests to the challenger for
   `live_duration_s` seconds (its answers never reach clients) and both outputs are paired by
   request id on the same live inputs; replay stays for models without live traffic. Both modes
   record the challenger's expected predictions, which the canary judges it against;
4. **compare**: prediction agreement, output shift (KS, PSI) and, on rows whose labels arrived,
   AUC/accuracy/F1 with a paired bootstrap; the challenger wins only when the lower confidence
   bound of its improvement clears `margin` and no guardrail worsens; too few labels is
   **inconclusive**, never a win. The decision, its evidence (JSON) and a readable report
   (Markdown) are recorded on both model versions in MLflow (`tritonflow.shadow.*`).
5. **branch**: `promote_challenger` triggers `canary_promotion` (conf `model`, `challenger`);
   `retrain` (champion degraded, no better challenger) triggers `retrain` (conf `model`,
   `reason`, `drift_event`); `nothing` / `inconclusive` end the run.

Triggers are fire-and-forget (`wait_for_completion=False`, `deferrable=False`, case H26).
"""

PARAMS = {
    "model": Param("", type="string",
                   description="Registered model name (empty: the model of the drift event)."),
    "challenger": Param(None, type=["null", "string"],
                        description="Challenger version (e.g. '7') or alias (empty: alias 'challenger')."),
    "window_start": Param(None, type=["null", "string"],
                          description="Replay window start, ISO 8601 (empty: window_end - window_hours)."),
    "window_end": Param(None, type=["null", "string"],
                        description="Replay window end, ISO 8601 (empty: the drift event's end, else now)."),
    "window_hours": Param(None, type=["null", "number"], exclusiveMinimum=0, maximum=24 * 90,
                          description="Hours replayed before window_end (empty: TRITONFLOW_SHADOW_WINDOW_HOURS)."),
    "min_labels": Param(None, type=["null", "integer"], minimum=2,
                        description="Fewest labelled rows to decide (empty: TRITONFLOW_SHADOW_MIN_LABELS)."),
    "confidence": Param(None, type=["null", "number"], exclusiveMinimum=0, exclusiveMaximum=1,
                        description="Two-sided confidence of the bootstrap (empty: TRITONFLOW_SHADOW_CONFIDENCE)."),
    "margin": Param(None, type=["null", "number"], minimum=0,
                    description="Improvement the challenger needs at the lower bound (empty: TRITONFLOW_SHADOW_MARGIN)."),
    "label_column": Param(None, type=["null", "string"],
                          description="Label column of the inference-log labels (empty: their only one)."),
    "mode": Param("replay", type="string", enum=["replay", "live"],
                  description="replay: logged inputs through both versions; live: mirror live requests to the challenger."),
    "live_duration_s": Param(None, type=["null", "number"], exclusiveMinimum=0, maximum=1500,
                             description="Live mode: seconds of mirrored traffic (empty: TRITONFLOW_SHADOW_LIVE_DURATION_S)."),
    "drift_event": Param(None, type=["null", "string"],
                         description="JSON of a drift event to evaluate (manual re-run of an alert; empty: none)."),
}


def _plan_request(context) -> dict:
    """Params plus the drift event that started the run (asset event), if any."""
    import json

    from tritonflow.exceptions import DataError
    from tritonflow.pipelines.shadow import drift_event_json, evaluation_window, latest_drift_event

    params = context["params"]
    events = []
    for asset_events in (context.get("triggering_asset_events") or {}).values():
        events.extend(asset_events)
    model = (params.get("model") or "").strip()
    event = latest_drift_event(events, model or None)
    if event is None and params.get("drift_event"):
        event = json.loads(drift_event_json(params["drift_event"]))
    model = model or (event or {}).get("model") or ""
    if not model:
        raise DataError("model='' and no drift event names a model; expected the 'model' param "
                        "or a drift alert")
    window = evaluation_window(window_start=params.get("window_start"),
                               window_end=params.get("window_end"),
                               window_hours=params.get("window_hours"), drift_event=event)
    return {"model": model, "challenger": (params.get("challenger") or "").strip(),
            **window, "drift_event": drift_event_json(event)}


@dag(
    dag_id="shadow_evaluation",
    schedule=DRIFT_ALERTS,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[TAG, "shadow"],
    doc_md=DOC_MD,
    params=PARAMS,
    render_template_as_native_obj=True,
)
def shadow_evaluation():
    @task(execution_timeout=SHORT_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def plan() -> dict:
        """Model, challenger and replay window from the params and the drift event."""
        return _plan_request(get_current_context())

    @task(execution_timeout=SHORT_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def resolve(request: dict) -> dict:
        """Champion and challenger versions in the MLflow registry."""
        from tritonflow.pipelines.shadow import resolve_versions

        return resolve_versions(request["model"], request["challenger"] or None)

    @task(execution_timeout=PUBLISH_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def publish_challenger(resolved: dict) -> dict:
        """Publish the challenger through the publish pipeline unless it is in the repository."""
        from tritonflow.pipelines.shadow import ensure_challenger_published

        return ensure_challenger_published(resolved)

    @task(execution_timeout=REPLAY_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def replay(request: dict, resolved: dict, published: dict) -> dict:
        """Replay the window's logged inputs through both versions, or mirror live traffic."""
        context = get_current_context()
        if context["params"].get("mode") == "live":
            from tritonflow.pipelines.shadow_live import live

            ti = context["ti"]
            return live(resolved["model"], resolved["champion"], resolved["challenger"],
                        duration_s=context["params"].get("live_duration_s"),
                        holder=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}")
        from tritonflow.pipelines.shadow import replay as run_replay

        return run_replay(resolved["model"], resolved["champion"], resolved["challenger"],
                          request["window_start"], request["window_end"])

    @task(execution_timeout=COMPARE_TASK_TIMEOUT)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def compare(request: dict, replayed: dict) -> dict:
        """Decide with confidence and record the decision on both model versions."""
        from tritonflow.pipelines.shadow import compare as run_compare

        params = get_current_context()["params"]
        overrides = {k: params.get(k) for k in ("min_labels", "confidence", "margin")}
        return run_compare(replayed, label_column=params.get("label_column") or None,
                           rule_overrides=overrides, drift_event=request["drift_event"])

    @task.branch(execution_timeout=SHORT_TASK_TIMEOUT)
    def choose(decision: dict) -> str:
        """Follow the outcome: canary, retraining, or nothing."""
        return {"promote_challenger": "trigger_canary", "retrain": "trigger_retrain"}.get(
            decision["outcome"], "no_action")

    trigger_canary = TriggerDagRunOperator(
        task_id="trigger_canary",
        trigger_dag_id="canary_promotion",
        conf="{{ ti.xcom_pull(task_ids='compare')['canary_conf'] }}",
        wait_for_completion=False,
        deferrable=False,
        execution_timeout=SHORT_TASK_TIMEOUT,
    )
    trigger_retrain = TriggerDagRunOperator(
        task_id="trigger_retrain",
        trigger_dag_id="retrain",
        conf="{{ ti.xcom_pull(task_ids='compare')['retrain_conf'] }}",
        wait_for_completion=False,
        deferrable=False,
        execution_timeout=SHORT_TASK_TIMEOUT,
    )
    no_action = EmptyOperator(task_id="no_action", execution_timeout=SHORT_TASK_TIMEOUT)

    request = plan()
    resolved = resolve(request)
    published = publish_challenger(resolved)
    replayed = replay(request, resolved, published)
    decision = compare(request, replayed)
    choose(decision) >> [trigger_canary, trigger_retrain, no_action]


shadow_evaluation()
