"""The canary's approval on its own: ``resolve_versions`` hands the plan in the run's conf to the
``approval`` task (tritonflow_plugin.approval), then ``after`` runs only when approved. Used by
tests/tritonflow/test_local_airflow_approval.py (no I/O at parse time).

A run's conf may set ``approval_timeout_h``: the approval task's process then reads it as
``TRITONFLOW_APPROVAL_TIMEOUT_H`` (set before the task runs, as tritonflow's connections set the
settings they give), so one run can time out in seconds while the deployment's other runs wait."""
import os
from datetime import datetime, timedelta, timezone

from airflow.sdk import Param, dag, get_current_context, task

from tritonflow_plugin.approval import CanaryApprovalOperator


def _timeout_from_conf(context):
    """The run's ``approval_timeout_h``, if any, as this task process's approval timeout setting."""
    hours = context["params"].get("approval_timeout_h")
    if hours is not None:
        os.environ["TRITONFLOW_APPROVAL_TIMEOUT_H"] = str(hours)


@dag(dag_id="approval_gate", schedule=None, start_date=datetime(2025, 1, 1, tzinfo=timezone.utc), catchup=False,
     params={"model": Param("", type="string"), "approval_timeout_h": Param(None, type=["null", "number"])})
def approval_gate():
    @task
    def resolve_versions():
        model = get_current_context()["params"]["model"]
        return {"model": model, "champion": 1, "challenger": 2, "noop": False, "dry_run": False}

    @task
    def after():
        return "canary would start"

    # the setting replaces this at run time: a run that times out within the test shows it did
    approval = CanaryApprovalOperator(task_id="approval", response_timeout=timedelta(minutes=30),
                                      on_execute_callback=_timeout_from_conf)
    resolve_versions() >> approval >> after()


approval_gate()
