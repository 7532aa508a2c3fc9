"""DAGs ``shadow_evaluation`` and ``retrain`` run with ``dag.test(run_conf=...)`` on SQLite.

The closed loop on real NOAA data, real MLflow, a real Triton and the real pipelines:

1. ``shadow_evaluation`` for the drifted window, champion (days 0-8,000) only: the champion is
   degraded -> ``trigger_retrain`` creates a ``retrain`` run whose conf is the loop context
   ``{"loop": {model, reason, drift_event, window_start, window_end}}``;
2. ``retrain`` with exactly that conf: trains on the labelled log before the drift event's end ->
   version 2 with alias ``challenger`` -> ``trigger_publish`` creates a ``model_publish`` run with
   the context handed on (version "2", the training window as ``dataset_uri``, the same drift event
   and window, ``then: ["shadow_evaluation"]``);
3. ``shadow_evaluation`` with the context ``model_publish`` hands on (version "2"): the challenger is
   published through the publish pipeline with its training window (it is not in the repository
   yet), replayed on the same window, wins -> ``trigger_canary`` creates a ``canary_promotion`` run
   with the context (version "2", expected predictions, drift event).

Each shadow run's decision is read back from XCom key ``alert_decision``.

The three runs happen in one subprocess (``dag.test`` runs every task in-process), with Airflow's
settings from ``tests/plugins/airflow_env.py`` and the session's migrated SQLite database. The
triggered target DAGs (``canary_promotion``, ``model_publish``) are stand-ins with the same ids in
the temporary DAGs folder: only the runs the triggers create are asserted, they are not executed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import uuid

import mlflow
import pytest

from model_registry import datasets as ds
from model_registry import training as tr
from repository_sync.triton.client import TritonModelControl
from tests.conftest import make_settings
from tests.pipelines.test_retrain_pipeline import INTERVAL, ts, write_noaa_log
from tests.pipelines.test_shadow_pipeline import onnx_and_config, publish_directly
from tests.plugins import airflow_env
from tritonflow.pipelines import shadow as sp
from tritonflow.runtime.services import TritonServer

DAGS = airflow_env.REPO / "dags"

TARGETS = textwrap.dedent('''\
    """Stand-ins for the DAGs the triggers start (same ids; never executed here)."""
    import pendulum
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    for _dag_id in ("canary_promotion", "model_publish"):
        with DAG(dag_id=_dag_id, schedule=None, start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
                 catchup=False, tags=["test"], doc_md="stand-in"):
            EmptyOperator(task_id="noop")
''')

DRIVER = textwrap.dedent('''\
    """Run shadow_evaluation -> retrain (conf of the triggered run) -> shadow_evaluation."""
    import json
    import sys

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    folder, model, first_conf, last_conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(folder)
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)

    def runs_of(dag_id):
        with create_session() as s:
            return [{"run_id": r.run_id, "conf": r.conf} for r in
                    s.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id)
                    if ((r.conf or {}).get("loop") or r.conf or {}).get("model") == model]

    def step(dag_id, conf):
        run = bag.dags[dag_id].test(run_conf=conf)
        with create_session() as s:
            tis = {t.task_id: str(t.state) for t in s.query(TaskInstance).filter(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run.run_id)}
            decisions = [XComModel.deserialize_value(x) for x in s.query(XComModel).filter(
                XComModel.dag_id == dag_id, XComModel.run_id == run.run_id, XComModel.key == "alert_decision")]
        out = {"dag_id": dag_id, "conf": conf, "state": str(run.state), "tasks": tis, "decisions": decisions,
               "triggered": {d: runs_of(d) for d in ("retrain", "canary_promotion", "model_publish")}}
        print("STEP " + json.dumps(out, default=str), flush=True)
        return out

    steps = [step("shadow_evaluation", first_conf)]
    retrain_runs = steps[0]["triggered"]["retrain"]
    if retrain_runs:
        steps.append(step("retrain", retrain_runs[-1]["conf"]))
        published = steps[-1]["triggered"]["model_publish"][-1]["conf"]["loop"]
        # what model_publish hands to its then-DAG after publishing (tritonflow.pipelines.loop_context)
        handed = {**published, "triggered_by": "model_publish", "reason": "published", "then": []}
        steps.append(step("shadow_evaluation", {**last_conf, "loop": handed}))
    print("RESULT " + json.dumps(steps, default=str))
''')


@pytest.fixture(scope="module")
def loop(tmp_path_factory, mlflow_server, airflow_home):
    """Champion serving on Triton, a drifted labelled log, then the three DAG runs."""
    from repository_sync.signing import generate_key_pair

    noaa = ds.load_noaa(with_timestamps=True, interval=INTERVAL)
    home = tmp_path_factory.mktemp("loop-home")
    repo = home / "repository"
    repo.mkdir()
    generate_key_pair(home / "keys" / "model_signing.pem", home / "keys" / "trusted" / "test.pub")
    triton = TritonServer(make_settings(home / "triton"), repository=str(repo)).start()
    try:
        port = int(triton.http_url.rsplit(":", 1)[1])
        settings = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri,
                                 repository_uri=str(repo), triton_http_port=port,
                                 inference_log_root=str(home / "logs"))
        model = f"noaa_loop_{uuid.uuid4().hex[:8]}"
        early = ds.window(noaa, 0, 8_000)
        champion = tr.train_noaa(early)
        tr.log_and_register(champion, early, name=model, alias="champion",
                            tracking_uri=mlflow_server.tracking_uri, lineage=tr.Lineage("initial"))
        publish_directly(settings, model, 1, *onnx_and_config(champion, model, settings))
        with TritonModelControl(settings.triton_http_url, repository=str(repo),
                                trusted_keys=str(sp.trusted_keys_dir(settings))) as control:
            control.load(model, 1)
        write_noaa_log(settings.inference_log_root, model, noaa, 12_000, 16_600)

        event = {"model": model, "version": 1, "features": ["sea_level_pressure"],
                 "scores": {"sea_level_pressure": {"psi": 0.4}},
                 "window_start": ts(16_588).isoformat(), "window_end": ts(16_600).isoformat()}
        first = {"model": model, "drift_event": json.dumps(event), "window_hours": 50}
        last = {"confidence": 0.99}
        folder = home / "dags"
        folder.mkdir()
        for name in ("shadow_evaluation.py", "retrain.py"):
            shutil.copy(DAGS / name, folder / name)
        (folder / "targets.py").write_text(TARGETS)
        driver = home / "driver.py"
        driver.write_text(DRIVER)
        env = airflow_env.subprocess_env(
            AIRFLOW__CORE__DAGS_FOLDER=str(folder),
            TRITONFLOW_HOME=str(home),
            TRITONFLOW_MLFLOW_TRACKING_URI=mlflow_server.tracking_uri,
            TRITONFLOW_REPOSITORY_URI=str(repo),
            TRITONFLOW_TRITON_HTTP_PORT=str(port),
            TRITONFLOW_INFERENCE_LOG_ROOT=settings.inference_log_root,
            TRITONFLOW_SHADOW_N_BOOT="400",
            TRITONFLOW_VALIDATION_SAMPLE_ROWS="16",
            # The chain's wiring is under test, not latency: two same-size logistic regressions
            # differ by well under a millisecond of p99, which the p99 gate can call a regression
            # on a busy 2-core machine (its own tests are in tests/pipelines/test_model_matrix.py).
            TRITONFLOW_PUBLISH_PERF_GATE="false",
        )
        proc = subprocess.run(
            [sys.executable, str(driver), str(folder), model, json.dumps(first), json.dumps(last)],
            env=env, capture_output=True, text=True, timeout=1200,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-6000:]
        steps = json.loads(lines[-1][len("RESULT "):])
        yield {"model": model, "event": event, "steps": steps, "settings": settings,
               "log": proc.stderr[-20000:]}
    finally:
        triton.stop()


def test_degraded_champion_without_challenger_triggers_retrain_with_the_drift_event(loop):
    shadow = loop["steps"][0]
    assert shadow["state"] == "success", loop["log"]
    assert shadow["tasks"]["trigger_retrain"] == "success"
    assert shadow["tasks"]["trigger_canary"] == shadow["tasks"]["no_action"] == "skipped"
    (run,) = shadow["triggered"]["retrain"]
    assert set(run["conf"]) == {"loop"}  # one typed conf, validated when the retrain run starts
    conf = run["conf"]["loop"]
    assert conf["model"] == loop["model"] and conf["reason"] == "champion_degraded"
    assert conf["drift_event"] == loop["event"] and conf["window_end"] == loop["event"]["window_end"]
    assert shadow["triggered"]["canary_promotion"] == []
    (decision,) = shadow["decisions"]
    assert decision["decision"] == "retrain" and decision["hour"] == loop["event"]["window_start"]
    assert decision["features"] == ["sea_level_pressure"] and decision["reason"]


def test_retrain_registers_a_challenger_and_triggers_its_publish(loop):
    assert len(loop["steps"]) == 3, loop["log"]
    retrain = loop["steps"][1]
    assert retrain["state"] == "success", loop["log"]
    assert retrain["tasks"] == {"training_window": "success", "train": "success",
                                "trigger_publish": "success"}
    (run,) = retrain["triggered"]["model_publish"]
    conf = run["conf"]["loop"]
    assert conf["dataset_uri"].endswith(".parquet")  # the training window validates the publish
    assert (conf["model"], conf["version"], conf["then"]) == (loop["model"], "2", ["shadow_evaluation"])
    assert conf["drift_event"] == loop["event"] and conf["window_end"] == loop["event"]["window_end"]
    client = mlflow.MlflowClient(tracking_uri=loop["settings"].resolved_mlflow_tracking_uri)
    mv = client.get_model_version_by_alias(loop["model"], "challenger")
    assert mv.version == "2" and mv.tags["tritonflow.reason"] == "champion_degraded"
    # the loop's reason reached the window choice: a confirmed shift, but this log has no score column
    assert mv.tags["tritonflow.window_rule"] == "span" and "no score column" in mv.tags["tritonflow.window_reason"]
    assert json.loads(mv.tags["tritonflow.drift_event"])["window_end"] == loop["event"]["window_end"]


def test_winning_challenger_is_published_and_triggers_the_canary(loop):
    assert len(loop["steps"]) == 3, loop["log"]
    shadow = loop["steps"][2]
    assert shadow["state"] == "success", f"tasks {shadow['tasks']}\n{loop['log']}"
    assert shadow["tasks"]["publish_challenger"] == "success"
    assert shadow["tasks"]["trigger_canary"] == "success"
    assert shadow["tasks"]["trigger_retrain"] == shadow["tasks"]["no_action"] == "skipped"
    (run,) = shadow["triggered"]["canary_promotion"]
    conf = run["conf"]["loop"]
    assert (conf["model"], conf["version"]) == (loop["model"], "2")
    # the canary gets the challenger's expected predictions (what it is judged against) and the drift event
    assert conf["expected_predictions"].endswith("/challenger_expected.parquet")
    assert conf["drift_event"] == loop["event"] and conf["window_end"] == loop["event"]["window_end"]
    assert [d["decision"] for d in shadow["decisions"]] == ["promote"]
    client = mlflow.MlflowClient(tracking_uri=loop["settings"].resolved_mlflow_tracking_uri)
    tags = client.get_model_version(loop["model"], "2").tags
    assert tags["tritonflow.status"] == "published"  # by the publish pipeline, in the shadow run
    assert tags["tritonflow.shadow.outcome"] == "promote_challenger"
    assert json.loads(tags["tritonflow.shadow.evidence"])["rule"]["confidence"] == 0.99
