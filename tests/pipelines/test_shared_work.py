"""Work files handed from one task to the next on separate workers: the publish staging folder, a
shadow replay's predictions, a training window travel through the shared store
(``TRITONFLOW_STAGING_URI``), against a real moto S3 server."""

from __future__ import annotations

import dataclasses
import shutil
import uuid

import boto3
import pytest

from ground.exceptions import SettingsError
from tritonflow.pipelines.publish_common import STAGING_MARKER, enter_staging, new_attempt, staging_dir
from tritonflow.pipelines.shared_work import discard, fetch, location, share

pytestmark = pytest.mark.integration


@pytest.fixture
def shared(s3_server, settings_factory):
    bucket = f"work-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    settings = dataclasses.replace(settings_factory(), staging_uri=f"s3://{bucket}/work",
                                   s3_endpoint_url=s3_server.endpoint_url)
    return settings, bucket


def _keys(settings, bucket) -> set[str]:
    doc = boto3.client("s3", endpoint_url=settings.s3_endpoint_url).list_objects_v2(Bucket=bucket)
    return {o["Key"] for o in doc.get("Contents", [])}


def test_a_worker_that_never_saw_a_publish_attempt_gets_its_files_and_adds_its_own(shared):
    settings, bucket = shared
    stage = staging_dir(settings, "noaa_rain", 3, new_attempt())
    enter_staging({"staging_dir": str(stage)})
    (stage / "model.onnx").write_bytes(b"onnx" * 1000)
    (stage / "profile").mkdir()
    (stage / "profile" / "config.pbtxt").write_text('name: "noaa_rain"\n')
    assert share(settings, stage) == 2
    assert share(settings, stage) == 0  # nothing new: nothing stored twice

    shutil.rmtree(stage)  # the next task runs on another host: its folder is empty
    assert fetch(settings, stage) == 2
    assert (stage / "model.onnx").read_bytes() == b"onnx" * 1000
    assert (stage / "profile" / "config.pbtxt").read_text() == 'name: "noaa_rain"\n'
    assert fetch(settings, stage) == 0

    (stage / "perf_gate.json").write_text("{}")
    assert share(settings, stage) == 1
    _, key = location(settings, stage)
    assert key == f"work/staging/noaa_rain/3/{stage.name}"
    assert _keys(settings, bucket) == {f"{key}/model.onnx", f"{key}/profile/config.pbtxt", f"{key}/perf_gate.json"}
    assert not any(k.endswith(STAGING_MARKER) for k in _keys(settings, bucket))
    assert discard(settings, stage) == 3
    assert _keys(settings, bucket) == set()


def test_a_single_file_is_shared_under_its_path_in_the_home_and_a_sibling_is_not_fetched(shared):
    settings, bucket = shared
    window = settings.home / "retrain" / "noaa_rain" / "windows" / "abc.parquet"
    sibling = window.with_name("abcdef.parquet")
    window.parent.mkdir(parents=True)
    window.write_bytes(b"PAR1" * 10)
    sibling.write_bytes(b"PAR1")
    assert share(settings, window) == 1 and share(settings, sibling) == 1
    window.unlink()
    sibling.unlink()
    assert fetch(settings, window) == 1
    assert window.read_bytes() == b"PAR1" * 10 and not sibling.exists()


def test_without_a_staging_uri_or_outside_the_home_nothing_is_shared_and_a_bad_uri_is_named(
        shared, settings_factory, tmp_path):
    settings, bucket = shared
    outside = tmp_path / "user-dataset.parquet"
    outside.write_bytes(b"x")
    assert location(settings, outside) is None and share(settings, outside) == 0
    plain = settings_factory()
    path = plain.home / "shadow" / "m" / "run"
    assert location(plain, path) is None
    assert fetch(plain, path) == share(plain, path) == discard(plain, path) == 0
    with pytest.raises(SettingsError, match=r"TRITONFLOW_STAGING_URI='/shared/work'.*s3://bucket"):
        location(dataclasses.replace(plain, staging_uri="/shared/work"), path)


def test_a_training_window_another_worker_wrote_is_fetched_for_the_publish_dataset(shared):
    """retrain writes the window on one worker and hands its path to model_publish as dataset_uri."""
    from tritonflow.pipelines.publish_validate import load_dataset

    settings, bucket = shared
    import pandas as pd

    window = settings.home / "retrain" / "noaa_rain" / "windows" / "w.parquet"
    window.parent.mkdir(parents=True)
    pd.DataFrame({"x": [1.0, 2.0], "rain": [0, 1]}).to_parquet(window, index=False)
    share(settings, window)
    window.unlink()  # the publish runs on another host
    assert fetch(settings, str(window)) == 1
    assert list(load_dataset(str(window))["rain"]) == [0, 1]
