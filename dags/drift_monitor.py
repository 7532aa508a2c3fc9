"""drift_monitor: hourly input-drift check of every served (champion) model version.

Wiring only: the stages are plain Python in :mod:`tritonflow.pipelines.drift` (imported inside the
tasks, so parsing this file stays fast and offline).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import CronDataIntervalTimetable, Param, get_current_context, task

from tritonflow_plugin import params as form
from tritonflow_plugin.dag_defaults import DRIFT_ALERTS, TIMEOUTS
from tritonflow_plugin.links import record_version_links
from tritonflow_plugin.wiring import data_task, fire_and_forget_mapped, tritonflow_dag
from tritonflow_plugin.xcom import limit_xcom_size

DESCRIPTION = "Every hour, check each served model's inputs for drift and raise an alert when they moved."

DOC = """
### Hourly drift monitor

Every hour, compares the inputs each served model received during that hour with a
**reference** and says whether they **drifted**. Models are checked in **batches**: one box
holds up to `TRITONFLOW_DRIFT_MODELS_PER_TASK` models (10 by default; its label lists them), so
a few hundred models fit in the hour.

For each model:

* **check** - the hour's inputs must keep their data contract (columns, types, ranges); then
  every feature is compared with the reference (KS, PSI, Wasserstein) against thresholds learnt
  from the last 30 days;
* **record** - figures and verdicts go to MLflow (experiment `tritonflow-drift`), with an
  Evidently report and a whylogs profile when ticked;
* **decide** (one box for every model) - the alerts are logged (and posted to the webhook); an
  alert fires after a few drifted hours in a row, or at once on a strong drift; a cooldown keeps
  it from repeating every hour. Each alerting model gets its own **drift_event** box once its hour
  is recorded, whose asset event starts `shadow_evaluation`; a quiet hour has none;
* **data_quality_gate** - after check, record, decide, Evidently and profile: fails the run naming
  every model that failed and why (a **broken data contract** - the hour is kept for inspection -,
  unreadable data, a step that failed). One model's failure never stops the other models of its
  batch: they are checked, recorded and alerted first (a **drift_event** that failed fails the run
  too);
* **trigger_followup_retrain** - a champion trained on few rows since a shift asks for a follow-up
  retraining once more labels have arrived (`TRITONFLOW_RETRAIN_FOLLOWUP_HOURS`); an hour that
  passed the gate starts it, once. A quiet hour has none.

It runs by itself every hour. To check one hour by hand, trigger it and pick **Models** (empty:
every model with a champion). A model without a reference yet gets the status `no_reference`
and an alert, never a crash. Re-running an hour replaces that hour's results, and
`airflow backfill create --dag-id drift_monitor --from-date ... --to-date ...` builds the history
the thresholds learn from.
"""


def _window(context) -> tuple[str, str]:
    start, end = context["data_interval_start"], context["data_interval_end"]
    if start is None or end is None or end <= start:  # e.g. a run without a data interval
        end = context["logical_date"]
        start = end - timedelta(hours=1)
    return start.isoformat(), end.isoformat()


def _last_try(context) -> bool:
    """Whether this is the task instance's last try (no retry left)."""
    ti = context["ti"]
    return int(ti.try_number or 1) > int(getattr(ti, "max_tries", 0) or 0)


#: Label of a batch's box in the grid: the models it holds (at most 200 characters; Airflow keeps 250).
BATCH_LABEL = "{{{{ task.op_kwargs['{arg}'] | map(attribute='model') | join(', ') | truncate(200, True, ' ...', 0) }}}}"


#: Environment variable of the schedule (read at parse time: Airflow schedules from it). A cron
#: expression (default ``@hourly``), or ``none`` for runs created only through the API/UI (the main
#: job creates each logical hour's run itself).
SCHEDULE_ENV = "TRITONFLOW_DRIFT_MONITOR_SCHEDULE"


def _schedule():
    import os

    raw = os.environ.get(SCHEDULE_ENV, "@hourly").strip()
    if raw.lower() in ("", "none", "off"):
        return None
    return CronDataIntervalTimetable(raw, timezone="UTC")


