"""The fallback replica: INT8 ``<model>__fallback`` built, gated, served, and answering for the champion.

Unit tests: the quantizer and the looser gate on real skl2onnx models, the gateway snippet, the
inference log's ``answered_by`` column. Integration tests (real NGINX; real MLflow server + Triton):
the gateway retries 5xx answers and timeouts of the serving version on the fallback with the same
body and a marker header (behind a loopback stand-in, which can be told to fail); the publish
pipeline serves a quantized MLP as ``<model>__fallback`` and records its tolerance; a model
quantization cannot handle is skipped with a recorded reason while the publish succeeds; when the
champion is unloaded from Triton, requests through the gateway are answered by the fallback and
the inference log records it as the answering model.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import types
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import DataError, WindowError
from repository_sync.routing.gateway_probe import FALLBACK_HEADER, answered_by, fallback_model_name, wait_live
from repository_sync.routing.nginx_router import NginxRouter
from repository_sync.routing.traffic_plan import TrafficPlan
from tritonflow.pipelines.publish_fallback import QuantizationUnsupported, gate, quantize

HEADER = "X-Tritonflow-Version"


# ------------------------------------------------------------------------------------ helpers
def _onnx(clf, n_features: int, path: Path) -> Path:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(clf, initial_types=[("float_input", FloatTensorType([None, n_features]))],
                          options={id(clf): {"zipmap": False}}, target_opset=17)
    path.write_bytes(onx.SerializeToString())
    return path


def _data(n: int = 600, d: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = (X[:, :3].sum(axis=1) > 0).astype(np.int64)
    return X, y


# ------------------------------------------------------------------------------------ unit
def test_an_mlp_is_quantized_and_passes_the_looser_gate_but_not_the_strict_one(tmp_path):
    from sklearn.neural_network import MLPClassifier

    X, y = _data()
    clf = MLPClassifier(hidden_layer_sizes=(32,), max_iter=300, random_state=0).fit(X, y)
    fp32 = _onnx(clf, X.shape[1], tmp_path / "m.onnx")
    ops = quantize(fp32, tmp_path / "m.int8.onnx")
    quantize(fp32, tmp_path / "again.int8.onnx")  # a re-run pushes the same bytes (versions are immutable)
    assert (tmp_path / "m.int8.onnx").read_bytes() == (tmp_path / "again.int8.onnx").read_bytes()
    assert ops.get("MatMulInteger", 0) + ops.get("DynamicQuantizeMatMul", 0) >= 1
    feeds = {"float_input": X[:200]}
    expected = {"label": clf.predict(X[:200]), "probabilities": clf.predict_proba(X[:200]).astype(np.float32)}
    loose = gate(tmp_path / "m.int8.onnx", feeds, expected, atol=0.05, rtol=0.05, min_label_agreement=0.95,
                 model_name="m__fallback")
    assert loose.passed, loose.describe_failures()
    strict = gate(tmp_path / "m.int8.onnx", feeds, expected, atol=1e-5, rtol=1e-4, min_label_agreement=1.0,
                  model_name="m__fallback")
    assert not strict.passed  # INT8 really changes the outputs: the looser tolerance is what admits it
    assert strict.outputs["probabilities"]["max_abs_error"] > 1e-5
    message = strict.describe_failures("m__fallback")
    assert message.startswith("fallback parity gate failed for model 'm__fallback'")
    assert "output 'probabilities': 0." in message and "rows within tolerance" in message


def test_a_model_without_int8_kernels_is_refused_with_the_operators_named(tmp_path):
    from sklearn.linear_model import LogisticRegression

    X, y = _data()
    fp32 = _onnx(LogisticRegression().fit(X, y), X.shape[1], tmp_path / "lr.onnx")
    with pytest.raises(QuantizationUnsupported, match="no operator has an INT8 kernel.*LinearClassifier"):
        quantize(fp32, tmp_path / "lr.int8.onnx")


def test_a_file_that_is_not_onnx_is_refused_as_unsupported(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(QuantizationUnsupported, match="quantize_dynamic failed"):
        quantize(bad, tmp_path / "out.onnx")


def test_the_gateway_snippet_retries_5xx_and_timeouts_on_the_fallback_only_when_enabled(tmp_path):
    plan = TrafficPlan.canary("churn", 6, 7, 10)
    off = NginxRouter(tmp_path, reload=["true"]).render(plan)[1].decode()
    assert "error_page" not in off and "__fallback" not in off
    on = NginxRouter(tmp_path, reload=["true"], fallback=True, fallback_timeout_s=2.5).render(plan)[1].decode()
    assert "error_page 500 502 503 504 = @tritonflow_fallback_" in on
    assert "proxy_read_timeout 2.5s;" in on and "proxy_intercept_errors on;" in on
    assert "/v2/models/churn__fallback/versions/$1$2 break;" in on
    assert f"add_header {FALLBACK_HEADER} churn__fallback always;" in on
    with pytest.raises(DataError, match="fallback_timeout_s"):
        NginxRouter(tmp_path, reload=["true"], fallback=True, fallback_timeout_s=0)


def test_fallback_names_and_the_answering_model():
    assert fallback_model_name("churn") == "churn__fallback"
    with pytest.raises(DataError, match="not a valid Triton model name"):
        fallback_model_name("m" * 125)
    assert answered_by("churn", {"x-tritonflow-fallback": "churn__fallback"}) == "churn__fallback"
    assert answered_by("churn", {HEADER: "6"}) == "churn"


def test_the_inference_log_records_which_model_answered(tmp_path):
    from drift_checks.inference_log import InferenceLogWriter, LogSchema, read_window

    t = pd.Timestamp("2026-11-30 10:15", tz="UTC")
    frame = pd.DataFrame({"request_id": ["a", "b"], "timestamp": [t, t], "model_version": [6, 6],
                          "x": [0.1, 0.2], "p": [0.4, 0.6], "answered_by": ["churn", "churn__fallback"]})
    writer = InferenceLogWriter(str(tmp_path), "churn", LogSchema({"x": "float"}, {"p": "float"}))
    writer.write(frame)
    window = read_window(str(tmp_path), "churn", t.floor("h"), t.floor("h") + dt.timedelta(hours=1))
    assert sorted(window.frame["answered_by"]) == ["churn", "churn__fallback"]
    with pytest.raises(WindowError, match="answered_by"):
        writer.write(frame.assign(request_id=["c", "d"], answered_by=["churn", ""]))
    with pytest.raises(WindowError, match="reserved"):
        LogSchema({"answered_by": "category"})


# ------------------------------------------------------------------------------------ NGINX
class _Upstream(BaseHTTPRequestHandler):
    """Stand-in for Triton: version 6 answers 503, 8 is too slow, 9 refuses the input (400);
    the fallback answers 200. Every answer echoes the path and the body it got."""

    protocol_version = "HTTP/1.1"

    def _reply(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        code = 200
        if "__fallback" not in self.path:
            code = {"/versions/6/": 503, "/versions/9/": 400}.get(self.path[self.path.find("/versions/"):][:12], 200)
            if "/versions/8/" in self.path:
                time.sleep(3)
        out = json.dumps({"path": self.path, "body": body.decode()}).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        except OSError:  # the gateway gave up on a slow answer
            pass

    do_GET = do_POST = _reply

    def log_message(self, *args) -> None:
        pass


@pytest.mark.integration
def test_the_gateway_retries_5xx_and_timeouts_on_the_fallback_with_the_same_body(gateway_factory):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        gateway = gateway_factory(types.SimpleNamespace(http_url=f"127.0.0.1:{server.server_address[1]}"))
        router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd(), response_header=HEADER,
                                            fallback=True, fallback_timeout_s=1)
        seen = {}
        for version in (6, 7, 8, 9):
            wait_live(gateway.url, router.apply(TrafficPlan.single("m", version)))
            req = urllib.request.Request(f"{gateway.url}/v2/models/m/infer", data=b'{"inputs": [1]}', method="POST")
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    seen[version] = (resp.status, resp.headers.get(FALLBACK_HEADER), resp.headers.get(HEADER),
                                     json.loads(resp.read()))
            except urllib.error.HTTPError as exc:
                seen[version] = (exc.code, exc.headers.get(FALLBACK_HEADER), exc.headers.get(HEADER), None)
    finally:
        server.shutdown()
        server.server_close()
    body = '{"inputs": [1]}'
    assert seen[6] == (200, "m__fallback", None, {"path": "/v2/models/m__fallback/versions/6/infer", "body": body})
    assert seen[7] == (200, None, "7", {"path": "/v2/models/m/versions/7/infer", "body": body})
    assert seen[8][:2] == (200, "m__fallback")  # timed out after 1 s, then answered by the fallback
    assert seen[9][:3] == (400, None, "9")  # a bad request is the client's: never retried


# ------------------------------------------------------------------------------------ real services
@pytest.fixture(scope="module")
def stack(tmp_path_factory, mlflow_server):
    from tests.conftest import make_settings
    from tritonflow.runtime.services import TritonServer

    home = tmp_path_factory.mktemp("fallback_home")
    repo = home / "model_repository"
    repo.mkdir()
    settings = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri, repository_uri=str(repo))
    triton = TritonServer(make_settings(tmp_path_factory.mktemp("triton")), repository=str(repo)).start()
    yield types.SimpleNamespace(settings=settings, repo=repo, triton=triton, tracking_uri=mlflow_server.tracking_uri)
    triton.stop()


@pytest.fixture(scope="module")
def published_mlp(stack):
    """An MLP classifier registered and published through every stage: it has a fallback."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from tests.pipelines.test_publish_pipeline import churn_data, register, unique
    from tritonflow.pipelines import publish as pipeline

    X, y = churn_data()
    X = X.astype(np.float64)
    # lbfgs keeps no optimizer object (MLflow's skops format refuses Adam's); alpha=3 keeps the
    # weights small, as INT8 needs (an unregularised net on 300 rows flips 10 % of its labels).
    model = make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(32,), solver="lbfgs", alpha=3.0,
                                                          max_iter=500, random_state=0)).fit(X, y)
    name = unique("churn_mlp")
    version = register(stack.tracking_uri, name, model, X)
    summary = pipeline.publish(f"{name}@champion", triton_url=stack.triton.http_url, settings=stack.settings,
                               max_batch_size=16, profile_enabled=False, perf_gate_enabled=False)
    return name, version, summary


