"""DAG ``retrain``: train a fresh challenger on recent labelled traffic, then publish it.

Wiring only; the work is in :mod:`tritonflow.pipelines.retrain` (imported inside the tasks so the
file parses fast and without network). Only the schedule is read at parse time (Airflow needs it
then: ``TRITONFLOW_RETRAIN_SCHEDULE``, an environment variable); every param left empty takes the
setting in effect when the run starts.
"""

from __future__ import annotations

from airflow.sdk import Param, get_current_context

from tritonflow_plugin import params as form
from tritonflow_plugin.dag_defaults import TIMEOUTS
from tritonflow_plugin.errors import fail_fast_on_bad_data, when_lock_held
from tritonflow_plugin.links import record_version_links, task_with_links
from tritonflow_plugin.wiring import data_task, fire_and_forget, tritonflow_dag
from tritonflow_plugin.xcom import limit_xcom_size

#: Environment variable of the optional schedule (read at parse time: Airflow schedules from it).
SCHEDULE_ENV = "TRITONFLOW_RETRAIN_SCHEDULE"


def _schedule() -> str | None:
    import os

    return os.environ.get(SCHEDULE_ENV, "").strip() or None

DESCRIPTION = "Train a new challenger version of a model on its recent labelled traffic, then publish it."

DOC_MD = """
### Retrain

Trains a new **challenger** version of one model on the traffic it served recently, using the
answers (labels) that arrived since, then publishes it to Triton.

**To start it by hand**, fill in **Model** (empty: `TRITONFLOW_RETRAIN_DEFAULT_MODEL`) and
optionally a **Reason**, then click *Trigger*.

1. **training_window** - the last **Days** of logged requests before **Window end**, joined with
   their labels, optionally mixed with a share of the original training data. When the labels
   confirmed a shift (reason `champion_degraded`, or a `retrain_followup`), the rows since the point
   where the served model's loss rose instead, at least `TRITONFLOW_RETRAIN_MIN_POST_SHIFT_ROWS` of
   them (`TRITONFLOW_RETRAIN_WINDOW_RULE`); the choice and its reason are tags of the new version;
2. **train** - runs the model's training code (**Training entry point**, else the deployment's)
   and registers the result in MLflow as a new version with alias `challenger`. A failed training
   changes nothing in the registry;
3. **trigger_publish** - starts `model_publish` for the new version, which then starts a shadow
   evaluation against the champion.

Only one retraining per model runs at a time, and a cooldown (`TRITONFLOW_RETRAIN_COOLDOWN_S`)
follows each success: a run refused by either is **skipped** and says why (**Ignore cooldown**
lifts the cooldown only). Runs also start by themselves when a shadow evaluation finds the
champion degraded, from `drift_monitor` when a champion trained on few post-shift rows is due its
follow-up (`TRITONFLOW_RETRAIN_FOLLOWUP_HOURS` later), and on `TRITONFLOW_RETRAIN_SCHEDULE` when set.
Fields left empty use the deployment's settings.
"""

PARAMS = {
    "model": form.text("Model", "Registered MLflow model to retrain. Empty: TRITONFLOW_RETRAIN_DEFAULT_MODEL.",
                       max_length=256),
    "reason": Param("manual", type="string", minLength=1, title="Reason",
                    description="Why it runs (drift, champion_degraded, manual...); recorded on the new version."),
    "drift_event": form.text("Drift event (JSON)", "The drift alert that called for this retraining, as JSON. "
                             "Empty: none."),
    "days": Param(None, type=["null", "number"], exclusiveMinimum=0, maximum=3650, title="Days",
                  description="Days of labelled traffic to train on. Empty: TRITONFLOW_RETRAIN_WINDOW_DAYS."),
    "window_end": form.text("Window end", "End of the training window, ISO 8601 (e.g. 2026-11-30T12:00:00Z). "
                            "Empty: the drift alert's end, else now."),
    "change_point": form.text("Change point", "Where the served model's loss rose, ISO 8601 (a follow-up retraining "
                              "passes the one its champion recorded). Empty: searched for when the labels "
                              "confirmed a shift."),
    "mix_reference_fraction": Param(None, type=["null", "number"], minimum=0, exclusiveMaximum=1,
                                    title="Share of original data",
                                    description="Share of the original training rows mixed in, 0 to below 1. "
                                                "Empty: TRITONFLOW_RETRAIN_MIX_REFERENCE_FRACTION."),
    "entry_point": form.text("Training entry point", "Training code: 'module:function' or "
                             "'project:<uri>[#entry]'. Empty: the one configured for the model."),
    "training_params": Param({}, type="object", title="Training parameters",
                             description="Parameters passed to the training code (JSON object)."),
    "label_column": form.text("Label column", "Column of the labels to learn. Empty: the labels' only column."),
    "ignore_cooldown": Param(False, type="boolean", title="Ignore cooldown",
                             description="Retrain even within the cooldown (never beside a retraining in flight)."),
    "loop": form.loop_param(),
}


