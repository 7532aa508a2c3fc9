"""The plugin inside Airflow: each signed MLflow delivery becomes a DAG run of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.plugins import airflow_env
from tritonflow_plugin.change_ledger import change_run_id

CONSUMER_DAG = textwrap.dedent('''\
    from datetime import timedelta
    import pendulum
    from airflow.sdk import dag, task
    from tritonflow_plugin.registry_watcher import registry_asset

    @dag(schedule=registry_asset("model_publish"), start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
         catchup=False, tags=["test"], default_args={"execution_timeout": timedelta(minutes=1)})
    def model_publish():
        @task
        def publish():
            return "ok"
        publish()

    model_publish()
''')


@pytest.mark.integration
def test_each_mlflow_delivery_creates_its_own_mapped_dag_run(tmp_path, airflow_home, mlflow_tracking_uri):
    """Two versions registered back to back on a real MLflow: MLflow delivers two signed webhooks, two runs.

    Never folded into one asset-triggered run (which would act on one change).
    """
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "model_publish.py").write_text(CONSUMER_DAG)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("webhook_sink_run.py")), str(dags), mlflow_tracking_uri],
        env=airflow_env.subprocess_env(
            AIRFLOW__CORE__DAGS_FOLDER=str(dags), TRITONFLOW_WEBHOOK_SECRET="e2e-secret",
            TRITONFLOW_HOME=str(tmp_path / "tf_home"), TRITONFLOW_EVENT_MAPPING_PATH="",
            TRITONFLOW_MLFLOW_TRACKING_URI=mlflow_tracking_uri),  # the receiver reads each version from MLflow
        capture_output=True, text=True, timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    runs = sorted(result["runs"], key=lambda r: int(r["conf"]["model_version"]))
    assert [r["conf"]["model_version"] for r in runs] == result["versions"] == ["1", "2"], result["runs"]
    for run in runs:
        # the change's run id (the one the reconciler would give it too)
        key = run["conf"]["registry_event"]["change_key"]
        assert run["run_type"] == "manual" and run["run_id"] == change_run_id(key, "model_publish", "version_created")
        assert run["conf"]["model_name"] == result["model"] and run["conf"]["then"] == ["shadow_evaluation"]
        assert run["conf"]["registry_event"]["kind"] == "version_created"
    assert len(set(result["deliveries"])) == 2
    # The receiver's sink writes no asset event.
    assert result["events"] == []
