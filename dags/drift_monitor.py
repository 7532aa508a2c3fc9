"""drift_monitor: hourly input-drift check of every served (champion) model version.

Wiring only: the stages are plain Python in :mod:`tritonflow.pipelines.drift` (imported inside the
tasks, so parsing this file stays fast and offline).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import CronDataIntervalTimetable, Param, dag, get_current_context, task

from tritonflow_plugin import params as form
from tritonflow_plugin.dag_defaults import DEFAULT_ARGS, DRIFT_ALERTS, START_DATE, TAG, TIMEOUTS
from tritonflow_plugin.errors import fail_fast_on_bad_data
from tritonflow_plugin.links import record_version_links, task_with_links
from tritonflow_plugin.xcom import limit_xcom_size

DESCRIPTION = "Every hour, check each served model's inputs for drift and raise an alert when they moved."

DOC = """
### Hourly drift monitor

Every hour, compares the inputs each served model received during that hour with a
**reference** and says whether they **drifted**. One box per model in the grid.

For each model:

* **check** - the hour's inputs must keep their data contract (columns, types, ranges); then
  every feature is compared with the reference (KS, PSI, Wasserstein) against thresholds learnt
  from the last 30 days;
* **record** - figures and verdicts go to MLflow (experiment `tritonflow-drift`), with an
  Evidently report and a whylogs profile when ticked;
* **alert** - an alert fires after a few drifted hours in a row, or at once on a strong drift; a
  cooldown keeps it from repeating every hour. An alert starts `shadow_evaluation`;
* a **broken data contract** fails the run (the hour is kept for inspection) instead of raising
  a drift alert.

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


@dag(
    dag_id="drift_monitor",
    schedule=_schedule(),
    start_date=START_DATE,
    catchup=False,
    max_active_runs=4,
    max_active_tasks=8,
    default_args=DEFAULT_ARGS,
    tags=[TAG, "drift"],
    description=DESCRIPTION,
    doc_md=DOC,
    params={
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
            "seasonal: the same hour one period earlier. Empty: TRITONFLOW_DRIFT_REFERENCE_STRATEGY.",
            form.REFERENCE_STRATEGIES),
        "profile": Param(True, type="boolean", title="whylogs profile",
                         description="Also store the hour's whylogs profile (merged into daily profiles)."),
    },
)
def drift_monitor():
    """Check every monitored model's hour of inference log for drift."""
    @task(execution_timeout=TIMEOUTS.listing)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def models(params=None) -> list[dict]:
        from tritonflow.pipelines.drift import monitored_models

        form.refuse_unknown_conf_keys(get_current_context())
        return monitored_models(only=list((params or {}).get("models") or []) or None)

    @task_with_links(execution_timeout=TIMEOUTS.check,
                     map_index_template="{{ task.op_kwargs['target']['model'] }}")
    @fail_fast_on_bad_data
    @limit_xcom_size
    def check(target: dict, params=None) -> dict:
        from tritonflow.pipelines.drift import check_model_hour

        record_version_links(target["model"], target["version"])
        start, end = _window(get_current_context())
        return check_model_hour(target["model"], target["version"], start, end,
                                reference_strategy=(params or {}).get("reference_strategy") or None)

    @task(execution_timeout=TIMEOUTS.check)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def evidently(target: dict, params=None) -> dict:
        from tritonflow.pipelines.drift import evidently_for_hour

        start, end = _window(get_current_context())
        rows = params.get("evidently_sample_rows") if params.get("evidently", True) else 0
        return evidently_for_hour(target["model"], target["version"], start, end,
                                  sample_rows=None if rows is None else int(rows))

    @task(execution_timeout=TIMEOUTS.check)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def profile(target: dict, params=None) -> dict:
        from tritonflow.pipelines.drift import profile_for_hour

        if not params.get("profile", True):
            return {"model": target["model"], "skipped": "profile parameter is false"}
        start, end = _window(get_current_context())
        return profile_for_hour(target["model"], target["version"], start, end)

    @task_with_links(execution_timeout=TIMEOUTS.short, trigger_rule="all_done")
    @fail_fast_on_bad_data
    @limit_xcom_size
    def record(summary: dict, evidently_results: list | None = None) -> dict:
        from tritonflow.pipelines.drift import record_in_mlflow

        ev = next((e for e in (evidently_results or []) if isinstance(e, dict)
                   and e.get("model") == summary.get("model")), None)
        recorded = record_in_mlflow(summary, evidently=ev)
        html = [a for a in recorded.get("artifacts") or [] if str(a).endswith(".html")]
        record_version_links(summary.get("model") or "", summary.get("model_version"),
                             mlflow_run_id=recorded.get("run_id"), mlflow_experiment_id=recorded.get("experiment_id"),
                             evidently_report_path=html[0] if html else None)
        return recorded

    @task(execution_timeout=TIMEOUTS.decision)
    @limit_xcom_size
    def notify(summary: dict) -> dict:
        from tritonflow.pipelines.drift import alert

        return alert(summary)

    @task(execution_timeout=TIMEOUTS.decision, outlets=[DRIFT_ALERTS], retries=0,
          trigger_rule="all_done")
    @limit_xcom_size
    def drift_event(summary: dict) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        from tritonflow.pipelines.drift import drift_event as event_of

        extra = event_of(summary)  # None when no alert fired or the contract failed
        if extra is None:
            raise AirflowSkipException(f"{summary.get('model')}: no drift alert in this hour "
                                       f"(status {summary.get('status')}); no asset event")
        get_current_context()["outlet_events"][DRIFT_ALERTS].extra = extra
        return extra

    @task(execution_timeout=TIMEOUTS.decision, trigger_rule="all_done",
          map_index_template="{{ task.op_kwargs['summary']['model'] }}")
    @fail_fast_on_bad_data
    @limit_xcom_size
    def decide(summary: dict) -> dict:
        from tritonflow.pipelines.alert_decision import XCOM_KEY, drift_hour_decision, record_decision

        made = drift_hour_decision(summary)
        get_current_context()["ti"].xcom_push(key=XCOM_KEY, value=made)
        if made["decision"] != "no_alert":
            record_decision(made)
        return made

    @task(execution_timeout=TIMEOUTS.decision, retries=0)
    @fail_fast_on_bad_data
    @limit_xcom_size
    def data_quality_gate(summary: dict) -> dict:
        from tritonflow.pipelines.drift import data_quality_gate as gate

        return gate(summary)

    targets = models()
    summaries = check.expand(target=targets)
    ev = evidently.expand(target=targets)
    profile.expand(target=targets)
    recorded = record.partial(evidently_results=ev).expand(summary=summaries)
    notified = notify.expand(summary=summaries)
    gate = data_quality_gate.expand(summary=summaries)
    decide.expand(summary=summaries)
    [recorded, notified] >> gate >> drift_event.expand(summary=summaries)


drift_monitor()
