"""Pre-push checks (batch independence, integer inputs, IR/opset limits, NaN) and the blocking parity gate."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ground.exceptions import ModelConfigError, ModelValidationError, ParityError
from model_registry.conversion import TensorSchema, convert_sklearn, sklearn_predict_fn
from model_registry.parity import parity_check
from model_registry.triton_config import build_config, parse_config
from model_registry.validation import (
    check_batching,
    check_onnx_compat,
    downconvert_ir_version,
    ensure_onnx_compat,
    make_compatible,
    make_session,
    validate_for_push,
    validation_sample,
)

from .conftest import FEATURES


def _add_model(ir: int, opset: int, ml_opset: int | None = None):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", ml_opset)] if ml_opset else [])
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = ir
    onnx.checker.check_model(m)
    return m


@pytest.fixture
def pinned_runtime_onnx_limits(settings):
    """target_runtime.yaml: IR <= 9, opset <= 20, ai.onnx.ml <= 4 for the pinned image."""
    return dataclasses.replace(settings, max_onnx_ir_version=9, max_onnx_opset=20, max_onnx_ml_opset=4,
                               target_triton_release="tritonserver:<pinned-tag>-py3")


# ------------------------------------------------------------------------------------ IR / opset limits
def test_ir_and_opset_newer_than_target_are_refused_before_push(pinned_runtime_onnx_limits):
    model = _add_model(10, 21, 5)  # model_meta.json
    with pytest.raises(ModelValidationError) as err:
        ensure_onnx_compat(model, pinned_runtime_onnx_limits, model_name="too_new_onnx")
    msg = str(err.value)
    assert "IR 10 > target max 9 (tritonserver:<pinned-tag>-py3)" in msg
    assert "opset ai.onnx 21 > target max 20" in msg and "opset ai.onnx.ml 5 > target max 4" in msg
    assert "version_converter" in msg and "target_opset" in msg


def test_model_within_limits_passes_the_compat_check(pinned_runtime_onnx_limits):
    report = check_onnx_compat(_add_model(8, 17), pinned_runtime_onnx_limits)
    assert report.ok and report.ir_version == 8 and report.opsets == {"": 17}


def test_make_compatible_reexports_within_limits_and_keeps_outputs(pinned_runtime_onnx_limits):
    model = _add_model(10, 21)
    fixed, notes = make_compatible(model, pinned_runtime_onnx_limits, model_name="too_new_onnx")
    assert fixed.ir_version <= 9 and {o.domain: o.version for o in fixed.opset_import}[""] <= 20
    assert notes and check_onnx_compat(fixed, pinned_runtime_onnx_limits).ok
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(make_session(fixed).run(None, {"x": x})[0], x + x)


def test_ir_down_conversion_is_refused_when_the_opset_needs_the_newer_ir():
    with pytest.raises(ModelValidationError, match="need IR 10"):
        downconvert_ir_version(_add_model(10, 21), 9, model_name="too_new_onnx")
    assert downconvert_ir_version(_add_model(10, 17), 9).ir_version == 9


# ------------------------------------------------------------------------------------ batch independence
def test_fixed_batch_model_with_batching_is_refused(fixed_batch_model, images_sample, settings):
    naive = parse_config(
        'name: "tiny_cnn_head" max_batch_size: 8 '
        'input [ { name: "images" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ] '
        'output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ] dynamic_batching { }')
    with pytest.raises(ModelConfigError, match="'images'.*fixes axis 0 to 1"):
        validate_for_push(fixed_batch_model, naive, images_sample, settings=settings)
    with pytest.raises(ModelValidationError, match="needs a dynamic batch axis"):
        check_batching(fixed_batch_model, images_sample, max_batch_size=8)


def test_fixed_batch_model_passes_when_served_without_batching(fixed_batch_model, images_sample, settings):
    cfg = build_config("tiny_cnn_head", fixed_batch_model, max_batch_size=8)  # falls back, warns
    report = validate_for_push(fixed_batch_model, cfg, {"images": images_sample["images"][:1]}, settings=settings)
    assert cfg.max_batch_size == 0 and report.batch_sizes == []
    assert report.checks[-1] == "finite"


def test_baked_reshape_fails_at_batch_above_one_and_names_the_batch_size(baked_reshape_model, images_sample, settings):
    cfg = build_config("tiny_cnn_head", baked_reshape_model, max_batch_size=8)
    assert cfg.max_batch_size == 8  # the graph input claims a dynamic batch
    with pytest.raises(ModelValidationError) as err:
        validate_for_push(baked_reshape_model, cfg, images_sample, settings=settings)
    assert "fails at batch size 3" in str(err.value) and "Reshape" in str(err.value)


def test_dynamic_model_runs_at_batch_one_and_three(churn_head_model, settings):
    cfg = build_config("churn_head", churn_head_model, max_batch_size=64)
    sample = {"features": np.random.default_rng(1).normal(size=(5, 12)).astype(np.float32)}
    report = validate_for_push(churn_head_model, cfg, sample, settings=settings)
    assert report.batch_sizes == [1, 3]
    assert report.checks == ["onnx.checker", "ir_opset", "tensor_outputs", "config", "batching", "finite"]


# ------------------------------------------------------------------------------------ integer inputs
def test_int64_model_with_generated_config_passes_and_fp32_config_is_refused(reco_ranker_model, settings):
    sample = {"user_id": np.array([[100234], [100236], [9007199254740993]], dtype=np.int64),
              "item_id": np.array([[55012], [55019], [55020]], dtype=np.int64)}
    good = build_config("reco_ranker", reco_ranker_model, max_batch_size=32)
    validate_for_push(reco_ranker_model, good, sample, settings=settings)
    bad = parse_config(
        'name: "reco_ranker" max_batch_size: 32 '
        'input [ { name: "user_id" data_type: TYPE_FP32 dims: [ 1 ] }, '
        '{ name: "item_id" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "score" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    with pytest.raises(ModelConfigError) as err:
        validate_for_push(reco_ranker_model, bad, sample, settings=settings)
    assert str(err.value).count("config TYPE_FP32, model tensor(int64)") == 2


# ------------------------------------------------------------------------------------ NaN
def test_nan_outputs_are_refused_naming_the_output(settings):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Log", ["x"], ["logx"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
                          [helper.make_tensor_value_info("logx", TensorProto.FLOAT, ["batch", 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    cfg = build_config("logm", m, max_batch_size=4)
    with pytest.raises(ModelValidationError, match=r"output 'logx' has \d+ NaN/Inf"):
        validate_for_push(m, cfg, {"x": np.array([[-1.0, 2.0], [3.0, 4.0]], dtype=np.float32)}, settings=settings)


# ------------------------------------------------------------------------------------ parity
@pytest.fixture
def converted_churn(churn_classifier, settings):
    return convert_sklearn(churn_classifier, schema={"features": {"dtype": "float32", "shape": [-1, 3]}},
                           settings=settings)


def test_parity_gate_passes_for_a_faithful_conversion(converted_churn, churn_classifier, train_20, settings):
    x, _, _ = train_20
    result = parity_check(sklearn_predict_fn(churn_classifier), converted_churn.onnx_model,
                          {"features": x}, settings=settings)
    assert result.passed and result.rows == 20
    assert result.outputs["probabilities"].max_abs_error <= 1e-5
    assert result.outputs["label"].label_agreement == 1.0


def test_parity_failure_names_output_worst_rows_and_errors(converted_churn, churn_classifier, train_20, settings):
    x, _, _ = train_20
    honest = sklearn_predict_fn(churn_classifier)

    def drifted(data):
        out = honest(data)
        out["probabilities"] = out["probabilities"].copy()
        out["probabilities"][7] += 0.02
        out["probabilities"][3] += 0.01
        return out

    with pytest.raises(ParityError) as err:
        parity_check(drifted, converted_churn.onnx_model, {"features": x}, atol={"probabilities": 1e-5},
                     rtol=0.0, settings=settings, model_name="churn")
    msg = str(err.value)
    assert "'churn'" in msg and "output 'probabilities'" in msg
    assert "2/20 rows out of tolerance" in msg and "worst rows [7, 3]" in msg
    assert "max abs error 0.02" in msg and "max rel error" in msg
    result = parity_check(drifted, converted_churn.onnx_model, {"features": x}, rtol=0.0,
                          raise_on_failure=False, settings=settings)
    assert not result.passed and result.outputs["probabilities"].worst_rows[:2] == [7, 3]
    assert result.outputs["probabilities"].max_abs_error == pytest.approx(0.02, abs=1e-5)


def test_label_disagreement_fails_the_gate(converted_churn, churn_classifier, train_20, settings):
    x, _, _ = train_20
    honest = sklearn_predict_fn(churn_classifier)

    def flipped(data):
        out = honest(data)
        out["label"] = out["label"].copy()
        out["label"][5] = 1 - out["label"][5]
        return out

    with pytest.raises(ParityError, match=r"output 'label': label agreement 0.9500.*worst rows \[5\]"):
        parity_check(flipped, converted_churn.onnx_model, {"features": x}, settings=settings)


def test_single_array_source_is_matched_to_the_label_output(converted_churn, churn_classifier, train_20, settings):
    x, _, df = train_20
    result = parity_check(lambda d: churn_classifier.predict(d[FEATURES].to_numpy(np.float32)),
                          converted_churn.onnx_model, {"features": x},
                          source_sample=df[FEATURES], settings=settings)
    assert list(result.outputs) == ["label"] and result.passed


# ------------------------------------------------------------------------------ validation sample
def test_sample_from_input_example_keeps_example_rows_and_is_seeded(train_20, settings):
    _, _, df = train_20
    example = df[FEATURES].head(3).assign(user=[1, 2, 3])
    inputs = [TensorSchema("features", "float32", (-1, 3), tuple(FEATURES)),
              TensorSchema("user", "int64", (-1, 1), ("user",))]
    a = validation_sample(inputs, input_example=example, rows=32, seed=3, settings=settings)
    b = validation_sample(inputs, input_example=example, rows=32, seed=3, settings=settings)
    c = validation_sample(inputs, input_example=example, rows=32, seed=4, settings=settings)
    assert a["features"].shape == (32, 3) and a["features"].dtype == np.float32
    np.testing.assert_array_equal(a["features"][:3], example[FEATURES].to_numpy(np.float32))
    np.testing.assert_array_equal(a["features"], b["features"])
    assert not np.array_equal(a["features"], c["features"])
    assert set(a["user"].ravel()) == {1, 2, 3}  # ids are never perturbed


def test_user_dataset_wins_over_the_example(train_20, settings):
    _, _, df = train_20
    inputs = [TensorSchema("features", "float32", (-1, 3), tuple(FEATURES))]
    sample = validation_sample(inputs, dataset=df, input_example=df.head(1), settings=settings)
    np.testing.assert_array_equal(sample["features"], df[FEATURES].to_numpy(np.float32))


def test_no_dataset_and_no_example_is_a_clear_error(settings):
    with pytest.raises(ModelValidationError, match="no validation data"):
        validation_sample([TensorSchema("x", "float32", (-1, 2))], settings=settings)


def test_missing_id_in_integer_input_is_refused(settings):
    import pandas as pd

    df = pd.DataFrame({"user_id": [100234, 100235], "item_id": [55012, None]})
    inputs = [TensorSchema("user_id", "int64", (-1, 1), ("user_id",)),
              TensorSchema("item_id", "int64", (-1, 1), ("item_id",))]
    with pytest.raises(ModelValidationError, match="'item_id' has missing values"):
        validation_sample(inputs, dataset=df, settings=settings)


def test_converted_classifier_with_generated_config_passes_every_pre_push_check(converted_churn, train_20, settings):
    x, _, _ = train_20
    cfg = build_config("churn", converted_churn.onnx_model, max_batch_size=16)
    report = validate_for_push(converted_churn.onnx_model, cfg, {"features": x}, settings=settings)
    assert report.batch_sizes == [1, 3] and report.opsets[""] <= settings.max_onnx_opset
