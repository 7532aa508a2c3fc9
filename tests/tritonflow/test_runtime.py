"""The local runtime runs real services: Triton round trips (folder and S3), MLflow, NGINX, and
start-up failures that are clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ground.exceptions import RuntimeStartError
from tests.conftest import make_settings
from tritonflow.runtime.services import MlflowServer, TritonServer, port_in_use

pytestmark = pytest.mark.integration

MODEL = "iris_clf"


@pytest.fixture(scope="module")
def iris_onnx():
    """A small scikit-learn classifier and its ONNX form with tensor outputs (no ZipMap)."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    clf = LogisticRegression(max_iter=500).fit(X, y)
    onx = to_onnx(
        clf,
        X[:1],
        options={id(clf): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    return clf, X, onx.SerializeToString()


def _config_pbtxt() -> str:
    cfg = model_config_pb2.ModelConfig(name=MODEL, backend="onnxruntime", max_batch_size=256)
    cfg.input.add(name="X", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    label = cfg.output.add(name="label", data_type=model_config_pb2.TYPE_INT64, dims=[1])
    label.reshape.shape[:] = []  # the model's label tensor is [batch]; clients see [batch, 1]
    cfg.output.add(name="probabilities", data_type=model_config_pb2.TYPE_FP32, dims=[3])
    cfg.dynamic_batching.max_queue_delay_microseconds = 100
    cfg.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    return text_format.MessageToString(cfg)


def _infer(url: str, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("X", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    out = [httpclient.InferRequestedOutput("label"), httpclient.InferRequestedOutput("probabilities")]
    res = client.infer(MODEL, [inp], outputs=out)
    return res.as_numpy("label"), res.as_numpy("probabilities")


def _load_and_check(triton: TritonServer, clf, X) -> None:
    client = httpclient.InferenceServerClient(triton.http_url)
    client.load_model(MODEL)
    assert client.is_model_ready(MODEL, "1")
    labels, probs = _infer(triton.http_url, X)
    np.testing.assert_allclose(probs, clf.predict_proba(X), atol=1e-5)
    np.testing.assert_array_equal(labels.reshape(-1), clf.predict(X))


def test_sklearn_model_round_trips_through_a_folder_repository(tmp_path, iris_onnx, triton_factory):
    clf, X, onnx_bytes = iris_onnx
    version = tmp_path / "repo" / MODEL / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(onnx_bytes)
    (tmp_path / "repo" / MODEL / "config.pbtxt").write_text(_config_pbtxt())

    triton = triton_factory(str(tmp_path / "repo"))
    _load_and_check(triton, clf, X)


def test_sklearn_model_round_trips_through_an_s3_repository(iris_onnx, s3_server, triton_factory):
    clf, X, onnx_bytes = iris_onnx
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint_url)
    s3.create_bucket(Bucket="roundtrip")
    s3.put_object(Bucket="roundtrip", Key=f"triton/{MODEL}/1/model.onnx", Body=onnx_bytes)
    s3.put_object(Bucket="roundtrip", Key=f"triton/{MODEL}/config.pbtxt", Body=_config_pbtxt().encode())

    triton = triton_factory(s3_server.triton_url("roundtrip", "triton"))
    assert triton.repository.startswith("s3://http://127.0.0.1:")
    _load_and_check(triton, clf, X)


def test_mlflow_server_registers_a_model_and_reads_it_back(mlflow_server, iris_onnx):
    import mlflow
    from mlflow.models import infer_signature

    clf, X, _ = iris_onnx
    mlflow.set_tracking_uri(mlflow_server.tracking_uri)
    mlflow.set_experiment("runtime-smoke")
    with mlflow.start_run():
        info = mlflow.sklearn.log_model(
            clf, name="model", signature=infer_signature(X, clf.predict(X)),
            registered_model_name="runtime_smoke",
        )
    client = mlflow.MlflowClient(mlflow_server.tracking_uri)
    version = client.get_model_version("runtime_smoke", info.registered_model_version)
    assert version.name == "runtime_smoke"
    loaded = mlflow.pyfunc.load_model(f"models:/runtime_smoke/{version.version}")
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))


def test_nginx_gateway_proxies_an_inference_to_triton(tmp_path, iris_onnx, triton_factory, gateway_factory):
    clf, X, onnx_bytes = iris_onnx
    version = tmp_path / "repo" / MODEL / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(onnx_bytes)
    (tmp_path / "repo" / MODEL / "config.pbtxt").write_text(_config_pbtxt())
    triton = triton_factory(str(tmp_path / "repo"))
    httpclient.InferenceServerClient(triton.http_url).load_model(MODEL)

    gateway = gateway_factory(triton)
    labels, probs = _infer(gateway.url.removeprefix("http://"), X[:5])
    np.testing.assert_allclose(probs, clf.predict_proba(X[:5]), atol=1e-5)
    # NGINX logs a request after sending its response: give the log phase a moment.
    import time

    log_file, deadline = gateway.conf_dir / "logs" / "access.log", time.monotonic() + 10
    while f"/v2/models/{MODEL}/infer" not in log_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"/v2/models/{MODEL}/infer" in log_file.read_text()


def test_a_taken_port_fails_clearly_and_leaves_no_process(tmp_path):
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        settings = make_settings(tmp_path / "home", mlflow_port=taken)
        server = MlflowServer(settings)
        with pytest.raises(RuntimeStartError, match=rf"port 127\.0\.0\.1:{taken} is already in use"):
            server.start()
        assert server.process is None
        assert not server.pid_path.exists()
    finally:
        holder.close()


def test_a_service_that_dies_during_start_up_reports_its_log_and_leaves_nothing(tmp_path):
    # A repository path that is a file makes Triton exit at start-up.
    bogus = tmp_path / "not-a-folder"
    bogus.write_text("x")
    settings = make_settings(tmp_path / "home", start_timeout_s=30.0)
    server = TritonServer(settings, repository=str(bogus))
    server.prepare = lambda: None  # keep the bogus file as the repository
    with pytest.raises(RuntimeStartError) as err:
        server.start()
    message = str(err.value)
    assert "triton" in message and str(server.log_path) in message
    for port in server.ports():
        assert not port_in_use(settings.host, port)
    assert not server.pid_path.exists()


def test_a_missing_binary_is_reported_with_the_set_up_command(tmp_path):
    settings = make_settings(tmp_path / "home", triton_venv=tmp_path / "no-venv")
    with pytest.raises(RuntimeStartError, match=r"binary .*tritonserver is missing; run scripts/setup.sh"):
        TritonServer(settings, repository=str(tmp_path / "repo")).start()


def _cli_env(tmp_path) -> dict[str, str]:
    """The CLI's environment: its own home and a free port for every service it may touch."""
    ports = ("S3_PORT", "MLFLOW_PORT", "TRITON_HTTP_PORT", "TRITON_GRPC_PORT", "TRITON_METRICS_PORT",
             "GATEWAY_PORT", "AIRFLOW_API_PORT", "AIRFLOW_EXECUTION_API_PORT", "AIRFLOW_WORKER_LOG_PORT",
             "AIRFLOW_TRIGGERER_LOG_PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONFLOW_")}
    env.update({f"TRITONFLOW_{p}": str(_free()) for p in ports}, TRITONFLOW_HOME=str(tmp_path / "home"),
               TRITONFLOW_START_TIMEOUT_S="600")
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tritonflow.cli", "runtime", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_starts_reports_and_stops_the_s3_endpoint(tmp_path):
    env = _cli_env(tmp_path)
    started = _cli(env, "start", "--services", "s3")
    assert started.returncode == 0, started.stderr
    assert f"S3 endpoint: http://127.0.0.1:{env['TRITONFLOW_S3_PORT']}" in started.stdout
    status = json.loads(_cli(env, "status", "--json").stdout)
    assert set(status) == {"s3", "mlflow", "triton", "gateway", "airflow"}
    assert status["s3"]["healthy"] is True and status["airflow"]["healthy"] is False
    stopped = _cli(env, "stop")
    assert stopped.returncode == 0, stopped.stderr
    status = json.loads(_cli(env, "status", "--json").stdout)
    assert status["s3"]["healthy"] is False


@pytest.mark.slow
def test_cli_starts_airflow_with_the_project_dags_and_a_plain_stop_stops_it(tmp_path):
    from tritonflow.runtime.airflow_api import AirflowApi

    env = _cli_env(tmp_path)
    url = f"http://127.0.0.1:{env['TRITONFLOW_AIRFLOW_API_PORT']}"
    try:
        started = _cli(env, "start", "--services", "airflow", timeout=900)
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"Airflow UI and REST API: {url} (no login" in started.stdout
        api = AirflowApi(url)
        dag = api.wait_for_dag("model_publish", 600)  # the project's dags/, parsed by the dag-processor
        assert dag["is_paused"] is True
        assert json.loads(_cli(env, "status", "--json").stdout)["airflow"]["healthy"] is True
    finally:
        stopped = _cli(env, "stop", timeout=300)
    assert stopped.returncode == 0, stopped.stderr
    assert "airflow: stopped" in stopped.stdout
    assert json.loads(_cli(env, "status", "--json").stdout)["airflow"]["healthy"] is False
    for port in ("AIRFLOW_API_PORT", "AIRFLOW_WORKER_LOG_PORT", "AIRFLOW_TRIGGERER_LOG_PORT"):
        assert not port_in_use("127.0.0.1", int(env[f"TRITONFLOW_{port}"])), port


@pytest.mark.slow
@pytest.mark.integration
def test_the_local_runtime_delivers_a_new_version_to_its_airflow_after_register_with_defaults(tmp_path):
    """runtime start, then ``registry webhook register`` with no options: MLflow's own delivery is a run."""
    import time

    from mlflow import MlflowClient

    from tritonflow.runtime.airflow_api import AirflowApi

    env = dict(_cli_env(tmp_path), TRITONFLOW_WEBHOOK_SECRET="local-runtime-secret")
    try:
        started = _cli(env, "start", "--services", "mlflow,airflow", timeout=900)
        assert started.returncode == 0, started.stdout + started.stderr
        api = AirflowApi(f"http://127.0.0.1:{env['TRITONFLOW_AIRFLOW_API_PORT']}")
        api.wait_for_dag("model_publish", 600)
        webhook = [sys.executable, "-m", "tritonflow.cli", "registry", "webhook"]
        registered = subprocess.run([*webhook, "register"], env=env, capture_output=True, text=True, timeout=120)
        assert registered.returncode == 0, registered.stderr
        tested = subprocess.run([*webhook, "test"], env=env, capture_output=True, text=True, timeout=120)
        assert tested.returncode == 0 and json.loads(tested.stdout)["status"] == 200, tested.stdout + tested.stderr
        uri = f"http://127.0.0.1:{env['TRITONFLOW_MLFLOW_PORT']}"
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.create_registered_model("local-webhook")
        run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
        client.create_model_version("local-webhook", f"{run.info.artifact_uri}/model", run.info.run_id)
        deadline, runs = time.monotonic() + 60, []
        while time.monotonic() < deadline and not runs:
            runs = [r for r in api.dag_runs("model_publish") if r["dag_run_id"].startswith("registry__")]
            time.sleep(1)
        assert [(r["conf"]["model_name"], r["conf"]["model_version"]) for r in runs] == [("local-webhook", "1")]
    finally:
        stopped = _cli(env, "stop", "--services", "mlflow,airflow", timeout=300)
    assert stopped.returncode == 0, stopped.stderr


def _free() -> int:
    from tritonflow.runtime.services import free_port

    return free_port()


def _write_repo(root: Path, onnx_bytes: bytes, config: str) -> None:
    version = root / MODEL / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(onnx_bytes)
    (root / MODEL / "config.pbtxt").write_text(config)


def test_onnxruntime_backend_batches_concurrent_requests(tmp_path, iris_onnx, triton_factory):
    from concurrent.futures import ThreadPoolExecutor

    clf, X, onnx_bytes = iris_onnx
    config = _config_pbtxt().replace(
        "max_queue_delay_microseconds: 100", "max_queue_delay_microseconds: 300000"
    )
    _write_repo(tmp_path / "repo", onnx_bytes, config)
    triton = triton_factory(str(tmp_path / "repo"))
    httpclient.InferenceServerClient(triton.http_url).load_model(MODEL)

    rows = X[:24]
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda i: _infer(triton.http_url, rows[i : i + 1]), range(len(rows))))
    probs = np.vstack([p for _, p in results])
    np.testing.assert_allclose(probs, clf.predict_proba(rows), atol=1e-5)

    stats = httpclient.InferenceServerClient(triton.http_url).get_inference_statistics(MODEL)
    model_stats = stats["model_stats"][0]
    assert model_stats["inference_count"] == len(rows)
    # Fewer executions than requests: the backend ran several requests as one batch.
    assert model_stats["execution_count"] < len(rows)


