"""drift_monitor DAG run in-process (``dag.test``) on SQLite for several logical hours.

The runs happen in a subprocess (this file run as a script) on the session's migrated Airflow
home, as ``airflow dags test`` would; the parent test prepares a real MLflow registry, an
inference log of real NOAA rows and the drift reference, then asserts on the runs' results.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

HOUR = dt.timedelta(hours=1)
T0 = dt.datetime(2025, 3, 1, 0, tzinfo=dt.timezone.utc)


def _run_hours(dags_folder: str, hours: list[str], conf: dict) -> dict:
    """Subprocess body: sync the DAG, run dag.test per logical hour, report states and events."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dags_folder)
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)
    dag = bag.dags["drift_monitor"]
    runs = []
    for h in hours:
        run = dag.test(logical_date=dt.datetime.fromisoformat(h), run_conf=conf)
        with create_session() as s:
            events = [e.extra for e in s.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                      .filter(AssetModel.uri == "tritonflow://drift/alerts")
                      .filter(AssetEvent.source_run_id == run.run_id)]
            tis = {f"{t.task_id}[{t.map_index}]": str(t.state) for t in run.get_task_instances(session=s)}
            labels = {f"{t.task_id}[{t.map_index}]": t.rendered_map_index for t in run.get_task_instances(session=s)}
            decisions = [d for x in s.query(XComModel).filter(
                XComModel.dag_id == "drift_monitor", XComModel.run_id == run.run_id,
                XComModel.key == "alert_decision") for d in XComModel.deserialize_value(x)]  # a list per batch
        runs.append({"hour": h, "state": str(run.state), "events": events, "tis": tis, "labels": labels,
                     "decisions": decisions})
    return {"runs": runs}


def _env(tmp_path, mlflow_server, **more: str) -> dict[str, str]:
    return {
        "TRITONFLOW_HOME": str(tmp_path / "home"),
        "TRITONFLOW_INFERENCE_LOG_ROOT": str(tmp_path / "logs"),
        "TRITONFLOW_DRIFT_HISTORY_DB_URL": f"sqlite:///{tmp_path / 'history.db'}",
        "TRITONFLOW_MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
        **more,
    }


def _champion(env: dict[str, str], client, noaa, prefix: str = "rain"):
    """A registered model ``<prefix>-<uid>`` with champion v1, its reference and a log writer."""
    from drift_checks.inference_log import InferenceLogWriter
    from drift_checks.reference import save_reference
    from ground.settings import Settings
    from model_registry.datasets import FEATURE_COLUMNS
    from tests.pipelines.test_drift_pipeline import SCHEMA
    from tritonflow.pipelines import drift

    settings = Settings.from_env(env)
    model = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.create_registered_model(model)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    client.create_model_version(model, f"{run.info.artifact_uri}/model", run.info.run_id)
    client.set_registered_model_alias(model, "champion", "1")
    save_reference(drift.log_root(settings), model, 1, noaa.iloc[0:3000][list(FEATURE_COLUMNS)], max_rows=3000)
    return model, InferenceLogWriter(drift.log_root(settings), model, SCHEMA)


def _run(tmp_path, env: dict[str, str], hours: list[dt.datetime], conf: dict):
    """Run drift_monitor for ``hours`` in a subprocess; (parsed result runs, the process)."""
    from tests.plugins import airflow_env

    dags = tmp_path / "dags"
    dags.mkdir(exist_ok=True)
    shutil.copy(airflow_env.REPO / "dags" / "drift_monitor.py", dags / "drift_monitor.py")
    args = json.dumps({"dags": str(dags), "hours": [h.isoformat() for h in hours], "conf": conf})
    proc = subprocess.run([sys.executable, __file__, args],
                          env=airflow_env.subprocess_env(AIRFLOW__CORE__DAGS_FOLDER=str(dags), **env),
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])["runs"], proc


