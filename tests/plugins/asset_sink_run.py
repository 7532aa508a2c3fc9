"""Subprocess body: the plugin's mounted webhook app writes a real Airflow asset event.

Parses a dags folder whose DAG is scheduled on registry_asset("model_publish"), syncs it to the
metadata DB (AIRFLOW_HOME), unpauses it, posts an MLflow-signed delivery to the app Airflow mounts,
and prints the asset events and queued DAG runs as one JSON line. Usage: asset_sink_run.py DAGS
"""

import json
import sys
import time
import uuid

from airflow import plugins_manager
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
from airflow.models.asset import AssetDagRunQueue, AssetEvent, AssetModel
from airflow.models.dag import DagModel
from airflow.utils.session import create_session
from fastapi.testclient import TestClient
from mlflow.webhooks.delivery import _generate_hmac_signature

DagBundlesManager().sync_bundles_to_db()
bag = DagBag(sys.argv[1])
assert not bag.import_errors, bag.import_errors
sync_bag_to_db(bag, "dags-folder", None)
with create_session() as s:
    s.query(DagModel).filter(DagModel.dag_id == "model_publish").update({"is_paused": False})

(app,) = [a["app"] for a in plugins_manager.get_fastapi_plugins()[0] if a["url_prefix"] == "/tritonflow"]
body = json.dumps({"entity": "model_version", "action": "created", "timestamp": "t",
                   "data": {"name": "churn", "version": "4", "source": "s3://b/m", "run_id": None,
                            "tags": {}, "description": None}})
did, ts = str(uuid.uuid4()), str(int(time.time()))
resp = TestClient(app).post("/webhooks/mlflow", content=body, headers={
    "X-MLflow-Delivery-Id": did, "X-MLflow-Timestamp": ts,
    "X-MLflow-Signature": _generate_hmac_signature("e2e-secret", did, ts, body)})
with create_session() as s:
    # Only this delivery's events: the metadata DB is shared with other tests of the session.
    events = [{"asset": m.name, "extra": e.extra} for e, m in
              s.query(AssetEvent, AssetModel).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
              if (e.extra or {}).get("delivery_id") == did]
    queued = [q.target_dag_id for q in s.query(AssetDagRunQueue)]
print("RESULT " + json.dumps({"status": resp.status_code, "body": resp.json(), "events": events,
                              "queued": queued}))
