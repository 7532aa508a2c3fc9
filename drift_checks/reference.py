"""Reference data per model version: a sample of the training data plus its whylogs profile.

Layout (folder or S3 prefix)::

    <root>/<model>/reference/v<version>/sample.parquet
    <root>/<model>/reference/v<version>/profile.bin
    <root>/<model>/reference/v<version>/meta.json      schema, rows, sampling seed, digest,
                                                       importance of each input
    <root>/<model>/reference/v<version>/times.parquet  each sample row's time, when the source
                                                       had a ``timestamp`` column

Recorded when a version is published or retrained (from its training data in MLflow), or from a
designated window of the inference log. The sample keeps the source's row order (a seeded
subsample, index-sorted), so chunks of consecutive rows follow the source's time order when the
source is ordered by time (the reference calibration of :mod:`drift_checks.thresholds` relies on
it for seasonality).

The row times (the source's ``timestamp`` column, the inference log's time column; never a
feature) let the ``training_seasonal`` strategy compare a window with the rows of its own season
(:mod:`drift_checks.season_match`). A reference without them is compared whole.

Each reference has an id, ``v<version>:training:<first 12 hex of the sample's SHA-256>``: the
drift history keys thresholds by it, so re-recording a version's reference starts new thresholds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
from typing import Any

import numpy as np
import pandas as pd

from drift_checks.inference_log import LogSchema
from drift_checks.profiles import profile_frame, read_profile, write_profile
from drift_checks.storage import Store
from ground.exceptions import WindowError

log = logging.getLogger(__name__)

#: Default rows kept in a reference sample.
DEFAULT_REFERENCE_ROWS = 100_000
#: File of the row times beside the sample.
TIMES_FILE = "times.parquet"


@dataclasses.dataclass
class Reference:
    """The reference of one model version.

    Attributes:
        model / version: Model name and MLflow model version.
        frame: The sample (feature columns).
        schema: Feature kinds.
        profile: whylogs profile view of the sample.
        uri: URI of the version's reference folder.
        reference_id: ``v<version>:training:<digest>`` (see the module docstring).
        importance: ``{feature: importance}`` of the model version (``None``: not computed).
        sample_sha256: SHA-256 (hex) of the ``sample.parquet`` bytes as written or read (keys the
            prepared-reference cache, :mod:`drift_checks.reference_cache`; ``""``: unknown).
        times: Each sample row's time, UTC-naive ``datetime64[ns]`` in row order (``None``: the
            source had no ``timestamp`` column).
    """

    model: str
    version: int
    frame: pd.DataFrame
    schema: LogSchema
    profile: Any
    uri: str
    reference_id: str = ""
    importance: dict[str, float] | None = None
    sample_sha256: str = ""
    times: np.ndarray | None = None


def _prefix(model: str, version: int) -> str:
    if int(version) < 1:
        raise WindowError(f"model version {version!r}; expected an integer >= 1")
    return f"{model}/reference/v{int(version)}"


def reference_id_of(version: int, digest: str) -> str:
    """The id thresholds are keyed by: ``v<version>:training:<digest[:12]>``."""
    return f"v{int(version)}:training:{digest[:12]}" if digest else f"v{int(version)}:training"


def save_reference(root: str, model: str, version: int, frame: pd.DataFrame,
                   schema: LogSchema | None = None, *, max_rows: int = DEFAULT_REFERENCE_ROWS,
                   seed: int = 0, endpoint_url: str | None = None,
                   importance: dict[str, float] | None = None,
                   importance_method: str = "") -> Reference:
    """Sample (deterministically), profile and store the reference of a model version.

    Args:
        root: Folder or ``s3://bucket/prefix``.
        model: Model name.
        version: MLflow model version.
        frame: Training data (or a designated window); feature columns at least. A ``timestamp``
            column (datetimes) is kept as the row times; one that cannot be read as times on
            every row is dropped with a warning (the reference is kept).
        schema: Feature kinds; inferred from ``frame`` when ``None``.
        max_rows: Rows kept (uniform sample without replacement, ``seed``; row order kept).
        seed: Random seed of the sample.
        endpoint_url: S3-compatible endpoint.
        importance: ``{feature: importance}`` of the model version
            (:func:`drift_checks.importance.permutation_importances`), stored in ``meta.json``.
        importance_method: How ``importance`` was computed (stored beside it).

    Raises:
        WindowError: ``frame`` is empty or lacks a schema column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if frame.empty:
        raise WindowError(f"reference for {model!r} v{version} is empty; expected training rows")
    schema = schema or LogSchema.infer(frame)
    missing = [c for c in schema.features if c not in frame.columns]
    if missing:
        raise WindowError(f"reference for {model!r} v{version} lacks feature columns {missing}")
    sample = frame[list(schema.features)]
    if len(sample) > max_rows:
        sample = sample.sample(n=max_rows, random_state=seed).sort_index()
    times, no_times = _row_times(frame, sample.index)
    if no_times and "timestamp" in frame.columns:
        log.warning("reference for %r v%s keeps no row times: %s", model, version, no_times)
    sample = sample.reset_index(drop=True)
    store = Store(root, endpoint_url)
    p = _prefix(model, version)
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(sample, preserve_index=False), buf)
    data = buf.getvalue()
    store.put_bytes(f"{p}/sample.parquet", data)
    view = profile_frame(sample)
    write_profile(store, f"{p}/profile.bin", view)
    digest = hashlib.sha256(data).hexdigest()
    importance_map = dict(importance) if importance else None
    meta = {"model": model, "version": int(version), "rows": len(sample), "source_rows": len(frame),
            "seed": seed, "schema": schema.to_dict(), "digest": digest,
            "importance": importance_map,
            "importance_method": importance_method if importance else ""}
    if times is not None:
        buf = io.BytesIO()
        pq.write_table(pa.table({"timestamp": pa.array(times, pa.timestamp("ns"))}), buf)
        store.put_bytes(f"{p}/{TIMES_FILE}", buf.getvalue())
    meta["times"] = times is not None
    meta["times_note"] = no_times
    store.put_bytes(f"{p}/meta.json", json.dumps(meta, sort_keys=True).encode())
    return Reference(model, int(version), sample, schema, view, store.uri(p),
                     reference_id_of(version, digest), importance_map, digest, times)


