"""The inference-log contract, a writer for producers and the hourly window reader.

Layout (folder or S3 prefix)::

    <root>/<model>/date=YYYY-MM-DD/hour=HH/<uuid>.parquet          inference records
    <root>/<model>/labels/date=YYYY-MM-DD/hour=HH/<uuid>.parquet   labels (arrive later)

Inference records have the columns

* ``request_id``: string, unique per request (joins labels);
* ``timestamp``: timezone-aware UTC timestamp of the request;
* ``model_version``: integer MLflow model version that served it;
* the feature columns and the prediction columns named by :class:`LogSchema`;
* optionally ``answered_by``: string, the Triton model that answered (the model itself, or its
  INT8 replica ``<model>__fallback`` when the gateway fell back; see
  :func:`repository_sync.routing.gateway_probe.answered_by`). Written when the frame has it.

Labels have ``request_id``, ``timestamp`` (when the label arrived, UTC) and label columns; they
are joined to inference records by ``request_id`` (:func:`join_labels`).

Partitions are by the record's UTC hour, so one hourly window (the DAG's data interval
``[start, end)``) reads one ``date=/hour=`` folder per hour it covers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
from typing import Any, Collection, Iterable, Literal, Mapping

import pandas as pd

from drift_checks.storage import Store, new_object_name
from ground.exceptions import WindowError

ColumnKind = Literal["float", "int", "category", "bool", "datetime"]
#: Columns every inference record has, with their kind.
BASE_COLUMNS: dict[str, str] = {"request_id": "string", "timestamp": "timestamp", "model_version": "int"}
LABEL_BASE_COLUMNS: dict[str, str] = {"request_id": "string", "timestamp": "timestamp"}
#: Optional columns of an inference record, written when the producer's frame has them.
OPTIONAL_COLUMNS: dict[str, str] = {"answered_by": "string"}
_KINDS = ("float", "int", "category", "bool", "datetime", "string", "timestamp")


@dataclasses.dataclass(frozen=True)
class LogSchema:
    """Feature and prediction columns of one model's inference log.

    Attributes:
        features: ``{column: kind}``; kind is ``"float"``, ``"int"``, ``"category"``, ``"bool"``
            or ``"datetime"``. Numeric kinds are scored with numeric statistics, the others with
            categorical ones (datetime: contract only). Every column is read as its kind before
            it is checked (:mod:`drift_checks.declared_schema`): a ``category`` column may hold
            strings, integers, floats or booleans, compared as category names.
        predictions: ``{column: kind}`` for the model's outputs.
    """

    features: Mapping[str, str]
    predictions: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for col, kind in {**self.features, **self.predictions}.items():
            if kind not in _KINDS:
                raise WindowError(f"column {col!r} has kind {kind!r}; expected one of {_KINDS}")
            if col in BASE_COLUMNS or col in OPTIONAL_COLUMNS:
                raise WindowError(f"column {col!r} is reserved for the log itself")

    @property
    def columns(self) -> dict[str, str]:
        """All columns in file order: base, features, predictions."""
        return {**BASE_COLUMNS, **self.features, **self.predictions}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{"features": {...}, "predictions": {...}}``."""
        return {"features": dict(self.features), "predictions": dict(self.predictions)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LogSchema":
        """Read a schema written by :meth:`to_dict` (``predictions`` optional)."""
        return cls(features=dict(d["features"]), predictions=dict(d.get("predictions", {})))

    @classmethod
    def infer(cls, frame: pd.DataFrame, predictions: Iterable[str] = ()) -> "LogSchema":
        """Schema from a frame's dtypes (base columns skipped)."""
        preds = set(predictions)
        feats: dict[str, str] = {}
        outs: dict[str, str] = {}
        for col in frame.columns:
            if col in BASE_COLUMNS or col in OPTIONAL_COLUMNS:
                continue
            (outs if col in preds else feats)[col] = _kind_of(frame[col])
        return cls(feats, outs)


def _kind_of(s: pd.Series) -> str:
    if pd.api.types.is_bool_dtype(s):
        return "bool"
    if pd.api.types.is_integer_dtype(s):
        return "int"
    if pd.api.types.is_float_dtype(s):
        return "float"
    if pd.api.types.is_datetime64_any_dtype(s):
        return "datetime"
    return "category"


def arrow_type_ok(kind: str, t: Any) -> bool:
    """Whether an Arrow column type can hold a log column of ``kind``.

    Args:
        kind: The column's kind in the log contract (``float``, ``int``, ``bool``, ``category``,
            ``string``, ``datetime``, ``timestamp``).
        t: A ``pyarrow.DataType``.

    Returns:
        ``True`` when the type fits (a ``timestamp`` must be timezone-aware).
    """
    import pyarrow as pa

    if kind == "float":
        return pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_null(t)
    if kind == "int":
        return pa.types.is_integer(t)
    if kind == "bool":
        return pa.types.is_boolean(t)
    if kind in ("category", "string"):  # any column of category values: read as names (declared_schema)
        return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)
                or pa.types.is_null(t) or pa.types.is_string_view(t) or pa.types.is_integer(t)
                or pa.types.is_floating(t) or pa.types.is_boolean(t))
    if kind == "datetime":
        return pa.types.is_timestamp(t) or pa.types.is_date(t)
    if kind == "timestamp":
        return pa.types.is_timestamp(t) and t.tz is not None
    return False


