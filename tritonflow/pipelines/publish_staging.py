"""Staged files shared between ``model_publish``'s tasks when they run on different workers.

Each publish stage is its own task, and the bulky artefacts (``model.onnx``, ``config.pbtxt``, the
validation sample, the drift reference frame, ...) travel by path under the attempt's staging folder
(:func:`tritonflow.pipelines.publish_common.staging_dir`). On one host, or with a ``TRITONFLOW_HOME``
every worker mounts, that is enough. Celery workers on separate hosts each have their own folder, so
with ``TRITONFLOW_STAGING_URI`` (``s3://bucket/prefix``) set, a task first fetches what the
attempt's earlier tasks stored (:func:`pull_staging`) and stores what it wrote when it ends
(:func:`push_staging`); the ``record`` task removes the attempt's objects (:func:`drop_staging`).
The objects of one attempt sit under ``<prefix>/<model>/<version>/<attempt>/``, the same relative
layout as the local folder, so a retry on any host finds the attempt's files. Objects of abandoned
attempts are left to the bucket's lifecycle rule (a day is ample).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from tritonflow.exceptions import SettingsError
from tritonflow.pipelines.publish_common import STAGING_MARKER
from tritonflow.settings import Settings

log = logging.getLogger(__name__)

__all__ = ["drop_staging", "pull_staging", "push_staging", "staging_location"]


def staging_location(settings: Settings, state: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(bucket, key prefix)`` of the attempt's shared objects; None when nothing is shared.

    Args:
        settings: ``staging_uri`` (``s3://bucket[/prefix]`` or empty).
        state: The publish state (``staging_dir``: ``.../<model>/<version>/<attempt>``).

    Raises:
        SettingsError: ``staging_uri`` is set but not ``s3://bucket[/prefix]``.
    """
    uri = settings.staging_uri.strip()
    if not uri:
        return None
    bucket, _, prefix = uri[len("s3://"):].partition("/") if uri.startswith("s3://") else ("", "", "")
    if not bucket:
        raise SettingsError(f"TRITONFLOW_STAGING_URI={uri!r} is invalid; expected s3://bucket[/prefix] or empty")
    attempt = Path(str(state["staging_dir"])).parts[-3:]
    return bucket, "/".join(p for p in (prefix.strip("/"), *attempt) if p)


def _client(settings: Settings) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=settings.s3_endpoint_url or None)


def _remote(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    """``{relative path: size}`` of the attempt's objects."""
    out: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1:]] = int(obj["Size"])
    return out


def pull_staging(state: Mapping[str, Any], settings: Settings) -> int:
    """Fetch the attempt's shared files missing (or of another size) in the local staging folder.

    Returns:
        The number of files fetched (0 when nothing is shared).
    """
    where = staging_location(settings, state)
    if where is None:
        return 0
    bucket, prefix = where
    s3, local, fetched = _client(settings), Path(str(state["staging_dir"])), 0
    for rel, size in _remote(s3, bucket, prefix).items():
        dest = local / rel
        if dest.is_file() and dest.stat().st_size == size:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, f"{prefix}/{rel}", str(dest))
        fetched += 1
    if fetched:
        log.info("fetched %d staged file(s) of this publish attempt from s3://%s/%s", fetched, bucket, prefix)
    return fetched


def push_staging(state: Mapping[str, Any], settings: Settings) -> int:
    """Store the local staging folder's files that the shared copy lacks (or has at another size).

    Returns:
        The number of files stored (0 when nothing is shared or the folder is gone).
    """
    where = staging_location(settings, state)
    local = Path(str(state["staging_dir"]))
    if where is None or not local.is_dir():
        return 0
    bucket, prefix = where
    s3 = _client(settings)
    remote, stored = _remote(s3, bucket, prefix), 0
    for path in sorted(p for p in local.rglob("*") if p.is_file() and p.name != STAGING_MARKER):
        rel = path.relative_to(local).as_posix()
        if remote.get(rel) == path.stat().st_size:
            continue
        s3.upload_file(str(path), bucket, f"{prefix}/{rel}")
        stored += 1
    if stored:
        log.info("stored %d staged file(s) of this publish attempt in s3://%s/%s", stored, bucket, prefix)
    return stored


def drop_staging(state: Mapping[str, Any], settings: Settings) -> int:
    """Remove the attempt's shared objects (when the publish ends). Errors are logged, never raised.

    Returns:
        The number of objects removed.
    """
    where = staging_location(settings, state)
    if where is None:
        return 0
    bucket, prefix = where
    try:
        s3 = _client(settings)
        keys = [f"{prefix}/{rel}" for rel in _remote(s3, bucket, prefix)]
        for i in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
    except Exception as exc:  # noqa: BLE001 - the publish's outcome is what matters
        log.warning("could not remove the shared staging objects s3://%s/%s: %s", bucket, prefix, exc)
        return 0
    return len(keys)
