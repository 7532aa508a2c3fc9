"""The local Airflow deployment (LocalExecutor, SQLite in WAL mode) and how the demo reads it back.

A real deployment (``AirflowConfig.local``: scheduler, dag-processor, triggerer, api-server) runs
three tiny DAGs shaped like the loop (tests/tritonflow/local_airflow_dags/chain.py): the test plays
the driver and creates one run through the REST API with the data interval of a logical hour; the
scheduler does the rest (asset event -> consumer -> TriggerDagRunOperator -> target). Then
:mod:`tritonflow.demo.runs` must name what triggered each run, read the ``alert_decision`` XCom
and measure the scheduling latency.
"""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ground.settings import Settings
from tritonflow.demo import runs as rr
from tritonflow.runtime.airflow import AirflowDeployment
from tritonflow.runtime.airflow_api import AirflowApi
from tritonflow.runtime.airflow_config import AirflowConfig
from tritonflow.runtime.services import free_port

pytestmark = [pytest.mark.integration]

DAGS = Path(__file__).parent / "local_airflow_dags"
CHAIN = ("chain_source", "chain_consumer", "chain_target")
#: Seconds the three runs may take on a loaded two-core machine.
CHAIN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    home = tmp_path_factory.mktemp("local_airflow")
    settings = Settings.from_env({}, home=home, start_timeout_s=600)
    config = AirflowConfig.local(settings, api_port=free_port(), execution_api_port=free_port(),
                                 worker_log_port=free_port(),
                                 triggerer_log_port=free_port(), dags_folder=DAGS)
    dep = AirflowDeployment(config)
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()


def test_config_is_local_executor_on_sqlite_without_celery(tmp_path):
    config = AirflowConfig.local(Settings.from_env({}, home=tmp_path))
    cfg = config.airflow_cfg()
    assert cfg["core"]["executor"] == "LocalExecutor"
    assert int(cfg["core"]["parallelism"]) >= 4
    assert cfg["database"]["sql_alchemy_conn"] == f"sqlite:///{tmp_path / 'airflow' / 'airflow.db'}"
    assert "celery" not in cfg
    assert config.api_port != 8080  # the gateway's port
    with pytest.raises(ValueError, match="parallelism"):
        AirflowConfig.local(Settings.from_env({}, home=tmp_path), parallelism=2)
    with pytest.raises(ValueError, match="PostgreSQL"):
        AirflowConfig.from_settings(Settings.from_env({}, home=tmp_path), database_url="sqlite:////x.db")


def test_on_sqlite_the_execution_api_has_a_process_of_its_own_and_on_postgresql_not(tmp_path):
    # Airflow 3.3's audit log commits on the API server's event loop: with the execution API in the
    # same process, a REST write and a task's XCom push waited out SQLite's 5 s busy timeout
    # together (the REST call answered 500), twice in one quick main job
    from tritonflow.runtime.airflow import AirflowDeployment

    settings = Settings.from_env({"TRITONFLOW_AIRFLOW_EXECUTION_API_PORT": "8391"}, home=tmp_path)
    sqlite = AirflowConfig.local(settings)
    assert sqlite.execution_api_port == 8391 != sqlite.api_port
    assert sqlite.airflow_cfg()["core"]["execution_api_server_url"] == "http://127.0.0.1:8391/execution/"
    dep = AirflowDeployment(sqlite)
    assert [s.name for s in dep.api_servers] == ["airflow-api-server", "airflow-execution-api"]
    assert dep.api_server.command()[-2:] == ["--apps", "core"]
    assert dep.execution_api.command()[-2:] == ["--apps", "execution"] and 8391 in dep.execution_api.ports()
    postgres = AirflowConfig.local(settings, database_url="postgresql+psycopg2://postgres@127.0.0.1:5432/x")
    assert postgres.execution_api_port == 0
    assert postgres.airflow_cfg()["core"]["execution_api_server_url"] == f"{postgres.api_url}/execution/"
    single = AirflowDeployment(postgres)
    assert single.api_servers == [single.api_server] and "--apps" not in single.api_server.command()
    assert "airflow-execution-api" not in {s.name for s in single.services}