def read_type_ok(kind: str, t: Any, *, feature: bool = False) -> bool:
    """Whether a log file's column of Arrow type ``t`` is read as ``kind``.

    The types of :func:`arrow_type_ok`, and for a declared feature also text (``string``,
    ``large_string``, ``string_view``): a file from another producer whose numeric, boolean or
    datetime feature is text is read, and its values are then read one by one as the declared
    kind (:mod:`drift_checks.declared_schema`), so a word among numbers fails the window's
    contract naming the column and the word, as the backtest of the same table does. The log's
    own writer still refuses such a column (:func:`validate_frame`).

    Args:
        kind: The column's kind in the log contract.
        t: A ``pyarrow.DataType``.
        feature: The column is a declared feature (base and prediction columns never take text
            for another kind).
    """
    import pyarrow as pa

    if arrow_type_ok(kind, t):
        return True
    return feature and (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


#: ``{kind: what a column of that kind must be}``, for error messages.
EXPECTED_TYPES = {
    "float": "a floating-point or integer column",
    "int": "an integer column",
    "bool": "a boolean column",
    "category": "a string column (or integer, float or boolean category values)",
    "string": "a string column (or integer, float or boolean category values)",
    "datetime": "a timestamp or date column",
    "timestamp": "a timezone-aware (UTC) timestamp column",
}


def offending_values(values: Any, kind: str, limit: int = 5) -> list[Any]:
    """The first distinct non-null values of a column that do not fit ``kind`` (for messages).

    Args:
        values: A pandas Series or a pyarrow (chunked) array.
        kind: The expected column kind.
        limit: Most values returned.
    """
    s = values if isinstance(values, pd.Series) else pd.Series(values.to_pylist(), dtype=object)
    s = s.dropna()
    if kind in ("float", "int"):
        num = pd.to_numeric(s, errors="coerce")
        bad = s[num.isna()] if kind == "float" else s[num.isna() | (num % 1 != 0)]
    elif kind == "bool":
        bad = s[~s.map(lambda v: isinstance(v, bool) or type(v).__name__ == "bool_")]
    elif kind in ("category", "string"):
        bad = s[~s.map(lambda v: isinstance(v, str))]
    elif kind in ("datetime", "timestamp"):
        bad = s[pd.to_datetime(s, errors="coerce", utc=True, format="mixed").isna()]
    else:
        bad = s
    out = []
    for v in pd.unique(bad.to_numpy(dtype=object))[:limit]:
        out.append(v.item() if hasattr(v, "item") else v if isinstance(v, (int, float, str, bool)) else str(v))
    return out


def type_error(where: str, col: str, t: Any, kind: str, values: Any) -> WindowError:
    """The error for a log column of the wrong type.

    Args:
        where: What was read (a file's URI, ``labels``, a frame's source).
        col: The column.
        t: Its type, as shown in the message.
        kind: The kind it should have (a key of :data:`EXPECTED_TYPES`).
        values: The column's values (pandas Series or pyarrow array), for the first offending ones.

    Returns:
        A :class:`WindowError` naming the source, column, type, what was expected and the first
        offending values (to raise).
    """
    bad = offending_values(values, kind)
    first = f"; first offending values: {bad!r}" if bad else ""
    return WindowError(f"{where}: column {col!r} has type {t}; expected {EXPECTED_TYPES[kind]}{first}")


def validate_frame(frame: pd.DataFrame, schema: LogSchema, source: str) -> None:
    """Check a frame against the log contract before writing.

    Raises:
        WindowError: A column is missing or has the wrong type; names source, column, dtype and
            the first offending values.
    """
    import pyarrow as pa

    for col, kind in schema.columns.items():
        if col not in frame.columns:
            raise WindowError(f"{source}: column {col!r} is missing; expected {EXPECTED_TYPES[kind]}")
        try:
            t = pa.Array.from_pandas(frame[col]).type
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            bad = offending_values(frame[col], kind)
            raise WindowError(f"{source}: column {col!r} cannot be stored ({exc}); "
                              f"expected {EXPECTED_TYPES[kind]}; first offending values: {bad!r}") from None
        if not arrow_type_ok(kind, t):
            raise type_error(source, col, f"{t} (pandas {frame[col].dtype})", kind, frame[col])


def hour_floor(ts: dt.datetime) -> pd.Timestamp:
    """The UTC hour a time falls in.

    Args:
        ts: A timezone-aware datetime (or anything ``pd.Timestamp`` reads as one).

    Returns:
        The start of its hour, in UTC.

    Raises:
        WindowError: ``ts`` is naive.
    """
    t = pd.Timestamp(ts)
    if t.tzinfo is None:
        raise WindowError(f"time {ts!r} is naive; expected a timezone-aware (UTC) datetime")
    return t.tz_convert("UTC").floor("h")


def partition_prefix(model: str, hour: dt.datetime, labels: bool = False) -> str:
    """``<model>[/labels]/date=YYYY-MM-DD/hour=HH`` of the hour containing ``hour``."""
    h = hour_floor(hour)
    base = f"{model}/labels" if labels else model
    return f"{base}/date={h:%Y-%m-%d}/hour={h:%H}"


def _write_partitions(store: Store, model: str, frame: pd.DataFrame, labels: bool) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ts = frame["timestamp"].dt.tz_convert("UTC")
    frame = frame.assign(timestamp=ts)
    uris = []
    for hour, part in frame.groupby(ts.dt.floor("h"), sort=True):
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(part.reset_index(drop=True), preserve_index=False), buf)
        key = f"{partition_prefix(model, hour, labels)}/{new_object_name()}"
        uris.append(store.put_bytes(key, buf.getvalue()))
    return uris


