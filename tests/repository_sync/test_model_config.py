"""The one config.pbtxt parser and serialiser (repository_sync.model_config).

It replaces three parsers that differed: model_registry.triton_config.parse_config (pbtxt text,
source in errors, no name pinning), repository_sync.publish (text, bytes or a message, name
pinned, ModelConfigError) and repository_sync.triton_client (also JSON text and dicts, name
pinned, ModelLoadRefusedError). Each case one of them handled is checked here.
"""

import json

import pytest

from ground.exceptions import ModelConfigError, ModelLoadRefusedError, RepositoryLayoutError
from model_registry import triton_config
from repository_sync.model_config import model_filename_for, parse_config, to_json, to_pbtxt

PBTXT = """
# the serving config of iris_clf
name: "iris_clf"
backend: "onnxruntime"
max_batch_size: 16
input { name: "float_input" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "label" data_type: TYPE_INT64 dims: [ 1 ] reshape { shape: [] } }
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


def test_model_registry_reexports_the_same_functions():
    assert triton_config.parse_config is parse_config
    assert triton_config.to_pbtxt is to_pbtxt


def test_pbtxt_with_comments_round_trips():
    cfg = parse_config(PBTXT)
    assert cfg.name == "iris_clf" and cfg.max_batch_size == 16
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 500
    assert cfg.output[0].HasField("reshape") and list(cfg.output[0].reshape.shape) == []
    assert parse_config(to_pbtxt(cfg)) == cfg


def test_bytes_parse_like_text():
    assert parse_config(PBTXT.encode()) == parse_config(PBTXT)


def test_json_text_and_dict_parse_like_pbtxt():
    """The load path reads Triton's JSON (its /config answer); publish and validation now can too."""
    expected = parse_config(PBTXT)
    as_json = to_json(expected)
    assert parse_config(as_json) == expected
    assert parse_config("  \n" + as_json) == expected
    assert parse_config(json.loads(as_json)) == expected


def test_json_fields_unknown_to_this_client_are_ignored():
    doc = {"name": "iris_clf", "backend": "onnxruntime", "field_of_a_newer_triton": {"x": 1}}
    assert parse_config(doc).backend == "onnxruntime"
    assert parse_config(json.dumps(doc)).name == "iris_clf"


def test_a_message_is_copied_not_shared():
    original = parse_config(PBTXT)
    copy = parse_config(original, model_name="iris_clf")
    copy.max_batch_size = 2
    assert original.max_batch_size == 16


def test_without_model_name_the_name_is_kept_as_parsed():
    assert parse_config(PBTXT).name == "iris_clf"
    assert parse_config('backend: "onnxruntime"').name == ""


def test_model_name_fills_an_empty_name_and_refuses_another():
    assert parse_config('backend: "onnxruntime"', model_name="iris_clf").name == "iris_clf"
    assert parse_config(PBTXT, model_name="iris_clf").name == "iris_clf"
    with pytest.raises(ModelConfigError, match="'iris_clf' differs from the model name 'fraud_scorer'"):
        parse_config(PBTXT, model_name="fraud_scorer")
    with pytest.raises(ModelConfigError, match="differs from the model name 'fraud_scorer'"):
        parse_config({"name": "iris_clf"}, model_name="fraud_scorer")


def test_parse_errors_name_the_source_and_carry_protobuf_position():
    with pytest.raises(ModelConfigError, match=r"my/config\.pbtxt: not a valid Triton model configuration: 1:"):
        parse_config("name: 'x' max_batch_size: lots", source="my/config.pbtxt")
    with pytest.raises(ModelConfigError, match="config.pbtxt for model 'iris_clf': not a valid"):
        parse_config("max_batch_size: lots", model_name="iris_clf")
    with pytest.raises(ModelConfigError, match="^config.pbtxt: not a valid"):
        parse_config('{"max_batch_size": "lots"}')


def test_undecodable_bytes_are_a_config_error():
    with pytest.raises(ModelConfigError, match="not a valid Triton model configuration"):
        parse_config(b"name: \"\xff\xfe\"")


def test_the_load_path_raises_its_own_error_class():
    with pytest.raises(ModelLoadRefusedError, match="not a valid Triton model configuration"):
        parse_config("max_batch_size: lots", model_name="iris_clf", error=ModelLoadRefusedError)
    with pytest.raises(ModelLoadRefusedError, match="differs from the model name"):
        parse_config(PBTXT, model_name="other", error=ModelLoadRefusedError)


def test_to_json_uses_the_proto_field_names_on_one_line():
    text = to_json(parse_config(PBTXT))
    assert "\n" not in text
    doc = json.loads(text)
    assert doc["max_batch_size"] == 16 and "maxBatchSize" not in doc
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == "500"  # 64-bit ints are strings


def test_model_filename_for_prefers_the_config_then_the_backend_default():
    assert model_filename_for(parse_config(PBTXT)) == "model.onnx"
    assert model_filename_for(parse_config('backend: "onnxruntime" default_model_filename: "m.onnx"')) == "m.onnx"
    with pytest.raises(RepositoryLayoutError):
        model_filename_for(parse_config('name: "x"'))
