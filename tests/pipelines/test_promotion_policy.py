"""The promotion policy read from MLflow, and an approval's answer written on the version (real MLflow)."""

from __future__ import annotations

import uuid

import pytest

from ground.exceptions import DataError
from tests.conftest import make_settings
from tritonflow.pipelines.promotion_policy import (
    APPROVAL_TAG_PREFIX,
    POLICY_TAG,
    approval_request,
    policy_from_tags,
    promotion_policy,
    record_answer,
)


def test_policy_defaults_to_the_setting_and_a_tag_overrides_it():
    assert policy_from_tags({}, "auto") == "auto"
    assert policy_from_tags({POLICY_TAG: " "}, "approve") == "approve"
    assert policy_from_tags({POLICY_TAG: "approve-steps"}, "auto") == "approve-steps"


def test_a_bad_policy_tag_names_the_tag_the_value_and_the_expected_values():
    with pytest.raises(DataError) as err:
        policy_from_tags({POLICY_TAG: "yolo"}, "auto")
    assert POLICY_TAG in str(err.value) and "'yolo'" in str(err.value)
    assert "auto, approve, approve-steps" in str(err.value)


@pytest.fixture(scope="module")
def registered(mlflow_server, tmp_path_factory):
    """A registered model with two versions (no artifacts needed for tags)."""
    from mlflow import MlflowClient

    from model_registry.registry import RegistryClient

    name = f"policy-{uuid.uuid4().hex[:6]}"
    client = MlflowClient(mlflow_server.tracking_uri)
    client.create_registered_model(name)
    for _ in range(2):
        client.create_model_version(name, source="s3://nowhere/model")
    client.set_model_version_tag(name, "2", "tritonflow.perf_gate",
                                 '{"status": "passed", "challenger_p99_ms": 2.1, "champion_p99_ms": 2.0}')
    client.set_model_version_tag(name, "2", "tritonflow.shadow.outcome", "promote")
    settings = make_settings(tmp_path_factory.mktemp("policy"), mlflow_tracking_uri=mlflow_server.tracking_uri)
    return name, client, settings, RegistryClient(mlflow_server.tracking_uri)


def test_policy_read_from_the_registered_model_tag(registered):
    name, client, settings, registry = registered
    assert promotion_policy(name, settings=settings, registry=registry) == "auto"
    client.set_registered_model_tag(name, POLICY_TAG, "approve")
    try:
        assert promotion_policy(name, settings=settings, registry=registry) == "approve"
        client.set_registered_model_tag(name, POLICY_TAG, "later")
        with pytest.raises(DataError, match="tritonflow.promotion_policy is 'later'"):
            promotion_policy(name, settings=settings, registry=registry)
    finally:
        client.delete_registered_model_tag(name, POLICY_TAG)


def test_approval_body_gives_the_figures_the_drift_event_and_both_versions(registered):
    name, _client, settings, registry = registered
    req = approval_request({"model": name, "champion": 1, "challenger": 2}, drift_event={"feature": "temp"},
                           mlflow_url="http://mlflow.test", settings=settings, registry=registry)
    assert name in req["subject"] and "v2" in req["subject"]
    body = req["body"]
    assert "2.1 ms" in body and "**Shadow**: promote" in body and '"feature": "temp"' in body
    assert "versions/1)" in body and "versions/2)" in body


def test_an_approval_and_a_rejection_are_recorded_on_the_version(registered):
    name, client, settings, registry = registered
    record_answer(name, 2, approved=True, by="alice", at="2026-01-01T00:00:00Z", settings=settings, registry=registry)
    tags = client.get_model_version(name, "2").tags
    assert tags[APPROVAL_TAG_PREFIX + "answer"] == "approved" and tags[APPROVAL_TAG_PREFIX + "by"] == "alice"
    assert tags[APPROVAL_TAG_PREFIX + "at"] == "2026-01-01T00:00:00Z" and "tritonflow.status" not in tags
    record_answer(name, 2, approved=False, note="timed out", settings=settings, registry=registry)
    tags = client.get_model_version(name, "2").tags
    assert tags[APPROVAL_TAG_PREFIX + "answer"] == "rejected" and tags[APPROVAL_TAG_PREFIX + "by"] == "nobody"
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "approval"
    assert "timed out" in tags["tritonflow.rejection_reason"]