def test_local_workers_preload_the_task_libraries_and_celery_does_not(tmp_path):
    settings = Settings.from_env({}, home=tmp_path)
    scheduler = AirflowConfig.local(settings).airflow_cfg()["scheduler"]
    assert scheduler["mp_start_method"] == "forkserver"
    preload = scheduler["mp_forkserver_preload"].split(",")
    assert "mlflow" in preload and "airflow" in preload
    assert preload[-1] == "tritonflow.runtime.forkserver_preload"  # gc.freeze() after the libraries
    project = ("tritonflow", "model_registry", "drift_checks", "repository_sync", "ground")
    assert not any(m.startswith(project) for m in preload[:-1])
    off = AirflowConfig.local(settings, task_preload_modules=()).airflow_cfg()["scheduler"]
    assert "mp_start_method" not in off and "mp_forkserver_preload" not in off
    celery = AirflowConfig.from_settings(settings).airflow_cfg()["scheduler"]
    assert "mp_start_method" not in celery


def test_local_supervisors_notice_a_finished_task_within_a_second(tmp_path):
    cfg = AirflowConfig.local(Settings.from_env({}, home=tmp_path)).airflow_cfg()
    assert int(cfg["workers"]["min_heartbeat_interval"]) == 1  # Airflow's default 5 held a slot 5 s


def test_local_scheduler_queues_a_ready_task_within_a_fifth_of_a_second(tmp_path):
    cfg = AirflowConfig.local(Settings.from_env({}, home=tmp_path)).airflow_cfg()
    assert float(cfg["scheduler"]["scheduler_idle_sleep_time"]) <= 0.2  # Airflow's default 1 s per task


def test_an_unchanged_dag_file_is_parsed_again_after_minutes_and_a_changed_one_at_once(tmp_path):
    # every 10 s the dag-processor kept 16-19 % of a core busy parsing unchanged files; Airflow's
    # default modified_time order still parses a changed file at the next scan (every 5 s)
    cfg = AirflowConfig.local(Settings.from_env({}, home=tmp_path)).airflow_cfg()["dag_processor"]
    assert int(cfg["min_file_process_interval"]) >= 60 and int(cfg["refresh_interval"]) <= 5
    assert cfg.get("file_parsing_sort_mode", "modified_time") == "modified_time"


def test_the_project_bytecode_is_written_at_start_only_when_the_processes_would_not(tmp_path, monkeypatch):
    # with PYTHONDONTWRITEBYTECODE every task process compiled every project module it imported
    from tritonflow.runtime.airflow import precompile_project

    dags, plugins = tmp_path / "dags", tmp_path / "plugins"
    for folder in (dags, plugins):
        folder.mkdir()
        (folder / "m.py").write_text("X = 1\n")
    config = AirflowConfig.local(Settings.from_env({}, home=tmp_path), dags_folder=dags, plugins_folder=plugins)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    assert precompile_project(config) == [] and not (dags / "__pycache__").exists()
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    done = precompile_project(config)
    assert str(dags) in done and str(plugins) in done
    assert list((dags / "__pycache__").glob("m.*.pyc")) and list((plugins / "__pycache__").glob("m.*.pyc"))


