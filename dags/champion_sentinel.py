"""DAG ``champion_sentinel``: one health sentinel per champion, in Airflow's triggerer.

Wiring only; the probing and judging are :mod:`repository_sync.sentinel`, the golden sets and the
rollback :mod:`tritonflow.pipelines.sentinel`, the trigger and the deferrable operator
:mod:`tritonflow_plugin.sentinel`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from tritonflow_plugin.dag_defaults import CHAMPION_CHANGED, DEFAULT_ARGS, START_DATE, TAG
from tritonflow_plugin.sentinel import ChampionSentinelOperator

#: Sentinels end at each multiple of this period (UTC) and the scheduled run restarts them with
#: fresh golden sets; the cron below fires at the same boundaries.
RENEW_PERIOD = timedelta(hours=6)
RENEW_CRON = "0 */6 * * *"
#: The watch task spends nearly all of it deferred (no worker slot); building the golden set and
#: a rollback take minutes at most.
WATCH_TIMEOUT = RENEW_PERIOD + timedelta(minutes=30)
LIST_TIMEOUT = timedelta(minutes=5)

DOC_MD = """
### Champion sentinel

Keeps one deferrable sentinel per champion in Airflow's **triggerer** (no worker slot held).
Every `TRITONFLOW_SENTINEL_INTERVAL_S` seconds (default 10) it sends the champion's golden samples
(rows of its drift reference) through the gateway and checks the answer: finite, not constant
across the samples, within the range seen at validation, and within `TRITONFLOW_SENTINEL_LATENCY_S`.
After `TRITONFLOW_SENTINEL_FAILURES` consecutive failed probes (default 3) it rolls the model back
to `previous_champion` through the `canary_rollback` path (gateway first, then aliases) and
records why on both MLflow model versions (`tritonflow.sentinel.*`).

Runs: on every `CHAMPION_CHANGED` event (canary_promotion, canary_rollback) for the models named
in the events; every 6 h (UTC) for all models with a champion, when every running sentinel ends
and restarts with a fresh golden set; manually with `models` (empty: all). A sentinel whose
version stops being the champion ends by itself.
"""


def _schedule():
    from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable

    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(RENEW_CRON, timezone="UTC"),
                               assets=CHAMPION_CHANGED)


@dag(
    dag_id="champion_sentinel",
    schedule=_schedule(),
    start_date=START_DATE,
    catchup=False,
    max_active_runs=64,
    default_args=DEFAULT_ARGS,
    tags=[TAG, "canary", "sentinel"],
    doc_md=DOC_MD,
    params={
        "models": Param([], type="array", items={"type": "string"},
                        description="Registered models to watch (empty: every model with a champion)."),
    },
)
def champion_sentinel():
    """Watch the champions' health after a change and roll back an unhealthy one."""
    @task(execution_timeout=LIST_TIMEOUT)
    def models_to_watch() -> list[str]:
        """Models named by the triggering CHAMPION_CHANGED events, else the param, else all."""
        from tritonflow.pipelines.sentinel import models_from_events, monitored_models

        context = get_current_context()
        events = context.get("triggering_asset_events") or {}
        extras = [e.extra for evs in events.values() for e in evs]
        if extras:
            return models_from_events(extras)
        return sorted(set(context["params"].get("models") or [])) or monitored_models()

    ChampionSentinelOperator.partial(
        task_id="watch_champion", renew_period_s=RENEW_PERIOD.total_seconds(),
        execution_timeout=WATCH_TIMEOUT, retries=1,
    ).expand(model=models_to_watch())


champion_sentinel()