def check_model_name(model: str) -> None:
    """Check that a model name can be a folder of the inference log.

    Args:
        model: The model name.

    Raises:
        WindowError: Empty, holding ``/``, starting with ``.``, or ``labels`` (the labels' folder).
    """
    if not model or "/" in model or model.startswith(".") or model == "labels":
        raise WindowError(f"model name {model!r} is not usable as a folder; expected e.g. 'fraud_v2'")


class InferenceLogWriter:
    """Writes inference records (and labels) for one model, one file per hour touched.

    Args:
        root: Folder or ``s3://bucket/prefix``.
        model: Model name (one folder level).
        schema: Columns contract; inferred from the first frame when ``None``.
        endpoint_url: S3-compatible endpoint.

    Example::

        w = InferenceLogWriter("/data/logs", "rain", LogSchema({"x": "float"}, {"p": "float"}))
        w.write(frame)  # -> ['/data/logs/rain/date=2024-05-01/hour=13/3f...parquet']
    """

    def __init__(self, root: str, model: str, schema: LogSchema | None = None,
                 endpoint_url: str | None = None):
        check_model_name(model)
        self.store = Store(root, endpoint_url)
        self.model = model
        self.schema = schema

    def write(self, frame: pd.DataFrame) -> list[str]:
        """Validate and write records, partitioned by UTC hour of ``timestamp``.

        Args:
            frame: One row per request with the base, feature and prediction columns.

        Returns:
            URIs of the written Parquet files (empty for an empty frame).

        Raises:
            WindowError: Missing column, wrong type, naive timestamps, duplicate request ids.
        """
        if self.schema is None:
            self.schema = LogSchema.infer(frame)
        validate_frame(frame, self.schema, f"inference log of {self.model!r}")
        optional = [c for c in OPTIONAL_COLUMNS if c in frame.columns]
        for col in optional:
            if not frame[col].map(lambda v: isinstance(v, str) and bool(v)).all():
                bad = [v for v in frame[col] if not (isinstance(v, str) and v)][:5]
                raise WindowError(f"inference log of {self.model!r}: column {col!r} has non-string or empty "
                                  f"values {bad!r}; expected the answering model's name")
        if frame.empty:
            return []
        if frame["request_id"].duplicated().any():
            dup = frame.loc[frame["request_id"].duplicated(), "request_id"].iloc[0]
            raise WindowError(f"request_id {dup!r} appears twice; expected unique request ids")
        cols = list(self.schema.columns) + optional
        return _write_partitions(self.store, self.model, frame[cols], labels=False)

    def write_labels(self, labels: pd.DataFrame) -> list[str]:
        """Write labels (``request_id``, ``timestamp`` of arrival, label columns).

        Raises:
            WindowError: ``request_id`` or a UTC ``timestamp`` is missing.
        """
        for col, kind in LABEL_BASE_COLUMNS.items():
            if col not in labels.columns:
                raise WindowError(f"labels: column {col!r} is missing; expected {EXPECTED_TYPES[kind]}")
        import pyarrow as pa

        t = pa.Array.from_pandas(labels["timestamp"]).type
        if not arrow_type_ok("timestamp", t):
            raise WindowError(f"labels: column 'timestamp' has type {t}; expected {EXPECTED_TYPES['timestamp']}")
        if labels.empty:
            return []
        return _write_partitions(self.store, self.model, labels, labels=True)


