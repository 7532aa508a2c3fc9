"""A connection created through Airflow's REST API is what a tritonflow task uses.

A real local deployment (scheduler, dag-processor, triggerer, api-server; LocalExecutor) runs the
project's own ``dags/``. The tasks' environment points ``TRITONFLOW_MLFLOW_TRACKING_URI`` at a
port where nothing listens; the ``mlflow_default`` connection, created through the REST API,
points at a real MLflow server. A manual ``champion_sentinel`` run lists the models holding a
champion: it can only succeed, naming the model registered there, if the task took MLflow from
the connection. The api-server's connection form metadata lists the ``mlflow`` and ``triton``
connection types registered by tritonflow's provider entry point.
"""

from __future__ import annotations

import time
import uuid

import pytest

from ground.settings import PROJECT_ROOT, Settings
from tritonflow.demo import runs as rr
from tritonflow.runtime.airflow import AirflowDeployment
from tritonflow.runtime.airflow_api import AirflowApi
from tritonflow.runtime.airflow_config import AirflowConfig
from tritonflow.runtime.services import free_port

pytestmark = [pytest.mark.integration]

#: Seconds the run may take on a loaded two-core machine.
RUN_TIMEOUT_S = 600

#: Task-instance states after which a task will not run again in this try.
FINISHED_STATES = ("success", "failed", "upstream_failed", "skipped")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    home = tmp_path_factory.mktemp("conn_airflow")
    settings = Settings.from_env({}, home=home, start_timeout_s=600)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = AirflowConfig.local(settings, api_port=free_port(), execution_api_port=free_port(),
                                 worker_log_port=free_port(),
                                 triggerer_log_port=free_port(), dags_folder=PROJECT_ROOT / "dags",
                                 extra_env={"TRITONFLOW_MLFLOW_TRACKING_URI": dead})
    dep = AirflowDeployment(config)
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()


def _register_champion(tracking_uri: str, name: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    client.create_registered_model(name)
    mv = client.create_model_version(name, source=f"s3://tritonflow-test-models/{name}/1")
    client.set_registered_model_alias(name, "champion", mv.version)


def test_a_connection_created_through_the_rest_api_is_used_by_a_task(deployment, mlflow_server):
    from urllib.parse import urlsplit

    name = f"conn_model_{uuid.uuid4().hex[:6]}"
    _register_champion(mlflow_server.tracking_uri, name)
    api = AirflowApi(deployment.api_url)
    parts = urlsplit(mlflow_server.tracking_uri)
    api.post("/connections", {"connection_id": "mlflow_default", "conn_type": "mlflow",
                              "host": parts.hostname, "port": parts.port, "schema": "http"})
    api.wait_for_dag("champion_sentinel", 300)
    api.unpause("champion_sentinel")
    run_id = f"manual_{uuid.uuid4().hex[:8]}"
    api.post("/dags/champion_sentinel/dagRuns", {"dag_run_id": run_id, "logical_date": None,
                                                  "conf": {"models": []}})
    # Only ``models_to_watch`` reads the connection: wait for it, not for the whole sentinel run.
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state, tis = None, {}
    while time.monotonic() < deadline:
        state = api.get(f"/dags/champion_sentinel/dagRuns/{run_id}")["state"]
        tis = {ti["task_id"]: ti["state"] for ti in rr.task_instances(api, "champion_sentinel", run_id)}
        if state in ("success", "failed") or tis.get("models_to_watch") in FINISHED_STATES:
            break
        time.sleep(2)
    assert tis.get("models_to_watch") == "success", (state, tis)
    [(_, _, listed)] = rr.xcom_values(api, "champion_sentinel", run_id, "return_value", ["models_to_watch"])
    assert name in listed


def test_the_connection_form_offers_the_mlflow_and_triton_types(deployment):
    api = AirflowApi(deployment.api_url)
    meta = {m["connection_type"]: m for m in api._request("GET", "/ui/connections/hook_meta")}
    assert {"mlflow", "triton"} <= set(meta)
    assert meta["triton"]["hook_name"] == "NVIDIA Triton"
    assert set(meta["triton"]["extra_fields"]) >= {"metrics_url", "grpc_url"}
    assert meta["mlflow"]["standard_fields"]["login"]["title"] == "Username"
