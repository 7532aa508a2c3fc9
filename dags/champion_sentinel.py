"""DAG ``champion_sentinel``: one health sentinel per champion, in Airflow's triggerer.

Wiring only; the probing and judging are :mod:`repository_sync.sentinel`, the golden sets and the
rollback :mod:`tritonflow.pipelines.sentinel`, the trigger and the deferrable operator
:mod:`tritonflow_plugin.sentinel`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, get_current_context, task

from tritonflow_plugin import params as form
from tritonflow_plugin.dag_defaults import CHAMPION_CHANGED, TIMEOUTS
from tritonflow_plugin.sentinel import ChampionSentinelOperator
from tritonflow_plugin.wiring import tritonflow_dag
from tritonflow_plugin.xcom import limit_xcom_size

#: Sentinels end at each multiple of this period (UTC) and the scheduled run restarts them with
#: fresh golden sets; the cron below fires at the same boundaries.
RENEW_PERIOD = timedelta(hours=6)
RENEW_CRON = "0 */6 * * *"
#: The watch task spends nearly all of it deferred (no worker slot); building the golden set and
#: a rollback take minutes at most.
WATCH_TIMEOUT = RENEW_PERIOD + timedelta(minutes=30)

DESCRIPTION = "Probe each champion model every few seconds and roll it back when it stops answering well."

DOC_MD = """
### Champion sentinel

Watches every **champion** model while it serves. Every few seconds
(`TRITONFLOW_SENTINEL_INTERVAL_S`, 10 by default) it sends a handful of known rows through the
gateway and checks the answers: real numbers, not all the same, within the range seen when the
version was published, and fast enough (`TRITONFLOW_SENTINEL_LATENCY_S`). After a few failed
probes in a row (`TRITONFLOW_SENTINEL_FAILURES`, 3) it **rolls the model back** to its previous
champion, exactly like `canary_rollback`, and writes why on both MLflow versions.

It runs by itself: after every promotion or rollback, and every 6 hours (UTC) for every model
with a champion. To start it by hand, list the **Models** to watch, or leave the list empty for
all. The sentinels wait in Airflow's triggerer, so they hold no worker slot.
"""


PARAMS = {
    "models": Param([], type="array", items={"type": "string"}, title="Models",
                    description="Registered MLflow models to watch, one per line. Empty: every model with "
                                "a champion."),
}


def _schedule():
    from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable

    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(RENEW_CRON, timezone="UTC"),
                               assets=CHAMPION_CHANGED)


@tritonflow_dag("champion_sentinel", schedule=_schedule(), topics=["canary", "sentinel"],
                description=DESCRIPTION, doc_md=DOC_MD, params=PARAMS, max_active_runs=64)
def champion_sentinel():
    """Watch the champions' health after a change and roll back an unhealthy one."""
    @task(execution_timeout=TIMEOUTS.listing)
    @limit_xcom_size
    def models_to_watch() -> list[str]:
        """Models named by the triggering CHAMPION_CHANGED events, else the param, else all."""
        from tritonflow.pipelines.sentinel import models_from_events, monitored_models

        context = get_current_context()
        form.refuse_unknown_conf_keys(context)
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
