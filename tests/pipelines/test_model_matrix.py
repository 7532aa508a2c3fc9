"""The model matrix on real services: one MLflow server, one Triton, one NGINX gateway.

Each flavour x task x input kind is registered in MLflow and published through the real publish
pipeline (convert, parity gate, sign, push, verified load, smoke test, record) into ONE Triton
session: scikit-learn multi-class with string columns (palmerpenguins), XGBoost multi-class,
LightGBM binary, PyTorch as ONNX and as TorchScript. The string model is then served through
the gateway with tritonclient BYTES tensors, logged with its string columns and drift-checked
with the categorical statistics. The model matrix of docs/models.md is these tests' output.

Also here, on the same services: the p99 regression gate rejecting a deliberately slower
challenger, and the profile stage dropping an unstable config.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import json
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_settings
from tritonflow.pipelines import publish as pipeline
from tritonflow.pipelines import publish_common, publish_profile, publish_signing, publish_validate

pytestmark = pytest.mark.integration

CASES = Path(__file__).resolve().parents[2].parent / "shared" / "cases" / "inputs"
if not CASES.is_dir():
    CASES = Path("/work/shared/cases/inputs")


@contextlib.contextmanager
def _tracking(uri: str):
    import mlflow

    prev = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(prev)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


def log_and_register(uri: str, flavor: str, model, X, y_pred, name: str, alias: str | None = "champion", **kw) -> int:
    import importlib

    import mlflow
    from mlflow.models import infer_signature

    with _tracking(uri), mlflow.start_run():
        info = importlib.import_module(f"mlflow.{flavor}").log_model(
            model, name="model", signature=infer_signature(X, y_pred), input_example=X[:5],
            registered_model_name=name, **kw)
    version = int(info.registered_model_version)
    if alias:
        mlflow.MlflowClient(uri).set_registered_model_alias(name, alias, str(version))
    return version


def tags_of(uri: str, name: str, version: int) -> dict[str, str]:
    import mlflow

    return dict(mlflow.MlflowClient(uri).get_model_version(name, str(version)).tags)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mlflow_server):
    from tritonflow.runtime.services import NginxGateway, TritonServer

    home = tmp_path_factory.mktemp("matrix_home")
    repo = home / "model_repository"
    repo.mkdir()
    settings = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri, repository_uri=str(repo))
    triton = TritonServer(make_settings(tmp_path_factory.mktemp("matrix_triton")), repository=str(repo)).start()
    gateway = NginxGateway(make_settings(tmp_path_factory.mktemp("matrix_gw")), triton_http=triton.http_url).start()
    yield {"settings": settings, "repo": repo, "triton": triton, "gateway": gateway, "uri": mlflow_server.tracking_uri}
    gateway.stop()
    triton.stop()


def _penguins():
    import palmerpenguins

    df = palmerpenguins.load_penguins()
    return df[["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "island", "sex"]], df["species"]


def _models(uri: str, tmp: Path) -> list[dict]:
    """Register one model per matrix row; returns publish arguments per row."""
    import lightgbm as lgb
    import torch
    import xgboost as xgb

    from tests.model_registry.test_real_models import penguin_pipeline

    rows = []
    X, y = _penguins()
    model = penguin_pipeline(X, y)
    name = unique("penguins")
    log_and_register(uri, "sklearn", model, X, model.predict(X), name, skops_trusted_types=["numpy.dtype"],
                     pip_requirements=["scikit-learn"])
    data = tmp / "penguins.csv"
    X.to_csv(data, index=False)
    rows.append({"row": "scikit-learn | multi-class (3) | numeric + string", "name": name, "dataset_uri": str(data)})

    rng = np.random.default_rng(0)
    T = pd.DataFrame(rng.normal(size=(400, 5)), columns=[f"f{i}" for i in range(5)])
    y3 = ((T.f0 > 0).astype(int) + (T.f1 > 0.5).astype(int)).to_numpy()
    xm = xgb.XGBClassifier(n_estimators=20, max_depth=3).fit(T, y3)
    name = unique("xgb")
    log_and_register(uri, "xgboost", xm, T, xm.predict(T), name, pip_requirements=["xgboost"])
    table = tmp / "table.csv"
    T.to_csv(table, index=False)
    rows.append({"row": "XGBoost | multi-class (3) | numeric", "name": name, "dataset_uri": str(table)})

    yb = (T.f0 + T.f2 > 0).astype(int).to_numpy()
    lm = lgb.LGBMClassifier(n_estimators=20, verbose=-1).fit(T, yb)
    name = unique("lgbm")
    log_and_register(uri, "lightgbm", lm, T, lm.predict(T), name, pip_requirements=["lightgbm"])
    rows.append({"row": "LightGBM | binary | numeric", "name": name, "dataset_uri": str(table)})

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1)
    ).eval()
    Xt = T.to_numpy(np.float32)
    for fmt in ("onnx", "torchscript"):
        name = unique(f"torch_{fmt}")
        log_and_register(uri, "pytorch", net, Xt, net(torch.from_numpy(Xt)).detach().numpy(), name,
                         pip_requirements=["torch==2.13.0"])
        rows.append({"row": f"PyTorch -> {'ONNX' if fmt == 'onnx' else 'TorchScript'} | regression | tensor",
                     "name": name, "export_format": fmt})
    return rows


def test_every_flavour_is_converted_parity_gated_loaded_served_and_recorded(stack, tmp_path):
    from repository_sync.triton.client import TritonModelControl

    s = stack["settings"]
    matrix = {}
    for row in _models(stack["uri"], tmp_path):
        summary = pipeline.publish(f"{row['name']}@champion", triton_url=stack["triton"].http_url, settings=s,
                                   max_batch_size=8, profile_enabled=False, dataset_uri=row.get("dataset_uri"),
                                   export_format=row.get("export_format", "onnx"))
        tags = tags_of(stack["uri"], row["name"], summary["version"])
        assert tags["tritonflow.status"] == "published", row
        parity = json.loads(tags["tritonflow.parity_errors"])
        assert tags["tritonflow.provenance.onnxruntime"] and tags["tritonflow.provenance.export_format"]
        assert any(k.startswith("tritonflow.artifact.publish/parity_report.json") for k in tags)
        keys = publish_signing.ensure_signing_keys(s, create=False)
        with TritonModelControl(stack["triton"].http_url, repository=str(stack["repo"]),
                                trusted_keys=str(keys.trusted_dir)) as ctl:
            assert ctl.is_ready(row["name"], summary["version"]), row
        matrix[row["row"]] = max(v.get("max_abs", 0.0) or 0.0 for v in parity.values())
    print("MODEL_MATRIX", json.dumps(matrix, sort_keys=True))
    assert len(matrix) == 5 and all(v <= 1e-4 for v in matrix.values()), matrix
    ts = [r for r in _files(stack["repo"]) if r.endswith("model.pt")]
    assert ts, "the TorchScript version is in the repository as model.pt"


def _files(repo: Path) -> list[str]:
    return [str(p) for p in repo.rglob("*") if p.is_file()]


def test_string_model_is_served_through_the_gateway_logged_and_drift_checked(stack, tmp_path):
    import tritonclient.http as httpclient

    from drift_checks.categorical_statistics import category_counts
    from drift_checks.inference_log import InferenceLogWriter, LogSchema, categorical_columns, read_window
    from drift_checks.statistics import score_categorical

    X, y = _penguins()
    from tests.model_registry.test_real_models import penguin_pipeline

    model = penguin_pipeline(X, y)
    name = unique("penguins_gw")
    log_and_register(stack["uri"], "sklearn", model, X, model.predict(X), name, skops_trusted_types=["numpy.dtype"],
                     pip_requirements=["scikit-learn"])
    summary = pipeline.publish(f"{name}@champion", triton_url=stack["triton"].http_url, settings=stack["settings"],
                               max_batch_size=8, profile_enabled=False)
    rows = X.iloc[40:48].reset_index(drop=True)
    gateway = stack["gateway"].url.split("://")[-1].rstrip("/")
    client = httpclient.InferenceServerClient(gateway)
    inputs = []
    for col in rows.columns:
        if rows[col].dtype == object:
            arr = np.array([[b"nan" if v is None or v != v else str(v).encode()] for v in rows[col]], dtype=object)
            item = httpclient.InferInput(col, list(arr.shape), "BYTES")
        else:
            arr = rows[[col]].to_numpy(np.float32)
            item = httpclient.InferInput(col, list(arr.shape), "FP32")
        item.set_data_from_numpy(arr)
        inputs.append(item)
    result = client.infer(name, inputs, model_version=str(summary["version"]))
    labels = [v.decode() for v in result.as_numpy("label").reshape(-1)]
    assert labels == model.predict(rows).tolist()
    np.testing.assert_allclose(result.as_numpy("probabilities"), model.predict_proba(rows), atol=1e-5)

    # the inference log takes the string columns; the categorical statistics drift-check them
    now = dt.datetime(2025, 1, 1, 10, 30, tzinfo=dt.timezone.utc)
    log = rows.assign(request_id=[f"r{i}" for i in range(len(rows))], timestamp=pd.Timestamp(now),
                      model_version=summary["version"], prediction=labels)
    root = str(tmp_path / "logs")
    InferenceLogWriter(root, name).write(log)
    window = read_window(root, name, now - dt.timedelta(hours=1), now + dt.timedelta(hours=1))
    assert window.frame["island"].tolist() == rows["island"].tolist()
    assert {"island", "sex"} <= set(categorical_columns(LogSchema.infer(log)))
    scores = score_categorical(category_counts(X["island"]), category_counts(window.frame["island"]))
    assert {"jensen_shannon", "chi_square_p_value", "unseen_share"} <= set(scores)
    assert scores["unseen_share"].value == 0.0  # every served island is a known category


def _onnx_mlp(layers: int, width: int):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(scale=0.1, size=(4, width)).astype(np.float32), "w_in"),
             numpy_helper.from_array((rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32), "w_h"),
             numpy_helper.from_array(rng.normal(scale=0.1, size=(width, 3)).astype(np.float32), "w_out")]
    nodes = [helper.make_node("MatMul", ["features", "w_in"], ["h0"])]
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [f"h{i}", "w_h"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
    nodes += [helper.make_node("MatMul", [f"h{layers}", "w_out"], ["z"]),
              helper.make_node("Softmax", ["z"], ["probabilities"], axis=1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 3])],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def test_a_much_slower_challenger_is_rejected_by_the_p99_gate_and_never_pushed(stack):
    """The challenger's staged config makes every batch wait 50 ms to fill (``max_queue_delay``, never
    reached at concurrency 4 < ``max_batch_size`` 8): the champion's p99 is a few milliseconds.

    Wall-clock slowness, not compute: on a loaded 2-core CI host p99 at concurrency 4 is mostly
    scheduling delay, and a challenger with ~34,000x the champion's multiply-adds (48 hidden 512x512
    layers) measured only +67 % to +105 % against limits of 31 % to 82 % beside eight CPU hogs, and
    perf_analyzer stabilised 2 of its 10 passes at 250 ms on a CI run (a CI failure). A queue delay
    holds whatever the load, and at ~80 requests/s its windows must grow to hold enough requests
    (``next_window_ms``), which this also checks.
    """
    import onnxruntime as ort

    from ground.exceptions import PerformanceRegressionError
    from model_registry.triton_config import read_config, to_pbtxt

    s = stack["settings"]
    x = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    name = unique("latency")
    small, big = _onnx_mlp(1, 16), _onnx_mlp(2, 16)

    def out(m):
        return ort.InferenceSession(m.SerializeToString()).run(None, {"features": x})[0]

    log_and_register(stack["uri"], "onnx", small, x, out(small), name, pip_requirements=["onnxruntime"])
    champion = pipeline.publish(f"{name}@champion", triton_url=stack["triton"].http_url, settings=s,
                                max_batch_size=8, profile_enabled=False)
    assert champion["status"] == "published"
    version = log_and_register(stack["uri"], "onnx", big, x, out(big), name, alias="challenger",
                               pip_requirements=["onnxruntime"])
    state = pipeline.resolve(f"{name}@challenger", settings=s)
    state = publish_validate.convert_and_validate(state, max_batch_size=8, settings=s)
    config = read_config(state["config_path"])
    config.dynamic_batching.max_queue_delay_microseconds = 50_000
    Path(state["config_path"]).write_text(to_pbtxt(config))
    with pytest.raises(PerformanceRegressionError, match="p99 latency regression against champion version"):
        publish_profile.perf_gate(state, settings=s)
    tags = tags_of(stack["uri"], name, version)
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "perf_gate"
    gate = json.loads(tags["tritonflow.perf_gate"])
    assert gate["status"] == "rejected" and gate["challenger_p99_ms"] > gate["champion_p99_ms"]
    assert gate["regression"] > gate["limit"] and gate["noise_band"] >= 0 and gate["max_regression"] == 0.1
    report = json.loads((Path(state["staging_dir"]) / publish_common.PERF_GATE_FILENAME).read_text())
    assert all(len(report["passes"][m]) >= 3 for m in ("champion", "challenger"))
    assert report["challenger_p99_ms"] >= 50.0
    windows = {m: [p["window_ms"] for p in report["passes"][m]] for m in ("champion", "challenger")}
    assert windows["challenger"][0] == s.perf_gate_measurement_ms and max(windows["challenger"]) >= 1000
    print("PERF_GATE", json.dumps({k: report[k] for k in ("champion_p99_ms", "challenger_p99_ms", "regression",
                                                           "noise_band", "limit")}),
          {m: [(p["window_ms"], p["stable"]) for p in report["passes"][m]] for m in ("champion", "challenger")})
    assert not (stack["repo"] / name / str(version)).exists()  # never pushed


def test_profile_stage_drops_the_unstable_config_of_the_case_and_adopts_the_steady_one(stack, monkeypatch):
    """Unstable measurements through the publish stage. Model Analyzer's single measurement ranks config_2 first
    (1312 infer/s vs 842); the confirmation passes are the case's (config_2 collapses to ~60 after
    three passes). Both measurements are replayed from the case (fakes: such instability cannot be
    produced on demand); selection, adoption, checks and MLflow records are the real stage."""
    import onnxruntime as ort

    from model_registry.profiling import analyzer
    from model_registry.profiling.perf import PerfPass
    from model_registry.triton_config import build_config, to_pbtxt

    s = stack["settings"]
    x = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)
    m = _onnx_mlp(1, 8)
    name = unique("tabular")
    expected = ort.InferenceSession(m.SerializeToString()).run(None, {"features": x})[0]
    log_and_register(stack["uri"], "onnx", m, x, expected, name, pip_requirements=["onnxruntime"])
    resolved = pipeline.resolve(f"{name}@champion", settings=s)
    state = publish_validate.convert_and_validate(resolved, max_batch_size=8, settings=s)
    passes: dict[str, list[float]] = {}
    with open(CASES / "H12_unstable_measurement" / "perf_passes.csv") as fh:
        for r in csv.DictReader(fh):
            passes.setdefault(r["config"], []).append(float(r["throughput_infer_per_s"]))
    configs = {"tabular_cpu_config_2": 32, "tabular_cpu_config_3": 8}

    def fake_profile_model(model_name, config, *, model_repository, work_dir, **kw):
        out = Path(work_dir) / "output_model_repository"
        for c, mbs in configs.items():
            (out / c / "1").mkdir(parents=True)
            cfg = build_config(c, m, max_batch_size=mbs)
            (out / c / "config.pbtxt").write_text(to_pbtxt(cfg))
        rows = [analyzer.ProfileRow(c, model_name, 1, 4, passes[c][0], 4.0, "1:CPU", mbs, True)
                for c, mbs in configs.items()]
        sel = analyzer.choose_best(rows, model_name=model_name, settings=s)
        assert sel.best == "tabular_cpu_config_2"  # the single measurement picks the unstable one
        path = Path(work_dir) / "profile.yaml"
        path.write_text("replayed\n")
        return analyzer.ProfileOutcome(sel, analyzer.chosen_config(out, sel, model_name=model_name), rows, path, path)

    def replay(cands, concurrency):
        return {c: [PerfPass(c, concurrency, t, 4.0, True) for t in passes[c]] for c in cands}

    monkeypatch.setattr(analyzer, "profile_model", fake_profile_model)
    state = publish_profile.profile(state, enabled=True, settings=s, pass_runner=replay)
    prof = state["profile"]
    assert prof["status"] == "profiled" and prof["best"] == "tabular_cpu_config_3"
    assert "coefficient of variation 1.2" in prof["dropped"]["tabular_cpu_config_2"]
    assert state["max_batch_size"] == 8  # the steady config was adopted
    assert "max_batch_size: 8" in Path(state["config_path"]).read_text()