def _tags(stack, name, version):
    from tests.pipelines.test_publish_pipeline import version_tags

    return version_tags(stack.tracking_uri, name, version)


@pytest.mark.integration
def test_a_quantized_model_passes_its_looser_gate_and_is_served_as_model__fallback(stack, published_mlp):
    from repository_sync.triton_client import TritonModelControl
    from tritonflow.pipelines.publish import triton_model_name

    name, version, summary = published_mlp
    assert summary["status"] == "published" and summary["fallback"] == "published"
    tags = _tags(stack, name, version)
    assert tags["tritonflow.fallback_status"] == "published"
    assert json.loads(tags["tritonflow.fallback_tolerance"]) == {
        "atol": stack.settings.fallback_atol, "rtol": stack.settings.fallback_rtol,
        "min_label_agreement": stack.settings.fallback_min_label_agreement}
    record = json.loads(tags["tritonflow.fallback"])
    assert record["quantized_ops"] and record["signature_digest"]
    assert all(o["passed"] for o in record["parity"].values()) and record["parity"]
    fb = fallback_model_name(triton_model_name(name))
    assert (stack.repo / fb / str(version) / "model.onnx").is_file()
    with TritonModelControl(stack.triton.http_url) as ctl:
        assert ctl.ready_versions(fb) == [version]

    from tritonflow.pipelines import publish as pipeline

    again = pipeline.publish(f"{name}@champion", triton_url=stack.triton.http_url, settings=stack.settings,
                             max_batch_size=16, profile_enabled=False, perf_gate_enabled=False)
    assert again["fallback"] == "published"  # a re-run keeps the immutable replica and loads it again
    assert json.loads(_tags(stack, name, version)["tritonflow.fallback"])["signature_digest"] == \
        record["signature_digest"]


