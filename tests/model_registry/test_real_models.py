"""Real model kinds through the conversion gate, without services: string columns, multi-class,
gradient boosting with float32 split-threshold probes, PyTorch to ONNX and TorchScript, provenance,
``tritonflow validate``, the IR/opset refusal, multi-class shadow metrics and the p99 verdict.

Models are saved as local MLflow model folders (``mlflow.<flavor>.save_model``); the gate loads
them exactly as it loads registered versions. Data: palmerpenguins (3 species, string columns with
missing values) and seeded synthetic tables.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import ModelValidationError
from ground.settings import Settings

NUMERIC = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
CATEGORICAL = ["island", "sex"]


@pytest.fixture(scope="module")
def penguins() -> tuple[pd.DataFrame, pd.Series]:
    import palmerpenguins

    df = palmerpenguins.load_penguins()
    return df[NUMERIC + CATEGORICAL], df["species"]


def penguin_pipeline(X, y):
    """The most common tabular model: ColumnTransformer with a OneHotEncoder beside numeric columns."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    pre = ColumnTransformer([("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), NUMERIC),
                             ("cat", OneHotEncoder(handle_unknown="ignore"), CATEGORICAL)])
    return Pipeline([("pre", pre), ("clf", LogisticRegression(max_iter=1000))]).fit(X, y)


def save_sklearn(path, model, X):
    import mlflow.sklearn
    from mlflow.models import infer_signature

    mlflow.sklearn.save_model(model, str(path), signature=infer_signature(X, model.predict(X)),
                              input_example=X.head(5), skops_trusted_types=["numpy.dtype"],
                              pip_requirements=["scikit-learn"])  # no requirement inference (slow)
    return str(path)


def amounts_table(n: int = 600, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Two normal features and an integer amount of 2e7..5e7 (float32 spacing 2-4 there)."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n),
                      "amount": rng.integers(20_000_000, 50_000_000, n).astype(np.int64)})
    y = ((X.a + (X.amount > 35_000_000)) > 0.5).astype(np.int64).to_numpy()
    return X, y


def save_boosting(path, model, X, flavor):
    import importlib

    from mlflow.models import infer_signature

    importlib.import_module(f"mlflow.{flavor}").save_model(model, str(path),
                                                         signature=infer_signature(X, model.predict(X)),
                                                         input_example=X.head(5), pip_requirements=[flavor])
    return str(path)


@pytest.fixture(scope="module")
def penguin_dir(tmp_path_factory, penguins) -> str:
    X, y = penguins
    return save_sklearn(tmp_path_factory.mktemp("penguins") / "model", penguin_pipeline(X, y), X)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings.from_env({}, home=tmp_path / "home")


def gate(path, settings, **kwargs):
    from model_registry.gate import local_model, validate_model

    local, io = local_model(path)
    return validate_model(local, io, model_name=kwargs.pop("name", "m"), settings=settings, **kwargs)


# ------------------------------------------------------------------------------ string inputs
def test_string_columns_become_per_column_string_tensors_and_pass_parity(penguin_dir, penguins, settings):
    X, y = penguins
    result = gate(penguin_dir, settings, dataset=X, name="penguins", max_batch_size=8)
    assert result.passed, result.failure
    types = {i.name: i.data_type for i in result.config.input}
    from tritonclient.grpc import model_config_pb2 as pb

    assert types["island"] == types["sex"] == pb.TYPE_STRING and types["body_mass_g"] == pb.TYPE_FP32
    assert all(list(i.dims) == [1] for i in result.config.input)
    probs = result.parity.outputs["probabilities"]
    assert probs.max_abs_error < 1e-5 and len(probs.per_class_max_abs) == 3 and probs.label_flips == 0
    assert result.parity.outputs["label"].label_agreement == 1.0  # species names, string labels
    # rows with a missing sex are in the sample and sent as "nan", the category skl2onnx writes
    assert X["sex"].isna().sum() > 0 and (result.sample["sex"] == "nan").sum() == X["sex"].isna().sum()


