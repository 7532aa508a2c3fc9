"""Spark (local mode, a real JVM) summarises the inference log's partitions like the single process."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from drift_checks import statistics as st
from drift_checks.history import HistoryStore
from drift_checks.streaming import open_window, summarize_window
from drift_checks.verdict import check_window

from .test_streaming import HOUR, SCHEMA, T0, _decision, _log, _reference

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None:
        pytest.fail("no Java runtime: scripts/setup.sh installs openjdk-17-jre-headless")
    from drift_checks.spark import get_spark

    session = get_spark("local[2]", app_name="tritonflow-test")
    yield session
    session.stop()


def test_spark_partition_summaries_merged_on_the_driver_equal_the_single_process_check(spark, tmp_path):
    from drift_checks.spark import summarize_window_spark

    rng = np.random.default_rng(11)
    ref = _reference(rng)
    root = _log(tmp_path, rng, n_files=3, rows=20_000)
    scan = open_window(root, "m", T0, T0 + HOUR, SCHEMA)
    local = summarize_window(scan, ref, workers=1)
    remote = summarize_window_spark(spark, scan, ref, partitions=3)
    assert remote.n_rows == local.n_rows == 60_000 and remote.files == sorted(scan.files)
    for col in ("amount", "items"):  # exact statistics equal
        np.testing.assert_array_equal(remote.numeric[col].counts, local.numeric[col].counts)
        f_r, f_l = remote.facts[col], local.facts[col]
        assert (str(f_r.dtype), f_r.n, f_r.n_null, f_r.vmin, f_r.vmax) == (str(f_l.dtype), f_l.n, f_l.n_null,
                                                                          f_l.vmin, f_l.vmax)
        a = st.score_numeric(ref.numeric[col], local.numeric_sample(col))
        b = st.score_numeric(ref.numeric[col], remote.numeric_sample(col))
        assert a["psi"].value == b["psi"].value
        # sketch statistics within the stated bound of each other (each within it of the exact)
        assert abs(a["ks_p_value"].extra["statistic"] - b["ks_p_value"].extra["statistic"]) <= \
            2 * b["ks_p_value"].extra["error_bound"]
        assert abs(a["wasserstein_normed"].value - b["wasserstein_normed"].value) <= \
            a["wasserstein_normed"].extra["error_bound"] + b["wasserstein_normed"].extra["error_bound"]
    for col in ("channel", "vip"):
        assert remote.category_counts(col) == local.category_counts(col)
    out = [check_window(model="m", frame=s, start=T0, end=T0 + HOUR, reference=ref,
                        history=HistoryStore(f"sqlite:///{tmp_path / name}.db"))
           for name, s in (("local", local), ("spark", remote))]
    assert _decision(out[0]) == _decision(out[1])
