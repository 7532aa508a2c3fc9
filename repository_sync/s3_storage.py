"""Repository storage in S3 (AWS or any S3 endpoint), and Triton's S3 repository URL syntax.

S3 has no atomic rename: objects are uploaded under a staging prefix, downloaded back and
verified, then copied server-side into the version prefix with the model file last (the commit
point, since a version without its model file cannot load). :func:`parse_s3_repository_url`
checks a URL against the boto3 endpoint the way Triton will read it. See
:mod:`repository_sync.storage`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from typing_extensions import override

from ground.checksums import sha256_stream
from ground.exceptions import ServiceUnavailableError, SettingsError, VersionNotInRepositoryError
from repository_sync.layout import (
    CONFIG_FILENAME,
    STAGING_PREFIX,
    VersionLayout,
    join_key,
    validate_model_name,
)
from repository_sync.storage_base import (
    STALE_STAGING_AGE_S,
    PushOutcome,
    RepositoryStorage,
    StagedPush,
    compare_digests,
)

#: S3 object metadata key holding the SHA-256 hex of the object's bytes (for idempotency checks).
SHA256_METADATA_KEY = "sha256"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_S3_EXPLICIT_RE = re.compile(r"^s3://(?P<scheme>[A-Za-z]+)://(?P<rest>.*)$")
_ADVICE = "a custom S3 endpoint needs the form s3://http(s)://host:port/bucket/prefix"


@dataclasses.dataclass(frozen=True)
class S3RepositoryURL:
    """A parsed Triton S3 repository URL.

    Attributes:
        bucket: Bucket name.
        prefix: Key prefix without leading/trailing slash ('' for the bucket root).
        scheme: ``http``/``https`` for a custom endpoint, '' for AWS.
        host: Endpoint host ('' for AWS).
        port: Endpoint port (0 for AWS).
    """

    bucket: str
    prefix: str
    scheme: str = ""
    host: str = ""
    port: int = 0

    @property
    def endpoint_url(self) -> str | None:
        """``scheme://host:port`` for boto3, or None for AWS."""
        return f"{self.scheme}://{self.host}:{self.port}" if self.host else None

    @property
    def triton_uri(self) -> str:
        """The normalised URL to give Triton (explicit scheme and port for custom endpoints)."""
        tail = join_key(self.bucket, self.prefix)
        return f"s3://{self.scheme}://{self.host}:{self.port}/{tail}" if self.host else f"s3://{tail}"

    def key(self, *parts: str) -> str:
        """Object key ``<prefix>/<parts...>`` with no leading slash."""
        return join_key(self.prefix, *parts)