@pytest.mark.integration
def test_a_model_quantization_cannot_handle_is_skipped_with_a_reason_and_the_publish_succeeds(stack):
    from sklearn.linear_model import LogisticRegression

    from tests.pipelines.test_publish_pipeline import churn_data, register, unique
    from tritonflow.pipelines import publish as pipeline

    X, y = churn_data()
    name = unique("churn_lr")
    version = register(stack.tracking_uri, name, LogisticRegression(max_iter=500).fit(X, y), X)
    summary = pipeline.publish(f"{name}@champion", triton_url=stack.triton.http_url, settings=stack.settings,
                               max_batch_size=16, profile_enabled=False, perf_gate_enabled=False)
    assert summary["status"] == "published" and summary["fallback"] == "skipped"
    tags = _tags(stack, name, version)
    assert tags["tritonflow.status"] == "published"
    assert tags["tritonflow.fallback_status"] == "skipped"
    assert "no operator has an INT8 kernel" in tags["tritonflow.fallback_reason"]
    assert not (stack.repo / fallback_model_name(pipeline.triton_model_name(name))).exists()


@pytest.mark.integration
def test_when_the_champion_is_unloaded_the_fallback_answers_and_the_log_records_it(
        stack, published_mlp, gateway_factory, tmp_path):
    from drift_checks.inference_log import InferenceLogWriter, LogSchema, read_window
    from repository_sync.triton_client import TritonModelControl
    from tests.pipelines.test_publish_pipeline import churn_data
    from tritonflow.pipelines import publish as pipeline

    name, version, _ = published_mlp
    triton_name = pipeline.triton_model_name(name)
    gateway = gateway_factory(stack.triton)
    router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd(), response_header=HEADER,
                                        fallback=True, fallback_timeout_s=5)
    wait_live(gateway.url, router.apply(TrafficPlan.single(triton_name, version)))
    sample = {"features": churn_data()[0].to_numpy(dtype=np.float32)[:1]}  # the publish's staging is gone
    with TritonModelControl(stack.triton.http_url) as ctl:
        specs = {s.name: s for s in ctl.input_specs(triton_name, version)}
    body = json.dumps({"inputs": [
        {"name": k, "shape": [1, *np.asarray(v).shape[1:]], "datatype": specs[k].datatype,
         "data": np.asarray(v)[:1].reshape(-1).tolist()} for k, v in sample.items()]}).encode()

    def infer():
        req = urllib.request.Request(f"{gateway.url}/v2/models/{triton_name}/infer", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())

    status, headers, before = infer()
    assert status == 200 and headers.get(HEADER) == str(version) and FALLBACK_HEADER not in headers
    with TritonModelControl(stack.triton.http_url) as ctl:
        ctl.unload(triton_name)
        deadline = time.monotonic() + 30
        while ctl.ready_versions(triton_name) and time.monotonic() < deadline:
            time.sleep(0.2)
    status, headers, after = infer()
    assert status == 200
    assert headers.get(FALLBACK_HEADER) == f"{triton_name}__fallback"
    assert after["model_name"] == f"{triton_name}__fallback"
    probs = {o["name"]: o["data"] for o in before["outputs"]}
    probs_fb = {o["name"]: o["data"] for o in after["outputs"]}
    key = next(k for k in probs if "prob" in k)
    assert np.allclose(probs[key], probs_fb[key], atol=stack.settings.fallback_atol)

    now = pd.Timestamp.now(tz="UTC")
    rows = [("r-before", triton_name), ("r-after", answered_by(triton_name, headers))]
    frame = pd.DataFrame({"request_id": [r[0] for r in rows], "timestamp": [now, now], "model_version": [version] * 2,
                          "p": [float(probs[key][-1]), float(probs_fb[key][-1])], "answered_by": [r[1] for r in rows]})
    InferenceLogWriter(str(tmp_path / "logs"), name, LogSchema({}, {"p": "float"})).write(frame)
    window = read_window(str(tmp_path / "logs"), name, now.floor("h"), now.floor("h") + dt.timedelta(hours=1))
    logged = dict(zip(window.frame["request_id"], window.frame["answered_by"], strict=True))
    assert logged == {"r-before": triton_name, "r-after": f"{triton_name}__fallback"}