def test_missing_strings_are_sent_as_the_nan_category_and_bytes_are_decoded():
    from model_registry.validation import string_tensor

    out = string_tensor(np.array([["Dream"], [None], [np.nan], [b"Biscoe"]], dtype=object))
    assert out.reshape(-1).tolist() == ["Dream", "nan", "nan", "Biscoe"]


# ------------------------------------------------------------------------------ boosting + probes
def test_xgboost_multiclass_converts_and_passes_parity_and_threshold_probes(tmp_path, settings):
    import xgboost as xgb

    X, _ = amounts_table()
    y3 = (X.a > 0).astype(int) + (X.amount > 35_000_000).astype(int)
    model = xgb.XGBClassifier(n_estimators=20, max_depth=3).fit(X, y3)
    result = gate(save_boosting(tmp_path / "xgb", model, X, "xgboost"), settings, dataset=X)
    assert result.passed, result.failure
    assert result.probes["probed"] and result.probes["passed"] and result.probes["thresholds_probed"] > 0
    assert len(result.parity.outputs["probabilities"].per_class_max_abs) == 3
    assert result.provenance["packages"]["xgboost"] and result.provenance["packages"]["onnxmltools"]


def test_lightgbm_with_large_magnitude_splits_is_refused_with_the_probe_rows(tmp_path, settings):
    """LightGBM compares in double, the ONNX tree in float32: amounts 2 apart round to one float32.
    The random sample passes; the probes next to the splits find the flipped labels."""
    import lightgbm as lgb

    X, y = amounts_table()
    model = lgb.LGBMClassifier(n_estimators=30, verbose=-1).fit(X, y)
    result = gate(save_boosting(tmp_path / "lgbm", model, X, "lightgbm"), settings, dataset=X)
    assert result.parity.passed  # the ordinary sample sees nothing
    assert not result.passed and "split thresholds" in result.failure
    probes = result.probes
    assert probes["passed"] is False and probes["label_flips"] >= 1 and probes["max_abs_diff"] > 0.1
    assert probes["worst_rows"] and {r["column"] for r in probes["worst_rows"]} == {"amount"}
    assert probes["resolution"]["amount"] == 1.0


def test_lightgbm_on_normal_magnitudes_passes_the_gate(tmp_path, settings):
    import lightgbm as lgb

    rng = np.random.default_rng(3)
    X = pd.DataFrame(rng.normal(size=(400, 4)), columns=list("abcd"))
    y = X.a * 2 + X.b - X.c
    model = lgb.LGBMRegressor(n_estimators=20, verbose=-1).fit(X, y)
    result = gate(save_boosting(tmp_path / "lgbr", model, X, "lightgbm"), settings, dataset=X)
    assert result.passed, result.failure and result.parity.outputs["variable"].max_abs_error < 1e-4
    assert result.probes["probed"] is False  # float32 is finer than these features' resolution


# ------------------------------------------------------------------------------ PyTorch
@pytest.fixture(scope="module")
def torch_model_dir(tmp_path_factory):
    import mlflow.pytorch
    import torch
    from mlflow.models import infer_signature

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.drop = torch.nn.Dropout(0.5)  # eval mode must switch it off

        def forward(self, x):
            return torch.softmax(self.fc(self.drop(x)), dim=1)

    torch.manual_seed(0)
    net = Net().eval()
    x = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    path = tmp_path_factory.mktemp("torch") / "net"
    mlflow.pytorch.save_model(net, str(path), signature=infer_signature(x, net(torch.from_numpy(x)).detach().numpy()),
                              input_example=x[:5], pip_requirements=["torch==2.13.0"])
    return str(path)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_pytorch_publishes_as_onnx_or_torchscript(torch_model_dir, settings, fmt):
    result = gate(torch_model_dir, settings, export_format=fmt, max_batch_size=8)
    assert result.passed, result.failure
    if fmt == "torchscript":
        assert result.config.platform == "pytorch_libtorch" and result.model_filename == "model.pt"
        assert [i.name for i in result.config.input] == ["input__0"]
        assert [o.name for o in result.config.output] == ["output__0"]
        assert "torchscript_eval_determinism" in result.report.checks and result.report.batch_sizes == [1, 3]
    else:
        assert result.config.backend == "onnxruntime" and result.provenance["ir_version"]


