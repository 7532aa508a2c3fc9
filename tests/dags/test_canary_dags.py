"""DAGs ``canary_promotion`` and ``canary_rollback`` run with ``dag.test(run_conf=...)`` on SQLite.

The DAG runs happen in one subprocess (Airflow reads its configuration at import time; the
session's migrated ``AIRFLOW_HOME`` from ``tests/plugins/airflow_env.py``) against real services
started here: Triton (explicit model control over a folder repository), the NGINX gateway in
front of it, and the session's MLflow server. The tasks find them the way they do in production:
through ``TRITONFLOW_*`` settings (the gateway's config folder is ``<home>/run/gateway``). While
the promotion runs, a bounded loopback client in the subprocess sends requests through the
gateway and writes the inference log.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import make_settings
from tests.plugins import airflow_env
from tritonflow.runtime.services import NginxGateway, TritonServer

pytestmark = pytest.mark.integration

DAGS = airflow_env.REPO / "dags"
MODEL = "canary_dag_model"

RUNNER = textwrap.dedent('''\
    """Run canary DAGs with dag.test(run_conf=...) one after another; print RESULT <json>."""
    import json, sys, threading, time, urllib.error, urllib.request, uuid

    import pandas as pd
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from drift_checks.inference_log import InferenceLogWriter, LogSchema

    spec = json.loads(open(sys.argv[1]).read())
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(spec["folder"])
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)


    def traffic(stop, t):
        """Bounded client: iris-like rows through the gateway, results into the inference log."""
        writer = InferenceLogWriter(t["log_root"], t["model"], LogSchema(
            {f"f{i}": "float" for i in range(4)}, {f"probability_{i}": "float" for i in range(3)}))
        url = f"{t['gateway']}/v2/models/{t['model']}/infer"
        rows, sent, last = [], 0, time.monotonic()
        while not stop.is_set() and sent < 5000:
            x = t["rows"][sent % len(t["rows"])]
            body = json.dumps({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32",
                                           "data": x}], "outputs": [{"name": "probabilities"}]}).encode()
            sent += 1
            try:
                req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=10) as resp:
                    version = int(resp.headers["X-Tritonflow-Version"])
                    probs = json.loads(resp.read())["outputs"][0]["data"]
            except (urllib.error.URLError, OSError, KeyError, TypeError, ValueError):
                continue
            rec = {"request_id": uuid.uuid4().hex, "timestamp": pd.Timestamp.now(tz="UTC"),
                   "model_version": version}
            rec.update({f"f{i}": float(v) for i, v in enumerate(x)})
            rec.update({f"probability_{i}": float(p) for i, p in enumerate(probs)})
            rows.append(rec)
            if time.monotonic() - last > 0.2:
                writer.write(pd.DataFrame(rows)); rows, last = [], time.monotonic()
        if rows:
            writer.write(pd.DataFrame(rows))


    results = []
    for run in spec["runs"]:
        stop = threading.Event()
        thread = threading.Thread(target=traffic, args=(stop, spec["traffic"]), daemon=True)
        if run.get("traffic"):
            thread.start()
        dr = bag.dags[run["dag_id"]].test(run_conf=run["conf"])
        stop.set()
        if run.get("traffic"):
            thread.join(timeout=30)
        with create_session() as s:
            rows = s.query(TaskInstance).filter(
                TaskInstance.dag_id == run["dag_id"], TaskInstance.run_id == dr.run_id).all()
            tis = {t.task_id: [str(t.state), t.try_number] for t in rows}
            labels = {f"{t.task_id}[{t.map_index}]": t.rendered_map_index for t in rows if t.map_index >= 0}
        results.append({"dag_id": run["dag_id"], "state": str(dr.state), "tis": tis, "labels": labels})
    print("RESULT " + json.dumps(results))
''')


def settings_env(settings) -> dict[str, str]:
    """``TRITONFLOW_*`` variables that rebuild exactly ``settings`` in another process."""
    out = {}
    for f in dataclasses.fields(settings):
        out["TRITONFLOW_" + f.metadata["env"]] = str(getattr(settings, f.name))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory, mlflow_server):
    """``canary_dag_model`` v1 (champion, 100 % at the gateway) and v2 published, real services."""
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    from model_registry.conversion.common import convert_sklearn
    from model_registry.registry import RegistryClient
    from model_registry.triton_config import InstanceGroupSpec, build_config, to_pbtxt
    from repository_sync.publish import publish_version
    from repository_sync.routing.gateway_probe import wait_live
    from repository_sync.routing.traffic_plan import TrafficPlan
    from repository_sync.signing import generate_key_pair
    from tritonflow.pipelines.canary import CanaryEnvironment
    from tritonflow.pipelines.canary_loading import ensure_loaded

    home = tmp_path_factory.mktemp("canary-dag-home")
    keys = home / "keys"
    generate_key_pair(keys / "signing.pem", keys / "trusted" / "current.pub")
    settings = make_settings(
        home, repository_uri=str(home / "repo"), signing_key_path=keys / "signing.pem",
        signing_trusted_keys_dir=keys / "trusted", mlflow_tracking_uri=mlflow_server.tracking_uri,
        inference_log_root=str(home / "inference_logs"), load_timeout_s=60.0,
        deadline_alerts=False,  # dag.test() in Airflow 3.3.2 fails at the end of a run of a DAG with one
    )
    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    client = MlflowClient(mlflow_server.tracking_uri)
    client.create_registered_model(MODEL)
    for version, c in ((1, 1.0), (2, 0.8)):
        clf = LogisticRegression(max_iter=500, C=c).fit(X, y)
        conv = convert_sklearn(clf, infer_signature(X, clf.predict_proba(X)), model_name=MODEL, settings=settings)
        onnx_path = home / f"v{version}.onnx"
        onnx_path.write_bytes(conv.serialized())
        config = to_pbtxt(build_config(MODEL, conv.onnx_model, max_batch_size=16,
                                       instance_groups=[InstanceGroupSpec("KIND_CPU", 1)]))
        publish_version(repository=settings.repository_uri, model_name=MODEL, version=version,
                        model_file=onnx_path, config=config, private_key=keys / "signing.pem",
                        trusted_keys=keys / "trusted")
        client.create_model_version(MODEL, source=f"s3://tritonflow-test-models/{MODEL}/{version}")
        client.set_model_version_tag(MODEL, str(version), "tritonflow.signature_digest", "published here")
    client.create_model_version(MODEL, source=f"s3://tritonflow-test-models/{MODEL}/3")  # never published
    RegistryClient(mlflow_server.tracking_uri).promote(MODEL, 1, reason="initial deployment")

    triton = TritonServer(settings, repository=settings.repository_uri).start()
    gateway = None
    try:
        gateway = NginxGateway(settings, triton_http=triton.http_url).start()
        assert gateway.conf_dir == settings.run_dir / "gateway"
        env = CanaryEnvironment.from_settings(settings)  # exactly what the tasks will build
        ensure_loaded(MODEL, [1], env=env)
        plan = TrafficPlan.single(MODEL, 1)
        env.router().apply(plan)
        wait_live(gateway.url, plan)
        yield dict(settings=settings, env=env, gateway=gateway, X=X, home=home)
    finally:
        if gateway is not None:
            gateway.stop()
        triton.stop()


def run_dags(served, tmp_path, runs: list[dict]) -> list[dict]:
    folder = tmp_path / "dags"
    folder.mkdir()
    for name in ("canary_promotion.py", "canary_rollback.py"):
        shutil.copy(DAGS / name, folder / name)
    runner = tmp_path / "canary_dag_runner.py"
    runner.write_text(RUNNER)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "folder": str(folder), "runs": runs,
        "traffic": {"gateway": served["gateway"].url, "model": MODEL,
                    "log_root": served["settings"].inference_log_root,
                    "rows": [[float(v) for v in row] for row in served["X"][::3]]},
    }))
    proc = subprocess.run(
        [sys.executable, str(runner), str(spec)],
        env=airflow_env.subprocess_env(AIRFLOW__CORE__DAGS_FOLDER=str(folder), **settings_env(served["settings"])),
        capture_output=True, text=True, timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def dag_runs(served, tmp_path_factory, airflow_home):
    """Every DAG run of this module, in order, in one Airflow subprocess."""
    promotion_conf = {"model": MODEL, "challenger": "2", "steps": [100], "bake_s": 1, "min_requests": 1}
    names = ["bad_schedule", "promoted", "noop", "rolled_back", "refused", "unsigned_refused", "rolled_to_signed"]
    runs = run_dags(served, tmp_path_factory.mktemp("canary-dag-runs"), [
        {"dag_id": "canary_promotion", "conf": {"model": MODEL, "challenger": "2", "steps": [5, 50, 100, 60]}},
        {"dag_id": "canary_promotion", "conf": promotion_conf, "traffic": True},
        # the registry watcher maps canary_promotion's own alias move back to it: a no-op
        {"dag_id": "canary_promotion", "conf": {"model": MODEL, "challenger": "champion"}},
        # started by a registry event: the model comes from the event, not the form's field
        {"dag_id": "canary_rollback", "conf": {"registry_event": {"kind": "alias_set", "alias": "champion"},
                                               "model_name": MODEL, "reason": "dag test: rollback"}},
        {"dag_id": "canary_rollback", "conf": {"model": MODEL, "reason": "dag test: again"}},
        # to a version named in the form: an unsigned one is refused, a signed one taken (champion is 1 here)
        {"dag_id": "canary_rollback", "conf": {"model": MODEL, "reason": "dag test: unsigned", "to_version": 3}},
        {"dag_id": "canary_rollback", "conf": {"model": MODEL, "reason": "dag test: to v2", "to_version": 2}},
    ])
    return dict(zip(names, runs, strict=True))


def test_promotion_dag_refuses_a_schedule_not_ending_at_100_without_retry(dag_runs):
    run = dag_runs["bad_schedule"]
    assert run["state"] == "failed"
    assert run["tis"]["resolve_versions"] == ["failed", 1], run


def test_promotion_dag_promotes_through_all_its_tasks(served, dag_runs):
    from model_registry.registry import RegistryClient

    run = dag_runs["promoted"]
    assert run["state"] == "success", run
    assert set(run["tis"]) == {"resolve_versions", "approval", "preflight", "load_side_by_side", "canary",
                               "traffic_steps", "canary_step", "pause_numbers", "step_decision"}
    assert run["tis"]["approval"] == ["success", 1], run  # policy auto: passed at once, nobody asked
    assert run["tis"]["step_decision"][0] == "skipped", run  # and no pause: nobody is asked during the canary
    assert run["tis"]["canary_step"] == ["success", 1], run  # the 100 % step's box in the grid
    assert run["labels"] == {"canary_step[0]": "100 %"}, run
    tags = RegistryClient(served["settings"].resolved_mlflow_tracking_uri).get_version(MODEL, 2).tags
    assert tags[f"tritonflow.canary.{tags['tritonflow.canary.latest']}.outcome"] == "promoted"
    assert tags[f"tritonflow.canary.{tags['tritonflow.canary.latest']}.promotion_policy"] == "auto"
    assert "tritonflow.approval.answer" not in tags


def test_promotion_dag_run_for_the_serving_champion_is_a_noop(dag_runs):
    assert dag_runs["noop"]["state"] == "success", dag_runs["noop"]
    assert dag_runs["noop"]["tis"]["canary_step"][0] == "skipped", dag_runs["noop"]  # no step was run


def test_rollback_dag_routes_back_moves_the_alias_and_unloads(served, dag_runs):
    from model_registry.registry import RegistryClient

    assert dag_runs["rolled_back"]["state"] == "success", dag_runs["rolled_back"]
    registry = RegistryClient(served["settings"].resolved_mlflow_tracking_uri)
    done = [e.record for e in registry.audit_log(MODEL) if e.action == "rollback" and e.outcome == "rolled_back"]
    assert [(r.get("reason"), r.get("observed_champion"), r.get("champion")) for r in done] == [
        ("dag test: rollback", 2, 1), ("dag test: to v2", 1, 2)]
    # the gateway, the aliases and Triton after the last rollback: the next test


def test_rollback_dag_to_a_signed_version_routes_there_and_refuses_an_unsigned_one(served, dag_runs):
    from model_registry.registry import RegistryClient
    from repository_sync.routing.gateway_probe import served_by

    refused = dag_runs["unsigned_refused"]
    assert refused["state"] == "failed" and refused["tis"]["rollback"][0] == "failed", refused
    assert dag_runs["rolled_to_signed"]["state"] == "success", dag_runs["rolled_to_signed"]
    assert dag_runs["rolled_to_signed"]["tis"]["choose_version"][0] == "success"  # the form decided: no wait
    env = served["env"]
    registry = RegistryClient(served["settings"].resolved_mlflow_tracking_uri)
    aliases = registry.aliases(MODEL)
    assert aliases["champion"] == 2 and "previous_champion" not in aliases
    assert registry.get_version(MODEL, 2).tags["tritonflow.rollback.reason"] == "dag test: to v2"
    assert env.router().current_plan(MODEL).weights == {2: 100}
    assert {served_by(served["gateway"].url, MODEL)[0] for _ in range(10)} == {"2"}
    with env.triton() as tc:
        assert tc.ready_versions(MODEL) == [2]


def test_rollback_dag_without_a_rollback_target_fails_at_once(dag_runs):
    run = dag_runs["refused"]
    assert run["state"] == "failed" and run["tis"]["rollback"] == ["failed", 1], run
