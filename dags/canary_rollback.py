"""DAG ``canary_rollback``: manual rollback of a model to a signed version, by default its previous champion.

Wiring only; the work is :func:`tritonflow.pipelines.canary_rollback.manual_rollback` (imported inside the
task so the file parses fast and without network); a person picks the version in task
``choose_version`` (:mod:`tritonflow_plugin.rollback_choice`) when the form asks for it.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, get_current_context

from tritonflow_plugin import params as form
from tritonflow_plugin.dag_defaults import CHAMPION_CHANGED, TIMEOUTS
from tritonflow_plugin.deadlines import run_deadline
from tritonflow_plugin.links import record_link_info
from tritonflow_plugin.rollback_choice import RollbackChoiceOperator, model_of
from tritonflow_plugin.wiring import data_task, tritonflow_dag

DESCRIPTION = "Put a model back on a signed version (default: its previous champion): traffic first, then the alias."
#: Hours the version choice waits for a person before it takes the preselected previous champion.
CHOICE_TIMEOUT = timedelta(hours=1)

DOC_MD = """
### Roll a model back

Puts a model back on the version that served before its last promotion (the version with alias
`previous_champion`), or on another version tritonflow published and signed. Fill in **Model** and
a **Reason**, then click *Trigger*.

**Another version.** Type it in **Roll back to version**, or tick **Choose from the signed
versions**: task **choose_version** then lists the model's published, signed versions on the
*Required Actions* page (`previous_champion` preselected, versions rejected by the sentinel
marked) and waits for you to pick one (after an hour without an answer it takes the preselected
one). A version that is not published and signed is refused, naming it.

In order: the previous version's signature is checked and it is loaded in Triton; **all traffic**
goes back to it (the run waits until the gateway really serves it); alias `champion` moves back
to it; the version rolled back from is unloaded (untick **Unload the newer version** to keep it).

The reason is written on both MLflow versions. Without a version named, a model without a
previous champion is not rolled back (the run fails and says so; it never falls back to "the latest version"). When a
promotion of the same model is running, the run fails at once and names it.
"""

PARAMS = {
    "model": form.text("Model", "Registered MLflow model to roll back.", max_length=256),
    "reason": Param("manual rollback from the Airflow UI", type="string", minLength=1, title="Reason",
                    description="Why the model is rolled back (recorded on its MLflow versions)."),
    "to_version": Param(None, type=["null", "integer"], minimum=1, title="Roll back to version",
                        description="A version tritonflow published and signed. Empty: the previous champion "
                                    "(or the version you pick, with the box below ticked)."),
    "choose_version": Param(False, type="boolean", title="Choose from the signed versions",
                            description="With no version above: list the signed versions on the Required Actions "
                                        "page and wait for a person to pick one (previous_champion preselected)."),
    "use_stages": Param(False, type="boolean", title="Move MLflow stages too",
                        description="Also set the legacy MLflow stages (Production for the target, "
                                    "Archived for the other)."),
    "unload_rolled_back": Param(True, type="boolean", title="Unload the newer version",
                                description="Unload the version rolled back from once traffic has left it."),
}


@tritonflow_dag("canary_rollback", schedule=None, topics=["canary"], description=DESCRIPTION, doc_md=DOC_MD,
                params=PARAMS, deadline=run_deadline("rollback"))
def canary_rollback():
    """Roll a model back to a signed version (gateway first, then the alias)."""
    @data_task(links=True, when_locked="fail", execution_timeout=TIMEOUTS.rollback, retries=1,
               outlets=[CHAMPION_CHANGED])
    def rollback() -> dict:
        """Gateway to the rollback target first, then the alias, then unload the old champion."""
        from ground.exceptions import SettingsError
        from tritonflow.pipelines.canary_rollback import manual_rollback

        context = get_current_context()
        form.refuse_unknown_conf_keys(context)
        p = context["params"]
        ti = context["ti"]
        model = model_of(context)
        if not model:
            raise SettingsError("model is empty; expected the name of the registered MLflow model to roll "
                                "back (field 'Model')")
        chosen = ti.xcom_pull(task_ids="choose_version") or {}
        result = manual_rollback(model, p["reason"], use_stages=bool(p["use_stages"]),
                                 to_version=chosen.get("version"),
                                 unload_rolled_back=bool(p["unload_rolled_back"]),
                                 holder=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}")
        target = None if result.get("rolled_back_to") is None else str(result["rolled_back_to"])
        record_link_info(model_name=model, model_version=target, triton_model=result.get("triton_model"),
                         triton_version=target)
        # champion_sentinel restarts the model's sentinel on the rolled-back-to champion
        context["outlet_events"][CHAMPION_CHANGED].extra = {
            "model": model, "champion": result.get("rolled_back_to"), "changed": True}
        return result

    choice = RollbackChoiceOperator(task_id="choose_version", execution_timeout=TIMEOUTS.short,
                                    response_timeout=CHOICE_TIMEOUT, retries=0)
    choice >> rollback()


canary_rollback()
