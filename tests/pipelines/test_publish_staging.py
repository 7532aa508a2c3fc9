"""model_publish's stages on separate workers: the staged files of an attempt travel through the
shared S3 staging store (``TRITONFLOW_STAGING_URI``), against a real moto S3 server."""

from __future__ import annotations

import dataclasses
import shutil

import boto3
import pytest

from tritonflow.exceptions import SettingsError
from tritonflow.pipelines.publish_common import STAGING_MARKER, enter_staging, new_attempt, staging_dir
from tritonflow.pipelines.publish_staging import drop_staging, pull_staging, push_staging, staging_location

pytestmark = pytest.mark.integration


@pytest.fixture
def shared(s3_server, settings_factory):
    bucket = f"staging-{new_attempt().lower().replace('t', '').replace('z', '')[-12:]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    settings = dataclasses.replace(settings_factory(), staging_uri=f"s3://{bucket}/publish",
                                   s3_endpoint_url=s3_server.endpoint_url)
    stage = staging_dir(settings, "noaa_rain", 3, new_attempt())
    return settings, {"staging_dir": str(stage)}, bucket


def test_a_worker_that_never_saw_the_attempt_gets_its_files_and_adds_its_own(shared):
    settings, state, bucket = shared
    stage = enter_staging(state)
    (stage / "model.onnx").write_bytes(b"onnx" * 1000)
    (stage / "profile").mkdir()
    (stage / "profile" / "config.pbtxt").write_text('name: "noaa_rain"\n')
    assert push_staging(state, settings) == 2
    assert push_staging(state, settings) == 0  # nothing new: nothing stored twice

    shutil.rmtree(stage)  # the next task runs on another host: its folder is empty
    assert pull_staging(state, settings) == 2
    assert (stage / "model.onnx").read_bytes() == b"onnx" * 1000
    assert (stage / "profile" / "config.pbtxt").read_text() == 'name: "noaa_rain"\n'
    assert pull_staging(state, settings) == 0

    (stage / "perf_gate.json").write_text("{}")
    assert push_staging(state, settings) == 1
    keys = {o["Key"] for o in boto3.client("s3", endpoint_url=settings.s3_endpoint_url)
            .list_objects_v2(Bucket=bucket)["Contents"]}
    _, prefix = staging_location(settings, state)
    assert keys == {f"{prefix}/model.onnx", f"{prefix}/profile/config.pbtxt", f"{prefix}/perf_gate.json"}
    assert not any(k.endswith(STAGING_MARKER) for k in keys)

    assert drop_staging(state, settings) == 3
    assert "Contents" not in boto3.client("s3", endpoint_url=settings.s3_endpoint_url).list_objects_v2(Bucket=bucket)


def test_without_a_staging_uri_nothing_is_shared_and_a_bad_one_is_named(settings_factory, tmp_path):
    settings = settings_factory()
    state = {"staging_dir": str(staging_dir(settings, "m", 1, new_attempt()))}
    assert staging_location(settings, state) is None
    assert pull_staging(state, settings) == push_staging(state, settings) == drop_staging(state, settings) == 0
    with pytest.raises(SettingsError, match=r"TRITONFLOW_STAGING_URI='/shared/staging'.*s3://bucket"):
        staging_location(dataclasses.replace(settings, staging_uri="/shared/staging"), state)
