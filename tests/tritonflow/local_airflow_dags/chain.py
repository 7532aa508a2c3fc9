"""Three tiny DAGs shaped like the loop: a driver-made run emits an asset event (and an
``alert_decision`` XCom), the asset starts a consumer, whose ``TriggerDagRunOperator`` starts a
target. Used by tests/tritonflow/test_local_airflow.py (no I/O at parse time)."""
from datetime import datetime, timezone

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Asset, dag, get_current_context, task

A = Asset(name="tests_alerts", uri="tests://alerts")
S = datetime(2025, 1, 1, tzinfo=timezone.utc)

@dag(dag_id="chain_source", schedule=None, start_date=S, catchup=False)
def chain_source():
    @task(outlets=[A])
    def emit():
        ctx = get_current_context()
        ctx["outlet_events"][A].extra = {"x": 1}
        decision = {"hour": 3, "features": ["f"], "decision": "act", "reason": "r"}
        ctx["ti"].xcom_push(key="alert_decision", value=decision)
        return {"start": str(ctx["data_interval_start"]), "end": str(ctx["data_interval_end"])}
    emit()
chain_source()

@dag(dag_id="chain_consumer", schedule=A, start_date=S, catchup=False)
def chain_consumer():
    TriggerDagRunOperator(task_id="trigger_next", trigger_dag_id="chain_target", conf={"a": 1},
                          wait_for_completion=False, deferrable=False)
chain_consumer()

@dag(dag_id="chain_target", schedule=None, start_date=S, catchup=False)
def chain_target():
    @task
    def t():
        return 1
    t()
chain_target()
