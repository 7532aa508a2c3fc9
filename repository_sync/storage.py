"""Triton model repository storage: one small interface, a filesystem/NFS and an S3 backend.

Guarantees of :meth:`RepositoryStorage.push_version`:

* **Immutable versions.** A published ``<model>/<N>/`` is never overwritten. Pushing identical
  content again is a no-op (status ``"unchanged"``; the signature file is not compared because
  ECDSA signatures differ between two signings of the same bytes); different content is refused
  with :class:`RepositoryConflictError` naming the differing files.
* **Never half-visible.** Files are first written to a staging folder ``<model>/.staging-<N>-<token>/``
  inside the model folder, which Triton ignores (its version scan keeps only names ``std::stoll``
  can parse; a leading ``.`` cannot be parsed). The optional ``verify`` callback (the signature
  check) runs on the staged copy *at the destination*, and only then is the version made visible.
* **A failed push leaves the repository as it was**: the staging folder, any partly copied final
  objects and a model folder created by this push are removed before the error propagates. A
  process that dies mid-push leaves at most a staging folder (filesystem) or staging objects / a
  version prefix without its model file (S3): never loadable, and cleaned by the next push.

Filesystem/NFS: staging is on the same filesystem as the version (same model folder), files are
fsynced, then ``os.rename(staging, <N>)`` publishes the folder atomically (POSIX rename; on NFS the
server performs it as one operation). A concurrent publisher that wins the rename makes ours fail
with ``ENOTEMPTY``; we then compare contents as for a re-publish.

S3 has no atomic rename, so the design relies on what Triton tolerates: Triton (explicit mode)
reads a version only when asked to load it, and a version folder without its model file cannot
load. The objects are uploaded under a staging prefix, downloaded back and verified, then copied
server-side into ``<prefix>/<model>/<N>/`` with **the model file copied last** (the commit point),
the staging prefix is deleted, and finally the listing of ``<prefix>/<model>/<N>/`` is checked to
hold the model file, the intended config and the signature. tritonflow's loader additionally
verifies the signature before every load, so a version prefix that lacks any signed file is refused.

Serving config (``<model>/config.pbtxt``): Triton has one config per model, the champion's. A push
writes it only when the model has none yet (first version); otherwise it is left untouched. Every
version carries the config it was built for in ``<N>/config.pbtxt.intended`` (signed with the model
file) and :mod:`repository_sync.triton_client` loads a version by passing that config through the
repository load API's ``config`` parameter, which overrides the on-disk config for that load. So
publishing a challenger whose config differs never changes the champion's serving config; a
promotion that wants the new config to be the on-disk default calls
:meth:`RepositoryStorage.write_serving_config` explicitly.

S3 URLs follow Triton's syntax: ``s3://bucket/prefix`` for AWS and
``s3://http(s)://host:port/bucket/prefix`` for any other endpoint. See :func:`parse_s3_repository_url`.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import errno
import hashlib
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from typing_extensions import override

from repository_sync.layout import (
    CONFIG_FILENAME,
    STAGING_PREFIX,
    VersionLayout,
    check_layout,
    join_key,
    validate_model_name,
    walk_local_repository,
)
from tritonflow.exceptions import (
    DataError,
    RepositoryConflictError,
    ServiceUnavailableError,
    SettingsError,
)

#: Age (seconds) after which a staging folder/prefix left by a crashed push is removed by the next
#: push of the same version. Long enough that a concurrent, slow push is not disturbed.
STALE_STAGING_AGE_S = 3600.0
#: S3 object metadata key holding the SHA-256 hex of the object's bytes (for idempotency checks).
SHA256_METADATA_KEY = "sha256"

ProgressCallback = Callable[[str], None]
VerifyCallback = Callable[[Path], object]


@dataclasses.dataclass(frozen=True)
class PushOutcome:
    """Result of a push.

    Attributes:
        version_uri: Where the version lives (folder path or ``s3://...`` URI).
        status: ``"published"`` (this push made it visible) or ``"unchanged"`` (identical content
            was already published).
        files: File names in the version folder.
        bytes: Total size of those files.
        serving_config_written: Whether this push wrote ``<model>/config.pbtxt`` (first version).
    """

    version_uri: str
    status: str
    files: tuple[str, ...]
    bytes: int
    serving_config_written: bool


def sha256_file(path: Path) -> str:
    """SHA-256 hex of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _source_files(layout: VersionLayout, source_dir: Path) -> list[Path]:
    """Files of a staged version folder, the model file last; refuses sub-folders and symlinks."""
    if not source_dir.is_dir():
        raise DataError(f"staged version folder {str(source_dir)!r} does not exist")
    files = []
    for p in sorted(source_dir.iterdir()):
        if p.is_symlink() or not p.is_file():
            raise DataError(
                f"staged version folder {str(source_dir)!r} holds {p.name!r}, which is not a plain "
                "file; expected only plain files (model file, intended config, signature)"
            )
        files.append(p)
    names = [p.name for p in files]
    if layout.model_filename not in names:
        raise DataError(
            f"staged version folder {str(source_dir)!r} lacks the model file "
            f"{layout.model_filename!r}; it holds {names}"
        )
    files.sort(key=lambda p: p.name == layout.model_filename)
    return files


def _compare_digests(
    layout: VersionLayout, where: str, existing: dict[str, str], staged: dict[str, str]
) -> None:
    """Raise :class:`RepositoryConflictError` unless both digest maps match (signature ignored)."""
    sig = layout.signature_filename
    if sig not in existing:
        raise RepositoryConflictError(
            f"model '{layout.model_name}' version {layout.version} already exists at {where} "
            f"without its signature file {sig!r}; versions are immutable: remove it by hand or "
            "publish a new version"
        )
    a = {k: v for k, v in existing.items() if k != sig}
    b = {k: v for k, v in staged.items() if k != sig}
    if a == b:
        return
    differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    raise RepositoryConflictError(
        f"model '{layout.model_name}' version {layout.version} already exists at {where} with "
        f"different content (files differing: {', '.join(differing)}); published versions are "
        "immutable: register and publish a new model version instead"
    )


class RepositoryStorage(abc.ABC):
    """A Triton model repository that versions can be pushed to and read from."""

    #: The repository URI as Triton is given it (folder path or normalised ``s3://`` URL).
    uri: str

    @abc.abstractmethod
    def push_version(
        self,
        layout: VersionLayout,
        source_dir: Path,
        *,
        serving_config: bytes | None = None,
        verify: VerifyCallback | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> PushOutcome:
        """Publish a staged version folder atomically (see the module docstring).

        Args:
            layout: Model name, version and model file name.
            source_dir: Local folder with the version's files (model file, intended config,
                signature); plain files only.
            serving_config: Bytes for ``<model>/config.pbtxt``, written only if the model has no
                serving config yet.
            verify: Called with a local path of the staged copy at the destination before it is
                made visible (e.g. the signature check); raising aborts the push.
            on_progress: Called with each file name after it has been written/copied.

        Returns:
            :class:`PushOutcome`.

        Raises:
            RepositoryConflictError: The version exists with different content.
            DataError: Bad staged folder, or ``verify`` refused it.
            ServiceUnavailableError: The store could not be reached (S3).
        """

    @abc.abstractmethod
    def local_version(self, layout: VersionLayout) -> contextlib.AbstractContextManager[Path]:
        """Context manager yielding a local folder with the version's files (S3: a temp copy).

        Raises:
            DataError: The version does not exist.
        """

    @abc.abstractmethod
    def list_paths(self) -> list[str]:
        """Repository content as relative POSIX file paths (for :func:`layout.check_layout`)."""

    @abc.abstractmethod
    def read_serving_config(self, model_name: str) -> bytes | None:
        """``<model>/config.pbtxt`` bytes, or None if absent."""

    @abc.abstractmethod
    def write_serving_config(self, model_name: str, data: bytes) -> None:
        """Replace ``<model>/config.pbtxt`` (promotion only; publishing never calls this)."""

    @abc.abstractmethod
    def version_uri(self, layout: VersionLayout) -> str:
        """URI of the version folder."""

    def check_layout(self) -> None:
        """Validate the whole repository.

        Raises:
            RepositoryLayoutError: One line per problem, naming the model and the folder.
        """
        check_layout(self.list_paths(), where=f"repository {self.uri!r}")


# =========================================================================== filesystem / NFS
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_fsync(src: Path, dst: Path) -> int:
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())
    return dst.stat().st_size


def _local_digests(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in folder.iterdir() if p.is_file()}


class FileSystemStorage(RepositoryStorage):
    """Repository in a local or NFS-mounted folder (atomic by ``os.rename``).

    Args:
        root: Repository folder (created if missing).
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)

    @override
    def version_uri(self, layout: VersionLayout) -> str:
        return str(self.root / layout.version_dir)

    def _remove_stale_staging(self, model_dir: Path, layout: VersionLayout) -> None:
        now = time.time()
        for p in model_dir.glob(f"{STAGING_PREFIX}{layout.version}-*"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > STALE_STAGING_AGE_S:
                    shutil.rmtree(p)

    def _existing(self, layout: VersionLayout, final: Path, staged: dict[str, str]) -> bool:
        """True if ``final`` holds the same content; raises on a conflict; False if absent/empty."""
        if not final.exists() or (final.is_dir() and not any(final.iterdir())):
            return False
        if not final.is_dir():
            raise RepositoryConflictError(f"{str(final)!r} exists and is not a folder")
        _compare_digests(layout, str(final), _local_digests(final), staged)
        return True

    def _write_serving_config_if_absent(self, model_dir: Path, data: bytes | None) -> bool:
        if data is None:
            return False
        target = model_dir / CONFIG_FILENAME
        if target.exists():
            return False
        tmp = model_dir / f".{CONFIG_FILENAME}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, target)  # atomic, refuses to replace a config written meanwhile
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(model_dir)
        return True

    @override
    def push_version(self, layout: VersionLayout, source_dir: Path, *, serving_config: bytes | None = None,
                     verify: VerifyCallback | None = None,
                     on_progress: ProgressCallback | None = None) -> PushOutcome:
        source_dir = Path(source_dir)
        files = _source_files(layout, source_dir)
        staged_digests = {p.name: sha256_file(p) for p in files}
        names = tuple(sorted(staged_digests))
        total = sum(p.stat().st_size for p in files)
        self.root.mkdir(parents=True, exist_ok=True)
        model_dir = self.root / layout.model_dir
        final = self.root / layout.version_dir
        created_model_dir = not model_dir.exists()
        model_dir.mkdir(exist_ok=True)
        staging = model_dir / layout.staging_dir_name(uuid.uuid4().hex[:12])
        try:
            self._remove_stale_staging(model_dir, layout)
            if self._existing(layout, final, staged_digests):
                written = self._write_serving_config_if_absent(model_dir, serving_config)
                return PushOutcome(str(final), "unchanged", names, total, written)
            staging.mkdir()
            for p in files:
                _copy_fsync(p, staging / p.name)
                if on_progress:
                    on_progress(p.name)
            _fsync_dir(staging)
            if verify is not None:
                verify(staging)
            try:
                os.rename(staging, final)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # a concurrent push of the same version won the rename
                self._existing(layout, final, staged_digests)
                shutil.rmtree(staging, ignore_errors=True)
                written = self._write_serving_config_if_absent(model_dir, serving_config)
                return PushOutcome(str(final), "unchanged", names, total, written)
            _fsync_dir(model_dir)
            written = self._write_serving_config_if_absent(model_dir, serving_config)
            return PushOutcome(str(final), "published", names, total, written)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if created_model_dir:
                with contextlib.suppress(OSError):
                    model_dir.rmdir()  # only if still empty
            raise

    @override
    @contextlib.contextmanager
    def local_version(self, layout: VersionLayout) -> Iterator[Path]:
        path = self.root / layout.version_dir
        if not path.is_dir():
            raise DataError(
                f"model '{layout.model_name}' version {layout.version} is not in repository "
                f"{self.uri!r} (no folder {str(path)!r})"
            )
        yield path

    @override
    def list_paths(self) -> list[str]:
        return walk_local_repository(self.root) if self.root.exists() else []

    @override
    def read_serving_config(self, model_name: str) -> bytes | None:
        path = self.root / validate_model_name(model_name) / CONFIG_FILENAME
        return path.read_bytes() if path.is_file() else None

    @override
    def write_serving_config(self, model_name: str, data: bytes) -> None:
        model_dir = self.root / validate_model_name(model_name)
        model_dir.mkdir(parents=True, exist_ok=True)
        tmp = model_dir / f".{CONFIG_FILENAME}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, model_dir / CONFIG_FILENAME)
        _fsync_dir(model_dir)


# =========================================================================== S3
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


class S3Storage(RepositoryStorage):
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
        h = hashlib.sha256()
        for block in iter(lambda: body.read(1 << 20), b""):
            h.update(block)
        return h.hexdigest()

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

    # ------------------------------------------------------------------ push
    @override
    def push_version(self, layout: VersionLayout, source_dir: Path, *, serving_config: bytes | None = None,
                     verify: VerifyCallback | None = None,
                     on_progress: ProgressCallback | None = None) -> PushOutcome:
        source_dir = Path(source_dir)
        files = _source_files(layout, source_dir)
        staged = {p.name: sha256_file(p) for p in files}
        names = tuple(sorted(staged))
        total = sum(p.stat().st_size for p in files)
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
                    _compare_digests(layout, self.version_uri(layout), digests, staged)
                    written = self._write_serving_config_if_absent(layout, serving_config)
                    self._check_listing(layout, final_prefix)
                    return PushOutcome(self.version_uri(layout), "unchanged", names, total, written)
                # objects without the model file: a crashed push, never loadable -> clean up
                self._delete([final_prefix + n for n in existing])
                self._remove_stale_staging(layout)

                for p in files:
                    key = staging_prefix + p.name
                    self.client.upload_file(
                        str(p), bucket, key, ExtraArgs={"Metadata": {SHA256_METADATA_KEY: staged[p.name]}}
                    )
                    created.append(key)
                    if on_progress:
                        on_progress(p.name)
                if verify is not None:
                    with tempfile.TemporaryDirectory(prefix="tritonflow-s3-verify-") as tmp:
                        local = Path(tmp) / str(layout.version)
                        local.mkdir()
                        for p in files:
                            self.client.download_file(bucket, staging_prefix + p.name, str(local / p.name))
                        verify(local)
                for p in files:  # model file last: the commit point
                    key = final_prefix + p.name
                    self.client.copy(
                        {"Bucket": bucket, "Key": staging_prefix + p.name}, bucket, key
                    )
                    created.append(key)
                    if on_progress:
                        on_progress(p.name)
                self._delete([staging_prefix + p.name for p in files])
                written = self._write_serving_config_if_absent(layout, serving_config)
                self._check_listing(layout, final_prefix)
                return PushOutcome(self.version_uri(layout), "published", names, total, written)
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
            raise DataError(
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


def open_repository(uri: str | os.PathLike[str], *, endpoint_url: str | None = None) -> RepositoryStorage:
    """Storage backend for a repository URI: ``s3://...`` -> :class:`S3Storage`, else a folder.

    Args:
        uri: Folder path (``file://`` accepted) or Triton S3 URL.
        endpoint_url: boto3 endpoint for S3 (must match the URL's host:port); empty
            means the URL's own endpoint.

    Raises:
        SettingsError: Empty URI or an invalid S3 URL.
    """
    uri = str(uri)
    if not uri:
        raise SettingsError("repository URI is empty: expected a folder or an s3:// URL (TRITONFLOW_REPOSITORY_URI)")
    if uri.startswith("s3://"):
        return S3Storage(uri, endpoint_url=endpoint_url or None)
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if "://" in uri:
        raise SettingsError(f"repository URI {uri!r} has an unsupported scheme: expected a folder or s3://")
    return FileSystemStorage(uri)
