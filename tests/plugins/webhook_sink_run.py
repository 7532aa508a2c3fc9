"""Subprocess body: the plugin's mounted webhook app creates real Airflow DAG runs, one per delivery.

Parses a dags folder whose DAG is scheduled on registry_asset("model_publish"), syncs it to the
metadata DB (AIRFLOW_HOME), unpauses it, posts two MLflow-signed deliveries back to back (two model
versions) to the app Airflow mounts, then hands one action to the optional asset-event sink, and
prints the DAG runs, asset events and queued DAGs as one JSON line. Usage: webhook_sink_run.py DAGS
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
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session
from fastapi.testclient import TestClient
from mlflow.webhooks.delivery import _generate_hmac_signature

from tritonflow_plugin.event_mapping import actions_for, load_mapping
from tritonflow_plugin.webhook import AssetEventSink, parse_delivery

DagBundlesManager().sync_bundles_to_db()
bag = DagBag(sys.argv[1])
assert not bag.import_errors, bag.import_errors
sync_bag_to_db(bag, "dags-folder", None)
with create_session() as s:
    s.query(DagModel).filter(DagModel.dag_id == "model_publish").update({"is_paused": False})

(app,) = [a["app"] for a in plugins_manager.get_fastapi_plugins()[0] if a["url_prefix"] == "/tritonflow"]
client = TestClient(app)
responses, deliveries = [], []
for version in ("4", "5"):
    body = json.dumps({"entity": "model_version", "action": "created", "timestamp": "t",
                       "data": {"name": "churn", "version": version, "source": "s3://b/m", "run_id": None,
                                "tags": {}, "description": None}})
    did, ts = str(uuid.uuid4()), str(int(time.time()))
    deliveries.append(did)
    resp = client.post("/webhooks/mlflow", content=body, headers={
        "X-MLflow-Delivery-Id": did, "X-MLflow-Timestamp": ts,
        "X-MLflow-Signature": _generate_hmac_signature("e2e-secret", did, ts, body)})
    responses.append({"status": resp.status_code, "body": resp.json()})
# The optional sink: an asset event on registry_asset("model_publish") for the same change.
(action,) = actions_for(parse_delivery(body), load_mapping(""))
asset_delivery = str(uuid.uuid4())
asset_result = AssetEventSink().deliver(action, asset_delivery)
with create_session() as s:
    # Only this test's rows: the metadata DB is shared with other tests of the session.
    runs = [{"run_id": r.run_id, "run_type": str(r.run_type), "conf": r.conf}
            for r in s.query(DagRun).filter(DagRun.dag_id == "model_publish")
            if any(d in r.run_id for d in deliveries)]
    events = [{"asset": m.name, "extra": e.extra} for e, m in
              s.query(AssetEvent, AssetModel).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
              if (e.extra or {}).get("delivery_id") in deliveries + [asset_delivery]]
    queued = [q.target_dag_id for q in s.query(AssetDagRunQueue)]
print("RESULT " + json.dumps({"responses": responses, "deliveries": deliveries, "runs": runs, "events": events,
                              "asset_result": asset_result, "queued": queued}, default=str))
