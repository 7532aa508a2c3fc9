"""Tiny object store over a local folder or an S3 prefix (boto3), used by every drift artefact.

A root is either a filesystem folder (``/data/logs``) or ``s3://bucket/prefix``; S3-compatible
endpoints (MinIO, moto) are given by ``endpoint_url``. Writes are atomic: on a filesystem the
bytes go to a temporary file in the same folder which is then renamed over the target
(``os.replace``); on S3 a single ``put_object`` is atomic by definition.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

from tritonflow.exceptions import ServiceUnavailableError, WindowError


class Store:
    """Keys (``/``-separated, relative) under a root folder or S3 prefix.

    Args:
        root: Folder path or ``s3://bucket/prefix``.
        endpoint_url: S3 endpoint (e.g. ``http://127.0.0.1:9000``); ``None`` = AWS default.

    Raises:
        WindowError: ``root`` is empty or an ``s3://`` URI without a bucket.
    """

    def __init__(self, root: str | os.PathLike[str], endpoint_url: str | None = None):
        root = str(root)
        if not root:
            raise WindowError("storage root is empty; expected a folder or s3://bucket/prefix")
        self.root = root.rstrip("/")
        self.endpoint_url = endpoint_url or None
        self.is_s3 = root.startswith("s3://")
        if self.is_s3:
            rest = root[len("s3://"):]
            bucket, _, prefix = rest.partition("/")
            if not bucket or ":" in bucket:
                raise WindowError(
                    f"S3 root {root!r} has no valid bucket; expected s3://bucket/prefix with the "
                    "endpoint given separately as endpoint_url"
                )
            self.bucket, self.prefix = bucket, prefix.strip("/")
            self._client = None

    # ------------------------------------------------------------------ helpers
    @property
    def client(self):
        """The boto3 S3 client (created lazily)."""
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint_url)
        return self._client

    def _key(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        """Full URI of ``key`` (``s3://bucket/prefix/key`` or an absolute path)."""
        if self.is_s3:
            return f"s3://{self.bucket}/{self._key(key)}"
        return str(Path(self.root) / key)

    # ------------------------------------------------------------------ operations
    def put_bytes(self, key: str, data: bytes) -> str:
        """Write ``data`` at ``key`` atomically; return its URI."""
        if self.is_s3:
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
            except Exception as exc:  # botocore errors: endpoint down, credentials
                if _is_connection_error(exc):
                    raise ServiceUnavailableError(f"S3 endpoint {self.endpoint_url}: {exc}") from exc
                raise
            return self.uri(key)
        path = Path(self.root) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return str(path)

    def get_bytes(self, key: str) -> bytes:
        """Read ``key``.

        Raises:
            FileNotFoundError: The key does not exist.
        """
        if self.is_s3:
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
            except self.client.exceptions.NoSuchKey:
                raise FileNotFoundError(self.uri(key)) from None
        return (Path(self.root) / key).read_bytes()

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        if self.is_s3:
            resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(key), MaxKeys=1)
            return any(o["Key"] == self._key(key) for o in resp.get("Contents", []))
        return (Path(self.root) / key).is_file()

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (relative to the root), sorted; temp files excluded."""
        return sorted(k for k in self._iter(prefix) if not Path(k).name.startswith("."))

    def _iter(self, prefix: str) -> Iterator[str]:
        prefix = prefix.strip("/")
        if self.is_s3:
            full = self._key(prefix) + "/"
            strip = len(self.prefix) + 1 if self.prefix else 0
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    yield obj["Key"][strip:]
            return
        base = Path(self.root) / prefix
        if not base.is_dir():
            return
        for p in base.rglob("*"):
            if p.is_file():
                yield p.relative_to(self.root).as_posix()


def _is_connection_error(exc: Exception) -> bool:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import EndpointConnectionError

    return isinstance(exc, (BotoConnectionError, EndpointConnectionError))


def new_object_name(suffix: str = ".parquet") -> str:
    """A unique object name (uuid4 hex + suffix)."""
    return f"{uuid.uuid4().hex}{suffix}"
