"""publish_version: stage, sign, push, verify at the destination, expose last."""

from __future__ import annotations

import json

import pytest

from ground.exceptions import (
    ModelConfigError,
    RepositoryConflictError,
    RepositoryLayoutError,
    SignatureVerificationError,
)
from repository_sync.publish import publish_version
from repository_sync.signing import verify_version


def _publish(repo, sklearn_onnx, keys, version=3, **kw):
    args = dict(
        repository=repo,
        model_name=sklearn_onnx.model_name,
        version=version,
        model_file=sklearn_onnx.onnx_path,
        config=sklearn_onnx.config_text,
        private_key=keys.private,
        trusted_keys=keys.trusted_dir,
    )
    args.update(kw)
    return publish_version(**args)


def test_publish_returns_a_json_result_and_the_version_verifies_in_place(tmp_path, sklearn_onnx, signing_keys):
    result = _publish(tmp_path / "repo", sklearn_onnx, signing_keys)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["model_name"] == "iris_clf" and data["version"] == 3
    assert data["key_id"] == signing_keys.key_id
    assert data["signed_files"] == ["config.pbtxt.intended", "model.onnx"]
    assert data["bytes"] > sklearn_onnx.onnx_path.stat().st_size
    assert not data["already_published"] and data["serving_config_written"]
    assert set(data["timings_s"]) == {"stage", "sign", "push", "total"}
    info = verify_version(tmp_path / "repo/iris_clf/3", signing_keys.trusted_dir, signature_file="model.onnx.sig")
    assert info.signature_digest == data["signature_digest"]


def test_rerunning_the_same_publish_is_idempotent(tmp_path, sklearn_onnx, signing_keys):
    first = _publish(tmp_path / "repo", sklearn_onnx, signing_keys)
    second = _publish(tmp_path / "repo", sklearn_onnx, signing_keys)
    assert second.already_published and not second.serving_config_written
    assert second.signature_digest == first.signature_digest  # the published signature is kept


def test_different_model_bytes_for_a_published_version_are_refused(tmp_path, sklearn_onnx, signing_keys):
    _publish(tmp_path / "repo", sklearn_onnx, signing_keys)
    other = tmp_path / "other.onnx"
    other.write_bytes(sklearn_onnx.onnx_path.read_bytes() + b"\0")
    with pytest.raises(RepositoryConflictError, match="immutable"):
        _publish(tmp_path / "repo", sklearn_onnx, signing_keys, model_file=other)


def test_destination_verification_failure_publishes_nothing(tmp_path, sklearn_onnx, signing_keys, other_keys):
    with pytest.raises(SignatureVerificationError):
        _publish(tmp_path / "repo", sklearn_onnx, signing_keys, trusted_keys=other_keys.trusted_dir)
    assert list((tmp_path / "repo").iterdir()) == []


def test_new_version_with_a_different_config_keeps_the_champion_serving_config(tmp_path, sklearn_onnx, signing_keys):
    _publish(tmp_path / "repo", sklearn_onnx, signing_keys, version=3)
    champion = (tmp_path / "repo/iris_clf/config.pbtxt").read_text()
    challenger_cfg = sklearn_onnx.config_text.replace("max_batch_size: 16", "max_batch_size: 4")
    _publish(tmp_path / "repo", sklearn_onnx, signing_keys, version=4, config=challenger_cfg)
    assert (tmp_path / "repo/iris_clf/config.pbtxt").read_text() == champion
    assert "max_batch_size: 4" in (tmp_path / "repo/iris_clf/4/config.pbtxt.intended").read_text()


def test_config_naming_another_model_is_refused(tmp_path, sklearn_onnx, signing_keys):
    with pytest.raises(ModelConfigError, match="'fraud_scorer' differs from the model name 'iris_clf'"):
        _publish(tmp_path / "repo", sklearn_onnx, signing_keys,
                 config=sklearn_onnx.config_text.replace('"iris_clf"', '"fraud_scorer"'))


def test_unsafe_name_is_refused_before_anything_is_written(tmp_path, sklearn_onnx, signing_keys):
    with pytest.raises(RepositoryLayoutError):
        _publish(tmp_path / "repo", sklearn_onnx, signing_keys, model_name="iris clf",
                 config=sklearn_onnx.config_text.replace('name: "iris_clf"', ""))
    assert not (tmp_path / "repo").exists()


@pytest.mark.integration
def test_publish_to_s3_verifies_at_the_destination(s3_server, tmp_path, sklearn_onnx, signing_keys):
    import boto3

    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket="publish-test")
    url = f"s3://{s3_server.endpoint_url}/publish-test/triton"
    result = _publish(url, sklearn_onnx, signing_keys, endpoint_url=s3_server.endpoint_url)
    assert result.repository_uri == url and result.version_uri == url + "/iris_clf/3"
    assert _publish(url, sklearn_onnx, signing_keys, endpoint_url=s3_server.endpoint_url).already_published
