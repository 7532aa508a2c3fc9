"""config.pbtxt built and parsed with protobuf; checks against the model."""

from __future__ import annotations

import logging

import pytest

from ground.exceptions import ModelConfigError
from model_registry.triton_config import (
    DynamicBatchingSpec,
    InstanceGroupSpec,
    build_config,
    check_config,
    config_summary,
    data_type_name,
    parse_config,
    to_pbtxt,
    validate_config,
)

BATCH_AXIS_IN_DIMS_CONFIG = """
name: "churn_head"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  { name: "features" data_type: TYPE_FP32 dims: [ -1, 12 ] }
]
output [
  { name: "probabilities" data_type: TYPE_FP32 dims: [ -1, 2 ] }
]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""
BATCH_AXIS_OUT_OF_DIMS_CONFIG = """
name: "churn_head"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  { name: "features" data_type: TYPE_FP32 dims: [ 12 ] }
]
output [
  { name: "probabilities" data_type: TYPE_FP32 dims: [ 2 ] }
]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""
BATCHING_ON_FIXED_BATCH_MODEL_CONFIG = """
name: "tiny_cnn_head"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "images" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { }
"""
FIXED_BATCH_WITHOUT_BATCHING_CONFIG = """
name: "tiny_cnn_head"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "images" data_type: TYPE_FP32 dims: [ 1, 3, 32, 32 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 1, 10 ] } ]
"""
FP32_IDS_FOR_INT64_MODEL_CONFIG = """
name: "reco_ranker"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [
  { name: "user_id" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "item_id" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [ { name: "score" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def _io(cfg):
    return {io.name: (data_type_name(io.data_type), list(io.dims)) for io in list(cfg.input) + list(cfg.output)}


def test_generator_leaves_batch_axis_out_of_dims_when_batching(churn_head_model):
    cfg = build_config("churn_head", churn_head_model, max_batch_size=64,
                       dynamic_batching=DynamicBatchingSpec(max_queue_delay_us=500))
    expected = parse_config(BATCH_AXIS_OUT_OF_DIMS_CONFIG)
    assert _io(cfg) == _io(expected) == {"features": ("TYPE_FP32", [12]), "probabilities": ("TYPE_FP32", [2])}
    assert cfg.max_batch_size == expected.max_batch_size
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 500
    assert cfg.backend == "onnxruntime"
    assert check_config(cfg, churn_head_model) == []


def test_batch_axis_in_dims_is_refused_with_rank_message_and_suggestion(churn_head_model):
    with pytest.raises(ModelConfigError) as err:
        validate_config(parse_config(BATCH_AXIS_IN_DIMS_CONFIG), churn_head_model)
    msg = str(err.value)
    assert "'churn_head'" in msg and "'features'" in msg
    assert "rank 2" in msg and "implies rank 3" in msg
    assert "dims: [12]" in msg


def test_pbtxt_text_round_trips_through_protobuf(churn_head_model):
    cfg = build_config("churn_head", churn_head_model, max_batch_size=16,
                       dynamic_batching=DynamicBatchingSpec((4, 8), 250),
                       instance_groups=[InstanceGroupSpec("KIND_CPU", 2)],
                       version_policy=[1, 3], default_model_filename="model.onnx")
    text = to_pbtxt(cfg)
    again = parse_config(text)
    assert again == cfg
    assert list(again.version_policy.specific.versions) == [1, 3]
    assert list(again.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config_summary(again)["instance_groups"] == [{"kind": "KIND_CPU", "count": 2, "gpus": []}]


def test_version_policy_latest_and_gpu_instance_group(churn_head_model):
    cfg = build_config("m", churn_head_model, version_policy="latest:2",
                       instance_groups=[InstanceGroupSpec("KIND_GPU", 1, (0,))])
    assert cfg.version_policy.latest.num_versions == 2
    assert list(cfg.instance_group[0].gpus) == [0]


@pytest.mark.parametrize("policy", ["newest", "latest:0", [0], []])
def test_invalid_version_policy_is_refused_naming_the_value(churn_head_model, policy):
    with pytest.raises(ModelConfigError, match="version_policy"):
        build_config("m", churn_head_model, version_policy=policy)


def test_preferred_batch_size_above_max_batch_size_is_refused(churn_head_model):
    with pytest.raises(ModelConfigError, match="preferred_batch_sizes"):
        build_config("m", churn_head_model, max_batch_size=4, dynamic_batching=DynamicBatchingSpec((8,), 0))


def test_unparseable_config_names_the_source():
    with pytest.raises(ModelConfigError, match="my/config.pbtxt"):
        parse_config("name: 'x' max_batch_size: lots", source="my/config.pbtxt")


def test_int64_ids_become_type_int64(reco_ranker_model):
    cfg = build_config("reco_ranker", reco_ranker_model, max_batch_size=32)
    assert _io(cfg) == {"user_id": ("TYPE_INT64", [1]), "item_id": ("TYPE_INT64", [1]),
                        "score": ("TYPE_FP32", [1])}


def test_fp32_config_for_int64_model_reports_config_type_then_model_type(reco_ranker_model):
    problems = check_config(parse_config(FP32_IDS_FOR_INT64_MODEL_CONFIG), reco_ranker_model)
    dtype_problems = [p for p in problems if "data type mismatch" in p]
    assert len(dtype_problems) == 2
    for tensor, p in zip(["user_id", "item_id"], dtype_problems, strict=True):
        assert f"'{tensor}'" in p
        assert "config TYPE_FP32, model tensor(int64)" in p


def test_unknown_and_missing_tensor_names_are_reported(churn_head_model):
    text = BATCH_AXIS_OUT_OF_DIMS_CONFIG.replace('"features"', '"feats"')
    problems = check_config(parse_config(text), churn_head_model)
    assert any("'feats' is not a model input" in p for p in problems)
    assert any("'features' is missing" in p for p in problems)


def test_fixed_batch_model_is_served_without_batching_and_warns(fixed_batch_model, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = build_config("tiny_cnn_head", fixed_batch_model, max_batch_size=8,
                           dynamic_batching=DynamicBatchingSpec())
    expected = parse_config(FIXED_BATCH_WITHOUT_BATCHING_CONFIG)
    assert cfg.max_batch_size == 0
    assert _io(cfg) == _io(expected)
    assert not cfg.HasField("dynamic_batching")
    assert "max_batch_size 0" in caplog.text
    assert check_config(cfg, fixed_batch_model) == []


def test_fixed_batch_model_can_be_refused_instead(fixed_batch_model):
    with pytest.raises(ModelConfigError, match="'images'.*axis 0 fixed to 1"):
        build_config("tiny_cnn_head", fixed_batch_model, max_batch_size=8, on_fixed_batch="refuse")


def test_naive_batching_config_for_fixed_batch_model_is_refused(fixed_batch_model):
    with pytest.raises(ModelConfigError) as err:
        validate_config(parse_config(BATCHING_ON_FIXED_BATCH_MODEL_CONFIG), fixed_batch_model)
    assert "'images'" in str(err.value) and "fixes axis 0 to 1" in str(err.value)
    assert "max_batch_size: 0" in str(err.value)


def test_rank1_batched_output_is_written_as_dims_1_with_empty_reshape(churn_classifier):
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(churn_classifier, initial_types=[("features", FloatTensorType([None, 3]))],
                          options={id(churn_classifier): {"zipmap": False}}, target_opset=17)
    cfg = build_config("churn", onx, max_batch_size=8)
    label = next(o for o in cfg.output if o.name == "label")
    assert list(label.dims) == [1] and label.HasField("reshape") and list(label.reshape.shape) == []
    assert check_config(parse_config(to_pbtxt(cfg)), onx) == []


def test_zipmap_output_gets_no_config(churn_classifier):
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(churn_classifier, initial_types=[("features", FloatTensorType([None, 3]))],
                          target_opset=17)
    with pytest.raises(ModelConfigError, match=r"'output_probability' has type seq\(map\(int64,tensor\(float\)\)\)"):
        build_config("churn", onx, max_batch_size=8)
