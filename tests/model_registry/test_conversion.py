"""Conversion: sklearn without ZipMap, PyTorch eval traces, ONNX passthrough and safe names."""

from __future__ import annotations

import numpy as np
import pytest

from ground.exceptions import ModelConversionError, ModelValidationError
from model_registry.conversion import (
    TensorSchema,
    convert_onnx,
    convert_sklearn,
    safe_tensor_name,
    sanitize_io_names,
    schema_from_signature,
)
from model_registry.flavors import convert_mlflow_model
from model_registry.pytorch_conversion import convert_pytorch, verify_torchscript
from model_registry.triton_config import build_config, check_config, model_io
from model_registry.validation import check_outputs_are_tensors, make_session

from .conftest import FEATURES


def _signature(df):
    from mlflow.models import infer_signature

    return infer_signature(df[FEATURES].astype("float32"))


def test_sklearn_classifier_outputs_are_plain_tensors_matching_predict_proba(churn_classifier, train_20, settings):
    x, _, df = train_20
    converted = convert_sklearn(churn_classifier, _signature(df), settings=settings, model_name="churn")
    sess = make_session(converted.onnx_model)
    types = {o.name: (o.type, o.shape) for o in sess.get_outputs()}
    assert types["label"][0] == "tensor(int64)"
    assert types["probabilities"][0] == "tensor(float)" and types["probabilities"][1][1] == 2
    label, proba = sess.run(["label", "probabilities"], {"features": x})
    assert proba.shape == (20, 2)
    np.testing.assert_allclose(proba, churn_classifier.predict_proba(x), atol=1e-5)
    np.testing.assert_array_equal(label, churn_classifier.predict(x))
    cfg = build_config("churn", converted.onnx_model, max_batch_size=16)
    assert {o.name for o in cfg.output} == {"label", "probabilities"}
    assert check_config(cfg, converted.onnx_model) == []


def test_sklearn_pipeline_classifier_also_has_zipmap_disabled(train_20, settings):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.tree import DecisionTreeClassifier

    x, y, df = train_20
    pipe = make_pipeline(StandardScaler(), DecisionTreeClassifier(random_state=0, max_depth=3)).fit(x, y)
    converted = convert_sklearn(pipe, _signature(df), settings=settings)
    check_outputs_are_tensors(converted.onnx_model)
    proba = make_session(converted.onnx_model).run(["probabilities"], {"features": x})[0]
    np.testing.assert_allclose(proba, pipe.predict_proba(x), atol=1e-5)


def test_default_skl2onnx_zipmap_model_is_refused_with_how_to_reconvert(churn_classifier):
    from skl2onnx import convert_sklearn as raw_convert
    from skl2onnx.common.data_types import FloatTensorType

    onx = raw_convert(churn_classifier, initial_types=[("features", FloatTensorType([None, 3]))], target_opset=17)
    with pytest.raises(ModelValidationError) as err:
        check_outputs_are_tensors(onx, model_name="churn")
    msg = str(err.value)
    assert "'output_probability'" in msg and "seq(map(int64,tensor(float)))" in msg
    assert "zipmap" in msg.lower()


def test_model_without_signature_or_schema_gets_a_clear_error(churn_classifier, settings):
    with pytest.raises(ModelConversionError, match="without a signature and no schema"):
        convert_sklearn(churn_classifier, None, settings=settings, model_name="churn")


def test_explicit_schema_replaces_a_missing_signature(churn_classifier, train_20, settings):
    x, _, _ = train_20
    converted = convert_sklearn(churn_classifier, schema={"features": {"dtype": "float32", "shape": [-1, 3]}},
                                settings=settings)
    out = make_session(converted.onnx_model).run(["probabilities"], {"features": x})[0]
    assert out.shape == (20, 2)


def test_bad_schema_entry_names_the_field(churn_classifier, settings):
    with pytest.raises(ModelConversionError, match="'features'"):
        convert_sklearn(churn_classifier, schema={"features": {"shape": [-1, 3]}}, settings=settings)


def test_tabular_signature_folds_columns_into_one_tensor(train_20):
    _, _, df = train_20
    schema = schema_from_signature(_signature(df))
    assert schema == [TensorSchema("features", "float32", (-1, 3), tuple(FEATURES))]


def test_target_opset_is_bounded_by_the_setting(churn_classifier, train_20, settings):
    import dataclasses

    _, _, df = train_20
    low = dataclasses.replace(settings, max_onnx_opset=15)
    converted = convert_sklearn(churn_classifier, _signature(df), settings=low)
    opsets = {o.domain: o.version for o in converted.onnx_model.opset_import}
    assert opsets[""] <= 15
    with pytest.raises(ModelConversionError, match="target_opset=16 exceeds max_onnx_opset=15"):
        convert_sklearn(churn_classifier, _signature(df), settings=low, target_opset=16)


# ------------------------------------------------------------------------------------ PyTorch
def _dropout_batchnorm_net_in_train_mode():
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.4), nn.Linear(16, 1))
    with torch.no_grad():
        for _ in range(50):
            net(torch.randn(64, 6) * 3 + 1)
    return net


FIXED_SAMPLE_ROWS = [[0.5, -1.0, 2.0, 0.0, 1.5, -0.3], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [-2.0, 0.1, 0.4, 3.0, -1.2, 0.7]]
SCHEMA_6 = {"x": {"dtype": "float32", "shape": [-1, 6]}}


