"""XCom discipline: tasks pass artefact *references*, never payloads.

On Airflow 3.0 a downstream task could hang in "running" while pulling a few-hundred-KB XCom
(apache/airflow#48852). tritonflow tasks therefore write histograms, profiles and reports to object
storage (or a shared folder) and return an :class:`ArtifactRef` ``{"uri", "sha256", "bytes"}``;
:func:`check_xcom_size` refuses any return value whose serialised form exceeds
``Settings.max_xcom_bytes`` (default 48 KiB), naming the task and the size.

Example::

    @task(execution_timeout=timedelta(minutes=5))
    @limit_xcom_size
    def histograms(window_uri: str) -> ArtifactRef:
        data = compute(...).tobytes()
        uri = store.put("histograms/...", data)
        return artifact_ref(uri, data)
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any, Callable, Mapping, TypedDict, TypeVar

from ground.exceptions import DataError

F = TypeVar("F", bound=Callable[..., Any])

#: Bytes read at a time when hashing a file.
HASH_CHUNK_BYTES = 1024 * 1024
#: Keys every artefact reference carries.
REF_KEYS = ("uri", "sha256", "bytes")
#: Attribute :func:`limit_xcom_size` sets on the callables it guards (found through other decorators).
XCOM_LIMITED_ATTR = "__tritonflow_xcom_limited__"


class XComTooLargeError(DataError):
    """A task's return value serialises to more bytes than the XCom limit allows."""


class ArtifactRef(TypedDict):
    """Reference to an artefact in storage, small enough for XCom.

    Attributes:
        uri: Where the artefact lives (``s3://bucket/key``, ``file:///...`` or a path).
        sha256: Lower-case hex SHA-256 of the artefact's bytes.
        bytes: Size of the artefact in bytes.
    """

    uri: str
    sha256: str
    bytes: int


def artifact_ref(uri: str, data: bytes) -> ArtifactRef:
    """Build the reference of ``data`` stored at ``uri``.

    Args:
        uri: Location the caller wrote ``data`` to.
        data: The exact bytes written.

    Raises:
        DataError: ``uri`` is empty or ``data`` is not bytes.
    """
    if not isinstance(uri, str) or not uri:
        raise DataError(f"artifact uri={uri!r} is invalid: expected a non-empty string")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DataError(f"artifact data is {type(data).__name__}: expected bytes")
    raw = bytes(data)
    return ArtifactRef(uri=uri, sha256=hashlib.sha256(raw).hexdigest(), bytes=len(raw))


def file_ref(path: str | Path, uri: str | None = None) -> ArtifactRef:
    """Build the reference of a file, hashing it in chunks (no full read into memory).

    Args:
        path: Local file.
        uri: URI to record (default: the absolute path as ``file://`` URI).

    Raises:
        DataError: ``path`` is not a file.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"artifact path={str(p)!r} is not a file: expected an existing file")
    digest = hashlib.sha256()
    size = 0
    with p.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return ArtifactRef(uri=uri or p.resolve().as_uri(), sha256=digest.hexdigest(), bytes=size)


def validate_ref(ref: Any) -> ArtifactRef:
    """Check that ``ref`` has the shape of an :class:`ArtifactRef` and return it.

    Raises:
        DataError: A key is missing or has the wrong type; the message names the key.
    """
    if not isinstance(ref, Mapping):
        raise DataError(f"artifact ref is {type(ref).__name__}: expected a mapping {REF_KEYS}")
    for key, kind in (("uri", str), ("sha256", str), ("bytes", int)):
        if key not in ref:
            raise DataError(f"artifact ref lacks key {key!r}: expected keys {REF_KEYS}")
        if not isinstance(ref[key], kind) or isinstance(ref[key], bool):
            raise DataError(
                f"artifact ref[{key!r}]={ref[key]!r} is {type(ref[key]).__name__}: "
                f"expected {kind.__name__}"
            )
    if len(ref["sha256"]) != 64:
        raise DataError(f"artifact ref['sha256']={ref['sha256']!r}: expected 64 hex characters")
    return ArtifactRef(uri=ref["uri"], sha256=ref["sha256"], bytes=ref["bytes"])


def verify_bytes(ref: Mapping[str, Any], data: bytes) -> None:
    """Check that ``data`` (read back from ``ref['uri']``) matches the reference.

    Raises:
        DataError: Size or SHA-256 differs; the message gives expected and actual values.
    """
    ref = validate_ref(ref)
    if len(data) != ref["bytes"]:
        raise DataError(
            f"artifact {ref['uri']} has {len(data)} bytes: expected {ref['bytes']} bytes"
        )
    actual = hashlib.sha256(data).hexdigest()
    if actual != ref["sha256"]:
        raise DataError(f"artifact {ref['uri']} has sha256 {actual}: expected {ref['sha256']}")


def serialized_xcom_size(value: Any) -> int:
    """Return the size in bytes of ``value`` as Airflow stores it in XCom.

    Uses the task SDK's serde (what ``BaseXCom.serialize_value`` applies), then compact JSON
    encoded as UTF-8, which is how the value travels to the API server and the database.

    Raises:
        TypeError: ``value`` is not serialisable by Airflow.
    """
    from airflow.sdk.serde import serialize

    return len(json.dumps(serialize(value), separators=(",", ":")).encode("utf-8"))


def check_xcom_size(value: Any, *, task_id: str, limit: int | None = None) -> int:
    """Refuse a return value too large for XCom.

    Args:
        value: The task's return value.
        task_id: Task whose value this is (named in the error).
        limit: Largest allowed size in bytes (default ``Settings.max_xcom_bytes``, 48 KiB).

    Returns:
        The serialised size in bytes.

    Raises:
        XComTooLargeError: The value serialises above ``limit``; the message names the task, the
            size and the limit, and says to return an artefact reference instead.
    """
    if limit is None:
        from ground.settings import get_settings

        limit = get_settings().max_xcom_bytes
    size = serialized_xcom_size(value)
    if size > limit:
        raise XComTooLargeError(
            f"task {task_id!r} returned {size} bytes of XCom: expected at most {limit} bytes "
            "(TRITONFLOW_MAX_XCOM_BYTES); write the payload to storage and return "
            "{uri, sha256, bytes} (tritonflow_plugin.xcom.artifact_ref) instead"
        )
    return size


def limit_xcom_size(func: F | None = None, *, limit: int | None = None) -> Any:
    """Decorate a task callable so its return value is checked by :func:`check_xcom_size`.

    Place it under ``@task``. The task id is the function name unless running inside Airflow, in
    which case it is the current task's id.

    Raises:
        XComTooLargeError: From the wrapped call when its return value is too large.
    """

    def decorate(fn: F) -> F:
        def _task_id() -> str:
            try:
                from airflow.sdk import get_current_context

                return get_current_context()["ti"].task_id
            except Exception:  # outside a running task
                return fn.__name__

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                result = await fn(*args, **kwargs)
                check_xcom_size(result, task_id=_task_id(), limit=limit)
                return result

            setattr(async_wrapper, XCOM_LIMITED_ATTR, True)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            check_xcom_size(result, task_id=_task_id(), limit=limit)
            return result

        # functools.wraps copies it onto every decorator above, so the DAG check finds it
        setattr(wrapper, XCOM_LIMITED_ATTR, True)
        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate
