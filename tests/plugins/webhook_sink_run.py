"""Subprocess body: MLflow's own deliveries reach the plugin's app and create real DAG runs, one each.

Parses a dags folder whose DAG is scheduled on registry_asset("model_publish"), syncs it to the
metadata DB (AIRFLOW_HOME), unpauses it, serves the app Airflow mounts at /tritonflow with uvicorn
on a free loopback port, registers the webhook on the MLflow server (``model_registry.webhooks``,
the events the receiver maps), registers two model versions back to back, waits for their runs,
and prints the DAG runs and the asset events of those deliveries as one JSON line.
Usage: webhook_sink_run.py DAGS MLFLOW_TRACKING_URI
"""

import json
import os
import sys
import threading
import time
import uuid

import uvicorn
from airflow import plugins_manager
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
from airflow.models.asset import AssetEvent, AssetModel
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session
from fastapi import FastAPI
from mlflow import MlflowClient

from model_registry.webhooks import register_webhook
from tritonflow.registry_events import SUPPORTED_EVENTS
from tritonflow.runtime.services import free_port

DagBundlesManager().sync_bundles_to_db()
bag = DagBag(sys.argv[1])
assert not bag.import_errors, bag.import_errors
sync_bag_to_db(bag, "dags-folder", None)
with create_session() as s:
    s.query(DagModel).filter(DagModel.dag_id == "model_publish").update({"is_paused": False})

(plugin_app,) = [a["app"] for a in plugins_manager.get_fastapi_plugins()[0] if a["url_prefix"] == "/tritonflow"]
app = FastAPI()
app.mount("/tritonflow", plugin_app)  # as the api-server mounts it
port = free_port()
server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
threading.Thread(target=server.run, daemon=True).start()
while not server.started:
    time.sleep(0.05)

uri = sys.argv[2]
client = MlflowClient(tracking_uri=uri, registry_uri=uri)
model = f"churn-{uuid.uuid4().hex[:8]}"
hook = register_webhook(client, f"http://127.0.0.1:{port}/tritonflow/webhooks/mlflow",
                        os.environ["TRITONFLOW_WEBHOOK_SECRET"],
                        [f"{entity}.{action}" for entity, action in SUPPORTED_EVENTS]).webhook
try:
    time.sleep(3)  # MLflow's webhook cache (2 s on tritonflow's MLflow) may still hold "no webhook"
    client.create_registered_model(model)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    versions = [client.create_model_version(model, f"{run.info.artifact_uri}/model", run.info.run_id).version
                for _ in range(2)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with create_session() as s:
            runs = [{"run_id": r.run_id, "run_type": str(r.run_type), "conf": r.conf}
                    for r in s.query(DagRun).filter(DagRun.dag_id == "model_publish")
                    if (r.conf or {}).get("model_name") == model]
        if len(runs) >= 2:
            break
        time.sleep(0.5)
    time.sleep(2)  # a third (duplicate) run would show up here
    with create_session() as s:
        runs = [{"run_id": r.run_id, "run_type": str(r.run_type), "conf": r.conf}
                for r in s.query(DagRun).filter(DagRun.dag_id == "model_publish")
                if (r.conf or {}).get("model_name") == model]
finally:
    client.delete_webhook(hook.webhook_id)  # the MLflow server is the session's
    server.should_exit = True
deliveries = [r["conf"]["delivery_id"] for r in runs]
with create_session() as s:
    # Only this test's rows: the metadata DB is shared with other tests of the session.
    events = [{"asset": m.name, "extra": e.extra} for e, m in
              s.query(AssetEvent, AssetModel).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
              if (e.extra or {}).get("delivery_id") in deliveries]
print("RESULT " + json.dumps({"model": model, "versions": versions, "deliveries": deliveries, "runs": runs,
                              "events": events}, default=str))
