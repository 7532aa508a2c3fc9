"""Storage backends: atomic, immutable pushes to a folder and to S3; S3 URL rules."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest

from ground.exceptions import DataError, RepositoryConflictError, SettingsError
from repository_sync.layout import find_layout_problems, plan_version
from repository_sync.storage.filesystem import FileSystemStorage
from repository_sync.storage.open import open_repository
from repository_sync.storage.s3 import S3Storage, parse_s3_repository_url

LAYOUT = plan_version("fraud_scorer", 7)


def _stage(folder, model=b"model-bytes", config=b'name: "fraud_scorer"\n'):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model)
    (folder / "config.pbtxt.intended").write_bytes(config)
    (folder / "model.onnx.sig").write_bytes(uuid.uuid4().bytes)  # signatures differ per signing
    return folder


# =========================================================================== S3 URLs
# Settings variants of an S3 model repository on a non-AWS endpoint (settings_variants.yaml), rebuilt
ENDPOINT = "http://objstore.internal:9000"


def test_no_port_is_rejected_with_the_explicit_form_advice():
    with pytest.raises(SettingsError) as err:
        parse_s3_repository_url("s3://objstore.internal/models/triton", ENDPOINT)
    message = str(err.value)
    assert "s3://http(s)://host:port/bucket/prefix" in message
    assert "'objstore.internal' as the bucket" in message
    assert "s3://http://objstore.internal:9000/models/triton" in message


def test_port_80_without_scheme_is_normalised_to_the_explicit_form():
    url = parse_s3_repository_url("s3://objstore.internal:80/models/triton", "http://objstore.internal:80")
    assert url.triton_uri == "s3://http://objstore.internal:80/models/triton"
    assert url.endpoint_url == "http://objstore.internal:80"


def test_host_port_without_scheme_and_without_endpoint_is_rejected():
    with pytest.raises(SettingsError, match=r"s3://http\(s\)://host:port/bucket/prefix"):
        parse_s3_repository_url("s3://objstore.internal:80/models/triton")


def test_leading_slash_key_template_is_normalised():
    url = parse_s3_repository_url("s3://http://objstore.internal:9000/models/triton", ENDPOINT)
    # object_key_template "/triton/{model}/{version}/model.onnx"
    assert url.key("/fraud_scorer/7/model.onnx") == "triton/fraud_scorer/7/model.onnx"
    assert LAYOUT.key("/" + url.prefix, "7", "model.onnx") == "triton/fraud_scorer/7/model.onnx"


def test_good_variant_is_accepted():
    url = parse_s3_repository_url("s3://http://objstore.internal:9000/models/triton", ENDPOINT)
    assert (url.bucket, url.prefix, url.host, url.port) == ("models", "triton", "objstore.internal", 9000)
    assert url.triton_uri == "s3://http://objstore.internal:9000/models/triton"


@pytest.mark.parametrize(
    "endpoint", ["http://objstore.internal:9001", "https://objstore.internal:9000", "http://other:9000"]
)
def test_triton_endpoint_must_match_the_boto3_endpoint(endpoint):
    with pytest.raises(SettingsError, match="must be the same store"):
        parse_s3_repository_url("s3://http://objstore.internal:9000/models/triton", endpoint)


def test_aws_form_is_accepted_without_custom_endpoint():
    url = parse_s3_repository_url("s3://models/triton/")
    assert (url.bucket, url.prefix, url.endpoint_url) == ("models", "triton", None)


@pytest.mark.parametrize(
    "bad", ["s3://http://objstore.internal/models", "s3://ftp://h:1/models", "s3://", "s3://http://h:9000/B_ad"]
)
def test_malformed_s3_urls_are_refused(bad):
    with pytest.raises(SettingsError):
        parse_s3_repository_url(bad)


def test_open_repository_picks_the_backend(tmp_path):
    assert isinstance(open_repository(tmp_path), FileSystemStorage)
    with pytest.raises(SettingsError):
        open_repository("")


# =========================================================================== filesystem
def test_filesystem_push_publishes_atomically_and_leaves_no_staging(tmp_path):
    storage = FileSystemStorage(tmp_path / "repo")
    out = storage.push_version(LAYOUT, _stage(tmp_path / "src"), serving_config=b'name: "fraud_scorer"\n')
    assert out.status == "published" and out.serving_config_written
    model_dir = tmp_path / "repo" / "fraud_scorer"
    assert sorted(p.name for p in model_dir.iterdir()) == ["7", "config.pbtxt"]
    assert (model_dir / "7" / "model.onnx").read_bytes() == b"model-bytes"
    assert find_layout_problems(storage.list_paths()) == []


def test_republishing_identical_content_is_a_no_op(tmp_path):
    storage = FileSystemStorage(tmp_path / "repo")
    storage.push_version(LAYOUT, _stage(tmp_path / "a"))
    sig_before = (tmp_path / "repo/fraud_scorer/7/model.onnx.sig").read_bytes()
    out = storage.push_version(LAYOUT, _stage(tmp_path / "b"))  # same content, new signature bytes
    assert out.status == "unchanged"
    assert (tmp_path / "repo/fraud_scorer/7/model.onnx.sig").read_bytes() == sig_before


def test_different_content_for_an_existing_version_is_refused_and_nothing_changes(tmp_path):
    storage = FileSystemStorage(tmp_path / "repo")
    storage.push_version(LAYOUT, _stage(tmp_path / "a"))
    with pytest.raises(RepositoryConflictError, match="files differing: model.onnx"):
        storage.push_version(LAYOUT, _stage(tmp_path / "b", model=b"other-bytes"))
    assert (tmp_path / "repo/fraud_scorer/7/model.onnx").read_bytes() == b"model-bytes"
    assert [p.name for p in (tmp_path / "repo/fraud_scorer").iterdir() if p.name.startswith(".")] == []


def test_failed_verification_leaves_the_repository_as_it_was(tmp_path):
    storage = FileSystemStorage(tmp_path / "repo")

    def refuse(path):
        raise DataError(f"refused {path}")

    with pytest.raises(DataError, match="refused"):
        storage.push_version(LAYOUT, _stage(tmp_path / "a"), serving_config=b"x", verify=refuse)
    assert list((tmp_path / "repo").iterdir()) == []  # not even the model folder remains


def test_later_version_does_not_change_the_serving_config(tmp_path):
    storage = FileSystemStorage(tmp_path / "repo")
    storage.push_version(LAYOUT, _stage(tmp_path / "a"), serving_config=b"champion config")
    out = storage.push_version(
        plan_version("fraud_scorer", 8), _stage(tmp_path / "b", config=b"challenger"), serving_config=b"challenger"
    )
    assert not out.serving_config_written
    assert storage.read_serving_config("fraud_scorer") == b"champion config"


def test_crash_between_files_never_exposes_the_version_and_a_retry_succeeds(tmp_path):
    """A real process dies (os._exit) after the first file is written."""
    src = _stage(tmp_path / "src")
    script = textwrap.dedent(
        f"""
        import os
        from repository_sync.layout import plan_version
        from repository_sync.storage.filesystem import FileSystemStorage
        FileSystemStorage({str(tmp_path / 'repo')!r}).push_version(
            plan_version("fraud_scorer", 7), __import__("pathlib").Path({str(src)!r}),
            serving_config=b"cfg", on_progress=lambda name: os._exit(3))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(_project_root()))
    assert proc.returncode == 3
    model_dir = tmp_path / "repo" / "fraud_scorer"
    assert not (model_dir / "7").exists()
    assert not (model_dir / "config.pbtxt").exists()
    leftovers = [p.name for p in model_dir.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".staging-7-")  # ignored by Triton
    out = FileSystemStorage(tmp_path / "repo").push_version(LAYOUT, src, serving_config=b"cfg")
    assert out.status == "published"
    assert (model_dir / "7" / "model.onnx").read_bytes() == b"model-bytes"