def _row_times(frame: pd.DataFrame, picked: pd.Index) -> tuple[np.ndarray | None, str]:
    """The ``timestamp`` of the rows kept (UTC-naive), and why none when ``None``.

    Times are a refinement (the ``training_seasonal`` strategy): a column that is missing, holds a
    value that is not a time or leaves a row without one keeps the reference and drops the times,
    with the reason (column, row or value) logged and recorded in ``meta.json``.
    """
    if "timestamp" not in frame.columns:
        return None, "no 'timestamp' column"
    if not frame.index.is_unique:
        return None, "the frame's index repeats labels, so the kept rows' times are ambiguous"
    col = frame["timestamp"].loc[picked]
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
        return None, f"column 'timestamp' holds numbers ({col.dtype}), not times; expected datetimes"
    try:
        ts = pd.to_datetime(col, utc=True)
    except (ValueError, TypeError) as exc:
        return None, f"column 'timestamp' holds a value that is not a time ({exc}); expected datetimes"
    if ts.isna().any():
        row = ts.index[ts.isna()][0]
        row = row.item() if hasattr(row, "item") else row
        return None, f"column 'timestamp' is empty at row {row!r}; expected a time on every row"
    return ts.dt.tz_convert(None).to_numpy(dtype="datetime64[ns]"), ""


def load_reference(root: str, model: str, version: int, endpoint_url: str | None = None,
                   with_profile: bool = True, with_times: bool = True) -> Reference:
    """Load a stored reference.

    ``with_profile`` / ``with_times``: also read the whylogs profile / the row times (callers that
    never use them skip a read each).

    Raises:
        WindowError: No reference stored for this version, or its files are unreadable.
    """
    import pyarrow.parquet as pq

    store = Store(root, endpoint_url)
    p = _prefix(model, version)
    try:
        meta = json.loads(store.get_bytes(f"{p}/meta.json"))
        data = store.get_bytes(f"{p}/sample.parquet")
        frame = pq.read_table(io.BytesIO(data)).to_pandas()
        view = read_profile(store, f"{p}/profile.bin") if with_profile else None
    except FileNotFoundError as exc:
        raise WindowError(f"no reference stored for {model!r} v{version} at {store.uri(p)} ({exc}); "
                          "expected save_reference() when the version was published") from None
    times = _read_times(store, p, len(frame)) if with_times and meta.get("times") else None
    return Reference(model, int(version), frame, LogSchema.from_dict(meta["schema"]), view, store.uri(p),
                     reference_id_of(version, meta.get("digest", "")), meta.get("importance") or None,
                     hashlib.sha256(data).hexdigest(), times)  # the bytes read, not meta.json's record of them


def _read_times(store: Store, prefix: str, rows: int) -> np.ndarray | None:
    """The stored row times, or ``None`` (logged) when they are missing, unreadable or not one per row.

    The times only refine the ``training_seasonal`` strategy: losing them never loses the reference.
    """
    import pyarrow.parquet as pq

    key = f"{prefix}/{TIMES_FILE}"
    try:
        times = pq.read_table(io.BytesIO(store.get_bytes(key))).column("timestamp").to_numpy()
    except Exception as exc:  # noqa: BLE001 - a missing or damaged file costs the times only
        log.warning("reference row times at %s not read (%s: %s); the reference is used without them",
                    store.uri(key), type(exc).__name__, exc)
        return None
    if len(times) != rows:
        log.warning("reference row times at %s hold %d rows, the sample %d; the reference is used without them",
                    store.uri(key), len(times), rows)
        return None
    return times.astype("datetime64[ns]")