def test_quiet_hour_records_shifted_hour_emits_one_event_and_rerun_replaces(tmp_path, airflow_home, mlflow_server):
    from mlflow import MlflowClient

    from drift_checks.history import HistoryStore
    from model_registry.datasets import load_noaa
    from tests.pipelines.test_drift_pipeline import QUIET, SHIFT_B, hour_frame

    env = _env(tmp_path, mlflow_server)
    noaa = load_noaa()
    client = MlflowClient(mlflow_server.tracking_uri)
    model, writer = _champion(env, client, noaa)
    writer.write(hour_frame(noaa, QUIET, T0))
    writer.write(hour_frame(noaa, SHIFT_B, T0 + 2 * HOUR))  # years after the shifts: a strong effect
    # a manual/test run's data interval is the last complete hour before its logical date
    hours = [T0 + HOUR, T0 + 3 * HOUR, T0 + 3 * HOUR]
    runs, _ = _run(tmp_path, env, hours, {"models": [model], "evidently": False, "profile": False})
    quiet, shifted, rerun = runs

    assert quiet["state"] == "success" and quiet["events"] == []
    # a quiet hour maps no drift_event and no follow-up at all: the mapped tasks are skipped
    assert quiet["tis"]["drift_event[-1]"] == "skipped" and quiet["tis"]["record[0]"] == "success"
    assert quiet["tis"]["trigger_followup_retrain[-1]"] == "skipped" and quiet["tis"]["decide[-1]"] == "success"
    assert quiet["tis"]["data_quality_gate[-1]"] == "success"
    assert quiet["labels"]["check[0]"] == model  # the batch's box is labelled with its models
    history = HistoryStore(env["TRITONFLOW_DRIFT_HISTORY_DB_URL"])
    assert history.window(model, T0)["status"] == "ok"

    assert len(shifted["events"]) == 1
    extra = shifted["events"][0]
    assert extra["model"] == model and extra["version"] == 1 and extra["severity"] == "drift"
    assert extra["features"] and extra["window_start"] == (T0 + 2 * HOUR).isoformat()
    assert set(extra) == {"model", "version", "features", "scores", "window_start", "window_end", "severity"}

    # rerun of the same hour replaces its results: same number of history rows
    assert rerun["tis"]["check[0]"] == "success" and len(rerun["events"]) == 1
    n_rows = len(history.values(model, "dew_point", "psi"))
    assert n_rows == 2  # quiet hour, shifted hour (run twice)
    # the shifted rows leave the ranges learned from the reference: a warning, not a failed
    # contract, so the gate passes and the event is emitted after it
    assert shifted["tis"]["data_quality_gate[-1]"] == "success" and shifted["state"] == "success"
    assert shifted["tis"]["drift_event[0]"] == "success" and shifted["labels"]["drift_event[0]"] == model
    assert client.get_model_version(model, "1").tags["tritonflow.drift.severity"] == "drift"

    # every hour's alert gets a decision with its reason, under one XCom key; alerts also in MLflow
    assert [d["decision"] for d in quiet["decisions"]] == ["no_alert"] and quiet["decisions"][0]["reason"]
    (decision,) = shifted["decisions"]
    assert decision["decision"] == "alert" and decision["hour"] == (T0 + 2 * HOUR).isoformat()
    assert decision["features"] == sorted(extra["features"]) and decision["reason"]
    tags = client.get_registered_model(model).tags
    assert json.loads(tags["tritonflow.alert_decision.2025-03-01T02-00.drift"])["decision"] == "alert"
    assert not [k for k in tags if k.startswith("tritonflow.alert_decision.2025-03-01T00")]  # no_alert: XCom only


