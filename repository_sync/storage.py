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

Layout: the interface and shared helpers are in :mod:`repository_sync.storage_base`, the backends
in :mod:`repository_sync.filesystem_storage` and :mod:`repository_sync.s3_storage`; this module
chooses one for a URI (:func:`open_repository`) and re-exports their public names.
"""

from __future__ import annotations

import os

from ground.checksums import sha256_file
from ground.exceptions import SettingsError
from repository_sync.filesystem_storage import FileSystemStorage
from repository_sync.s3_storage import (
    SHA256_METADATA_KEY,
    S3RepositoryURL,
    S3Storage,
    parse_s3_repository_url,
)
from repository_sync.storage_base import (
    STALE_STAGING_AGE_S,
    ProgressCallback,
    PushOutcome,
    RepositoryStorage,
    VerifyCallback,
)

__all__ = [
    "FileSystemStorage",
    "ProgressCallback",
    "PushOutcome",
    "RepositoryStorage",
    "S3RepositoryURL",
    "S3Storage",
    "SHA256_METADATA_KEY",
    "STALE_STAGING_AGE_S",
    "VerifyCallback",
    "open_repository",
    "parse_s3_repository_url",
    "sha256_file",
]


def open_repository(uri: str | os.PathLike[str], *, endpoint_url: str | None = None) -> RepositoryStorage:
    """Storage backend for a repository URI, by its scheme (``s3://...`` -> :class:`S3Storage`).

    A folder path (``file://`` accepted) is a :class:`FileSystemStorage`. Backends register
    themselves by scheme (:class:`RepositoryStorage`'s ``BACKENDS``); a new one is a module
    defining ``class X(RepositoryStorage, scheme="...")``, imported here.

    Args:
        uri: Folder path (``file://`` accepted) or a URL of a registered scheme.
        endpoint_url: Endpoint of an object store (S3: must match the URL's host:port); empty
            means the URL's own endpoint.

    Raises:
        SettingsError: Empty URI, an unregistered scheme, or an invalid URL for its backend.
    """
    uri = str(uri)
    if not uri:
        raise SettingsError("repository URI is empty: expected a folder or an s3:// URL (TRITONFLOW_REPOSITORY_URI)")
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    backend = RepositoryStorage.BACKENDS.get(scheme)
    if backend is None:
        expected = sorted(k + "://" for k in RepositoryStorage.BACKENDS if k)
        raise SettingsError(f"repository URI {uri!r} has an unsupported scheme: expected a folder or one of {expected}")
    if scheme:
        return backend(uri, endpoint_url=endpoint_url or None)  # type: ignore[call-arg]
    return backend(uri)  # type: ignore[call-arg]
