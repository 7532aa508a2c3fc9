"""What a person may roll a model back to: its published, signed versions, newest first, labelled
(``previous_champion`` preselected, sentinel rejections marked), read from a real MLflow."""

from __future__ import annotations

import uuid

import pytest

from ground.exceptions import DataError, RegistryError
from tritonflow.pipelines.canary_rollback import rollback_choices, version_of_choice
from tritonflow_plugin.rollback_choice import choice_body


def test_the_choices_are_the_signed_versions_but_the_champion_with_previous_champion_preselected(
        mlflow_server, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("TRITONFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("TRITONFLOW_MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    name = f"choices-{uuid.uuid4().hex[:6]}"
    client = MlflowClient(mlflow_server.tracking_uri)
    client.create_registered_model(name)
    for _ in range(4):
        client.create_model_version(name, source="s3://nowhere/model")
    with pytest.raises(RegistryError, match="no published, signed version"):
        rollback_choices(name)
    for v in ("1", "2", "4"):
        client.set_model_version_tag(name, v, "tritonflow.signature_digest", "sha256:abc")
    client.set_model_version_tag(name, "1", "tritonflow.status", "rejected")
    client.set_model_version_tag(name, "1", "tritonflow.rejected_stage", "sentinel")
    client.set_model_version_tag(name, "1", "tritonflow.rejection_reason", "errors | timeouts")
    client.set_registered_model_alias(name, "previous_champion", "2")
    client.set_registered_model_alias(name, "champion", "4")
    choices = rollback_choices(name)
    assert choices["options"] == ["v2 (previous_champion)", "v1 (rejected by the sentinel)"]  # v3 unsigned
    assert choices["default"] == "v2 (previous_champion)"
    assert [version_of_choice(o) for o in choices["options"]] == [2, 1]
    body = choice_body(name, choices["rows"], "latency doubled")
    assert "latency doubled" in body and "| v1 |" in body and "at sentinel: errors / timeouts" in body


@pytest.mark.parametrize("label", ["", "3", "version 3", "previous_champion"])
def test_a_choice_that_names_no_version_is_refused_naming_it(label):
    with pytest.raises(DataError, match="expected a label starting with v<version>"):
        version_of_choice(label)
