"""Which rows a shadow decision judges around a recorded change point (service-free).

The end-to-end case (a challenger trained after NOAA's shift, replayed on Triton, losing over a
window straddling it and winning since its change point) is in ``test_shadow_pipeline.py``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import WindowError
from tritonflow.pipelines.shadow_compare import since_change_point

START = pd.Timestamp("2025-01-04T00:00", tz="UTC")
WINDOW = (START, START + pd.Timedelta(hours=10), START + pd.Timedelta(hours=12))


def _rows(n: int = 600) -> tuple[pd.DataFrame, np.ndarray]:
    stamps = START + pd.to_timedelta(np.arange(n) * 60, unit="s")  # one row a minute, 10 hours
    y = np.where(np.arange(n) % 5 == 0, np.nan, np.arange(n) % 2).astype(np.float64)
    return pd.DataFrame({"timestamp": stamps, "champion_score": 0.5}), y


def _replayed(champion_point: str = "", challenger_point: str = "") -> dict:
    return {"champion": {"version": 3, "change_point": champion_point},
            "challenger": {"version": 4, "change_point": challenger_point}}


def test_the_latest_change_point_inside_the_window_starts_the_rows_judged():
    rows, y = _rows()
    champion_point, challenger_point = START + pd.Timedelta(hours=2), START + pd.Timedelta(hours=4)
    judged_rows, judged_y, judged = since_change_point(
        rows, y, _replayed(champion_point.isoformat(), challenger_point.isoformat()), WINDOW, min_labels=200)
    assert len(judged_rows) == 360 and len(judged_y) == 360  # minutes 240..599
    assert judged_rows["timestamp"].min() == challenger_point
    assert judged == {"since": challenger_point.isoformat(), "recorded_by": 4, "rows_before": 240,
                      "labelled_since": 288, "reason": judged["reason"]}
    assert "240 before it follow the replaced concept" in judged["reason"]


def test_change_points_outside_the_window_or_with_too_few_labels_after_leave_the_whole_window():
    rows, y = _rows()
    before = (START - pd.Timedelta(days=3)).isoformat()  # an old shift, before the window
    late = (START + pd.Timedelta(hours=8)).isoformat()  # 120 rows, 96 labelled, after it
    for replayed, labelled_since, words in ((_replayed(), None, "no version records"),
                                            (_replayed(champion_point=before), None, "no version records"),
                                            (_replayed(challenger_point=late), 96, "fewer than min_labels=200")):
        judged_rows, judged_y, judged = since_change_point(rows, y, replayed, WINDOW, min_labels=200)
        assert judged_rows is rows and judged_y is y
        assert judged["since"] == "" and judged["labelled_since"] == labelled_since and words in judged["reason"]
    # no label arrived: nothing to judge since the change point either
    assert since_change_point(rows, None, _replayed(challenger_point=late), WINDOW, 2)[2]["since"] == ""


def test_a_change_point_that_is_not_a_time_is_named():
    rows, y = _rows()
    with pytest.raises(WindowError, match="challenger.change_point"):
        since_change_point(rows, y, _replayed(challenger_point="yesterday-ish"), WINDOW, min_labels=200)
