"""The canary's approval on its own: ``resolve_versions`` hands the plan in the run's conf to the
``approval`` task (tritonflow_plugin.approval), then ``after`` runs only when approved. Used by
tests/tritonflow/test_local_airflow_approval.py (no I/O at parse time)."""
from datetime import datetime, timedelta, timezone

from airflow.sdk import Param, dag, get_current_context, task

from tritonflow_plugin.approval import CanaryApprovalOperator


@dag(dag_id="approval_gate", schedule=None, start_date=datetime(2025, 1, 1, tzinfo=timezone.utc), catchup=False,
     params={"model": Param("", type="string")})
def approval_gate():
    @task
    def resolve_versions():
        model = get_current_context()["params"]["model"]
        return {"model": model, "champion": 1, "challenger": 2, "noop": False, "dry_run": False}

    @task
    def after():
        return "canary would start"

    approval = CanaryApprovalOperator(task_id="approval", response_timeout=timedelta(minutes=30))
    resolve_versions() >> approval >> after()


approval_gate()
