"""The per-canary plot over time: error rate, latency and the prediction statistic with their
thresholds and the step boundaries, from the analyses a canary records."""

from __future__ import annotations

import json

import pytest

from tests.repository_sync.test_canary_continuous import POLICY, Clocked, drive
from tritonflow.canary_plot import plot_canary, step_boundaries


def test_a_rolled_back_canary_is_drawn_with_its_steps_and_failure(tmp_path):
    c = Clocked(challenger_rps=20, bad_from=362.0, mode="error")  # fails in the second step
    result, analyses = drive(c)
    assert result.outcome == "rolled_back"
    records = [json.loads(a.to_json()) for a in analyses]  # as logged to MLflow
    assert step_boundaries(records) == [(0.0, "25%"), (pytest.approx(300.0, abs=1), "100%")]
    png = plot_canary(records, tmp_path / "canary.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_extensions_are_marked_where_the_previous_bake_ended():
    records = [
        {"step": 1, "attempt": 1, "percent": 5, "window_start": 100.0, "window_end": 105.0},
        {"step": 1, "attempt": 1, "percent": 5, "window_start": 100.0, "window_end": 110.0},
        {"step": 1, "attempt": 2, "percent": 5, "window_start": 100.0, "window_end": 115.0},
        {"step": 2, "attempt": 1, "percent": 100, "window_start": 116.0, "window_end": 121.0},
    ]
    assert step_boundaries(records) == [(100.0, "5%"), (110.0, "5% (ext. 1)"), (116.0, "100%")]


def test_nothing_to_plot_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no analysis"):
        plot_canary([], tmp_path / "x.png")
    assert POLICY.analysis_interval_s == 5
