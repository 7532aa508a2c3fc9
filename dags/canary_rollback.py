"""DAG ``canary_rollback``: manual rollback of a model to its previous champion (Airflow UI).

Wiring only; the work is :func:`tritonflow.pipelines.canary.manual_rollback` (imported inside the
task so the file parses fast and without network).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context

from tritonflow_plugin.dag_defaults import CHAMPION_CHANGED, DEFAULT_ARGS, START_DATE, TAG
from tritonflow_plugin.errors import fail_fast_on_bad_data
from tritonflow_plugin.links import record_link_info, task_with_links

#: Timeout of the rollback task (a verify, at most one load, one gateway reload, registry calls).
ROLLBACK_TASK_TIMEOUT = timedelta(minutes=15)

DOC_MD = """
### Canary rollback (manual)

Rolls a model back to the version its `previous_champion` alias names, in this order:

1. resolve the rollback target (a missing or dangling alias stops the run, naming the alias and
   the version it last named: never a fall-back to "latest");
2. re-verify the target's signature and make sure it is loaded in Triton;
3. route 100 % of the gateway's traffic to it (and wait until that routing is live);
4. move alias `champion` back (`previous_champion` is cleared, so a second rollback stops);
5. unload the version rolled back from.

The reason is recorded on both MLflow model versions and in the registry's audit trail. A
promotion of the same model in progress makes this run fail naming the holder.
"""

PARAMS = {
    "model": Param("", type="string", minLength=1, description="Registered model name to roll back."),
    "reason": Param("manual rollback from the Airflow UI", type="string", minLength=1,
                    description="Why the model is rolled back (recorded on the MLflow versions)."),
    "use_stages": Param(False, type="boolean",
                        description="Also move legacy MLflow stages (target to Production, the other archived)."),
    "unload_rolled_back": Param(True, type="boolean",
                                description="Unload the version rolled back from once traffic has left it."),
}


@dag(
    dag_id="canary_rollback",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[TAG, "canary"],
    doc_md=DOC_MD,
    params=PARAMS,
)
def canary_rollback():
    """Roll a model back to its previous champion (gateway first, then the alias)."""
    @task_with_links(execution_timeout=ROLLBACK_TASK_TIMEOUT, retries=1, outlets=[CHAMPION_CHANGED])
    @fail_fast_on_bad_data
    def rollback() -> dict:
        """Gateway to the rollback target first, then the alias, then unload the old champion."""
        from tritonflow.exceptions import ConcurrencyError
        from tritonflow.pipelines.canary import manual_rollback

        context = get_current_context()
        p = context["params"]
        ti = context["ti"]
        try:
            result = manual_rollback(p["model"], p["reason"], use_stages=bool(p["use_stages"]),
                                     unload_rolled_back=bool(p["unload_rolled_back"]),
                                     holder=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}")
        except ConcurrencyError as exc:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"ConcurrencyError: {exc}") from exc
        target = None if result.get("rolled_back_to") is None else str(result["rolled_back_to"])
        record_link_info(model_name=p["model"], model_version=target, triton_model=result.get("triton_model"),
                         triton_version=target)
        # champion_sentinel restarts the model's sentinel on the rolled-back-to champion
        context["outlet_events"][CHAMPION_CHANGED].extra = {
            "model": p["model"], "champion": result.get("rolled_back_to"), "changed": True}
        return result

    rollback()


canary_rollback()