def test_a_driver_run_starts_the_chain_and_the_runs_say_what_triggered_them(deployment):
    api = AirflowApi(deployment.api_url)
    services = {s.name for s in deployment.services}
    assert services == {"airflow-api-server", "airflow-execution-api", "airflow-dag-processor", "airflow-scheduler",
                        "airflow-triggerer"}
    db = deployment.config.sql_alchemy_conn.removeprefix("sqlite:///")
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # the tasks' execution API is the other process's; the REST API's process does not serve it
    assert deployment.execution_api.healthy()
    try:  # the UI's pages answer any other path
        with urllib.request.urlopen(f"{deployment.api_url}/execution/health", timeout=30) as resp:  # noqa: S310
            answer = resp.read()
    except urllib.error.HTTPError as exc:
        answer = exc.read()
    assert b'"healthy"' not in answer
    with urllib.request.urlopen(deployment.execution_api.health_url(), timeout=30) as resp:  # noqa: S310
        assert json.loads(resp.read()) == {"status": "healthy"}
    for dag_id in CHAIN:
        api.wait_for_dag(dag_id, 300)
        api.unpause(dag_id)
    run_id = "demo_hour_0003__2025-01-01T03:00"
    api.post("/dags/chain_source/dagRuns", {
        "dag_run_id": run_id, "logical_date": "2025-01-01T03:00:00+00:00",
        "data_interval_start": "2025-01-01T03:00:00+00:00",
        "data_interval_end": "2025-01-01T04:00:00+00:00", "conf": {}})
    deadline = time.monotonic() + CHAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        targets = api.dag_runs("chain_target")
        if targets and targets[0]["state"] in ("success", "failed"):
            break
        time.sleep(2)
    runs = rr.dag_runs(api, CHAIN, {run_id})
    by_dag = {r["dag_id"]: r for r in runs}
    assert set(by_dag) == set(CHAIN) and all(r["state"] == "success" for r in runs), runs
    assert by_dag["chain_source"]["triggered_by"] == "driver"
    assert by_dag["chain_consumer"]["triggered_by"] == "asset:tests_alerts"
    assert by_dag["chain_consumer"]["run_type"] == "asset_triggered"
    assert by_dag["chain_target"]["triggered_by"] == f"dag:chain_consumer/{by_dag['chain_consumer']['run_id']}"
    # the task saw the logical hour as its data interval
    [(_, _, window)] = rr.xcom_values(api, "chain_source", run_id, "return_value", ["emit"])
    assert window == {"start": "2025-01-01 03:00:00+00:00", "end": "2025-01-01 04:00:00+00:00"}
    decisions = rr.xcom_values(api, "chain_source", run_id, rr.ALERT_DECISION_KEY)
    assert [v for _, _, v in decisions] == [{"hour": 3, "features": ["f"], "decision": "act", "reason": "r"}]
    latency = rr.scheduling_latency_s(runs)
    assert latency["n"] == 2 and 0 <= latency["all"] < 120


def test_rest_calls_answered_with_a_server_error_are_retried_and_client_errors_are_not(monkeypatch):
    """A busy SQLite metadata DB makes the API server answer HTTP 500 for a moment; a client
    error (409: the run exists) is an answer, never retried."""
    import http.server
    import json as _json
    import threading

    import tritonflow.runtime.airflow_api as af

    monkeypatch.setattr(af, "API_RETRY_DELAY_S", 0.01)
    answers = {"/api/v2/busy": [500, 500, 200], "/api/v2/exists": [409, 200], "/api/v2/slow": [-1, 200]}
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            seen.append(self.path)
            status = answers[self.path].pop(0)
            if status < 0:  # no answer within the client's timeout (a stalled API server)
                time.sleep(1.0)
                status = 500
            body = _json.dumps({"detail": "database is locked"} if status >= 400 else {"ok": True}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = AirflowApi(f"http://127.0.0.1:{server.server_address[1]}")
        api._token = "test"
        assert api.post("/busy", {}) == {"ok": True}
        assert seen.count("/api/v2/busy") == 3
        with pytest.raises(af.AirflowApiError) as exc:
            api.post("/exists", {})
        assert exc.value.status == 409 and seen.count("/api/v2/exists") == 1
        impatient = AirflowApi(api.base_url, timeout=0.3)
        impatient._token = "test"
        assert impatient.post("/slow", {}) == {"ok": True}
        assert seen.count("/api/v2/slow") == 2
    finally:
        server.shutdown()
