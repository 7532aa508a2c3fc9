"""Subprocess body of the fire-and-forget trigger test: parse a dags folder, sync it, run dag.test twice.

Prints one JSON line: trigger task states and the runs of the target DAG with their conf.
Run with AIRFLOW_HOME pointing at a migrated metadata DB. Usage: fire_and_forget_run.py DAGS_FOLDER
"""

import json
import sys

from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session

folder = sys.argv[1]
DagBundlesManager().sync_bundles_to_db()
bag = DagBag(folder)
assert not bag.import_errors, bag.import_errors
sync_bag_to_db(bag, "dags-folder", None)
dag = bag.dags["drift_monitor_hourly_trigger"]
states = [str(dag.test().state) for _ in range(2)]
with create_session() as s:
    runs = [{"run_id": r.run_id, "conf": r.conf} for r in
            s.query(DagRun).filter(DagRun.dag_id == "retrain_pipeline").order_by(DagRun.id)]
    tis = [(t.run_id, t.task_id, str(t.state)) for t in
           s.query(TaskInstance).filter(TaskInstance.dag_id == "drift_monitor_hourly_trigger")]
print("RESULT " + json.dumps({"states": states, "runs": runs, "tis": tis}))