def test_deleting_a_version_removes_only_that_version_and_leaves_nothing_hidden(tmp_path):
    storage = FileSystemStorage(tmp_path / "repo")
    storage.push_version(LAYOUT, _stage(tmp_path / "a"), serving_config=b'name: "fraud_scorer"\n')
    storage.push_version(plan_version("fraud_scorer", 8), _stage(tmp_path / "b", model=b"v8"))
    assert storage.delete_version(LAYOUT) is True
    model_dir = tmp_path / "repo" / "fraud_scorer"
    assert sorted(p.name for p in model_dir.iterdir()) == ["8", "config.pbtxt"]
    assert find_layout_problems(storage.list_paths()) == []
    assert storage.delete_version(LAYOUT) is False  # nothing left to delete
    with pytest.raises(DataError, match="version 7 is not in repository"):
        with storage.local_version(LAYOUT):
            pass


def test_deleting_a_path_that_is_not_a_version_folder_is_refused(tmp_path):
    storage = FileSystemStorage(tmp_path / "repo")
    (tmp_path / "repo" / "fraud_scorer").mkdir(parents=True)
    (tmp_path / "repo" / "fraud_scorer" / "7").write_bytes(b"not a folder")
    with pytest.raises(DataError, match="not a version folder"):
        storage.delete_version(LAYOUT)
    assert (tmp_path / "repo" / "fraud_scorer" / "7").read_bytes() == b"not a folder"


def test_staged_folder_without_model_file_is_refused(tmp_path):
    src = _stage(tmp_path / "src")
    (src / "model.onnx").unlink()
    with pytest.raises(DataError, match="lacks the model file 'model.onnx'"):
        FileSystemStorage(tmp_path / "repo").push_version(LAYOUT, src)


def _project_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]


# =========================================================================== S3 (real moto server)
@pytest.fixture
def s3_repo(s3_server):
    import boto3

    bucket = f"models-{uuid.uuid4().hex[:10]}"
    client = boto3.client("s3", endpoint_url=s3_server.endpoint_url)
    client.create_bucket(Bucket=bucket)
    url = f"s3://{s3_server.endpoint_url}/{bucket}/triton"
    return S3Storage(url, endpoint_url=s3_server.endpoint_url), client, bucket


