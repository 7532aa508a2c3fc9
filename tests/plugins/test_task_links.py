"""``@task_with_links``: the extra link buttons of tritonflow's tasks, as Airflow 3 serves them.

A tiny DAG runs through ``dag.test()`` in a subprocess (Airflow reads its configuration at import
time; the session's SQLite metadata DB comes from ``tests/plugins/airflow_env.py``). The runner
then asks the *serialized* DAG for each task instance's links, exactly as the api-server's
``GET .../taskInstances/{task}/links`` does. Guards: a decorated ``@task`` that declares no links
(the API answered ``{"extra_links": {}}``); a link shown without recorded info (a broken button);
links lost when the task fails; the repository's DAGs losing the links on the tasks that
publish, analyse or promote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.plugins import airflow_env

LINK_NAMES = ["Evidently report", "Grafana panel", "MLflow model version", "MLflow run", "Registry deliveries",
              "Triton model"]

LINKED_DAG = textwrap.dedent('''\
    import pendulum
    from airflow.sdk import dag, task
    from tritonflow_plugin.links import record_link_info, task_with_links

    @dag(dag_id="linked_demo", schedule=None, start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
         catchup=False)
    def linked_demo():
        @task_with_links
        def publish():
            record_link_info(model_name="churn head", model_version="3", mlflow_run_id="r1",
                             mlflow_experiment_id="5")
            record_link_info(triton_model="churn", triton_version="3", triton_http_url="127.0.0.1:8000")
            return "ok"

        @task_with_links
        def nothing_recorded():
            return "ok"

        @task_with_links(retries=0)
        def fails_after_recording():
            record_link_info(model_name="churn", model_version="4", mlflow_run_id="r2",
                             mlflow_experiment_id="5", evidently_report_path="windows/h/report.html")
            raise RuntimeError("parity gate failed")

        @task_with_links(map_index_template="{{ task.op_kwargs['model'] }}")
        def check(model: str):
            record_link_info(triton_model=model)
            return model

        @task_with_links
        def map_changes():
            from tritonflow_plugin.links import delivery_status_url
            record_link_info(delivery_status_url=delivery_status_url("http://airflow.example:8080/"))
            return []

        @task
        def plain():
            return 1

        publish() >> nothing_recorded() >> plain()
        fails_after_recording()
        map_changes()
        check.expand(model=["a", "b"])

    linked_demo()
''')

RUNNER = textwrap.dedent('''\
    import json, sys
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    folder = sys.argv[1]
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(folder)
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)
    run = bag.dags["linked_demo"].test()
    with create_session() as s:
        sdag = SerializedDagModel.get_dag("linked_demo", session=s)
        out = {}
        for ti in s.query(TaskInstance).filter(TaskInstance.dag_id == "linked_demo",
                                               TaskInstance.run_id == run.run_id):
            task = sdag.get_task(ti.task_id)
            # what GET /api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}/links returns
            links = {name: task.get_extra_links(ti, name) or None for name in task.extra_links}
            out[ti.task_id + ("" if ti.map_index < 0 else f"[{ti.map_index}]")] = {
                "state": str(ti.state), "links": links}
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def served_links(tmp_path_factory) -> dict:
    """Links of every task instance of one ``linked_demo`` run, as the api-server serves them."""
    airflow_env.migrated_home()
    tmp = tmp_path_factory.mktemp("linked")
    dags = tmp / "dags"
    dags.mkdir()
    (dags / "linked_demo.py").write_text(LINKED_DAG)
    runner = tmp / "run_linked.py"
    runner.write_text(RUNNER)
    proc = subprocess.run(
        [sys.executable, str(runner), str(dags)],
        env=airflow_env.subprocess_env(
            AIRFLOW__CORE__DAGS_FOLDER=str(dags), TRITONFLOW_HOME=str(tmp / "home"),
            TRITONFLOW_MLFLOW_UI_URL="http://mlflow.example:5000",
            TRITONFLOW_GRAFANA_DASHBOARD_URL="http://grafana.example:3000/d/tritonflow-triton",
            TRITONFLOW_TRITON_PUBLIC_URL=""),
        capture_output=True, text=True, timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "XCom not found" not in proc.stdout + proc.stderr
    return json.loads(lines[-1][len("RESULT "):])


def test_a_linked_task_serves_the_urls_of_what_it_recorded(served_links):
    publish = served_links["publish"]
    assert publish["state"] == "success"
    assert publish["links"] == {
        "Evidently report": None,
        "Grafana panel": "http://grafana.example:3000/d/tritonflow-triton?var-model=churn&viewPanel=1",
        "MLflow model version": "http://mlflow.example:5000/#/models/churn%20head/versions/3",
        "MLflow run": "http://mlflow.example:5000/#/experiments/5/runs/r1",
        "Registry deliveries": None,
        "Triton model": "http://127.0.0.1:8000/v2/models/churn/versions/3",
    }


def test_a_registry_events_task_links_the_receivers_delivery_status(served_links):
    links = served_links["map_changes"]["links"]
    assert links["Registry deliveries"] == "http://airflow.example:8080/tritonflow/webhooks/status"
    assert {k for k, v in links.items() if v} == {"Registry deliveries"}


def test_nothing_recorded_means_no_button_and_plain_tasks_declare_no_links(served_links):
    assert served_links["nothing_recorded"]["links"] == dict.fromkeys(LINK_NAMES)
    assert served_links["plain"]["links"] == {}


def test_a_failed_task_keeps_the_links_it_recorded(served_links):
    failed = served_links["fails_after_recording"]
    assert failed["state"] == "failed"
    assert failed["links"]["MLflow model version"] == "http://mlflow.example:5000/#/models/churn/versions/4"
    assert failed["links"]["Evidently report"] == (
        "http://mlflow.example:5000/#/experiments/5/runs/r2/artifacts/windows/h/report.html")


def test_each_mapped_task_instance_has_its_own_links(served_links):
    assert served_links["check[0]"]["links"]["Grafana panel"].endswith("?var-model=a&viewPanel=1")
    assert served_links["check[1]"]["links"]["Triton model"].endswith("/v2/models/b")


#: Tasks of the repository's DAGs that publish, analyse, promote or map registry changes: they show the links.
LINKED_TASKS = {
    "model_publish": {"resolve", "convert_and_validate", "profile", "load_and_smoke", "record"},
    "shadow_evaluation": {"publish_challenger", "compare"},
    "drift_monitor": {"check", "record"},
    "canary_promotion": {"canary"},
    "canary_rollback": {"rollback"},
    "retrain": {"train"},
    "registry_events": {"map_changes"},
}


def test_the_dags_tasks_that_publish_analyse_promote_or_map_registry_changes_declare_the_links():
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    bag = DagBag(dag_folder=str(airflow_env.REPO / "dags"), safe_mode=False)
    assert bag.import_errors == {}
    for dag_id, task_ids in LINKED_TASKS.items():
        served = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags[dag_id]))
        linked = {t.task_id for t in served.tasks if set(LINK_NAMES) & set(t.extra_links)}
        assert linked == task_ids, dag_id
        for task_id in task_ids:
            assert sorted(served.get_task(task_id).extra_links) == LINK_NAMES, (dag_id, task_id)
