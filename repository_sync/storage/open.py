"""Open a repository's storage backend by the scheme of its URI.

Importing this module registers every backend (each registers itself by ``scheme=`` on its
class); a new backend's module is imported here. The guarantees every backend keeps are in
:mod:`repository_sync.storage`.
"""

from __future__ import annotations

import os

from ground.exceptions import SettingsError
from repository_sync.storage import filesystem, s3  # noqa: F401 -- importing a backend registers it
from repository_sync.storage.base import RepositoryStorage

__all__ = ["open_repository"]


def open_repository(uri: str | os.PathLike[str], *, endpoint_url: str | None = None) -> RepositoryStorage:
    """Storage backend for a repository URI, by its scheme (``s3://...`` -> an ``S3Storage``).

    A folder path (``file://`` accepted) is a
    :class:`~repository_sync.storage.filesystem.FileSystemStorage`. Backends register
    themselves by scheme (:class:`RepositoryStorage`'s ``BACKENDS``); a new one is a module
    defining ``class X(RepositoryStorage, scheme="...")``, imported in this module.

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