def test_torchscript_is_refused_for_a_flavour_that_cannot_produce_it(penguin_dir, settings):
    from ground.exceptions import ModelConversionError

    with pytest.raises(ModelConversionError, match="export_format='torchscript' is not available"):
        gate(penguin_dir, settings, export_format="torchscript")


# ------------------------------------------------------------------------------ provenance
def test_provenance_tags_name_library_converter_runtime_ir_and_opsets(penguin_dir, penguins, settings):
    from model_registry.provenance import provenance_tags

    X, y = penguins
    result = gate(penguin_dir, settings, dataset=X)
    tags = provenance_tags(result.provenance)
    import onnx
    import skl2onnx
    import sklearn

    assert tags["tritonflow.provenance.scikit-learn"] == sklearn.__version__
    assert tags["tritonflow.provenance.skl2onnx"] == skl2onnx.__version__
    assert tags["tritonflow.provenance.onnx"] == onnx.__version__ and tags["tritonflow.provenance.onnxruntime"]
    assert tags["tritonflow.provenance.ir_version"] == str(result.converted.onnx_model.ir_version)
    assert "ai.onnx.ml=" in tags["tritonflow.provenance.opsets"]
    assert result.validation_doc(settings.target_triton_release)["provenance"] == result.provenance


# ------------------------------------------------------------------------------ tritonflow validate
def test_validate_cli_passes_a_good_model_and_fails_a_bad_one_with_a_json_report(tmp_path, penguin_dir, penguins,
                                                                                  capsys):
    import lightgbm as lgb

    from tritonflow.cli import main

    X, y = penguins
    good = penguin_dir
    sample = tmp_path / "penguins.csv"
    X.to_csv(sample, index=False)
    assert main(["validate", good, "--sample", str(sample), "--out", str(tmp_path / "out")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["published"] is False
    assert "TYPE_STRING" in report["config_pbtxt"] and (tmp_path / "out" / "config.pbtxt").is_file()
    assert report["parity"]["outputs"]["probabilities"]["max_abs_error"] < 1e-5

    A, b = amounts_table()
    bad = save_boosting(tmp_path / "bad", lgb.LGBMClassifier(n_estimators=30, verbose=-1).fit(A, b), A, "lightgbm")
    amounts = tmp_path / "amounts.parquet"
    A.to_parquet(amounts)
    assert main(["validate", bad, "--sample", str(amounts)]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["passed"] is False and report["parity"]["threshold_probes"]["label_flips"] >= 1
    assert "split thresholds" in captured.err


def test_validate_cli_refuses_a_missing_sample_naming_it(tmp_path, penguin_dir):
    from tritonflow.cli import validate

    rc, report = validate(penguin_dir, str(tmp_path / "nope.csv"))
    assert rc == 1 and "nope.csv" in report["failure"]


# ------------------------------------------------------------------------------ IR / opset
def test_ml_opset_refusal_names_the_target_image_and_the_exact_limit():
    import onnx
    from onnx import TensorProto, helper

    from model_registry.validation import make_compatible

    g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    s = dataclasses.replace(Settings.from_env({}), max_onnx_ir_version=9, max_onnx_opset=20, max_onnx_ml_opset=4)
    with pytest.raises(ModelValidationError) as err:
        make_compatible(m, s, model_name="too_new_onnx")
    msg = str(err.value)
    assert "opset ai.onnx.ml 5 > target max 4" in msg and "nvcr.io/nvidia/tritonserver:24.10-py3" in msg
    s5 = dataclasses.replace(s, max_onnx_ml_opset=5)  # then the IR is what blocks: named with its cause
    with pytest.raises(ModelValidationError, match="IR 10 > target max 9.*opset ai.onnx.ml 5 needs IR 10"):
        make_compatible(m, s5, model_name="too_new_onnx")


# ------------------------------------------------------------------------------ multi-class shadow
def _probs(y, noise, rng):
    logits = np.eye(3)[y] * 2 + rng.normal(scale=noise, size=(len(y), 3))
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def test_multiclass_shadow_uses_ovr_auc_log_loss_and_accuracy_with_intervals():
    from model_registry.shadow import DecisionRule, Outcome, evaluate

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 600)
    decision = evaluate(y.astype(float), _probs(y, 2.0, rng), _probs(y, 0.7, rng),
                        rule=DecisionRule(task="multiclass", n_boot=300))
    assert decision.outcome is Outcome.PROMOTE_CHALLENGER
    assert set(decision.comparisons) == {"auc_ovr", "accuracy", "log_loss"}
    ll = decision.comparisons["log_loss"]
    assert not ll.higher_is_better and ll.challenger < ll.champion and ll.ci_low > 0
    from sklearn.metrics import log_loss, roc_auc_score

    champ = _probs(y, 2.0, np.random.default_rng(0))
    from drift_checks.multiclass import multiclass_metrics

    m = multiclass_metrics(y, champ)
    assert m["auc_ovr"] == pytest.approx(roc_auc_score(y, champ, multi_class="ovr"), abs=1e-9)
    assert m["log_loss"] == pytest.approx(log_loss(y, champ), abs=1e-9)


def test_multiclass_labels_outside_the_classes_are_refused_by_position():
    from drift_checks.multiclass import multiclass_metrics
    from ground.exceptions import DataError

    with pytest.raises(DataError, match=r"labels\[1\]=3.0 is not a class index"):
        multiclass_metrics([0, 3], np.full((2, 3), 1 / 3))


def test_per_class_prediction_shift_names_the_class_that_moved():
    from drift_checks.multiclass import per_class_prediction_shift

    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 500)
    champion = _probs(y, 0.5, rng)
    canary = champion.copy()
    canary[:, 2] *= 4  # class 2 inflated
    canary /= canary.sum(axis=1, keepdims=True)
    shift = per_class_prediction_shift(champion, canary)
    assert shift["worst_class"] == 2 and shift["max_ks"] > 0.3
    assert shift["per_class"][2]["share_canary"] > shift["per_class"][2]["share_champion"]


# ------------------------------------------------------------------------------ p99 verdict
def test_p99_regression_is_judged_beyond_the_noise_band():
    from model_registry.profiling.perf import p99_regression

    slow = p99_regression([2.0, 2.1, 2.2], [4.0, 4.1, 4.3], max_regression=0.10)
    assert slow.rejected and slow.regression == pytest.approx(4.1 / 2.1 - 1)
    noisy = p99_regression([2.0, 3.0, 2.5], [3.2, 3.0, 3.4], max_regression=0.10)
    assert not noisy.rejected and noisy.noise_band == pytest.approx(0.4)  # 28 % < 10 % + 40 % noise
    with pytest.raises(ValueError, match=">= 3 passes"):
        p99_regression([1.0, float("nan"), 1.0], [1.0, 1.0, 1.0], max_regression=0.1)


def test_from_five_passes_one_outlier_pass_does_not_widen_the_noise_band():
    """A slower challenger with one hiccup pass of the champion's: the range of 3 hides it, 5 trimmed do not."""
    from model_registry.profiling.perf import noise_spread, p99_regression

    assert noise_spread([2.0, 2.2, 3.8]) == pytest.approx(1.8 / 2.2)  # 3 passes: the range
    assert noise_spread([2.0, 2.1, 2.2, 2.3, 3.8]) == pytest.approx(0.2 / 2.2)  # 5: 2nd to 4th
    three = p99_regression([2.0, 2.2, 3.8], [3.6, 3.7, 3.9], max_regression=0.10, min_regression_ms=1.0)
    assert not three.rejected and three.limit == pytest.approx(0.1 + 1.8 / 2.2)
    five = p99_regression([2.0, 2.1, 2.2, 2.3, 3.8], [3.6, 3.7, 3.7, 3.8, 3.9], max_regression=0.10,
                          min_regression_ms=1.0)
    assert five.rejected and five.regression_ms == pytest.approx(1.5)
    quiet = p99_regression([2.0, 2.1, 2.2, 2.3, 3.8], [2.1, 2.2, 2.2, 2.4, 2.0], max_regression=0.10,
                           min_regression_ms=1.0)
    assert not quiet.rejected


def test_a_slow_models_gate_window_grows_until_it_holds_enough_requests_and_doubles_after_instability():
    """A challenger 20x slower than its champion completed a dozen requests in the champion's 250 ms
    window and perf_analyzer stabilised 2 of its 10 passes (a CI failure): its next window must hold
    ``min_requests`` at its own throughput; an unstable pass doubles it; it never shrinks or passes the cap."""
    from model_registry.profiling.perf import PerfPass, next_window_ms

    def grow(throughput, stable=True, window=250):
        return next_window_ms(PerfPass("m", 4, throughput, 20.0, stable, window), min_requests=100,
                              max_window_ms=4000)

    assert grow(1000.0) == 250  # a fast champion: 250 requests already, the window stays
    assert grow(50.0) == 2000  # 12 requests at 50/s: 100 need 2 s
    assert grow(10.0) == 4000  # capped
    assert grow(float("nan"), stable=False) == 500 and grow(300.0, stable=False, window=3000) == 4000
    assert grow(1000.0, window=1000) == 1000  # never shrinks


def test_p99_regression_under_the_absolute_floor_passes_a_submillisecond_model():
    """A +40 % ratio that is 0.6 ms of scheduling noise is no regression; the same ratio at 15 ms is."""
    from model_registry.profiling.perf import p99_regression

    fast = p99_regression([1.50, 1.52, 1.55], [2.05, 2.10, 2.12], max_regression=0.10, min_regression_ms=1.0)
    assert fast.regression > fast.limit and not fast.rejected
    assert fast.regression_ms == pytest.approx(0.58) and "1 ms floor" in fast.reason
    without_floor = p99_regression([1.50, 1.52, 1.55], [2.05, 2.10, 2.12], max_regression=0.10)
    assert without_floor.rejected
    slow = p99_regression([15.0, 15.2, 15.5], [20.5, 21.0, 21.2], max_regression=0.10, min_regression_ms=1.0)
    assert slow.rejected and slow.regression_ms == pytest.approx(5.8)
    with pytest.raises(ValueError, match="min_regression_ms=-1"):
        p99_regression([1.0] * 3, [1.0] * 3, max_regression=0.1, min_regression_ms=-1.0)


def test_negative_perf_gate_settings_are_refused_by_name():
    from ground.settings import Settings
    from ground.settings_checks import settings_problems

    problems = settings_problems(Settings.from_env({"TRITONFLOW_MIN_P99_REGRESSION_MS": "-0.5",
                                                    "TRITONFLOW_MAX_P99_REGRESSION": "-1"}))
    assert "TRITONFLOW_MIN_P99_REGRESSION_MS=-0.5: expected a number >= 0" in problems
    assert "TRITONFLOW_MAX_P99_REGRESSION=-1.0: expected a number >= 0" in problems
    problems = settings_problems(Settings.from_env({"TRITONFLOW_PERF_GATE_PASSES": "2",
                                                    "TRITONFLOW_PERF_GATE_MEASUREMENT_MS": "0"}))
    assert "TRITONFLOW_PERF_GATE_PASSES=2: expected a whole number >= 3" in problems
    assert "TRITONFLOW_PERF_GATE_MEASUREMENT_MS=0: expected milliseconds >= 1" in problems
    problems = settings_problems(Settings.from_env({"TRITONFLOW_ANALYZER_MEASUREMENT_MS": "10"}))
    assert "TRITONFLOW_ANALYZER_MEASUREMENT_MS=10: expected milliseconds >= 50" in problems
