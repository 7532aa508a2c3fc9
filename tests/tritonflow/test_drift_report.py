"""The demo report's drift plots: each hour's statistic against its own reference."""

import datetime as dt

from drift_checks.history import HistoryStore, StatisticRow
from tritonflow.report import drift_series

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
REF = "v1:training:a"


def test_the_plotted_series_and_threshold_leave_out_the_hours_statistics_against_their_season(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    store = HistoryStore(url)
    for h in range(4):
        store.record_hour("m", T0 + dt.timedelta(hours=h), status="ok", n_rows=10, reference_id=REF,
                          statistics=[StatisticRow("x", "psi", 0.05 + h / 100),
                                      StatisticRow("x", "psi", 0.9, reference_id=REF + ":seasonal")])
    store.engine.dispose()
    summary = {"hours": [{"start": (T0 + dt.timedelta(hours=h)).isoformat(), "hour": h} for h in range(4)]}
    series = drift_series(url, "m", summary, min_windows=1)["x"]
    assert list(series["logical_hour"]) == [0, 1, 2, 3]
    assert list(series["value"].round(2)) == [0.05, 0.06, 0.07, 0.08]
    assert series["threshold"].iloc[1:].max() < 0.1  # learned from the hours' own values only
