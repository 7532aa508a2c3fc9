"""Pre-flight of MLflow artifact locations on an S3-compatible store.

The "request-recording fake" below is a botocore ``before-send`` event hook: it records every
request boto3 is about to send and answers it locally with an empty HTTP 200, so nothing leaves
the machine. It stands in for the internet (the default AWS endpoint cannot be reached, nor may it
be contacted, from a test). Bucket checks against a store that does answer use the real moto S3
server of ``tests/conftest.py``.
"""

from __future__ import annotations

import re
import uuid
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from model_registry.preflight import (
    ArtifactStorePreflightError,
    check_artifact_location,
    check_experiment_artifact_store,
    load_env_file,
    validate_endpoint_url,
)

# Artifact-location inputs, rebuilt (values invented by the case).
EXPERIMENT = {"experiment_name": "churn", "artifact_location": "s3://ml-artifacts/experiments/7"}
WORKER_BAD = """# Airflow worker environment (values invented).
MLFLOW_TRACKING_URI=http://mlflow.internal:5000
AWS_ACCESS_KEY_ID=EXAMPLEKEYID0000
AWS_SECRET_ACCESS_KEY=example/secret/0000000000000000000000
AWS_DEFAULT_REGION=us-east-1
# MLFLOW_S3_ENDPOINT_URL is missing -> boto3 talks to the public AWS endpoint for bucket "ml-artifacts"
"""
WORKER_BAD_SCHEME = """MLFLOW_TRACKING_URI=http://mlflow.internal:5000
MLFLOW_S3_ENDPOINT_URL=s3://ml-artifacts/experiments/
AWS_ACCESS_KEY_ID=EXAMPLEKEYID0000
AWS_SECRET_ACCESS_KEY=example/secret/0000000000000000000000
"""
WORKER_GOOD = """MLFLOW_TRACKING_URI=http://mlflow.internal:5000
MLFLOW_S3_ENDPOINT_URL=http://objstore.internal:9000
AWS_ACCESS_KEY_ID=EXAMPLEKEYID0000
AWS_SECRET_ACCESS_KEY=example/secret/0000000000000000000000
AWS_DEFAULT_REGION=us-east-1
"""


@pytest.fixture
def env_files(tmp_path):
    out = {}
    for name, text in [("bad", WORKER_BAD), ("bad_scheme", WORKER_BAD_SCHEME), ("good", WORKER_GOOD)]:
        path = tmp_path / f"worker_{name}.env"
        path.write_text(text)
        out[name] = load_env_file(path)
    return out


class _Raw:
    def stream(self, **_):
        yield b""


class RecordingSession:
    """A real boto3 session whose requests are recorded and answered locally (never sent)."""

    def __init__(self):
        self.session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="y",
                                             region_name="us-east-1")
        self.urls: list[str] = []
        self.session.events.register("before-send", self._record)

    def _record(self, request, **_):
        self.urls.append(request.url)
        return AWSResponse(request.url, 200, {}, _Raw())

    @property
    def hosts(self) -> list[str]:
        return [urlsplit(u).netloc for u in self.urls]


def test_env_file_loader_reads_values_and_skips_comments(env_files):
    assert "MLFLOW_S3_ENDPOINT_URL" not in env_files["bad"]
    assert env_files["good"]["MLFLOW_S3_ENDPOINT_URL"] == "http://objstore.internal:9000"


def test_recording_fake_does_see_a_request_to_the_default_aws_host():
    """Control: the same fake, given a naive client with no endpoint, records the AWS host."""
    fake = RecordingSession()
    fake.session.client("s3").head_bucket(Bucket="ml-artifacts")
    assert any(h.endswith("amazonaws.com") for h in fake.hosts), fake.urls


def test_worker_without_endpoint_fails_and_no_request_reaches_the_default_aws_host(env_files):
    fake = RecordingSession()
    with pytest.raises(ArtifactStorePreflightError) as err:
        check_artifact_location(EXPERIMENT["artifact_location"], env_files["bad"], session=fake.session)
    assert "endpoint not set; refusing to use the default AWS endpoint" in str(err.value)
    assert "MLFLOW_S3_ENDPOINT_URL" in str(err.value) and "s3://ml-artifacts/experiments/7" in str(err.value)
    assert fake.urls == []