@dataclasses.dataclass
class Window:
    """One window of the inference log.

    Attributes:
        model: Model name.
        start / end: UTC bounds, ``[start, end)``.
        frame: Records with ``start <= timestamp < end`` (sorted by timestamp, request_id).
        files: URIs read.
    """

    model: str
    start: pd.Timestamp
    end: pd.Timestamp
    frame: pd.DataFrame
    files: list[str]

    @property
    def empty(self) -> bool:
        """True when the window holds no row."""
        return len(self.frame) == 0


def hours_between(start: pd.Timestamp, end: pd.Timestamp) -> list[pd.Timestamp]:
    """The hours whose partitions a ``[start, end)`` window reads.

    Args:
        start: Window start (its hour is the first one).
        end: Window end (exclusive).

    Returns:
        Hour starts from ``start``'s hour while before ``end``, oldest first.
    """
    out, h = [], start.floor("h")
    while h < end:
        out.append(h)
        h += pd.Timedelta(hours=1)
    return out


def arrow_to_pandas(table) -> pd.DataFrame:
    """A pyarrow Table as pandas, integer columns holding nulls as nullable ``Int*`` dtypes.

    ``Table.to_pandas()`` turns an integer column with nulls into float64 unless the file carries
    pandas metadata saying otherwise; files from other producers (pyarrow without pandas, Spark)
    do not, so the same column would read back as ``int64`` from one producer and ``float64``
    from another. Here it is ``Int64`` (or the matching width) whatever wrote it.
    """
    import pyarrow as pa

    frame = table.to_pandas()
    for i, field in enumerate(table.schema):
        if pa.types.is_integer(field.type) and table.column(i).null_count > 0:
            dtype = pd.api.types.pandas_dtype(str(field.type).replace("int", "Int").replace("uInt", "UInt"))
            frame[field.name] = table.column(i).to_pandas(types_mapper={field.type: dtype}.get).array
    return frame


def _read_parquet(store: Store, key: str, required: Mapping[str, str],
                  features: Collection[str] = ()) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    uri = store.uri(key)
    try:
        table = pq.read_table(io.BytesIO(store.get_bytes(key)))
    except (pa.ArrowInvalid, OSError) as exc:
        raise WindowError(f"{uri}: not a readable Parquet file ({exc})") from None
    for col, kind in required.items():
        if col not in table.column_names:
            raise WindowError(f"{uri}: column {col!r} is missing; expected {EXPECTED_TYPES[kind]}")
        if not read_type_ok(kind, table.schema.field(col).type, feature=col in features):
            raise type_error(uri, col, table.schema.field(col).type, kind, table.column(col))
    return arrow_to_pandas(table)