PARAMS = {
    "models": Param([], type="array", items={"type": "string"}, title="Models",
                    description="Registered MLflow models to check, one per line. Empty: every model with "
                                "a champion (or TRITONFLOW_MONITORED_MODELS)."),
    "evidently": Param(True, type="boolean", title="Evidently report",
                       description="Also build an Evidently drift report on a sample of the hour."),
    "evidently_sample_rows": Param(None, type=["null", "integer"], minimum=0, title="Evidently sample rows",
                                   description="Rows per side in the Evidently report (0: no report). "
                                               "Empty: TRITONFLOW_DRIFT_EVIDENTLY_SAMPLE_ROWS."),
    "reference_strategy": form.optional_choice(
        "Compare with",
        "training: the data the version was trained on; trailing: the last days it served; "
        "seasonal: the same hour one period earlier; training_seasonal: the training rows of the same "
        "hour of the period. Empty: TRITONFLOW_DRIFT_REFERENCE_STRATEGY.",
        form.REFERENCE_STRATEGIES),
    "profile": Param(True, type="boolean", title="whylogs profile",
                     description="Also store the hour's whylogs profile (profiled once per hour; it decides "
                                 "nothing)."),
}


def _batches():
    """The ``models`` task: the monitored models, cut into batches (one mapped box each)."""
    @data_task(execution_timeout=TIMEOUTS.listing)
    def models(params=None) -> list[list[dict]]:
        from tritonflow.pipelines.drift import monitored_models
        from tritonflow.pipelines.drift_batches import batch_models

        form.refuse_unknown_conf_keys(get_current_context())
        return batch_models(monitored_models(only=list((params or {}).get("models") or []) or None))

    return models()


def _hour_stages(batches):
    """``check``, ``evidently`` and ``profile`` of each batch's hour: (checked, evidently results, profiles)."""
    @data_task(links=True, execution_timeout=TIMEOUTS.drift_batch, map_index_template=BATCH_LABEL.format(arg="batch"))
    def check(batch: list, params=None) -> list[dict]:
        from tritonflow.pipelines.drift_batches import check_batch, retry_if_transient

        if len(batch) == 1:
            record_version_links(batch[0]["model"], batch[0]["version"])
        context = get_current_context()
        start, end = _window(context)
        out = check_batch(batch, start, end, reference_strategy=(params or {}).get("reference_strategy") or None)
        retry_if_transient(out, "check", _last_try(context))
        return out

    @data_task(execution_timeout=TIMEOUTS.drift_batch, map_index_template=BATCH_LABEL.format(arg="batch"))
    def evidently(batch: list, params=None) -> list[dict]:
        from tritonflow.pipelines.drift_batches import evidently_batch, retry_if_transient

        context = get_current_context()
        start, end = _window(context)
        rows = params.get("evidently_sample_rows") if params.get("evidently", True) else 0
        out = evidently_batch(batch, start, end, sample_rows=None if rows is None else int(rows))
        retry_if_transient(out, "evidently", _last_try(context))
        return out

    @data_task(execution_timeout=TIMEOUTS.drift_batch, map_index_template=BATCH_LABEL.format(arg="batch"))
    def profile(batch: list, params=None) -> list[dict]:
        from tritonflow.pipelines.drift_batches import profile_batch, retry_if_transient

        if not params.get("profile", True):
            return [{"model": t["model"], "skipped": "profile parameter is false"} for t in batch]
        context = get_current_context()
        start, end = _window(context)
        out = profile_batch(batch, start, end)
        retry_if_transient(out, "profile", _last_try(context))
        return out

    return check.expand(batch=batches), evidently.expand(batch=batches), profile.expand(batch=batches)


