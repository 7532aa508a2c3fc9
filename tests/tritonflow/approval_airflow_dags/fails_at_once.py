"""A run that fails in its one task: what ``tritonflow ... --wait`` reports for a failed run. Used by
tests/tritonflow/test_local_airflow_approval.py (no I/O at parse time)."""
from datetime import datetime, timezone

from airflow.sdk import dag, task


@dag(dag_id="fails_at_once", schedule=None, start_date=datetime(2025, 1, 1, tzinfo=timezone.utc), catchup=False)
def fails_at_once():
    @task(retries=0)
    def broken():
        raise RuntimeError("this task always fails")

    broken()


fails_at_once()