def _read_range(store: Store, model: str, start, end, required, labels: bool, features: Collection[str] = ()):
    s, e = hour_floor(start), pd.Timestamp(end)
    if e.tzinfo is None:
        raise WindowError(f"window end {end!r} is naive; expected a timezone-aware (UTC) datetime")
    e = e.tz_convert("UTC")
    s_exact = pd.Timestamp(start).tz_convert("UTC")
    if e <= s_exact:
        raise WindowError(f"window end {e} is not after start {s_exact}")
    frames, files = [], []
    for h in hours_between(s, e):
        for key in store.list(partition_prefix(model, h, labels)):
            if not key.endswith(".parquet"):
                continue
            frames.append(_read_parquet(store, key, required, features))
            files.append(store.uri(key))
    if not frames:
        return None, files, s_exact, e
    frame = pd.concat(frames, ignore_index=True)
    ts = frame["timestamp"].dt.tz_convert("UTC")
    frame = frame[(ts >= s_exact) & (ts < e)]
    return frame, files, s_exact, e


def read_window(root: str, model: str, start: dt.datetime, end: dt.datetime,
                schema: LogSchema | None = None, endpoint_url: str | None = None) -> Window:
    """Read the records of ``model`` with ``start <= timestamp < end`` (UTC).

    Args:
        root: Folder or ``s3://bucket/prefix``.
        model: Model name.
        start: Timezone-aware start, inclusive (the DAG's ``data_interval_start``).
        end: Timezone-aware end, exclusive (the DAG's ``data_interval_end``).
        schema: When given, every file must hold its columns with compatible types (a declared
            feature may also be text: :func:`read_type_ok`).
        endpoint_url: S3-compatible endpoint.

    Returns:
        A :class:`Window`; an hour with no files gives an empty frame with the schema's columns
        (the caller reports "no data", it is not an error).

    Raises:
        WindowError: Naive or inverted bounds, a malformed file, a missing column or a column of
            the wrong type; the message names the file, the column and the expected type.
    """
    check_model_name(model)
    store = Store(root, endpoint_url)
    required = schema.columns if schema is not None else dict(BASE_COLUMNS)
    frame, files, s, e = _read_range(store, model, start, end, required, labels=False,
                                     features=schema.features if schema is not None else ())
    if frame is None:
        frame = _empty_frame(required)
    frame = frame.sort_values(["timestamp", "request_id"], kind="stable").reset_index(drop=True)
    return Window(model=model, start=s, end=e, frame=frame, files=files)


def read_labels(root: str, model: str, start: dt.datetime, end: dt.datetime,
                endpoint_url: str | None = None) -> pd.DataFrame:
    """Labels that arrived in ``[start, end)`` (UTC); empty frame if none.

    Raises:
        WindowError: As :func:`read_window`.
    """
    check_model_name(model)
    store = Store(root, endpoint_url)
    frame, _, _, _ = _read_range(store, model, start, end, LABEL_BASE_COLUMNS, labels=True)
    return _empty_frame(LABEL_BASE_COLUMNS) if frame is None else frame.reset_index(drop=True)


def join_labels(records: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """Left-join labels to inference records by ``request_id``.

    When a request got several labels the latest (by label ``timestamp``) wins. The label's
    arrival time becomes ``label_timestamp``; records without a label keep nulls.
    """
    if "request_id" not in labels.columns:
        raise WindowError("labels: column 'request_id' is missing; expected a string column")
    lab = labels.sort_values("timestamp", kind="stable").drop_duplicates("request_id", keep="last")
    lab = lab.rename(columns={"timestamp": "label_timestamp"})
    clash = [c for c in lab.columns if c in records.columns and c != "request_id"]
    if clash:
        raise WindowError(f"label columns {clash} clash with inference-log columns")
    return records.merge(lab, on="request_id", how="left")


def _empty_frame(columns: Mapping[str, str]) -> pd.DataFrame:
    dtypes = {"float": "float64", "int": "int64", "bool": "bool", "category": "object",
              "string": "object", "datetime": "datetime64[ns]", "timestamp": "datetime64[ns, UTC]"}
    return pd.DataFrame({c: pd.Series([], dtype=dtypes[k]) for c, k in columns.items()})


def numeric_columns(schema: LogSchema) -> list[str]:
    """Feature columns scored with numeric statistics."""
    return [c for c, k in schema.features.items() if k in ("float", "int")]


def categorical_columns(schema: LogSchema) -> list[str]:
    """Feature columns scored with categorical statistics."""
    return [c for c, k in schema.features.items() if k in ("category", "bool", "string")]


__all__ = [
    "LogSchema", "InferenceLogWriter", "Window", "read_window", "read_labels", "join_labels",
    "partition_prefix", "validate_frame", "numeric_columns", "categorical_columns",
]
