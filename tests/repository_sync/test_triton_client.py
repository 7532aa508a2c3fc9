"""Triton model-control client: integer-input request building, verified load, smoke test, rollback.

Integration tests run a real Triton (explicit model-control mode) from ``tritonflow.runtime``; one
server per repository kind is shared by the module to keep the suite fast.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import DataError, ParityError, SignatureVerificationError
from repository_sync.publish import publish_version
from repository_sync.triton.client import TritonModelControl
from repository_sync.triton.inputs import InputSpec, exact_integer, frame_to_inputs

# Shadow requests with a missing item_id and a user_id of 2^53+1 (shadow_requests.csv), rebuilt
SHADOW_CSV = "user_id,item_id\n100234,55012\n100235,\n100236,55019\n9007199254740993,55020\n"
RECO_SPECS = [InputSpec("user_id", "INT64", (1,)), InputSpec("item_id", "INT64", (1,))]


# =========================================================================== integer inputs, client side
@pytest.mark.parametrize("dtype", [None, str, object])
def test_id_above_2_53_is_sent_exactly_and_missing_id_row_is_refused(dtype):
    frame = pd.read_csv(io.StringIO(SHADOW_CSV), dtype=dtype)
    arrays, rows, invalid = frame_to_inputs(frame, RECO_SPECS)
    assert rows == [0, 2, 3]
    assert [i for i, _ in invalid] == [1] and "item_id: missing value" in invalid[0][1]
    assert arrays["user_id"].dtype == np.int64 and arrays["user_id"].shape == (3, 1)
    assert int(arrays["user_id"][2, 0]) == 9007199254740993  # not 9007199254740992
    assert arrays["item_id"][:, 0].tolist() == [55012, 55019, 55020]


def test_float_column_above_2_53_is_refused_not_rounded():
    frame = pd.DataFrame({"user_id": [1.0, 9007199254740993.0], "item_id": [2, 3]})
    arrays, rows, invalid = frame_to_inputs(frame, RECO_SPECS)
    assert rows == [0] and invalid[0][0] == 1 and "2**53" in invalid[0][1]


@pytest.mark.parametrize("value", [None, float("nan"), pd.NA, "12a", 1.5, True, 2**63])
def test_non_integer_ids_are_refused(value):
    with pytest.raises(ValueError):
        exact_integer(value)


def test_exact_integer_keeps_every_digit_of_a_string_id():
    assert exact_integer(" 9007199254740993 ") == 9007199254740993


def test_feature_frame_is_stacked_into_a_single_vector_input():
    frame = pd.DataFrame(np.arange(8, dtype=np.float64).reshape(2, 4), columns=list("abcd"))
    arrays, rows, invalid = frame_to_inputs(frame, [InputSpec("float_input", "FP32", (4,))])
    assert arrays["float_input"].dtype == np.float32 and arrays["float_input"].shape == (2, 4)
    assert rows == [0, 1] and invalid == []


def test_missing_input_column_is_a_clear_error():
    with pytest.raises(DataError, match="input 'item_id'"):
        frame_to_inputs(pd.DataFrame({"user_id": [1]}), RECO_SPECS)


# =========================================================================== integration
def _reco_onnx(path):
    """ONNX 'reco_ranker' with int64 ids: score = float(user_id + item_id), user_echo = user_id."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", 1]) for n in ("user_id", "item_id")]
    outputs = [
        helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1]),
        helper.make_tensor_value_info("user_echo", TensorProto.INT64, ["batch", 1]),
    ]
    nodes = [
        helper.make_node("Add", ["user_id", "item_id"], ["sum"]),
        helper.make_node("Cast", ["sum"], ["score"], to=TensorProto.FLOAT),
        helper.make_node("Identity", ["user_id"], ["user_echo"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "reco", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


RECO_CONFIG = """
name: "reco_ranker"
backend: "onnxruntime"
max_batch_size: 32
input [ { name: "user_id" data_type: TYPE_INT64 dims: [ 1 ] },
        { name: "item_id" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "score" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "user_echo" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""


def _start_triton(tmp_path_factory, repository):
    from tests.conftest import make_settings
    from tritonflow.runtime.services import TritonServer

    return TritonServer(make_settings(tmp_path_factory.mktemp("triton")), repository=repository).start()


@pytest.fixture(scope="module")
def fs_stack(tmp_path_factory, signing_keys):
    repo = tmp_path_factory.mktemp("repo")
    server = _start_triton(tmp_path_factory, str(repo))
    client = TritonModelControl(
        server.http_url, repository=str(repo), trusted_keys=signing_keys.trusted_dir, load_timeout_s=60
    )
    yield repo, server, client
    client.close()
    server.stop()


def _publish(repo, name, version, model_file, config, keys, **kw):
    return publish_version(
        repository=repo, model_name=name, version=version, model_file=model_file, config=config,
        private_key=keys.private, trusted_keys=keys.trusted_dir, **kw,
    )


def _triton_ready(client, name, version):
    return any(
        e.get("name") == name and e.get("version") == str(version) and e.get("state") == "READY"
        for e in client.index()
    )


@pytest.mark.integration
def test_published_classifier_is_served_like_sklearn(fs_stack, sklearn_onnx, signing_keys):
    repo, _, client = fs_stack
    _publish(repo, "iris_clf", 3, sklearn_onnx.onnx_path, sklearn_onnx.config_text, signing_keys)
    X = sklearn_onnx.X[::5]  # 30 rows: sent in chunks of max_batch_size 16
    info, smoke = client.load_and_smoke_test(
        "iris_clf", 3, {"float_input": X}, {"probabilities": sklearn_onnx.clf.predict_proba(X)}, atol=1e-5, rtol=0
    )
    assert info["versions"] == [3] and info["key_id"] == signing_keys.key_id
    assert smoke.max_abs_error["probabilities"] <= 1e-5
    labels = client.infer("iris_clf", 3, {"float_input": X})["label"].reshape(-1)  # dims [1] per row
    assert labels.tolist() == sklearn_onnx.clf.predict(X).tolist()
    assert _triton_ready(client, "iris_clf", 3)


@pytest.mark.integration
def test_challenger_load_keeps_the_champion_loaded(fs_stack, sklearn_onnx, signing_keys):
    repo, _, client = fs_stack
    pair_config = sklearn_onnx.config_text.replace("iris_clf", "iris_pair")
    _publish(repo, "iris_pair", 1, sklearn_onnx.onnx_path, pair_config, signing_keys)
    _publish(repo, "iris_pair", 2, sklearn_onnx.onnx_path, pair_config, signing_keys)
    client.load("iris_pair", 1)
    assert client.load("iris_pair", 2)["versions"] == [1, 2]
    assert client.ready_versions("iris_pair") == [1, 2]


@pytest.mark.integration
def test_tampered_model_file_refuses_the_load_and_triton_never_loads_it(fs_stack, sklearn_onnx, signing_keys):
    repo, _, client = fs_stack
    config = sklearn_onnx.config_text.replace("iris_clf", "iris_tampered")
    _publish(repo, "iris_tampered", 5, sklearn_onnx.onnx_path, config, signing_keys)
    with open(repo / "iris_tampered" / "5" / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(SignatureVerificationError, match="modified file\\(s\\): model.onnx"):
        client.load("iris_tampered", 5)
    assert not _triton_ready(client, "iris_tampered", 5)
    assert not client.is_ready("iris_tampered", 5)


@pytest.mark.integration
def test_half_finished_upload_is_never_loadable(fs_stack, sklearn_onnx, signing_keys):
    repo, _, client = fs_stack
    config = sklearn_onnx.config_text.replace("iris_clf", "iris_crash")
    script = textwrap.dedent(
        f"""
        import os
        from repository_sync.publish import publish_version
        publish_version(repository={str(repo)!r}, model_name="iris_crash", version=7,
            model_file={str(sklearn_onnx.onnx_path)!r}, config={config!r},
            private_key={str(signing_keys.private)!r}, trusted_keys={str(signing_keys.trusted_dir)!r},
            on_progress=lambda name: os._exit(3))
        """
    )
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-c", script], cwd=str(Path(__file__).resolve().parents[2]))
    assert proc.returncode == 3
    with pytest.raises(DataError, match="not in repository"):
        client.load("iris_crash", 7)
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException):  # even asked directly, Triton finds no version 7
        client.client.load_model("iris_crash", config='{"name": "iris_crash", "backend": "onnxruntime", '
                                 '"version_policy": {"specific": {"versions": [7]}}}')
    assert not client.is_ready("iris_crash", 7)


@pytest.mark.integration
def test_failed_smoke_test_unloads_the_new_version(fs_stack, sklearn_onnx, signing_keys):
    repo, _, client = fs_stack
    config = sklearn_onnx.config_text.replace("iris_clf", "iris_bad")
    _publish(repo, "iris_bad", 2, sklearn_onnx.onnx_path, config, signing_keys)
    X = sklearn_onnx.X[:10]
    wrong = sklearn_onnx.clf.predict_proba(X)[:, ::-1]
    with pytest.raises(ParityError, match="output 'probabilities'.*worst row"):
        client.load_and_smoke_test("iris_bad", 2, {"float_input": X}, {"probabilities": wrong})
    assert not client.is_ready("iris_bad", 2)


@pytest.mark.integration
def test_int64_ids_reach_triton_exactly_and_invalid_rows_are_counted(fs_stack, signing_keys, tmp_path):
    repo, _, client = fs_stack
    _publish(repo, "reco_ranker", 1, _reco_onnx(tmp_path / "reco.onnx"), RECO_CONFIG, signing_keys)
    client.load("reco_ranker", 1)
    frame = pd.read_csv(io.StringIO(SHADOW_CSV))  # pandas reads item_id as float64 (one is missing)
    smoke = client.smoke_test("reco_ranker", 1, frame)
    assert smoke.invalid_requests == 1 and smoke.invalid_rows[0][0] == 1
    assert smoke.rows_sent == [0, 2, 3]
    assert smoke.outputs["user_echo"][:, 0].tolist() == [100234, 100236, 9007199254740993]


# --------------------------------------------------------------------------- S3 repository
@pytest.fixture(scope="module")
def s3_stack(tmp_path_factory, s3_server, signing_keys, sklearn_onnx):
    import boto3

    bucket = f"triton-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    url = f"s3://{s3_server.endpoint_url}/{bucket}/triton"
    # Triton refuses to start on an empty S3 prefix ("repository path is not a valid directory")
    _publish(url, "iris_clf", 3, sklearn_onnx.onnx_path, sklearn_onnx.config_text, signing_keys,
             endpoint_url=s3_server.endpoint_url)
    server = _start_triton(tmp_path_factory, url)
    client = TritonModelControl(
        server.http_url, repository=url, trusted_keys=signing_keys.trusted_dir,
        endpoint_url=s3_server.endpoint_url, load_timeout_s=60,
    )
    yield url, bucket, server, client
    client.close()
    server.stop()


@pytest.mark.integration
def test_s3_published_classifier_is_served_like_sklearn(s3_stack, s3_server, sklearn_onnx, signing_keys):
    url, _, _, client = s3_stack  # iris_clf version 3 published by the fixture
    X = sklearn_onnx.X[:20]
    _, smoke = client.load_and_smoke_test(
        "iris_clf", 3, {"float_input": X}, {"probabilities": sklearn_onnx.clf.predict_proba(X)}, atol=1e-5, rtol=0
    )
    assert smoke.max_abs_error["probabilities"] <= 1e-5


@pytest.mark.integration
def test_s3_tampered_object_refuses_the_load(s3_stack, s3_server, sklearn_onnx, signing_keys):
    import boto3

    url, bucket, _, client = s3_stack
    config = sklearn_onnx.config_text.replace("iris_clf", "iris_s3_tampered")
    _publish(url, "iris_s3_tampered", 4, sklearn_onnx.onnx_path, config, signing_keys,
             endpoint_url=s3_server.endpoint_url)
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint_url)
    s3.put_object(Bucket=bucket, Key="triton/iris_s3_tampered/4/config.pbtxt.intended",
                  Body=config.replace("max_batch_size: 16", "max_batch_size: 64").encode())
    with pytest.raises(SignatureVerificationError, match="config.pbtxt.intended"):
        client.load("iris_s3_tampered", 4)
    assert not client.is_ready("iris_s3_tampered", 4)
