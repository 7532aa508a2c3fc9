"""XCom discipline: payloads go to storage, XCom carries {uri, sha256, bytes}."""

from __future__ import annotations

import json

import pytest

from ground.exceptions import DataError
from tritonflow_plugin.xcom import (
    XComTooLargeError,
    artifact_ref,
    check_xcom_size,
    file_ref,
    limit_xcom_size,
    serialized_xcom_size,
    validate_ref,
    verify_bytes,
)

LIMIT = 48 * 1024


def _hourly_histogram_matrix() -> list[list[int]]:
    """The return value of the case's ``compute_histograms`` task (1200 x 80 ints)."""
    return [[(f * 31 + b * 7) % 997 for b in range(80)] for f in range(1200)]


def test_histogram_matrix_is_refused_naming_task_and_size():
    hist = _hourly_histogram_matrix()
    size = serialized_xcom_size(hist)
    assert size > LIMIT
    with pytest.raises(XComTooLargeError) as err:
        check_xcom_size(hist, task_id="compute_histograms", limit=LIMIT)
    msg = str(err.value)
    assert "'compute_histograms'" in msg and str(size) in msg and str(LIMIT) in msg
    assert isinstance(err.value, DataError)


def test_reference_to_stored_histograms_fits_and_verifies(tmp_path):
    hist = _hourly_histogram_matrix()
    payload = json.dumps(hist).encode()
    path = tmp_path / "histograms.json"
    path.write_bytes(payload)
    ref = file_ref(path)
    assert ref["bytes"] == len(payload) and ref["uri"].startswith("file://")
    assert check_xcom_size(ref, task_id="compute_histograms", limit=LIMIT) < 1024
    assert ref == artifact_ref(ref["uri"], payload)
    verify_bytes(ref, path.read_bytes())
    with pytest.raises(DataError, match="sha256"):
        verify_bytes(ref, payload.replace(b"1", b"2"))
    with pytest.raises(DataError, match="bytes"):
        verify_bytes(ref, payload + b" ")


def test_default_limit_comes_from_settings(monkeypatch):
    monkeypatch.setenv("TRITONFLOW_MAX_XCOM_BYTES", "100")
    with pytest.raises(XComTooLargeError, match="at most 100 bytes"):
        check_xcom_size(list(range(200)), task_id="t")
    monkeypatch.setenv("TRITONFLOW_MAX_XCOM_BYTES", str(10**6))
    assert check_xcom_size(list(range(200)), task_id="t") > 100


def test_limit_xcom_size_decorator_refuses_a_bulky_return_value():
    @limit_xcom_size(limit=LIMIT)
    def compute_histograms():
        return _hourly_histogram_matrix()

    @limit_xcom_size(limit=LIMIT)
    def small():
        return {"uri": "s3://b/k", "sha256": "0" * 64, "bytes": 3}

    with pytest.raises(XComTooLargeError, match="compute_histograms"):
        compute_histograms()
    assert small()["bytes"] == 3


def test_malformed_reference_error_names_the_key():
    with pytest.raises(DataError, match="'sha256'"):
        validate_ref({"uri": "s3://b/k", "bytes": 3})
    with pytest.raises(DataError, match=r"ref\['bytes'\]"):
        validate_ref({"uri": "s3://b/k", "sha256": "0" * 64, "bytes": "3"})
    with pytest.raises(DataError, match="uri"):
        artifact_ref("", b"x")
