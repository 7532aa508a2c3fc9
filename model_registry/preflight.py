"""Pre-flight check of an MLflow artifact location on an S3-compatible store.

MLflow artifacts are uploaded by the *client* (the Airflow worker), not by the tracking server
(mlflow/mlflow#1813). A worker that lacks ``MLFLOW_S3_ENDPOINT_URL`` sends the upload for
``s3://bucket/...`` to the public AWS endpoint: odd credential errors, or worse, an object in a
stranger's bucket of the same name. An ``s3://`` value in that variable makes MLflow's endpoint
resolution crash (mlflow/mlflow#9523). So before training or logging, for an ``s3://`` artifact
location on a non-AWS store this check:

1. requires ``MLFLOW_S3_ENDPOINT_URL`` to be set -- otherwise it fails with "endpoint not set;
   refusing to use the default AWS endpoint" and sends **no request at all**;
2. requires it to be an ``http(s)://host[:port]`` URL with no path;
3. sends one ``HEAD`` for the bucket to that endpoint (boto3 ``head_bucket``), with the
   credentials of the same environment.

It never imports Airflow; the DAG runs it as its first task.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from ground.exceptions import DataError, ServiceUnavailableError

#: Environment variable MLflow reads for a custom S3 endpoint.
ENDPOINT_VAR = "MLFLOW_S3_ENDPOINT_URL"
#: Seconds to wait for the bucket HEAD (connect and read each).
DEFAULT_HEAD_TIMEOUT_S = 5.0
#: Region used to sign requests when the environment names none (S3-compatible stores ignore it).
DEFAULT_REGION = "us-east-1"
#: URI schemes MLflow treats as S3 artifact locations.
S3_SCHEMES = ("s3",)


class ArtifactStorePreflightError(DataError):
    """The worker's environment would send MLflow artifacts to the wrong or a broken endpoint."""


@dataclasses.dataclass(frozen=True)
class PreflightResult:
    """Outcome of :func:`check_artifact_location`.

    Attributes:
        artifact_location: The location checked.
        applies: False when the location is not on S3 (nothing to check).
        bucket: Bucket name ("" when not S3).
        endpoint_url: Endpoint the uploads will go to (None when not S3).
        bucket_checked: True when the bucket HEAD succeeded.
    """

    artifact_location: str
    applies: bool
    bucket: str = ""
    endpoint_url: str | None = None
    bucket_checked: bool = False