def test_endpoint_with_an_s3_scheme_is_refused_because_it_must_be_an_http_url(env_files):
    fake = RecordingSession()
    with pytest.raises(ArtifactStorePreflightError) as err:
        check_artifact_location(EXPERIMENT["artifact_location"], env_files["bad_scheme"], session=fake.session)
    assert "must be an http(s) URL" in str(err.value)
    assert "s3://ml-artifacts/experiments/" in str(err.value)
    assert fake.urls == []


def test_good_worker_passes_and_heads_the_bucket_at_its_own_endpoint_only(env_files):
    fake = RecordingSession()
    result = check_artifact_location(EXPERIMENT["artifact_location"], env_files["good"], session=fake.session)
    assert result.applies and result.bucket_checked
    assert result.endpoint_url == "http://objstore.internal:9000" and result.bucket == "ml-artifacts"
    assert fake.hosts == ["objstore.internal:9000"]
    assert not any("amazonaws.com" in u for u in fake.urls)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("", "endpoint not set"),
        ("ftp://store:21", "must be an http(s) URL"),
        ("store.internal:9000", "must be an http(s) URL"),
        ("http://:9000", "no host"),
        ("http://store.internal:99999", "port is not a number"),
        ("http://store.internal:9000/ml-artifacts", "must not carry a path"),
    ],
)
def test_malformed_endpoint_values_are_refused_naming_the_value(value, expected):
    with pytest.raises(ArtifactStorePreflightError, match=re.escape(expected)) as err:
        validate_endpoint_url(value)
    if value:
        assert repr(value) in str(err.value)


def test_valid_endpoints_are_accepted():
    assert validate_endpoint_url("https://minio.example.com") == "https://minio.example.com"
    assert validate_endpoint_url("http://127.0.0.1:9000/") == "http://127.0.0.1:9000"


def test_non_s3_artifact_location_needs_no_endpoint():
    assert not check_artifact_location("mlflow-artifacts:/7", {}).applies
    assert not check_artifact_location("/srv/mlflow/artifacts", {}).applies


@pytest.mark.integration
def test_bucket_is_headed_on_a_real_s3_compatible_endpoint_and_a_missing_bucket_is_named(s3_server):
    bucket = f"ml-artifacts-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    env = load_env_text(WORKER_GOOD) | {"MLFLOW_S3_ENDPOINT_URL": s3_server.endpoint_url}
    result = check_artifact_location(f"s3://{bucket}/experiments/7", env)
    assert result.bucket_checked and result.endpoint_url == s3_server.endpoint_url
    with pytest.raises(ArtifactStorePreflightError, match=rf"bucket 'absent-{bucket}' .* does not exist at http://"):
        check_artifact_location(f"s3://absent-{bucket}/x", env)


@pytest.mark.integration
def test_experiment_artifact_location_is_read_from_mlflow_and_checked(s3_server, mlflow_server):
    from mlflow import MlflowClient

    bucket = f"ml-artifacts-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    client = MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    name = f"{EXPERIMENT['experiment_name']}-{uuid.uuid4().hex[:8]}"
    client.create_experiment(name, artifact_location=f"s3://{bucket}/experiments/7")
    with pytest.raises(ArtifactStorePreflightError, match="endpoint not set"):
        check_experiment_artifact_store(client, name, load_env_text(WORKER_BAD))
    env = load_env_text(WORKER_GOOD) | {"MLFLOW_S3_ENDPOINT_URL": s3_server.endpoint_url}
    assert check_experiment_artifact_store(client, name, env).bucket_checked
    with pytest.raises(ArtifactStorePreflightError, match="does not exist in MLflow"):
        check_experiment_artifact_store(client, f"missing-{name}", env)


def load_env_text(text: str) -> dict[str, str]:
    import io

    from dotenv import dotenv_values

    return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}
