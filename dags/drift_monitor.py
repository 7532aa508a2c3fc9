"""drift_monitor: hourly input-drift check of every served (champion) model version.

Wiring only: the stages are plain Python in :mod:`tritonflow.pipelines.drift` (imported inside the
tasks, so parsing this file stays fast and offline).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import CronDataIntervalTimetable, Param, dag, get_current_context, task

from tritonflow_plugin.dag_defaults import DEFAULT_ARGS, DRIFT_ALERTS, START_DATE, TAG
from tritonflow_plugin.errors import fail_fast_on_bad_data
from tritonflow_plugin.links import record_version_links, task_with_links

DOC = """
### Hourly drift monitor

One run checks **one hour**: the run's data interval `[data_interval_start, data_interval_end)`
selects the inference-log window of every monitored model (registered models with a `champion`
alias, or the `models` parameter / `TRITONFLOW_MONITORED_MODELS`), one mapped task per model.

Per model: **check** (data contract: exact vectorised checks + Great Expectations; KS / PSI /
Wasserstein per feature against the reference chosen by `reference_strategy`; thresholds per
reference: P95 of the last 30 days of taught history, else of the reference's own chunks, with
a floor and a ceiling; per-feature vote; importance-weighted dataset verdict; alert policy:
k consecutive drifted windows or one strong effect, per-model cooldown; statistics stored every
hour) → **record** in MLflow (experiment `tritonflow-drift`, metrics with the hour as step,
summary JSON and Evidently HTML as artifacts, verdict tags on the model version) → **alert**
(log, webhook when configured) → **data-quality gate**: a broken data contract fails the run
without retries; the window is kept for inspection → **drift event** (after the gates): an
asset event on `tritonflow_drift_alerts` only when the alert policy fired and the window's
contract held, with `extra = {model, version, features, scores, window_start, window_end,
severity}` (`shadow_evaluation` is scheduled on it). **decide** records the hour's alert decision
(`alert`, `cooldown` (logical time: the windows' hours), `no_alert`, `contract_failed`,
`no_reference`) with its reason under the XCom key `alert_decision` (`model`, `hour`,
`features`, `decision`, `reason`), and on the registered model in MLflow
(`tritonflow.alert_decision.<hour>.drift`, every decision but `no_alert`).

Parameters left empty take their values from the settings when the run starts
(`TRITONFLOW_DRIFT_REFERENCE_STRATEGY`, `TRITONFLOW_DRIFT_EVIDENTLY_SAMPLE_ROWS`).

The **Evidently** sample report and the **whylogs** profile run beside the check (they decide
nothing and cost a fixed 15-30 s).

Idempotent per hour (a rerun replaces that hour's results) and backfill-friendly:
`airflow backfill create --dag-id drift_monitor --from-date ... --to-date ...` builds the
history the dynamic thresholds need. A model without a recorded reference gets status
`no_reference` and an alert, not a crash.
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
    doc_md=DOC,
    params={
        "models": Param([], type="array", items={"type": "string"},
                        description="Only these registered models (empty: every model with a "
                                    "'champion' alias, or TRITONFLOW_MONITORED_MODELS)."),
        "evidently": Param(True, type="boolean",
                           description="Also build the Evidently DataDriftPreset report on a sample "
                                       "(its own task, off the critical path)."),
        "evidently_sample_rows": Param(None, type=["null", "integer"], minimum=0,
                                       description="Rows per side passed to Evidently (0: no report; "
                                                   "empty: TRITONFLOW_DRIFT_EVIDENTLY_SAMPLE_ROWS)."),
        "reference_strategy": Param(None, type=["null", "string"],
                                    enum=[None, "training", "trailing", "seasonal"],
                                    description="What each window is compared with: training (the "
                                                "version's reference), trailing (the last N days served) "
                                                "or seasonal (the same window one period earlier); empty: "
                                                "TRITONFLOW_DRIFT_REFERENCE_STRATEGY."),
        "profile": Param(True, type="boolean",
                         description="Also store the hour's whylogs profile (mergeable into daily "
                                     "profiles)."),
    },
)
def drift_monitor():
    """Check every monitored model's hour of inference log for drift."""
    @task(execution_timeout=timedelta(minutes=5))
    @fail_fast_on_bad_data
    def models(params=None) -> list[dict]:
        from tritonflow.pipelines.drift import monitored_models

        return monitored_models(only=list((params or {}).get("models") or []) or None)

    @task_with_links(execution_timeout=timedelta(minutes=15),
                     map_index_template="{{ task.op_kwargs['target']['model'] }}")
    @fail_fast_on_bad_data
    def check(target: dict, params=None) -> dict:
        from tritonflow.pipelines.drift import check_model_hour

        record_version_links(target["model"], target["version"])
        start, end = _window(get_current_context())
        return check_model_hour(target["model"], target["version"], start, end,
                                reference_strategy=(params or {}).get("reference_strategy") or None)

    @task(execution_timeout=timedelta(minutes=15))
    @fail_fast_on_bad_data
    def evidently(target: dict, params=None) -> dict:
        from tritonflow.pipelines.drift import evidently_for_hour

        start, end = _window(get_current_context())
        rows = params.get("evidently_sample_rows") if params.get("evidently", True) else 0
        return evidently_for_hour(target["model"], target["version"], start, end,
                                  sample_rows=None if rows is None else int(rows))

    @task(execution_timeout=timedelta(minutes=15))
    @fail_fast_on_bad_data
    def profile(target: dict, params=None) -> dict:
        from tritonflow.pipelines.drift import profile_for_hour

        if not params.get("profile", True):
            return {"model": target["model"], "skipped": "profile parameter is false"}
        start, end = _window(get_current_context())
        return profile_for_hour(target["model"], target["version"], start, end)

    @task_with_links(execution_timeout=timedelta(minutes=10), trigger_rule="all_done")
    @fail_fast_on_bad_data
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

    @task(execution_timeout=timedelta(minutes=5))
    def notify(summary: dict) -> dict:
        from tritonflow.pipelines.drift import alert

        return alert(summary)

    @task(execution_timeout=timedelta(minutes=5), outlets=[DRIFT_ALERTS], retries=0,
          trigger_rule="all_done")
    def drift_event(summary: dict) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        from tritonflow.pipelines.drift import drift_event as event_of

        extra = event_of(summary)  # None when no alert fired or the contract failed
        if extra is None:
            raise AirflowSkipException(f"{summary.get('model')}: no drift alert in this hour "
                                       f"(status {summary.get('status')}); no asset event")
        get_current_context()["outlet_events"][DRIFT_ALERTS].extra = extra
        return extra

    @task(execution_timeout=timedelta(minutes=5), trigger_rule="all_done",
          map_index_template="{{ task.op_kwargs['summary']['model'] }}")
    @fail_fast_on_bad_data
    def decide(summary: dict) -> dict:
        from tritonflow.pipelines.alert_decision import XCOM_KEY, drift_hour_decision, record_decision

        made = drift_hour_decision(summary)
        get_current_context()["ti"].xcom_push(key=XCOM_KEY, value=made)
        if made["decision"] != "no_alert":
            record_decision(made)
        return made

    @task(execution_timeout=timedelta(minutes=5), retries=0)
    @fail_fast_on_bad_data
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