def _outcome_stages(checked, evidently_results):
    """``record`` (MLflow, per batch) and ``decide`` (every model's alert decision): (recorded, events)."""
    @data_task(links=True, execution_timeout=TIMEOUTS.drift_batch, trigger_rule="all_done",
                     map_index_template=BATCH_LABEL.format(arg="checked"))
    def record(checked: list, evidently_results: list | None = None) -> list[dict]:
        from tritonflow.pipelines.drift_batches import is_failure, record_batch, retry_if_transient

        context = get_current_context()
        out = record_batch(checked, evidently_results or [])
        if len(out) == 1 and not is_failure(out[0]):
            summary, recorded = next(s for s in checked if not is_failure(s)), out[0]
            html = [a for a in recorded.get("artifacts") or [] if str(a).endswith(".html")]
            record_version_links(summary.get("model") or "", summary.get("model_version"),
                                 mlflow_run_id=recorded.get("run_id"),
                                 mlflow_experiment_id=recorded.get("experiment_id"),
                                 evidently_report_path=html[0] if html else None)
        retry_if_transient(out, "record", _last_try(context))
        return out

    @data_task(execution_timeout=TIMEOUTS.drift_batch, trigger_rule="all_done")
    def decide(checked: list) -> list[dict]:
        """Every checked model's alert and decision; returns the asset-event extras of the alerting ones."""
        from tritonflow.pipelines.alert_decision import XCOM_KEY
        from tritonflow.pipelines.drift_batches import (
            OUTCOMES_KEY,
            alert_events,
            decide_hour,
            is_failure,
            outcomes,
            retry_if_transient,
        )

        context = get_current_context()
        out = decide_hour(checked)
        context["ti"].xcom_push(key=XCOM_KEY, value=[e["decision"] for e in out if not is_failure(e)])
        context["ti"].xcom_push(key=OUTCOMES_KEY, value=outcomes(out))
        retry_if_transient(out, "decide", _last_try(context))
        return alert_events(checked)

    recorded = record.partial(evidently_results=evidently_results).expand(checked=checked)
    return recorded, decide(checked)


def _alert_events(recorded, events):
    """One ``drift_event`` box per alerting model, once its hour is recorded and decided."""
    @task(execution_timeout=TIMEOUTS.decision, outlets=[DRIFT_ALERTS], retries=0, trigger_rule="all_done",
          map_index_template="{{ task.op_kwargs['extra']['model'] }}")
    @limit_xcom_size
    def drift_event(extra: dict) -> dict:
        get_current_context()["outlet_events"][DRIFT_ALERTS].extra = extra
        return extra

    emitted = drift_event.expand(extra=events)
    recorded >> emitted
    return emitted


def _quality_gate(batches, checked, recorded, events, evidently_results, profiles):
    """``data_quality_gate`` after every stage (fails the run naming each model that failed), then the follow-ups.

    It does not wait for the ``drift_event`` boxes (a quiet hour's skipped mapping cost one more
    scheduler loop): one that failed fails the run itself, as a leaf.
    """
    @data_task(execution_timeout=TIMEOUTS.decision, retries=0, trigger_rule="all_done")
    def data_quality_gate(batches: list, checked: list, recorded: list, evidently_results: list,
                          profiles: list, params=None) -> list[dict]:
        from tritonflow.pipelines.drift_batches import OUTCOMES_KEY, due_followups, problems, raise_problems
        from tritonflow.pipelines.retrain_followup import start_followups

        context = get_current_context()
        decided = context["ti"].xcom_pull(task_ids="decide", key=OUTCOMES_KEY, default=None)
        stages = {"record": recorded, "decide": decided or []}
        if params.get("evidently", True):
            stages["evidently"] = evidently_results
        if params.get("profile", True):
            stages["profile"] = profiles
        batches = list(batches or [])
        found = problems(batches, checked, stages)
        raise_problems(found, sum(len(b) for b in batches), *_window(context))
        return start_followups(due_followups(recorded))

    gate = data_quality_gate(batches, checked, recorded, evidently_results, profiles)
    events >> gate
    # a champion trained on few post-shift rows: its follow-up retraining, started by an hour that passed
    return fire_and_forget_mapped("trigger_followup_retrain").expand_kwargs(gate)


@tritonflow_dag("drift_monitor", schedule=_schedule(), topics=["drift"], description=DESCRIPTION, doc_md=DOC,
                params=PARAMS, max_active_runs=4, max_active_tasks=8)
def drift_monitor():
    """Check every monitored model's hour of inference log for drift, a batch of models per task."""
    batches = _batches()
    checked, ev, profiled = _hour_stages(batches)
    recorded, events = _outcome_stages(checked, ev)
    _alert_events(recorded, events)
    _quality_gate(batches, checked, recorded, events, ev, profiled)

drift_monitor()
