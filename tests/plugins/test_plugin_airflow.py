"""The plugin inside Airflow: a signed MLflow delivery becomes a real asset event and queued run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.plugins import airflow_env

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


def test_signed_webhook_creates_asset_event_that_queues_the_mapped_dag(tmp_path, airflow_home):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "model_publish.py").write_text(CONSUMER_DAG)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("asset_sink_run.py")), str(dags)],
        env=airflow_env.subprocess_env(
            AIRFLOW__CORE__DAGS_FOLDER=str(dags), TRITONFLOW_WEBHOOK_SECRET="e2e-secret",
            TRITONFLOW_HOME=str(tmp_path / "tf_home"), TRITONFLOW_EVENT_MAPPING_PATH=""),
        capture_output=True, text=True, timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["status"] == 200, result["body"]
    (event,) = result["events"]
    assert event["asset"] == "tritonflow_registry__model_publish"
    assert event["extra"]["model_name"] == "churn" and event["extra"]["model_version"] == "4"
    assert event["extra"]["then"] == ["shadow_evaluation"]
    assert "model_publish" in result["queued"]