def _reason(params, context, loop_reason: str | None = None) -> str:
    """The loop's reason when the param kept its default, else the param; a scheduled run says ``schedule``."""
    if loop_reason and params.get("reason") == "manual":
        return loop_reason
    reason = (params.get("reason") or "manual").strip()
    run_type = str(getattr(context.get("dag_run"), "run_type", "") or "").lower()
    return "schedule" if reason == "manual" and run_type.endswith("scheduled") else reason


@tritonflow_dag("retrain", schedule=_schedule(), topics=["retrain"], description=DESCRIPTION, doc_md=DOC_MD,
                render_template_as_native_obj=True, params=PARAMS)
def retrain():
    """Retrain a model on its recent labelled inference log and register the new version."""
    @data_task(execution_timeout=TIMEOUTS.training_window)
    def training_window() -> dict:
        """Inference log joined with labels (+ reference mix), stored with its lineage."""
        from ground.exceptions import DataError
        from tritonflow.pipelines.retrain import training_window as build
        from tritonflow_plugin.loop import loop_context, param_or_setting

        context = get_current_context()
        params = context["params"]
        loop = loop_context(context)  # validated first: a bad conf fails before any work
        model = (params.get("model") or (loop.model if loop else None)
                 or param_or_setting(params, "model", "retrain_default_model") or "").strip()
        if not model:
            raise DataError("model='' ; expected the registered model to retrain (param 'model', the loop "
                            "context, or TRITONFLOW_RETRAIN_DEFAULT_MODEL)")
        drift_event = params.get("drift_event") or (loop.drift_event if loop else None)
        window_end = params.get("window_end") or (loop.window_end if loop else None)
        window = build(model, days=params.get("days"),
                       mix_reference_fraction=params.get("mix_reference_fraction"),
                       end=window_end or None, drift_event=drift_event,
                       label_column=params.get("label_column") or None,
                       reason=_reason(params, context, loop.reason if loop else None),
                       change_point=params.get("change_point") or None)
        return {**window, "loop": loop.model_dump(mode="json", exclude_none=True) if loop else None}

    @task_with_links(execution_timeout=TIMEOUTS.train)
    @fail_fast_on_bad_data
    @when_lock_held("skip")  # a retraining in flight elsewhere, or within the cooldown
    @limit_xcom_size
    def train(window: dict) -> dict:
        """Run the entry point under the single-flight lock and cooldown; register a challenger."""
        from tritonflow.pipelines.loop_context import retrain_handoff
        from tritonflow.pipelines.retrain import run_training

        context = get_current_context()
        params, ti = context["params"], context["ti"]
        loop = window.get("loop") or {}
        reason = _reason(params, context, loop.get("reason"))
        drift_event = params.get("drift_event") or loop.get("drift_event")
        result = run_training(
            window["model"], window, entry_point=params.get("entry_point") or None,
            reason=reason, drift_event=drift_event,
            params=params.get("training_params") or None,
            ignore_cooldown=bool(params.get("ignore_cooldown")),
            holder=f"{ti.dag_id}/{ti.run_id}",
        )
        out = {k: result[k] for k in ("name", "version", "run_id", "model_uri", "alias", "entry_point")}
        record_version_links(out["name"], out["version"], served=False, mlflow_run_id=out["run_id"])
        out["publish_conf"] = retrain_handoff(
            window["model"], result["version"], reason=reason, drift_event=drift_event,
            window_start=loop.get("window_start"), window_end=params.get("window_end") or loop.get("window_end"),
            dataset_uri=result["publish_conf"].get("dataset_uri"), run_id=ti.run_id,
            then=tuple(result["publish_conf"].get("then") or ("shadow_evaluation",)))
        return out

    trigger_publish = fire_and_forget(
        "trigger_publish", trigger_dag_id="model_publish",
        conf="{{ ti.xcom_pull(task_ids='train')['publish_conf'] }}",
    )

    train(training_window()) >> trigger_publish


retrain()
