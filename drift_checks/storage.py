"""Tiny object store over a local folder or an S3 prefix (boto3), used by every drift artefact.

A root is either a filesystem folder (``/data/logs``) or ``s3://bucket/prefix``; S3-compatible
endpoints (MinIO, moto) are given by ``endpoint_url``. Writes are atomic: on a filesystem the
bytes go to a temporary file in the same folder which is then renamed over the target
(``os.replace``); on S3 a single ``put_object`` is atomic by definition. ``Store(root)`` returns
the :class:`FolderStore` or :class:`S3Store` for the root; both share the :class:`Store` interface.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

from ground.exceptions import ServiceUnavailableError, WindowError


class Store:
    """Keys (``/``-separated, relative) under a root folder or S3 prefix.

    ``Store(root)`` gives a :class:`FolderStore` for a folder and an :class:`S3Store` for an
    ``s3://`` root; both implement the same operations, so drift code never asks which it has
    (except to hand a path to Arrow or Spark, through :attr:`is_s3`).

    Args:
        root: Folder path or ``s3://bucket/prefix``.
        endpoint_url: S3 endpoint (e.g. ``http://127.0.0.1:9000``); ``None`` = AWS default.

    Raises:
        WindowError: ``root`` is empty or an ``s3://`` URI without a bucket.
    """

    #: True for an S3 root.
    is_s3: bool = False
    #: Backends by the URI scheme of their roots (``""``: a local folder); a subclass registers
    #: itself with ``class MyStore(Store, scheme="gs")``.
    BACKENDS: dict[str, type[Store]] = {}

    def __init_subclass__(cls, scheme: str | None = None, **kwargs: Any) -> None:
        """Register a backend for the roots of ``scheme`` (``None``: not a backend of its own)."""
        super().__init_subclass__(**kwargs)
        if scheme is not None:
            Store.BACKENDS[scheme] = cls

    def __new__(cls, root: str | os.PathLike[str] | None = None, endpoint_url: str | None = None) -> "Store":
        """Pick the backend of ``root``'s scheme when ``Store`` itself is called (a subclass is kept).

        Raises:
            WindowError: No backend is registered for the root's scheme.
        """
        if cls is Store:
            text = str(root or "")
            scheme = text.split("://", 1)[0] if "://" in text else ""
            if scheme not in Store.BACKENDS:
                raise WindowError(f"storage root {text!r} has the scheme {scheme!r}; expected a folder or one of "
                                  f"{sorted(k + '://' for k in Store.BACKENDS if k)}")
            cls = Store.BACKENDS[scheme]
        return super().__new__(cls)

    def __init__(self, root: str | os.PathLike[str], endpoint_url: str | None = None):
        root = str(root)
        if not root:
            raise WindowError("storage root is empty; expected a folder or s3://bucket/prefix")
        self.root = root.rstrip("/")
        self.endpoint_url = endpoint_url or None

    def uri(self, key: str) -> str:
        """Full URI of ``key`` (``s3://bucket/prefix/key`` or an absolute path)."""
        raise NotImplementedError

    def put_bytes(self, key: str, data: bytes) -> str:
        """Write ``data`` at ``key`` atomically; return its URI."""
        raise NotImplementedError

    def get_bytes(self, key: str) -> bytes:
        """Read ``key``.

        Raises:
            FileNotFoundError: The key does not exist.
        """
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (relative to the root), sorted; temp files excluded."""
        return sorted(k for k in self._iter(prefix) if not Path(k).name.startswith("."))

    def _iter(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix``, temp files included, in no particular order."""
        raise NotImplementedError


class FolderStore(Store, scheme=""):
    """A :class:`Store` in a filesystem folder: atomic writes by temporary file + ``os.replace``."""

    def uri(self, key: str) -> str:
        """Absolute path of ``key``."""
        return str(Path(self.root) / key)

    def put_bytes(self, key: str, data: bytes) -> str:
        """Write ``data`` at ``key`` atomically; return its path."""
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
        return (Path(self.root) / key).read_bytes()

    def exists(self, key: str) -> bool:
        """Whether ``key`` is a file."""
        return (Path(self.root) / key).is_file()

    def _iter(self, prefix: str) -> Iterator[str]:
        base = Path(self.root) / prefix.strip("/")
        if not base.is_dir():
            return
        for p in base.rglob("*"):
            if p.is_file():
                yield p.relative_to(self.root).as_posix()


class S3Store(Store, scheme="s3"):
    """A :class:`Store` under an S3 prefix (boto3); a single ``put_object`` is atomic."""

    is_s3 = True

    def __init__(self, root: str | os.PathLike[str], endpoint_url: str | None = None):
        super().__init__(root, endpoint_url)
        rest = self.root[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket or ":" in bucket:
            raise WindowError(
                f"S3 root {str(root)!r} has no valid bucket; expected s3://bucket/prefix with the "
                "endpoint given separately as endpoint_url"
            )
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The boto3 S3 client (created lazily)."""
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint_url)
        return self._client

    def _key(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        """``s3://bucket/prefix/key``."""
        return f"s3://{self.bucket}/{self._key(key)}"

    def put_bytes(self, key: str, data: bytes) -> str:
        """Write ``data`` at ``key`` (one ``put_object``); return its URI.

        Raises:
            ServiceUnavailableError: The endpoint could not be reached.
        """
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:  # botocore errors: endpoint down, credentials
            if _is_connection_error(exc):
                raise ServiceUnavailableError(f"S3 endpoint {self.endpoint_url}: {exc}") from exc
            raise
        return self.uri(key)

    def get_bytes(self, key: str) -> bytes:
        """Read ``key``.

        Raises:
            FileNotFoundError: The key does not exist.
        """
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(self.uri(key)) from None

    def exists(self, key: str) -> bool:
        """Whether the object ``key`` exists."""
        resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(key), MaxKeys=1)
        return any(o["Key"] == self._key(key) for o in resp.get("Contents", []))

    def _iter(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix.strip("/")) + "/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for obj in page.get("Contents", []):
                yield obj["Key"][strip:]


def _is_connection_error(exc: Exception) -> bool:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import EndpointConnectionError

    return isinstance(exc, (BotoConnectionError, EndpointConnectionError))


def new_object_name(suffix: str = ".parquet") -> str:
    """A unique object name (uuid4 hex + suffix)."""
    return f"{uuid.uuid4().hex}{suffix}"
