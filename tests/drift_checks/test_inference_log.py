"""Inference-log contract, writer, hourly reader and labels (filesystem and S3)."""

import pandas as pd
import pytest

from drift_checks.inference_log import InferenceLogWriter, LogSchema, join_labels, read_labels, read_window
from ground.exceptions import WindowError

SCHEMA = LogSchema({"x": "float", "device": "category"}, {"p_rain": "float"})
H0 = pd.Timestamp("2024-05-01T13:00:00Z")


def _records(n=6, start=None, step="20min", prefix="r"):
    start = H0 - pd.Timedelta(minutes=30) if start is None else start
    ts = pd.date_range(start, periods=n, freq=step, tz="UTC")
    return pd.DataFrame({"request_id": [f"{prefix}{i}" for i in range(n)], "timestamp": ts,
                         "model_version": [3] * n, "x": [float(i) for i in range(n)],
                         "device": ["ios", "android"] * (n // 2), "p_rain": [0.5] * n})


def test_writer_partitions_by_utc_hour_and_reader_selects_one_hour(tmp_path):
    w = InferenceLogWriter(str(tmp_path), "rain", SCHEMA)
    uris = w.write(_records())  # 12:30 .. 14:10
    assert sorted(u.split("rain/")[1].rsplit("/", 1)[0] for u in uris) == [
        "date=2024-05-01/hour=12", "date=2024-05-01/hour=13", "date=2024-05-01/hour=14"]
    win = read_window(str(tmp_path), "rain", H0, H0 + pd.Timedelta(hours=1), SCHEMA)
    assert list(win.frame["request_id"]) == ["r2", "r3", "r4"]
    assert (win.frame["timestamp"] >= H0).all() and (win.frame["timestamp"] < H0 + pd.Timedelta(hours=1)).all()
    assert not list(tmp_path.rglob("*.tmp"))  # atomic: no temp file left


def test_an_hour_without_files_is_an_empty_window_not_an_error(tmp_path):
    win = read_window(str(tmp_path), "rain", H0, H0 + pd.Timedelta(hours=1), SCHEMA)
    assert win.empty and "x" in win.frame.columns


def test_missing_column_in_a_stored_file_names_file_column_and_type(tmp_path):
    writer = InferenceLogWriter(str(tmp_path), "rain", LogSchema({"x": "float"}))
    writer.write(_records().drop(columns=["device", "p_rain"]))
    with pytest.raises(WindowError, match=r"hour=13/.*\.parquet: column 'device' is missing; expected a string column"):
        read_window(str(tmp_path), "rain", H0, H0 + pd.Timedelta(hours=1), SCHEMA)


def test_malformed_parquet_file_is_refused_with_its_path(tmp_path):
    part = tmp_path / "rain" / "date=2024-05-01" / "hour=13"
    part.mkdir(parents=True)
    (part / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(WindowError, match="broken.parquet: not a readable Parquet file"):
        read_window(str(tmp_path), "rain", H0, H0 + pd.Timedelta(hours=1))


def test_writer_refuses_wrong_types_and_naive_timestamps(tmp_path):
    w = InferenceLogWriter(str(tmp_path), "rain", SCHEMA)
    bad = _records().assign(x=["a"] * 6)
    with pytest.raises(WindowError, match="column 'x' has type string.*expected a floating-point"):
        w.write(bad)
    naive = _records().assign(timestamp=lambda d: d.timestamp.dt.tz_localize(None))
    with pytest.raises(WindowError, match="column 'timestamp'.*timezone-aware"):
        w.write(naive)
    assert not list(tmp_path.rglob("*.parquet"))


def test_labels_arrive_later_and_join_by_request_id_latest_wins(tmp_path):
    w = InferenceLogWriter(str(tmp_path), "rain", SCHEMA)
    w.write(_records())
    later = H0 + pd.Timedelta(hours=5)
    w.write_labels(pd.DataFrame({"request_id": ["r2", "r3", "r3"], "rain": [1, 0, 1],
                                 "timestamp": [later, later, later + pd.Timedelta(minutes=5)]}))
    labels = read_labels(str(tmp_path), "rain", later, later + pd.Timedelta(hours=1))
    win = read_window(str(tmp_path), "rain", H0, H0 + pd.Timedelta(hours=1), SCHEMA)
    joined = join_labels(win.frame, labels).set_index("request_id")
    assert joined.loc["r2", "rain"] == 1 and joined.loc["r3", "rain"] == 1
    assert pd.isna(joined.loc["r4", "rain"])


def test_s3_root_round_trip_on_an_s3_compatible_endpoint(s3_root):
    root, endpoint = s3_root
    InferenceLogWriter(root, "rain", SCHEMA, endpoint_url=endpoint).write(_records())
    win = read_window(root, "rain", H0, H0 + pd.Timedelta(hours=1), SCHEMA, endpoint_url=endpoint)
    assert list(win.frame["request_id"]) == ["r2", "r3", "r4"]
    assert all(f.startswith(root + "/rain/date=2024-05-01/hour=13/") for f in win.files)


def test_s3_root_with_endpoint_inside_the_uri_is_refused():
    with pytest.raises(WindowError, match="no valid bucket"):
        read_window("s3://http://127.0.0.1:9000/bucket", "rain", H0, H0 + pd.Timedelta(hours=1))


def _foreign_file(root, table):
    """A Parquet file written by another producer: pyarrow without pandas metadata (as Spark)."""
    import pyarrow.parquet as pq

    part = root / "rain" / "date=2024-05-01" / "hour=13"
    part.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(None), part / "spark-00000.parquet")


def test_integer_column_with_nulls_from_another_producer_reads_back_as_nullable_integers(tmp_path):
    import pyarrow as pa

    from drift_checks.contracts import derive_contract, run_contract

    schema = LogSchema({"clicks": "int"})
    ts = pd.date_range(H0, periods=4, freq="5min", tz="UTC")
    _foreign_file(tmp_path, pa.table({
        "request_id": ["a", "b", "c", "d"], "timestamp": pa.array(ts),
        "model_version": pa.array([1, 1, 1, 1], pa.int64()),
        "clicks": pa.array([3, None, 5, None], pa.int32())}))
    win = read_window(str(tmp_path), "rain", H0, H0 + pd.Timedelta(hours=1), schema)
    assert str(win.frame["clicks"].dtype) == "Int32"
    assert win.frame["clicks"].tolist()[::2] == [3, 5] and win.frame["clicks"].isna().sum() == 2
    reference = pd.DataFrame({"clicks": pd.array([1, 2, None, 4], dtype="Int64")})
    res = run_contract(derive_contract(reference, schema), win.frame)
    assert not [r for r in res.failures if r.expectation == "expect_column_values_to_be_in_type_list"]


def test_a_stored_column_of_the_wrong_type_is_named_with_its_first_offending_values(tmp_path):
    import pyarrow as pa

    ts = pd.date_range(H0, periods=3, freq="5min", tz="UTC")
    _foreign_file(tmp_path, pa.table({
        "request_id": ["a", "b", "c"], "timestamp": pa.array(ts), "model_version": [1, 1, 1],
        "x": ["1.5", "n/a", "oops"], "device": ["ios"] * 3, "p_rain": ["0.1", "n/a", "oops"]}))
    with pytest.raises(WindowError, match=r"column 'p_rain' has type string; expected a floating-point.*"
                                          r"first offending values: \['n/a', 'oops'\]"):
        read_window(str(tmp_path), "rain", H0, H0 + pd.Timedelta(hours=1), SCHEMA)
    # a declared feature in text is read as it is: the window's contract judges its values one by one
    # (drift_checks.declared_schema), naming the words, as the backtest of the same table does
    features_only = LogSchema(dict(SCHEMA.features))
    w = read_window(str(tmp_path), "rain", H0, H0 + pd.Timedelta(hours=1), features_only)
    assert w.frame["x"].tolist() == ["1.5", "n/a", "oops"]