def _keys(client, bucket):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


@pytest.mark.integration
def test_s3_push_writes_keys_without_leading_slash_and_requires_all_files(s3_repo, tmp_path):
    storage, client, bucket = s3_repo
    out = storage.push_version(LAYOUT, _stage(tmp_path / "a"), serving_config=b"cfg")
    assert out.status == "published"
    assert _keys(client, bucket) == [
        "triton/fraud_scorer/7/config.pbtxt.intended",
        "triton/fraud_scorer/7/model.onnx",
        "triton/fraud_scorer/7/model.onnx.sig",
        "triton/fraud_scorer/config.pbtxt",
    ]
    assert find_layout_problems(storage.list_paths()) == []
    with storage.local_version(LAYOUT) as local:
        assert (local / "model.onnx").read_bytes() == b"model-bytes"


@pytest.mark.integration
def test_s3_republish_is_idempotent_and_different_content_is_refused(s3_repo, tmp_path):
    storage, client, bucket = s3_repo
    storage.push_version(LAYOUT, _stage(tmp_path / "a"), serving_config=b"cfg")
    before = _keys(client, bucket)
    assert storage.push_version(LAYOUT, _stage(tmp_path / "b"), serving_config=b"cfg").status == "unchanged"
    with pytest.raises(RepositoryConflictError, match="model.onnx"):
        storage.push_version(LAYOUT, _stage(tmp_path / "c", model=b"other"), serving_config=b"cfg")
    assert _keys(client, bucket) == before
    body = client.get_object(Bucket=bucket, Key="triton/fraud_scorer/7/model.onnx")["Body"].read()
    assert body == b"model-bytes"


@pytest.mark.integration
def test_s3_failed_push_removes_what_it_uploaded(s3_repo, tmp_path):
    storage, client, bucket = s3_repo

    def refuse(path):
        raise DataError("signature refused")

    with pytest.raises(DataError):
        storage.push_version(LAYOUT, _stage(tmp_path / "a"), serving_config=b"cfg", verify=refuse)
    assert _keys(client, bucket) == []


@pytest.mark.integration
def test_s3_deleting_a_version_removes_its_objects_only(s3_repo, tmp_path):
    storage, client, bucket = s3_repo
    storage.push_version(LAYOUT, _stage(tmp_path / "a"), serving_config=b"cfg")
    storage.push_version(plan_version("fraud_scorer", 8), _stage(tmp_path / "b", model=b"v8"))
    assert storage.delete_version(LAYOUT) is True
    assert _keys(client, bucket) == [
        "triton/fraud_scorer/8/config.pbtxt.intended",
        "triton/fraud_scorer/8/model.onnx",
        "triton/fraud_scorer/8/model.onnx.sig",
        "triton/fraud_scorer/config.pbtxt",
    ]
    assert storage.delete_version(LAYOUT) is False
    assert storage.push_version(LAYOUT, _stage(tmp_path / "c"), serving_config=b"cfg").status == "published"


@pytest.mark.integration
def test_s3_crash_between_files_leaves_no_loadable_version_and_a_retry_succeeds(s3_repo, s3_server, tmp_path):
    storage, client, bucket = s3_repo
    src = _stage(tmp_path / "src")
    script = textwrap.dedent(
        f"""
        import os, pathlib
        from repository_sync.layout import plan_version
        from repository_sync.storage.s3 import S3Storage
        S3Storage({storage.uri!r}, endpoint_url={s3_server.endpoint_url!r}).push_version(
            plan_version("fraud_scorer", 7), pathlib.Path({str(src)!r}), serving_config=b"cfg",
            on_progress=lambda name: os._exit(3))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(_project_root()))
    assert proc.returncode == 3
    keys = _keys(client, bucket)
    assert keys and all("/.staging-7-" in k for k in keys)  # nothing under fraud_scorer/7/
    assert storage.push_version(LAYOUT, src, serving_config=b"cfg").status == "published"
    assert "triton/fraud_scorer/7/model.onnx" in _keys(client, bucket)


def test_a_new_backend_registers_by_scheme_and_open_repository_picks_it(tmp_path):
    from ground.exceptions import SettingsError
    from repository_sync.storage.base import RepositoryStorage
    from repository_sync.storage.filesystem import FileSystemStorage
    from repository_sync.storage.open import open_repository

    class MemoryStorage(FileSystemStorage, scheme="memtest"):
        def __init__(self, uri, endpoint_url=None):
            super().__init__(tmp_path / uri.split("://", 1)[1])
            self.endpoint_url = endpoint_url

    try:
        opened = open_repository("memtest://models", endpoint_url="http://127.0.0.1:1")
        assert isinstance(opened, MemoryStorage) and opened.endpoint_url == "http://127.0.0.1:1"
        assert isinstance(open_repository(f"file://{tmp_path}"), FileSystemStorage)
    finally:
        del RepositoryStorage.BACKENDS["memtest"]
    with pytest.raises(SettingsError, match=r"'memtest://models' has an unsupported scheme.*s3://"):
        open_repository("memtest://models")