def test_pytorch_onnx_export_has_a_dynamic_batch_axis_and_eval_outputs(settings):
    import torch

    net = _dropout_batchnorm_net_in_train_mode()
    assert net.training
    converted = convert_pytorch(net, schema=SCHEMA_6, output_names=["score"], settings=settings)
    assert net.training, "the caller's module must not be switched to eval"
    (inp,), (out,) = model_io(converted.onnx_model)
    assert inp.batch_axis_dynamic and out.batch_axis_dynamic
    sess = make_session(converted.onnx_model)
    ref_net = _dropout_batchnorm_net_in_train_mode().eval()
    for batch in (1, 5):
        x = np.random.default_rng(batch).normal(size=(batch, 6)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        with torch.no_grad():
            want = ref_net(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_torchscript_is_traced_in_eval_under_no_grad(settings):
    import torch

    net = _dropout_batchnorm_net_in_train_mode()
    x = torch.tensor(FIXED_SAMPLE_ROWS)
    converted = convert_pytorch(net, schema=SCHEMA_6, example=[x], export_format="torchscript", settings=settings)
    with torch.no_grad():
        want = _dropout_batchnorm_net_in_train_mode().eval()(x)
        got = converted.torchscript(x)
    assert float((got - want).abs().max()) <= 1e-5
    assert converted.default_model_filename == "model.pt" and len(converted.serialized()) > 0


def test_train_mode_trace_fails_both_checks_and_is_not_accepted():
    import torch

    net = _dropout_batchnorm_net_in_train_mode()
    x = torch.tensor(FIXED_SAMPLE_ROWS)
    bad = torch.jit.trace(net, x, check_trace=False)  # still in train mode: the bug
    with pytest.raises(ModelValidationError) as err:
        verify_torchscript(bad, _dropout_batchnorm_net_in_train_mode(), [x], atol=1e-5, model_name="train_mode_trace")
    msg = str(err.value)
    assert "max abs diff" in msg and "> 1e-05" in msg
    assert "two TorchScript calls differ" in msg


def test_eval_trace_passes_the_torchscript_check():
    import torch

    net = _dropout_batchnorm_net_in_train_mode().eval()
    x = torch.tensor(FIXED_SAMPLE_ROWS)
    with torch.no_grad():
        good = torch.jit.trace(net, x)
    result = verify_torchscript(good, _dropout_batchnorm_net_in_train_mode(), [x], atol=1e-5)
    assert result["max_abs_diff"] <= 1e-5 and result["repeat_max_abs_diff"] == 0.0


# ------------------------------------------------------------------------------ names
def _onnx_with_names(names):
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", [names[0]], ["a"], to=TensorProto.FLOAT)]
    prev = "a"
    for i, n in enumerate(names[1:]):
        nodes.append(helper.make_node("Cast", [n], [f"c{i}"], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Add", [prev, f"c{i}"], [f"s{i}"]))
        prev = f"s{i}"
    nodes.append(helper.make_node("ReduceSum", [prev], ["logits"], keepdims=1))
    g = helper.make_graph(
        nodes, "ticket_classifier",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in names],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def test_unsafe_input_name_is_renamed_from_the_signature_with_a_mapping():
    model = _onnx_with_names(["input_ids", "attention_mask", "onnx::Cast_2"])
    schema = {n: {"dtype": "int64", "shape": [-1, -1]} for n in ["input_ids", "attention_mask", "token_type_ids"]}
    converted = convert_onnx(model, schema=schema, model_name="ticket_classifier")
    names = [t.name for t in model_io(converted.onnx_model)[0]]
    assert names == ["input_ids", "attention_mask", "token_type_ids"]
    assert converted.name_mapping == {"onnx::Cast_2": "token_type_ids"}
    assert '"onnx::Cast_2": "token_type_ids"' in converted.name_mapping_json()
    feeds = {n: np.ones((2, 4), dtype=np.int64) for n in names}
    assert make_session(converted.onnx_model).run(None, feeds)[0].item() == 24.0


def test_unsafe_names_without_signature_become_identifiers():
    model, mapping = sanitize_io_names(_onnx_with_names(["onnx::Cast_0", "9x"]))
    assert mapping == {"onnx::Cast_0": "onnx__Cast_0", "9x": "_9x"}
    assert safe_tensor_name("a b:c") == "a_b_c"
    make_session(model)  # still a valid graph


def test_invalid_onnx_passthrough_is_refused():
    with pytest.raises(ModelConversionError, match="ONNX model is invalid"):
        convert_onnx(b"not a model", model_name="junk")


def test_mlflow_model_is_converted_with_its_signature_and_refused_without(tmp_path, churn_classifier, train_20,
                                                                          settings):
    import mlflow.sklearn

    _, _, df = train_20
    mlflow.sklearn.save_model(churn_classifier, tmp_path / "signed", signature=_signature(df),
                             pip_requirements=["scikit-learn"])  # skip the slow requirement inference
    converted = convert_mlflow_model(str(tmp_path / "signed"), settings=settings)
    assert converted.source_flavor == "sklearn"
    assert [t.name for t in model_io(converted.onnx_model)[1]] == ["label", "probabilities"]
    mlflow.sklearn.save_model(churn_classifier, tmp_path / "unsigned", pip_requirements=["scikit-learn"])
    with pytest.raises(ModelConversionError, match="without a signature"):
        convert_mlflow_model(str(tmp_path / "unsigned"), settings=settings)
