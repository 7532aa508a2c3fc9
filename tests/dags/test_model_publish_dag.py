"""DAG ``model_publish``: wiring checks, and ``dag.test()`` runs against real MLflow and Triton.

The runs happen in a subprocess (Airflow reads its configuration at import time; the session's
SQLite metadata DB comes from ``tests/plugins/airflow_env.py``): the subprocess parses a dags folder
holding ``dags/model_publish.py`` and a tiny follow-up DAG, syncs it to the DB and calls
``dag.test(run_conf=...)``, which runs every task in-process. The tritonflow settings reach the tasks
through ``TRITONFLOW_*`` environment variables (MLflow server, Triton port, repository, home).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from tests.plugins import airflow_env

DAG_FILE = airflow_env.REPO / "dags" / "model_publish.py"

FOLLOWUP_DAG = textwrap.dedent('''\
    from __future__ import annotations
    import pendulum
    from airflow.sdk import dag, task

    @dag(dag_id="publish_followup", schedule=None, start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
         catchup=False, tags=["test"])
    def publish_followup():
        @task
        def noop():
            return "ok"
        noop()

    publish_followup()
''')

RUNNER = textwrap.dedent('''\
    import json, sys
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    folder, conf = sys.argv[1], json.loads(sys.argv[2])
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(folder)
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)
    run = bag.dags["model_publish"].test(run_conf=conf)
    with create_session() as s:
        tis = {t.task_id + ("" if t.map_index < 0 else f"[{t.map_index}]"): str(t.state)
               for t in s.query(TaskInstance).filter(TaskInstance.dag_id == "model_publish",
                                                    TaskInstance.run_id == run.run_id)}
        follow = [r.conf for r in s.query(DagRun).filter(DagRun.dag_id == "publish_followup")]
    print("RESULT " + json.dumps({"state": str(run.state), "tis": tis, "followups": follow}, default=str))
''')


# ------------------------------------------------------------------------------ static wiring
@pytest.fixture(scope="module")
def publish_dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE), safe_mode=False)
    assert bag.import_errors == {}
    return bag.dags["model_publish"]


def test_every_task_has_a_timeout_and_the_run_is_exclusive(publish_dag):
    assert publish_dag.max_active_runs == 1
    assert all(t.execution_timeout is not None for t in publish_dag.tasks)
    assert [t.task_id for t in publish_dag.tasks] == [
        "resolve", "convert_and_validate", "profile", "perf_gate", "sign_and_push", "load_and_smoke", "record",
        "then_triggers", "trigger_then"]


def test_then_triggers_are_fire_and_forget_and_never_deferrable(publish_dag):
    trigger = publish_dag.get_task("trigger_then")
    kwargs = trigger.partial_kwargs
    assert type(trigger).__name__ == "MappedOperator" and trigger.operator_class.__name__ == "TriggerDagRunOperator"
    assert kwargs["wait_for_completion"] is False and kwargs["deferrable"] is False


def test_registry_events_start_the_dag_and_published_versions_emit_an_event(publish_dag):
    from tritonflow_plugin.dag_defaults import MODEL_PUBLISHED

    assert publish_dag.timetable.asset_condition.name == "tritonflow_registry__model_publish"
    assert MODEL_PUBLISHED in publish_dag.get_task("record").outlets


@pytest.mark.parametrize("param, value", [
    ("model", "churn model!"), ("version_or_alias", "3x!"), ("atol", -1.0), ("rtol", -0.5),
    ("max_batch_size", 5000), ("max_batch_size", -1),
])
def test_invalid_params_are_refused_by_the_trigger_form(publish_dag, param, value):
    from airflow.sdk.exceptions import ParamValidationError

    declared = publish_dag.params.get_param(param)
    declared.resolve(declared.value)  # the default is valid
    with pytest.raises(ParamValidationError):
        declared.resolve(value)  # what the trigger form and the API do with a submitted value


# ------------------------------------------------------------------------------ dag.test runs
def _register(tracking_uri: str, name: str) -> int:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from tests.pipelines.test_publish_pipeline import churn_data, register

    X, y = churn_data(n=200, seed=3)
    return register(tracking_uri, name, make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), X)


#: Profiled DAG runs (a new model each) before an inconclusive verdict is accepted.
PROFILE_ATTEMPTS = 2


def _run_dag(tmp_path, airflow_home, conf: dict, env: dict, timeout: int) -> dict:
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copyfile(DAG_FILE, dags / "model_publish.py")
    (dags / "publish_followup.py").write_text(FOLLOWUP_DAG)
    runner = tmp_path / "run_publish.py"
    runner.write_text(RUNNER)
    proc = subprocess.run(
        [sys.executable, str(runner), str(dags), json.dumps(conf)],
        env=airflow_env.subprocess_env(AIRFLOW__CORE__DAGS_FOLDER=str(dags), **env),
        capture_output=True, text=True, timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    (tmp_path / "run.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def _stack_env(tmp_path, mlflow_server, triton, repo) -> dict:
    port = triton.http_url.rsplit(":", 1)[1]
    return {"TRITONFLOW_HOME": str(tmp_path / "home"), "TRITONFLOW_MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
            "TRITONFLOW_HOST": "127.0.0.1", "TRITONFLOW_TRITON_HTTP_PORT": port,
            "TRITONFLOW_REPOSITORY_URI": str(repo), "MLFLOW_TRACKING_URI": mlflow_server.tracking_uri}


def _assert_served_and_recorded(tracking_uri, triton, repo, home, name, version) -> dict:
    import mlflow

    from repository_sync.triton.client import TritonModelControl

    with TritonModelControl(triton.http_url, repository=str(repo),
                            trusted_keys=str(home / "keys" / "trusted")) as ctl:
        assert ctl.ready_versions(name) == [version]
    tags = dict(mlflow.MlflowClient(tracking_uri).get_model_version(name, str(version)).tags)
    assert tags["tritonflow.status"] == "published"
    assert tags["tritonflow.triton_model_version"] == str(version)
    return tags


@pytest.mark.integration
def test_manual_run_publishes_the_champion_and_triggers_the_then_dags(tmp_path, airflow_home, mlflow_server,
                                                                       triton_factory):
    repo = tmp_path / "repo"
    repo.mkdir()
    triton = triton_factory(str(repo))
    name = f"dag_churn_{uuid.uuid4().hex[:6]}"
    version = _register(mlflow_server.tracking_uri, name)
    conf = {"model": name, "version_or_alias": "champion", "profile": False, "max_batch_size": 8,
            "then": ["publish_followup"]}
    result = _run_dag(tmp_path, airflow_home, conf, _stack_env(tmp_path, mlflow_server, triton, repo), 600)
    assert result["state"] == "success", result
    assert {k: v for k, v in result["tis"].items() if v != "success"} == {}, result["tis"]
    # the then-DAG gets the loop context (one typed conf), validated when its run starts
    assert [set(c) for c in result["followups"]] == [{"loop"}]
    handed = result["followups"][0]["loop"]
    assert (handed["model"], handed["version"], handed["triggered_by"]) == (name, str(version), "model_publish")
    tags = _assert_served_and_recorded(mlflow_server.tracking_uri, triton, repo, tmp_path / "home", name, version)
    assert json.loads(tags["tritonflow.profile"])["status"] == "skipped"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(PROFILE_ATTEMPTS * 900 + 300)
def test_profiled_run_adopts_the_model_analyzer_choice(tmp_path, airflow_home, mlflow_server, triton_factory):
    """The DAG's profile stage serves Model Analyzer's choice.

    On a host too loaded to measure (seen in CI at load 9), the verdict is ``inconclusive``: that
    verdict is asserted (the version served, its reason recorded, nothing rejected), the run is
    repeated for a new model up to PROFILE_ATTEMPTS times, and when every attempt is inconclusive
    the test is reported skipped, never passed.
    """
    from ground.settings import Settings
    from tritonflow.pipelines.publish_profile import profiling_unavailable_reason

    reason = profiling_unavailable_reason(Settings.from_env({}))
    if reason:
        pytest.skip(f"Model Analyzer cannot run here: {reason}")
    repo = tmp_path / "repo"
    repo.mkdir()
    triton = triton_factory(str(repo))
    verdicts = []
    for attempt in range(PROFILE_ATTEMPTS):
        work = tmp_path / f"attempt{attempt}"
        work.mkdir()
        name = f"dag_prof_{uuid.uuid4().hex[:6]}"
        version = _register(mlflow_server.tracking_uri, name)
        env = _stack_env(work, mlflow_server, triton, repo)
        # the tightest sweep: one config (+ Model Analyzer's default), concurrency 1, 1 s windows;
        # stability relaxed to CV 0.5 because the shared 2-core test machine is heavily loaded
        env.update(TRITONFLOW_ANALYZER_MAX_BATCH_SIZES="8", TRITONFLOW_ANALYZER_INSTANCE_COUNTS="1",
                   TRITONFLOW_ANALYZER_QUEUE_DELAYS_US="100", TRITONFLOW_ANALYZER_CONCURRENCY="1",
                   TRITONFLOW_ANALYZER_MEASUREMENT_MS="1000", TRITONFLOW_ANALYZER_STABILITY_CV="0.5",
                   TRITONFLOW_ANALYZER_TIMEOUT_S="500")
        conf = {"model": name, "version_or_alias": str(version), "profile": True, "max_batch_size": 8}
        result = _run_dag(work, airflow_home, conf, env, 900)
        assert result["state"] == "success", result
        tags = _assert_served_and_recorded(mlflow_server.tracking_uri, triton, repo, work / "home", name, version)
        profile = json.loads(tags["tritonflow.profile"])
        assert profile["status"] in ("profiled", "inconclusive"), profile
        if profile["status"] == "profiled":
            break
        # nothing chosen from noise, the model not judged by it: the generated config serves
        assert "measured stably" in profile["reason"], profile
        assert "tritonflow.rejected_stage" not in tags, tags
        verdicts.append(profile["reason"])
    else:
        pytest.skip(f"all {PROFILE_ATTEMPTS} profiled runs were inconclusive on this host (asserted as such; "
                    f"no profiled choice shown): {verdicts[-1][:300]}")
    assert profile["throughput"] > 0
    assert profile["p99_latency_ms"] <= profile["p99_constraint_ms"]
    assert any(k.startswith("tritonflow.artifact.profile/results.csv") for k in tags)
    # the config Triton serves is the one Model Analyzer's selection chose, not the generated one
    from mlflow.artifacts import download_artifacts

    from model_registry.triton_config import config_summary, read_config

    chosen_uri = tags["tritonflow.artifact.profile/chosen_config.pbtxt"]
    chosen = read_config(download_artifacts(artifact_uri=chosen_uri, dst_path=str(work / "chosen"),
                                            tracking_uri=mlflow_server.tracking_uri))
    served = read_config(repo / name / "config.pbtxt")
    keys = ("max_batch_size", "instance_groups", "dynamic_batching")
    assert {k: config_summary(served)[k] for k in keys} == {k: config_summary(chosen)[k] for k in keys}
    assert profile["best"]  # the selection named a config, and that config is the one pushed