def test_a_broken_contract_in_a_batch_fails_the_run_after_the_drifting_model_alerted(tmp_path, airflow_home,
                                                                                     mlflow_server):
    """Two models in one batch: one breaks its contract, one drifts. The drifting one is
    recorded and emits its event; the broken one does not stop it, and the run fails naming it."""
    import numpy as np
    from mlflow import MlflowClient

    from drift_checks.history import HistoryStore
    from model_registry.datasets import load_noaa
    from tests.pipelines.test_drift_pipeline import QUIET, SHIFT_B, hour_frame

    env = _env(tmp_path, mlflow_server, TRITONFLOW_DRIFT_MODELS_PER_TASK="10")
    noaa = load_noaa()
    client = MlflowClient(mlflow_server.tracking_uri)
    broken, broken_log = _champion(env, client, noaa, prefix="a-broken")  # sorted first in the batch
    drifting, drifting_log = _champion(env, client, noaa, prefix="b-drift")
    bad = hour_frame(noaa, QUIET, T0)
    bad["temperature"] = np.nan  # the sensor feed broke
    broken_log.write(bad)
    drifting_log.write(hour_frame(noaa, SHIFT_B, T0))
    (run,), proc = _run(tmp_path, env, [T0 + HOUR],
                        {"models": [drifting, broken], "evidently": False, "profile": False})

    # one box per stage holds both models, and succeeds: the broken model did not stop the batch
    assert run["tis"]["check[0]"] == "success" and "check[1]" not in run["tis"]
    assert run["labels"]["check[0]"] == f"{broken}, {drifting}" == run["labels"]["record[0]"]
    assert run["tis"]["record[0]"] == "success" and run["tis"]["decide[-1]"] == "success"
    # the drifting model is recorded and emits its event, with the same extra as one model alone
    (extra,) = run["events"]
    assert extra["model"] == drifting and extra["severity"] == "drift" and extra["features"]
    assert set(extra) == {"model", "version", "features", "scores", "window_start", "window_end", "severity"}
    assert run["tis"]["drift_event[0]"] == "success" and "drift_event[1]" not in run["tis"]
    assert client.get_model_version(drifting, "1").tags["tritonflow.drift.severity"] == "drift"
    assert client.get_model_version(broken, "1").tags["tritonflow.drift.status"] == "contract_failed"
    history = HistoryStore(env["TRITONFLOW_DRIFT_HISTORY_DB_URL"])
    assert history.window(drifting, T0)["status"] == "ok"
    assert {d["model"]: d["decision"] for d in run["decisions"]} == {broken: "contract_failed", drifting: "alert"}
    # then the gate fails the run naming the broken model and why (bad data: no retry)
    assert run["tis"]["data_quality_gate[-1]"] == "failed" and run["state"] == "failed"
    assert run["tis"]["trigger_followup_retrain[-1]"] == "upstream_failed"
    out = proc.stdout + proc.stderr
    (tmp_path / "run.log").write_text(out)
    failed = [ln[ln.index("ModelsFailedError: "):] for ln in out.splitlines() if "ModelsFailedError: 1 of" in ln]
    assert failed and failed[0].startswith("ModelsFailedError: 1 of 2 monitored model(s) failed"), out[-3000:]
    assert f"{broken} (data contract: " in failed[0] and drifting not in failed[0]
    assert "temperature: expect_column_values_to_not_be_null" in failed[0]


def test_an_hour_without_monitored_models_maps_nothing_and_succeeds(tmp_path, airflow_home):
    # an empty MLflow registry (its own SQLite store): no champion, no batch, no event
    env = {"TRITONFLOW_HOME": str(tmp_path / "home"), "TRITONFLOW_INFERENCE_LOG_ROOT": str(tmp_path / "logs"),
           "TRITONFLOW_DRIFT_HISTORY_DB_URL": f"sqlite:///{tmp_path / 'history.db'}",
           "TRITONFLOW_MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    (run,), _ = _run(tmp_path, env, [T0 + HOUR], {"evidently": False, "profile": False})
    assert run["state"] == "success" and run["events"] == [] and run["decisions"] == []
    assert run["tis"]["models[-1]"] == "success" and run["tis"]["check[-1]"] == "skipped"
    assert run["tis"]["drift_event[-1]"] == "skipped" and run["tis"]["data_quality_gate[-1]"] == "success"


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    sys.path[:0] = [str(Path(__file__).resolve().parents[2])]
    print("RESULT " + json.dumps(_run_hours(spec["dags"], spec["hours"], spec["conf"]), default=str))
