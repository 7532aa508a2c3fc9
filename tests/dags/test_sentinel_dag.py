"""DAG ``champion_sentinel`` with ``dag.test(run_conf=...)``: the deferrable task defers to the
sentinel trigger (run inline by ``dag.test``), which probes the real champion through the real
gateway; on ``unhealthy`` the task rolls back through the ``canary_rollback`` path.

Real services started here: Triton (explicit model control over a signed folder repository), the
NGINX gateway, the session's MLflow server. The champion (v2) is unhealthy because its answers
fall outside the validation range recorded on its MLflow version.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_settings
from tests.dags.test_canary_dags import settings_env
from tests.plugins import airflow_env
from tritonflow.runtime.services import NginxGateway, TritonServer

pytestmark = pytest.mark.integration

DAGS = airflow_env.REPO / "dags"
MODEL = "sentinel_dag_model"

RUNNER = textwrap.dedent('''\
    import json, sys
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    spec = json.loads(open(sys.argv[1]).read())
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(spec["folder"])
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)
    dr = bag.dags["champion_sentinel"].test(run_conf={"models": [spec["model"]]})
    with create_session() as s:
        tis = [(t.task_id, t.map_index, str(t.state)) for t in s.query(TaskInstance).filter(
            TaskInstance.dag_id == "champion_sentinel", TaskInstance.run_id == dr.run_id)]
    print("RESULT " + json.dumps({"state": str(dr.state), "tis": tis}))
''')


@pytest.fixture(scope="module")
def served(tmp_path_factory, mlflow_server):
    """``sentinel_dag_model`` v1 and v2 signed and loaded; champion 2 (100 %), previous 1."""
    with serve_unhealthy_champion(tmp_path_factory.mktemp("sentinel-dag-home"), mlflow_server.tracking_uri,
                                  MODEL, sentinel_interval_s=0.3) as served:
        yield served


@contextlib.contextmanager
def serve_unhealthy_champion(home, tracking_uri: str, model: str, *, sentinel_interval_s: float):
    """``model`` v1 and v2 signed and loaded in a real Triton behind the real gateway.

    v2 is ``champion`` (100 % at the gateway), v1 ``previous_champion``; v2's recorded validation
    range (probabilities in [0, 0.001]) makes every answer of it out of range, i.e. unhealthy.
    The sentinel settings: ``sentinel_interval_s`` between probes, 3 failures, 5 s latency.

    Yields:
        ``settings`` (what the tasks must see), ``env``, ``gateway``, ``reg``.
    """
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    from drift_checks.reference import save_reference
    from model_registry.conversion.common import convert_sklearn
    from model_registry.registry import RegistryClient
    from model_registry.triton_config import InstanceGroupSpec, build_config, to_pbtxt
    from repository_sync.publish import publish_version
    from repository_sync.routing.gateway_probe import wait_live
    from repository_sync.routing.traffic_plan import TrafficPlan
    from repository_sync.signing import generate_key_pair
    from tritonflow.pipelines.canary import CanaryEnvironment
    from tritonflow.pipelines.canary_loading import ensure_loaded
    from tritonflow.pipelines.publish_record import reference_root
    from tritonflow.pipelines.sentinel import OUTPUT_RANGE_TAG

    keys = home / "keys"
    generate_key_pair(keys / "signing.pem", keys / "trusted" / "current.pub")
    settings = make_settings(
        home, repository_uri=str(home / "repo"), signing_key_path=keys / "signing.pem",
        signing_trusted_keys_dir=keys / "trusted", mlflow_tracking_uri=tracking_uri,
        inference_log_root=str(home / "inference_logs"), load_timeout_s=60.0,
        sentinel_interval_s=sentinel_interval_s, sentinel_failures=3, sentinel_latency_s=5.0,
    )
    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    client = MlflowClient(tracking_uri)
    client.create_registered_model(model)
    for version, c in ((1, 1.0), (2, 0.8)):
        clf = LogisticRegression(max_iter=500, C=c).fit(X, y)
        conv = convert_sklearn(clf, infer_signature(X, clf.predict_proba(X)), model_name=model, settings=settings)
        onnx_path = home / f"v{version}.onnx"
        onnx_path.write_bytes(conv.serialized())
        config = to_pbtxt(build_config(model, conv.onnx_model, max_batch_size=16,
                                       instance_groups=[InstanceGroupSpec("KIND_CPU", 1)]))
        publish_version(repository=settings.repository_uri, model_name=model, version=version,
                        model_file=onnx_path, config=config, private_key=keys / "signing.pem",
                        trusted_keys=keys / "trusted")
        client.create_model_version(model, source=f"s3://tritonflow-test-models/{model}/{version}")
    reg = RegistryClient(tracking_uri)
    reg.promote(model, 1, reason="initial deployment")
    reg.promote(model, 2, reason="test: champion 2")
    reg.set_version_tags(reg.get_version(model, 2), {OUTPUT_RANGE_TAG: json.dumps({"probabilities": [0.0, 0.001]})})
    save_reference(reference_root(settings), model, 2, pd.DataFrame(X, columns=[f"f{i}" for i in range(4)]))

    triton = TritonServer(settings, repository=settings.repository_uri).start()
    gateway = None
    try:
        gateway = NginxGateway(settings, triton_http=triton.http_url).start()
        env = CanaryEnvironment.from_settings(settings)  # exactly what the tasks will build
        ensure_loaded(model, [1, 2], env=env)
        plan = TrafficPlan.single(model, 2)
        env.router().apply(plan)
        wait_live(gateway.url, plan)
        yield dict(settings=settings, env=env, gateway=gateway, reg=reg)
    finally:
        if gateway is not None:
            gateway.stop()
        triton.stop()


def test_sentinel_dag_defers_detects_and_rolls_back_to_the_previous_champion(served, tmp_path, airflow_home):
    """Triton first forgets the model (as a restart in ``explicit`` mode does): the sentinel loads
    the desired versions back before it builds its golden set, and only then judges the
    (unhealthy) champion and rolls it back."""
    import tritonclient.http as httpclient

    from repository_sync.routing.gateway_probe import served_by

    folder = tmp_path / "dags"
    folder.mkdir()
    shutil.copy(DAGS / "champion_sentinel.py", folder / "champion_sentinel.py")
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"folder": str(folder), "model": MODEL}))
    httpclient.InferenceServerClient(served["env"].triton_url).unload_model(MODEL)
    proc = subprocess.run(
        [sys.executable, str(runner), str(spec)],
        env=airflow_env.subprocess_env(AIRFLOW__CORE__DAGS_FOLDER=str(folder), **settings_env(served["settings"])),
        capture_output=True, text=True, timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"{MODEL} did not hold v2; loaded back [1, 2]" in proc.stdout + proc.stderr, proc.stdout[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["state"] == "success", result
    assert ("watch_champion", 0, "success") in [tuple(t) for t in result["tis"]]
    assert served["reg"].aliases(MODEL)["champion"] == 1
    assert {served_by(served["gateway"].url, MODEL)[0] for _ in range(10)} == {"1"}
    tags = served["reg"].get_version(MODEL, 2).tags
    assert "outside the validation range" in tags["tritonflow.sentinel.reason"]
    # the rolled-back version is rejected (no later shadow/canary puts it back), the target is not
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "sentinel"
    assert served["reg"].get_version(MODEL, 1).tags.get("tritonflow.status") != "rejected"