def _split_endpoint(endpoint_url: str) -> tuple[str, str, int]:
    parts = urlsplit(endpoint_url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise SettingsError(
            f"S3 endpoint_url {endpoint_url!r} is invalid: expected http(s)://host[:port]"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname.lower(), port


def _bucket_and_prefix(url: str, rest: str) -> tuple[str, str]:
    segments = [s for s in rest.split("/") if s]
    if not segments:
        raise SettingsError(f"S3 repository URL {url!r} names no bucket: {_ADVICE}")
    bucket = segments[0]
    if not _BUCKET_RE.match(bucket):
        raise SettingsError(
            f"S3 repository URL {url!r}: {bucket!r} is not a valid bucket name (3-63 lowercase "
            f"letters, digits, '.', '-'); {_ADVICE}"
        )
    return bucket, "/".join(segments[1:])


def parse_s3_repository_url(url: str, endpoint_url: str | None = None) -> S3RepositoryURL:
    """Parse and check a Triton S3 repository URL against the boto3 endpoint.

    Accepted forms (Triton's model repository docs, "S3"):

    * ``s3://http(s)://host:port/bucket/prefix`` -- custom endpoint (MinIO, moto, Ceph...).
    * ``s3://host:port/bucket/prefix`` -- normalised to the explicit-scheme form using the scheme
      of ``endpoint_url`` (Triton releases could not parse this with port 80,
      triton-inference-server/server#2165); refused when no ``endpoint_url`` says the scheme.
    * ``s3://bucket/prefix`` -- AWS; refused when a custom ``endpoint_url`` is configured, because
      Triton would read the first segment as the bucket (server#1295).

    Args:
        url: The repository URL.
        endpoint_url: The boto3 ``endpoint_url`` used for pushing (None for AWS).

    Returns:
        :class:`S3RepositoryURL`; its ``triton_uri`` is the normalised form.

    Raises:
        SettingsError: Malformed URL, missing port, invalid bucket, or a Triton endpoint different
            from ``endpoint_url`` (pushing to one store while Triton reads another); the message
            names both values and advises ``s3://http(s)://host:port/bucket/prefix``.
    """
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise SettingsError(f"repository URL {url!r} is not an s3:// URL: {_ADVICE}, or s3://bucket/prefix for AWS")
    endpoint = _split_endpoint(endpoint_url) if endpoint_url else None
    m = _S3_EXPLICIT_RE.match(url)
    if m:
        scheme = m.group("scheme").lower()
        if scheme not in {"http", "https"}:
            raise SettingsError(f"S3 repository URL {url!r} has scheme {scheme!r}: {_ADVICE}")
        hostport, _, rest = m.group("rest").partition("/")
        host, sep, port_text = hostport.rpartition(":")
        if not sep or not host or not port_text.isdigit():
            raise SettingsError(
                f"S3 repository URL {url!r} has no port after host {hostport!r}: {_ADVICE}"
            )
        parsed_host, port = host.lower(), int(port_text)
    else:
        first, _, rest = url[len("s3://"):].partition("/")
        if ":" in first:
            host, _, port_text = first.rpartition(":")
            if not port_text.isdigit() or not host:
                raise SettingsError(f"S3 repository URL {url!r}: bad host:port {first!r}; {_ADVICE}")
            if endpoint is None:
                raise SettingsError(
                    f"S3 repository URL {url!r} gives host:port without a scheme and no S3 "
                    f"endpoint_url says whether it is http or https: {_ADVICE}"
                )
            scheme, parsed_host, port = endpoint[0], host.lower(), int(port_text)
        else:
            if endpoint is not None:
                bucket_guess = [s for s in rest.split("/") if s]
                example = (
                    f"s3://{endpoint[0]}://{endpoint[1]}:{endpoint[2]}/{'/'.join(bucket_guess)}"
                    if bucket_guess
                    else f"s3://{endpoint[0]}://{endpoint[1]}:{endpoint[2]}/<bucket>/<prefix>"
                )
                raise SettingsError(
                    f"S3 repository URL {url!r} has no port, so Triton would read {first!r} as the "
                    f"bucket on AWS while boto3 pushes to {endpoint_url!r}: {_ADVICE} "
                    f"(here {example})"
                )
            bucket, prefix = _bucket_and_prefix(url, url[len("s3://"):])
            return S3RepositoryURL(bucket=bucket, prefix=prefix)
    if not 0 < port < 65536:
        raise SettingsError(f"S3 repository URL {url!r} has port {port}, expected 1-65535")
    if endpoint is not None and (scheme, parsed_host, port) != endpoint:
        raise SettingsError(
            f"S3 repository URL {url!r} points Triton at {scheme}://{parsed_host}:{port} but boto3 "
            f"pushes to endpoint_url {endpoint_url!r}; they must be the same store"
        )
    bucket, prefix = _bucket_and_prefix(url, rest)
    return S3RepositoryURL(bucket=bucket, prefix=prefix, scheme=scheme, host=parsed_host, port=port)


class S3Storage(RepositoryStorage, scheme="s3"):
    """Repository in an S3 bucket (AWS or any S3-compatible endpoint) via boto3.

    Credentials come from the usual boto3 sources (``AWS_ACCESS_KEY_ID``...), which Triton reads
    too.

    Args:
        url: Triton S3 repository URL (see :func:`parse_s3_repository_url`).
        endpoint_url: boto3 endpoint; default: the endpoint in ``url`` (None for AWS).
        client: A boto3 S3 client to use instead of creating one.

    Raises:
        SettingsError: See :func:`parse_s3_repository_url`.
    """

    def __init__(self, url: str, endpoint_url: str | None = None, client=None):
        self.location = parse_s3_repository_url(url, endpoint_url)
        self.uri = self.location.triton_uri
        self.endpoint_url = endpoint_url or self.location.endpoint_url
        if client is None:
            import boto3

            client = boto3.client("s3", endpoint_url=self.endpoint_url)
        self.client = client

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        try:
            yield
        except EndpointConnectionError as exc:
            raise ServiceUnavailableError(f"S3 endpoint {self.endpoint_url!r} unreachable while {what}: {exc}") from exc
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
                raise SettingsError(
                    f"S3 {code} on bucket {self.location.bucket!r} at {self.endpoint_url or 'AWS'} "
                    f"while {what}"
                ) from exc
            raise ServiceUnavailableError(f"S3 error {code or exc} while {what}") from exc
        except BotoCoreError as exc:
            raise ServiceUnavailableError(f"S3 error while {what}: {exc}") from exc

    def _list(self, prefix: str) -> list[dict]:
        out: list[dict] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix):
            out.extend(page.get("Contents", []))
        return out

    def _delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            if chunk:
                self.client.delete_objects(
                    Bucket=self.location.bucket,
                    Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
                )

    def _object_sha256(self, key: str) -> str:
        head = self.client.head_object(Bucket=self.location.bucket, Key=key)
        digest = head.get("Metadata", {}).get(SHA256_METADATA_KEY)
        if digest:
            return digest
        body = self.client.get_object(Bucket=self.location.bucket, Key=key)["Body"]
        return sha256_stream(body)

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.location.bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise

    def _write_serving_config_if_absent(self, layout: VersionLayout, data: bytes | None) -> bool:
        if data is None:
            return False
        key = self.location.key(layout.model_name, CONFIG_FILENAME)
        if self._exists(key):
            return False
        self.client.put_object(Bucket=self.location.bucket, Key=key, Body=data)
        return True

    @override
    def version_uri(self, layout: VersionLayout) -> str:
        return f"{self.uri.rstrip('/')}/{layout.model_name}/{layout.version}"

    @override
    def delete_version(self, layout: VersionLayout) -> bool:
        prefix = self.location.key(layout.model_name, str(layout.version)) + "/"
        with self._errors(f"deleting model '{layout.model_name}' version {layout.version}"):
            keys = [o["Key"] for o in self._list(prefix)]
            if not keys:
                return False
            model_key = prefix + layout.model_filename
            if model_key in keys:  # first: without its model file the version cannot load
                self._delete([model_key])
            self._delete([k for k in keys if k != model_key])
        return True

    # ------------------------------------------------------------------ push
    @override
    def _push_staged(self, push: StagedPush) -> PushOutcome:
        layout, files, staged = push.layout, push.files, push.digests
        bucket = self.location.bucket
        final_prefix = self.location.key(layout.model_name, str(layout.version)) + "/"
        staging_prefix = (
            self.location.key(layout.model_name, layout.staging_dir_name(uuid.uuid4().hex[:12])) + "/"
        )
        created: list[str] = []
        with self._errors(f"pushing model '{layout.model_name}' version {layout.version}"):
            try:
                existing = {o["Key"][len(final_prefix):]: o for o in self._list(final_prefix)}
                if layout.model_filename in existing:
                    digests = {n: self._object_sha256(final_prefix + n) for n in existing if "/" not in n}
                    compare_digests(layout, self.version_uri(layout), digests, staged)
                    written = self._write_serving_config_if_absent(layout, push.serving_config)
                    self._check_listing(layout, final_prefix)
                    return push.outcome(self.version_uri(layout), "unchanged", written)
                # objects without the model file: a crashed push, never loadable -> clean up
                self._delete([final_prefix + n for n in existing])
                self._remove_stale_staging(layout)

                for p in files:
                    key = staging_prefix + p.name
                    self.client.upload_file(
                        str(p), bucket, key, ExtraArgs={"Metadata": {SHA256_METADATA_KEY: staged[p.name]}}
                    )
                    created.append(key)
                    push.progress(p.name)
                if push.verify is not None:
                    with tempfile.TemporaryDirectory(prefix="tritonflow-s3-verify-") as tmp:
                        local = Path(tmp) / str(layout.version)
                        local.mkdir()
                        for p in files:
                            self.client.download_file(bucket, staging_prefix + p.name, str(local / p.name))
                        push.verify(local)
                for p in files:  # model file last: the commit point
                    key = final_prefix + p.name
                    self.client.copy(
                        {"Bucket": bucket, "Key": staging_prefix + p.name}, bucket, key
                    )
                    created.append(key)
                    push.progress(p.name)
                self._delete([staging_prefix + p.name for p in files])
                written = self._write_serving_config_if_absent(layout, push.serving_config)
                self._check_listing(layout, final_prefix)
                return push.outcome(self.version_uri(layout), "published", written)
            except BaseException:
                with contextlib.suppress(Exception):
                    self._delete(created)
                raise

    def _remove_stale_staging(self, layout: VersionLayout) -> None:
        prefix = self.location.key(layout.model_name, f"{STAGING_PREFIX}{layout.version}-")
        now = time.time()
        stale = [
            o["Key"]
            for o in self._list(prefix)
            if now - o["LastModified"].timestamp() > STALE_STAGING_AGE_S
        ]
        self._delete(stale)

    def _check_listing(self, layout: VersionLayout, final_prefix: str) -> None:
        """Require the version's files and the model's serving config to be listed."""
        listed = {o["Key"] for o in self._list(final_prefix)}
        required = [final_prefix + n for n in layout.version_files]
        serving = self.location.key(layout.model_name, CONFIG_FILENAME)
        missing = [k for k in required if k not in listed]
        if not self._exists(serving):
            missing.append(serving)
        if missing:
            raise ServiceUnavailableError(
                f"after the push, s3://{self.location.bucket}/{final_prefix} lacks {missing}; "
                f"listed: {sorted(listed)}"
            )

    # ------------------------------------------------------------------ read
    @override
    @contextlib.contextmanager
    def local_version(self, layout: VersionLayout) -> Iterator[Path]:
        prefix = self.location.key(layout.model_name, str(layout.version)) + "/"
        with self._errors(f"downloading model '{layout.model_name}' version {layout.version}"):
            objects = self._list(prefix)
        if not objects:
            raise VersionNotInRepositoryError(
                f"model '{layout.model_name}' version {layout.version} is not in repository "
                f"{self.uri!r} (no objects under {prefix!r})"
            )
        with tempfile.TemporaryDirectory(prefix="tritonflow-s3-version-") as tmp:
            local = Path(tmp) / str(layout.version)
            local.mkdir()
            with self._errors(f"downloading {prefix!r}"):
                for o in objects:
                    rel = o["Key"][len(prefix):]
                    if not rel or rel.endswith("/"):
                        continue
                    target = local / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    self.client.download_file(self.location.bucket, o["Key"], str(target))
            yield local

    @override
    def list_paths(self) -> list[str]:
        base = self.location.key() + "/" if self.location.prefix else ""
        with self._errors("listing the repository"):
            return sorted(o["Key"][len(base):] for o in self._list(base))

    @override
    def read_serving_config(self, model_name: str) -> bytes | None:
        key = self.location.key(validate_model_name(model_name), CONFIG_FILENAME)
        with self._errors(f"reading {key!r}"):
            if not self._exists(key):
                return None
            return self.client.get_object(Bucket=self.location.bucket, Key=key)["Body"].read()

    @override
    def write_serving_config(self, model_name: str, data: bytes) -> None:
        key = self.location.key(validate_model_name(model_name), CONFIG_FILENAME)
        with self._errors(f"writing {key!r}"):
            self.client.put_object(Bucket=self.location.bucket, Key=key, Body=data)
