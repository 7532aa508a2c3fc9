"""Work files one task hands to another, shared when the tasks run on different workers.

Several stages write files under ``settings.home`` that a later task reads by path:

- ``model_publish``'s staging folder (``<home>/staging/<model>/<version>/<attempt>/``:
  ``model.onnx``, ``config.pbtxt``, the validation sample, the drift reference frame, ...);
- ``shadow_evaluation``'s replay (``<home>/shadow/<model>/<run>/``: the predictions ``compare``
  reads, the challenger's expected predictions the canary reads);
- ``retrain``'s training window (``<home>/retrain/<model>/windows/<hash>.parquet``).

On one host, or with a ``TRITONFLOW_HOME`` every worker mounts, the path is enough. Celery workers
on separate hosts each have their own home, so with ``TRITONFLOW_STAGING_URI``
(``s3://bucket[/prefix]``) set, the writer stores what it wrote (:func:`share`) and the reader
first fetches what it lacks (:func:`fetch`); the object key is the path relative to the home, so
every host finds a file under the same name (the home's path is the same on every worker). A path
outside the home (a user's dataset) is never shared, and nothing is shared without the setting.
Objects of abandoned work are left to the bucket's lifecycle rule (a day is ample).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ground.exceptions import SettingsError
from ground.settings import Settings
from tritonflow.pipelines.publish_common import STAGING_MARKER

log = logging.getLogger(__name__)

__all__ = ["MARKER_NAMES", "discard", "fetch", "location", "share"]

#: Files never shared: the publish attempt's liveness marker (each host touches its own).
MARKER_NAMES = (STAGING_MARKER,)


def location(settings: Settings, path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """``(bucket, key)`` of ``path`` in the shared store; None when nothing is shared.

    Args:
        settings: ``staging_uri`` (``s3://bucket[/prefix]`` or empty) and ``home``.
        path: A file or folder under ``settings.home``.

    Returns:
        None without ``staging_uri`` or for a path outside the home.

    Raises:
        SettingsError: ``staging_uri`` is set but not ``s3://bucket[/prefix]``.
    """
    uri = settings.staging_uri.strip()
    if not uri:
        return None
    bucket, _, prefix = uri[len("s3://"):].partition("/") if uri.startswith("s3://") else ("", "", "")
    if not bucket:
        raise SettingsError(f"TRITONFLOW_STAGING_URI={uri!r} is invalid; expected s3://bucket[/prefix] or empty")
    try:
        rel = Path(os.path.abspath(path)).relative_to(Path(os.path.abspath(settings.home)))
    except ValueError:
        return None
    return bucket, "/".join(p for p in (prefix.strip("/"), rel.as_posix()) if p and p != ".")


def _client(settings: Settings) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=settings.s3_endpoint_url or None)


def _remote(s3: Any, bucket: str, key: str) -> dict[str, int]:
    """``{relative path: size}`` of the object at ``key`` (relative path ``""``) and those under it."""
    out: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        for obj in page.get("Contents", []):
            k = obj["Key"]
            if k == key:
                out[""] = int(obj["Size"])
            elif k.startswith(key + "/"):
                out[k[len(key) + 1:]] = int(obj["Size"])
    return out


def fetch(settings: Settings, path: str | os.PathLike[str]) -> int:
    """Fetch the shared copy of ``path`` (a file, or a folder's files) where this host lacks it.

    A local file of the same size is kept. Returns the number of files fetched (0 when nothing is
    shared or the store has nothing under that name).
    """
    where = location(settings, path)
    if where is None:
        return 0
    bucket, key = where
    s3, local, fetched = _client(settings), Path(path), 0
    for rel, size in _remote(s3, bucket, key).items():
        dest = local / rel if rel else local
        if dest.is_file() and dest.stat().st_size == size:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, f"{key}/{rel}" if rel else key, str(dest))
        fetched += 1
    if fetched:
        log.info("fetched %d shared work file(s) of %s from s3://%s/%s", fetched, path, bucket, key)
    return fetched


def share(settings: Settings, path: str | os.PathLike[str]) -> int:
    """Store ``path`` (a file, or a folder's files) in the shared store where its copy differs.

    Returns the number of files stored (0 when nothing is shared or the path is gone).
    """
    where = location(settings, path)
    local = Path(path)
    if where is None or not local.exists():
        return 0
    bucket, key = where
    s3 = _client(settings)
    remote, stored = _remote(s3, bucket, key), 0
    files = [("", local)] if local.is_file() else [
        (p.relative_to(local).as_posix(), p) for p in sorted(local.rglob("*"))
        if p.is_file() and p.name not in MARKER_NAMES]
    for rel, file in files:
        if remote.get(rel) == file.stat().st_size:
            continue
        s3.upload_file(str(file), bucket, f"{key}/{rel}" if rel else key)
        stored += 1
    if stored:
        log.info("stored %d work file(s) of %s in s3://%s/%s", stored, path, bucket, key)
    return stored


def discard(settings: Settings, path: str | os.PathLike[str]) -> int:
    """Remove the shared copy of ``path`` (when the work is done). Errors are logged, never raised.

    Returns the number of objects removed.
    """
    where = location(settings, path)
    if where is None:
        return 0
    bucket, key = where
    try:
        s3 = _client(settings)
        keys = [f"{key}/{rel}" if rel else key for rel in _remote(s3, bucket, key)]
        for i in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
    except Exception as exc:  # noqa: BLE001 - the work's outcome is what matters
        log.warning("could not remove the shared work objects s3://%s/%s: %s", bucket, key, exc)
        return 0
    return len(keys)