def load_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a ``KEY=VALUE`` environment file (comments and blank lines ignored) with python-dotenv.

    Raises:
        DataError: The file does not exist.
    """
    from dotenv import dotenv_values

    p = Path(path)
    if not p.is_file():
        raise DataError(f"env file {str(p)!r} does not exist (expected KEY=VALUE lines)")
    return {k: v for k, v in dotenv_values(p).items() if v is not None}


def validate_endpoint_url(value: str | None, location: str = "") -> str:
    """Check an ``MLFLOW_S3_ENDPOINT_URL`` value.

    Args:
        value: The variable's value (None or "" when unset).
        location: The artifact location, quoted in errors.

    Returns:
        The endpoint URL without a trailing slash.

    Raises:
        ArtifactStorePreflightError: Unset ("endpoint not set; refusing to use the default AWS
            endpoint"), not ``http``/``https``, no host, a bad port, or a path/query.
    """
    where = f" for artifact location {location!r}" if location else ""
    if value is None or not value.strip():
        raise ArtifactStorePreflightError(
            f"{ENDPOINT_VAR}: endpoint not set; refusing to use the default AWS endpoint{where}. "
            f"Set {ENDPOINT_VAR}=http(s)://<host>:<port> of the S3-compatible store on this worker"
        )
    raw = value.strip()
    parts = urlsplit(raw)
    if "://" not in raw or parts.scheme not in ("http", "https"):
        scheme = parts.scheme if "://" in raw else "none"
        raise ArtifactStorePreflightError(
            f"{ENDPOINT_VAR}={raw!r}: the endpoint must be an http(s) URL such as "
            f"http://minio.internal:9000, not scheme {scheme!r}{where}"
        )
    if not parts.hostname:
        raise ArtifactStorePreflightError(f"{ENDPOINT_VAR}={raw!r}: no host (expected http(s)://<host>:<port>)")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ArtifactStorePreflightError(
            f"{ENDPOINT_VAR}={raw!r}: port is not a number 1-65535 (expected http(s)://<host>:<port>)"
        ) from None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ArtifactStorePreflightError(
            f"{ENDPOINT_VAR}={raw!r}: the endpoint must not carry a path or query "
            f"({parts.path!r}); put the bucket and prefix in the artifact location"
        )
    return raw.rstrip("/")


def check_artifact_location(
    artifact_location: str,
    env: Mapping[str, str] | None = None,
    *,
    aws_store: bool = False,
    head_bucket: bool = True,
    timeout_s: float = DEFAULT_HEAD_TIMEOUT_S,
    session: Any = None,
) -> PreflightResult:
    """Check that MLflow artifacts for ``artifact_location`` will reach the intended store.

    Args:
        artifact_location: Experiment artifact location, e.g. ``s3://ml-artifacts/experiments/7``.
        env: Environment of the worker (default ``os.environ``); credentials are read from it.
        aws_store: True when the store really is AWS S3 (then no endpoint is required).
        head_bucket: Send the bucket HEAD (set False for a configuration-only check).
        timeout_s: Connect and read timeout of the HEAD, seconds.
        session: A ``boto3.session.Session`` to build the client from (default: a new one with
            the credentials of ``env``); lets a caller attach botocore event hooks.

    Returns:
        :class:`PreflightResult`.

    Raises:
        ArtifactStorePreflightError: Endpoint unset or malformed, no bucket in the location,
            bucket missing (404) or access denied (403). No request is sent before the endpoint
            is validated.
        ServiceUnavailableError: The endpoint did not answer (may be retried).
    """
    env = os.environ if env is None else env
    parts = urlsplit(artifact_location or "")
    if parts.scheme not in S3_SCHEMES:
        return PreflightResult(artifact_location, applies=False)
    bucket = parts.netloc
    if not bucket:
        raise ArtifactStorePreflightError(
            f"artifact location {artifact_location!r} names no bucket (expected s3://<bucket>/<prefix>)"
        )
    endpoint = None if aws_store else validate_endpoint_url(env.get(ENDPOINT_VAR), artifact_location)
    if not head_bucket:
        return PreflightResult(artifact_location, True, bucket, endpoint, False)

    import boto3
    import botocore.config
    import botocore.exceptions

    if session is None:
        session = boto3.session.Session(
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=env.get("AWS_SESSION_TOKEN"),
            region_name=env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
        )
    s3 = session.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        region_name=env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
        config=botocore.config.Config(
            connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 1},
            s3={"addressing_style": "path"},
        ),
    )
    target = endpoint or "the AWS S3 endpoint"
    try:
        s3.head_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("404", "NoSuchBucket", "NotFound") or status == 404:
            raise ArtifactStorePreflightError(
                f"bucket {bucket!r} of artifact location {artifact_location!r} does not exist at {target}"
            ) from None
        if code in ("403", "AccessDenied", "Forbidden") or status == 403:
            raise ArtifactStorePreflightError(
                f"access to bucket {bucket!r} at {target} denied (HTTP 403): check AWS_ACCESS_KEY_ID / "
                f"AWS_SECRET_ACCESS_KEY of this worker"
            ) from None
        raise ServiceUnavailableError(f"HEAD bucket {bucket!r} at {target} failed: {code or exc}") from None
    except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
            botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectionClosedError) as exc:
        raise ServiceUnavailableError(f"HEAD bucket {bucket!r}: {target} did not answer ({exc})") from None
    return PreflightResult(artifact_location, True, bucket, endpoint, True)


def check_experiment_artifact_store(
    client: Any, experiment_name: str, env: Mapping[str, str] | None = None, **kwargs: Any
) -> PreflightResult:
    """Run :func:`check_artifact_location` on an MLflow experiment's artifact location.

    Args:
        client: An ``mlflow.MlflowClient``.
        experiment_name: Experiment the training run will log to.
        env: Worker environment (default ``os.environ``).
        **kwargs: Passed to :func:`check_artifact_location`.

    Raises:
        ArtifactStorePreflightError: As :func:`check_artifact_location`, or the experiment does
            not exist.
    """
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        raise ArtifactStorePreflightError(f"experiment {experiment_name!r} does not exist in MLflow")
    return check_artifact_location(exp.artifact_location, env, **kwargs)