def test_onnxruntime_backend_refuses_a_config_whose_dtype_contradicts_the_model(tmp_path, iris_onnx, triton_factory):
    _, _, onnx_bytes = iris_onnx
    wrong = _config_pbtxt().replace("data_type: TYPE_FP32\n  dims: 4", "data_type: TYPE_INT64\n  dims: 4")
    assert wrong != _config_pbtxt()
    _write_repo(tmp_path / "repo", onnx_bytes, wrong)
    triton = triton_factory(str(tmp_path / "repo"))
    client = httpclient.InferenceServerClient(triton.http_url)
    with pytest.raises(Exception, match=r"input 'X': config TYPE_INT64, model tensor\(float\)"):
        client.load_model(MODEL)
    assert not client.is_model_ready(MODEL)


def test_the_local_mlflow_may_deliver_to_its_loopback_receiver_and_runs_no_job_runner(tmp_path, monkeypatch):
    for name in ("MLFLOW_WEBHOOK_ALLOWED_SCHEMES", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS",
                 "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"):
        monkeypatch.delenv(name, raising=False)
    server = MlflowServer(make_settings(tmp_path / "home"))
    env = server.environment()
    assert env["MLFLOW_WEBHOOK_ALLOWED_SCHEMES"] == "http,https"
    assert env["MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS"] == "true"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    # One key, drawn once and kept (owner-only) under the home: a restart reads the same.
    assert env["MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"] == server.webhook_key_path.read_text().strip()
    assert server.webhook_key_path.stat().st_mode & 0o777 == 0o600
    assert MlflowServer(make_settings(tmp_path / "home")).environment()["MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"] == \
        env["MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"]
    monkeypatch.setenv("MLFLOW_WEBHOOK_ALLOWED_SCHEMES", "https")  # the operator's own value wins
    assert server.environment()["MLFLOW_WEBHOOK_ALLOWED_SCHEMES"] == "https"


def test_a_corrupt_webhook_key_file_is_refused_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY", raising=False)
    server = MlflowServer(make_settings(tmp_path / "home"))
    server.webhook_key_path.parent.mkdir(parents=True)
    server.webhook_key_path.write_text("not-a-key")
    with pytest.raises(RuntimeStartError, match=rf"{server.webhook_key_path} holds no valid Fernet key"):
        server.environment()
