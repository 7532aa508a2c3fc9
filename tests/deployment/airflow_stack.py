"""One real Airflow deployment per test session, shared by tests/deployment and tests/ui.

:func:`get_stack` starts :class:`tritonflow.runtime.airflow.AirflowDeployment` once (PostgreSQL
database ``tritonflow_af_<random>``, Redis broker, CeleryExecutor, api-server, scheduler,
dag-processor, triggerer, Celery worker, all on free loopback ports), beside a Triton server in
explicit mode over the stack's model repository (folder), which the workers' settings name, and
registers the teardown with the pytest session, so both test folders use the same processes.

The DAG folder is ``<repo>/dags`` when every DAG the tests drive is there; a DAG still being
written is replaced by a stand-in with the same id, schedule and kind of Params in a temporary
copy of the folder (the test reports which DAGs were stand-ins).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ground.settings import PROJECT_ROOT, Settings
from tritonflow.runtime.airflow import AirflowDeployment
from tritonflow.runtime.airflow_api import AirflowApi
from tritonflow.runtime.airflow_config import AirflowConfig
from tritonflow.runtime.services import TritonServer, free_port

REPO_DAGS = PROJECT_ROOT / "dags"
#: The compose stack's Grafana dashboard (deploy/grafana/dashboards/triton.json, uid tritonflow-triton).
GRAFANA_DASHBOARD_URL = "http://localhost:3000/d/tritonflow-triton"
#: DAG files the tests need, and the stand-in used while a file is missing.
STAND_INS = {
    "model_publish.py": textwrap.dedent('''\
        """Stand-in for model_publish while dags/model_publish.py is being written."""
        from datetime import timedelta

        import pendulum
        from airflow.sdk import Param, dag, task

        from tritonflow_plugin.registry_watcher import registry_asset

        @dag(dag_id="model_publish", schedule=registry_asset("model_publish"),
             start_date=pendulum.datetime(2025, 1, 1, tz="UTC"), catchup=False, max_active_runs=4,
             tags=["tritonflow", "stand-in"], doc_md="Stand-in for model_publish.",
             default_args={"execution_timeout": timedelta(minutes=2)},
             params={
                 "model": Param("", type="string", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9_.\\-]*$",
                                description="Registered model name."),
                 "version_or_alias": Param("champion", type="string",
                                           pattern=r"^([1-9][0-9]*|[A-Za-z_][A-Za-z0-9_\\-]*)$",
                                           description="Model version or alias."),
                 "atol": Param(1e-5, type="number", minimum=0,
                               description="Parity gate absolute tolerance (>= 0)."),
             })
        def model_publish():
            @task
            def publish(params=None):
                return {"model": params["model"], "version": params["version_or_alias"]}

            publish()

        model_publish()
    '''),
}


@dataclasses.dataclass
class Stack:
    """A started deployment plus what the tests need to drive it."""

    deployment: AirflowDeployment
    api: AirflowApi
    webhook_secret: str
    model: str
    env: dict[str, str]
    stand_ins: list[str]
    home: Path
    triton: TritonServer
    repository: Path

    @property
    def url(self) -> str:
        """API server base URL (UI, REST, plugin)."""
        return self.deployment.api_url


def _dags_folder(tmp: Path) -> tuple[Path, list[str]]:
    # TRITONFLOW_TEST_STAND_IN_DAGS=model_publish forces a stand-in (to tell a harness problem from
    # a problem of the real DAG).
    forced = {f"{n.strip()}.py" for n in os.environ.get("TRITONFLOW_TEST_STAND_IN_DAGS", "").split(",") if n.strip()}
    missing = [name for name in STAND_INS if name in forced or not (REPO_DAGS / name).exists()]
    if not missing:
        return REPO_DAGS, []
    folder = tmp / "dags"
    folder.mkdir(parents=True, exist_ok=True)
    for path in REPO_DAGS.iterdir():
        if path.is_file() and path.suffix in (".py", ".json", ".yaml", ".yml"):
            shutil.copy2(path, folder / path.name)
    for name in missing:
        (folder / name).write_text(STAND_INS[name])
    return folder, [n.removesuffix(".py") for n in missing]


_STACK: dict[str, Any] = {}


def get_stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    """The session's deployment (started on first use, stopped when the session ends)."""
    if "stack" in _STACK:
        return _STACK["stack"]
    if "error" in _STACK:
        pytest.fail(f"the Airflow deployment failed to start earlier: {_STACK['error']}")
    mlflow = request.getfixturevalue("mlflow_server")
    home = tmp_path_factory.mktemp("airflow_stack")
    dags, stand_ins = _dags_folder(home)
    model = f"deploy-{secrets.token_hex(4)}"
    secret = secrets.token_urlsafe(24)
    repository = home / "repository"
    repository.mkdir()
    triton_settings = Settings.from_env({}, home=home / "triton", triton_http_port=free_port(),
                                        triton_grpc_port=free_port(), triton_metrics_port=free_port())
    triton = TritonServer(triton_settings, repository=str(repository))
    request.config.add_cleanup(triton.stop)
    triton.start()
    env = {
        "TRITONFLOW_HOME": str(home / "tf_home"),
        "TRITONFLOW_MLFLOW_TRACKING_URI": mlflow.tracking_uri,
        "TRITONFLOW_INFERENCE_LOG_ROOT": str(home / "inference_logs"),
        "TRITONFLOW_DRIFT_HISTORY_DB_URL": f"sqlite:///{home / 'drift_history.db'}",
        "TRITONFLOW_MONITORED_MODELS": model,
        "TRITONFLOW_WEBHOOK_SECRET": secret,
        "TRITONFLOW_REGISTRY_POLL_INTERVAL_S": "5",
        "TRITONFLOW_REGISTRY_RESEND_AFTER_S": "15",
        "TRITONFLOW_EVENT_MAPPING_PATH": "",
        "TRITONFLOW_HOST": triton_settings.host,
        "TRITONFLOW_TRITON_HTTP_PORT": str(triton_settings.triton_http_port),
        "TRITONFLOW_TRITON_GRPC_PORT": str(triton_settings.triton_grpc_port),
        "TRITONFLOW_TRITON_METRICS_PORT": str(triton_settings.triton_metrics_port),
        "TRITONFLOW_REPOSITORY_URI": str(repository),
        # no Grafana runs here: the link only has to name the compose stack's dashboard
        "TRITONFLOW_GRAFANA_DASHBOARD_URL": GRAFANA_DASHBOARD_URL,
    }
    settings = Settings.from_env({}, home=home / "tf_home")
    config = AirflowConfig.from_settings(
        settings,
        api_port=free_port(), worker_log_port=free_port(), triggerer_log_port=free_port(),
        database=f"tritonflow_af_{secrets.token_hex(4)}", queue=f"tritonflow_{secrets.token_hex(4)}",
        redis_db=secrets.randbelow(15) + 1, dags_folder=dags, extra_env=env,
    )
    deployment = AirflowDeployment(config, drop_database=True)
    request.config.add_cleanup(deployment.stop)
    try:
        deployment.start()
    except Exception as exc:
        _STACK["error"] = str(exc)[-3000:]
        raise
    stack = Stack(deployment=deployment, api=AirflowApi(deployment.api_url), webhook_secret=secret,
                  model=model, env=env, stand_ins=stand_ins, home=home, triton=triton, repository=repository)
    _STACK["stack"] = stack
    return stack
