"""A run that outlasts its tiny deadline alert (tritonflow_plugin.deadlines, as on the canary, rollback and
publish DAGs): the triggerer runs the failure notifier, which posts to TRITONFLOW_ALERT_WEBHOOK_URL. Used by
tests/tritonflow/test_local_airflow_approval.py (no I/O at parse time)."""
import time
from datetime import datetime, timezone

from airflow.sdk import dag, task

from tritonflow_plugin.deadlines import run_deadline


@dag(dag_id="overruns_its_deadline", schedule=None, start_date=datetime(2025, 1, 1, tzinfo=timezone.utc),
     catchup=False, deadline=run_deadline("rollback", seconds=2))
def overruns_its_deadline():
    @task(retries=0)
    def slow():
        time.sleep(20)

    slow()


overruns_its_deadline()
