"""The seasonally matched training reference (``training_seasonal``): each window against the
reference rows at its phase of the period, thresholds from chunks scored the same way."""

import numpy as np
import pandas as pd
import pytest

from drift_checks.backtest import run_backtest
from drift_checks.inference_log import LogSchema
from drift_checks.season_match import SeasonalReference, choose_period, season_mask
from drift_checks.strategies import ReferenceStrategy
from drift_checks.verdict import prepare_reference
from ground.settings import Settings

YEAR = pd.Timedelta(days=365)


def _seasonal_days(years=8, drop_day=6 * 365 + 60, drop=0.8, seed=0):
    """Daily rows with a strong yearly cycle (amplitude 2 sd) and, from ``drop_day``, a level
    lower by ``drop`` sd: smaller than the cycle's swing, so in the windy half of the year the
    dropped days are still near the whole reference's middle."""
    rng = np.random.default_rng(seed)
    day = np.arange(years * 365)
    wind = 2.0 * np.sin(2 * np.pi * day / 365) + rng.normal(0, 1.0, day.size)
    wind[day >= drop_day] -= drop
    return pd.DataFrame({"ts": pd.Timestamp("2000-01-01", tz="UTC") + pd.to_timedelta(day, unit="D"), "wind": wind})


def test_a_row_matches_the_window_at_the_same_phase_of_every_cycle_and_wraps_at_the_year_end():
    times = (pd.Timestamp("2000-01-01") + pd.to_timedelta(np.arange(3 * 365), unit="D")).to_numpy("datetime64[ns]")
    start = pd.Timestamp("2003-12-20")  # a window across the year's end
    mask = season_mask(times, start, start + pd.Timedelta(days=20), YEAR)
    picked = pd.DatetimeIndex(times[mask])
    runs = np.split(picked, np.flatnonzero(np.diff(picked.asi8) > pd.Timedelta(days=1).value) + 1)
    assert [len(r) for r in runs][1:3] == [20, 20]  # whole cycles; the first and last are cut by the series
    assert len(runs) == 4 and set(picked.month) == {12, 1} and picked.min() == pd.Timestamp("2000-01-01")
    assert not season_mask(times, start, start, YEAR).any()


def _run(table, tmp_path, strategy, end="2007-06-01"):
    spec = ReferenceStrategy(name=strategy, period=YEAR.to_pytimedelta())
    return run_backtest(table, time_column="ts", out_dir=tmp_path / strategy, window="30",
                        reference_range=("2000-01-01T00:00Z", "2005-01-01T00:00Z"), strategy=spec,
                        replay_end=f"{end}T00:00Z", html_report=False)


def test_a_drop_smaller_than_the_seasons_swing_is_seen_in_its_own_season_and_quiet_seasons_stay_quiet(tmp_path):
    table = _seasonal_days()
    runs = {s: _run(table, tmp_path, s)["windows"] for s in ("training", "training_seasonal")}
    drop_at = table["ts"].iloc[6 * 365 + 60]
    drop = next(i for i, w in enumerate(runs["training"]) if pd.Timestamp(w["end"]) > drop_at)  # holds the drop
    flagged = {s: [i for i, w in enumerate(ws) if w["drifted"]] for s, ws in runs.items()}
    assert [i for i in flagged["training_seasonal"] if i < drop] == []  # a year of seasons, no false flag
    assert runs["training_seasonal"][drop + 1]["reference"].startswith("training_seasonal (")
    seasonal_after = [i for i in flagged["training_seasonal"] if drop <= i <= drop + 3]
    assert seasonal_after and not [i for i in flagged["training"] if drop <= i <= drop + 3], flagged
    assert any(w["alert"] for w in runs["training_seasonal"][drop:drop + 4])


def _training_run(table, tmp_path, run_windows, reference_end="2005-01-01", end="2007-06-01", period=YEAR):
    """The ``training`` strategy with the season-matched run rule on (``run_windows``) or off (0);
    ``period`` ``None``: undeclared, chosen from the reference's times."""
    from drift_checks.verdict import CheckConfig

    cfg = CheckConfig.from_settings(Settings.from_env({"TRITONFLOW_DRIFT_SEASONAL_RUN_WINDOWS": str(run_windows)}))
    spec = ReferenceStrategy(name="training", period=period.to_pytimedelta() if period is not None else None)
    return run_backtest(table, time_column="ts", out_dir=tmp_path / f"run{run_windows}-{period}", window="30",
                        config=cfg,
                        reference_range=("2000-01-01T00:00Z", f"{reference_end}T00:00Z"), strategy=spec,
                        replay_end=f"{end}T00:00Z", html_report=False)["windows"]


def test_the_season_run_rule_alerts_on_the_first_window_flagged_after_evidence_against_its_season(tmp_path):
    """Against the whole reference the drop is flagged only once the windy season ends; against its
    own season it showed in every window before, so the first flagged window alerts."""
    table = _seasonal_days()
    on, off = _training_run(table, tmp_path, 4), _training_run(table, tmp_path, 0)
    assert [w["reference"] for w in on] == [w["reference"] for w in off] == ["training"] * len(on)
    drop_at = table["ts"].iloc[6 * 365 + 60]
    drop = next(i for i, w in enumerate(on) if pd.Timestamp(w["end"]) > drop_at)
    first_flag = next(i for i, w in enumerate(on) if w["drifted"])
    assert first_flag > drop + 2  # the whole reference sees nothing for a while
    alerts = {name: [i for i, w in enumerate(ws) if w["alert"]] for name, ws in (("on", on), ("off", off))}
    assert alerts["on"][0] == first_flag < alerts["off"][0], alerts
    assert "against the season on wind" in on[first_flag]["alert_reason"]
    assert [i for i in alerts["on"] if i < drop] == []  # quiet seasons raise nothing


def test_undeclared_the_season_is_the_year_the_daily_rows_cover_and_the_rule_alerts_as_declared(tmp_path):
    table = _seasonal_days()
    declared, found = _training_run(table, tmp_path, 4), _training_run(table, tmp_path, 4, period=None)
    alerts = {name: [i for i, w in enumerate(ws) if w["alert"]] for name, ws in (("declared", declared),
                                                                                 ("found", found))}
    assert alerts["found"] == alerts["declared"] and alerts["found"], alerts
    assert "against the season on wind" in found[alerts["found"][0]]["alert_reason"]


def _times(start, step, count):
    return (pd.Timestamp(start) + pd.to_timedelta(np.arange(count) * pd.Timedelta(step).value, unit="ns")
            ).to_numpy("datetime64[ns]")


@pytest.mark.parametrize(("times", "window", "expected"), [
    (_times("2000-01-01", "1D", 8 * 365), "30D", pd.Timedelta(days=365.25)),  # daily weather: a year
    (_times("2000-01-01", "1D", 3 * 365), "6h", pd.Timedelta(days=7)),  # midnight rows: no day; a year too few
    (_times("2000-01-01", "10min", 3000), "1h", pd.Timedelta(days=1)),  # three weeks: 18 rows an hour of a week
    (_times("2000-01-01", "1h", 24 * 365), "1h", pd.Timedelta(days=7)),  # a year of hours: not twice a year
    (_times("2000-01-01", "1D", 21), "1D", None),  # three weeks of days: 3 rows a weekday
    (_times("2000-01-01", "1h", 1), "1h", None),
])
def test_undeclared_the_period_is_the_longest_of_a_year_a_week_and_a_day_covered_twice_with_rows_to_match(
        times, window, expected):
    assert choose_period(times, pd.Timedelta(window)) == expected


def test_without_two_cycles_of_the_period_the_season_run_rule_changes_nothing(tmp_path):
    table = _seasonal_days(years=3, drop_day=int(1.5 * 365))
    short = dict(reference_end="2001-03-01", end="2002-06-01")  # 14 months: one cycle per season
    on, off = _training_run(table, tmp_path, 4, **short), _training_run(table, tmp_path, 0, **short)
    assert [(w["alert"], w["alert_reason"]) for w in on] == [(w["alert"], w["alert_reason"]) for w in off]
    assert any(w["alert"] for w in on)


def test_a_reference_spanning_less_than_two_periods_falls_back_to_the_whole_reference(tmp_path):
    table = _seasonal_days(years=2)
    spec = ReferenceStrategy(name="training_seasonal", period=YEAR.to_pytimedelta())
    doc = run_backtest(table, time_column="ts", out_dir=tmp_path, window="30", strategy=spec,
                       reference_range=("2000-01-01T00:00Z", "2001-03-01T00:00Z"), replay_end="2001-06-01T00:00Z",
                       html_report=False)
    assert all(w["reference"].startswith("training (the season matches ") and "from 1 cycle(s)" in w["reference"]
               for w in doc["windows"])


@pytest.mark.parametrize("value", ["training_seasonal", "seasonal"])
def test_the_strategy_setting_accepts_the_matched_season(value):
    settings = Settings.from_env({"TRITONFLOW_DRIFT_REFERENCE_STRATEGY": value,
                                  "TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS": "8766"})
    spec = ReferenceStrategy.from_settings(settings)
    assert spec.name == value and spec.period == pd.Timedelta(hours=8766)
    assert (spec.served_range("2024-01-01", "2024-01-02") is None) == (value == "training_seasonal")
    undeclared = ReferenceStrategy.from_settings(Settings.from_env({"TRITONFLOW_DRIFT_REFERENCE_STRATEGY": value}))
    assert undeclared.period is None and undeclared.served_period == pd.Timedelta(days=7)  # seasonal: last week
    assert "the reference's times" in undeclared.describe() or value == "seasonal"


def test_a_reference_keeps_its_rows_times_through_sampling_and_a_round_trip(tmp_path):
    from drift_checks.reference import load_reference, save_reference

    table = _seasonal_days(years=2).rename(columns={"ts": "timestamp"})
    saved = save_reference(str(tmp_path), "m", 1, table, max_rows=300, seed=3)
    loaded = load_reference(str(tmp_path), "m", 1, with_profile=False)
    assert list(saved.schema.features) == ["wind"]  # the time is never a feature
    expected = table.set_index("wind").loc[loaded.frame["wind"], "timestamp"].dt.tz_convert(None).to_numpy()
    assert np.array_equal(loaded.times, expected) and np.array_equal(saved.times, loaded.times)
    timeless = save_reference(str(tmp_path), "m", 2, table[["wind"]])
    assert timeless.times is None and load_reference(str(tmp_path), "m", 2, with_profile=False).times is None


def test_a_reference_time_that_is_not_a_time_drops_the_times_with_the_reason_and_keeps_the_reference(
        tmp_path, caplog):
    """A training window mixing in earlier reference rows has rows without a time: the reference is
    what drift checks need, so it is kept; the times go, and the log and meta.json say why."""
    import json

    from drift_checks.reference import load_reference, save_reference

    table = _seasonal_days(years=1).rename(columns={"ts": "timestamp"}).astype({"timestamp": object})
    for value, why in (("soon", "holds a value that is not a time"), (None, "is empty at row 7")):
        table.loc[7, "timestamp"] = value
        saved = save_reference(str(tmp_path), "m", 1, table)
        assert saved.times is None and len(saved.frame) == len(table)
        assert f"column 'timestamp' {why}" in caplog.text
        meta = json.loads((tmp_path / "m" / "reference" / "v1" / "meta.json").read_text())
        assert meta["times"] is False and why in meta["times_note"]
        assert load_reference(str(tmp_path), "m", 1, with_profile=False).times is None


def _seasonal(table: pd.DataFrame, order=None) -> SeasonalReference:
    rows = table if order is None else table.iloc[order]
    prepared = prepare_reference(rows[["wind"]].reset_index(drop=True), LogSchema({"wind": "float"}),
                                 reference_id="r", time_ordered=True)
    return SeasonalReference(prepared, rows["ts"].dt.tz_convert(None).to_numpy("datetime64[ns]"), YEAR)


def test_the_calibration_follows_the_rows_times_not_their_order():
    """A training set is often shuffled: the seasons come from the times, so the thresholds match."""
    table = _seasonal_days(years=5)
    shuffled = np.random.default_rng(1).permutation(len(table))
    month = pd.Timedelta(days=30)
    ordered = _seasonal(table).calibration(30, 0.95, duration=month)
    mixed = _seasonal(table, shuffled).calibration(30, 0.95, duration=month)
    assert ordered is not None and mixed is not None and ordered.n_chunks == mixed.n_chunks >= 10
    assert mixed.values == pytest.approx(ordered.values)


def test_a_reference_shorter_than_two_cycles_per_season_calibrates_nothing():
    month = pd.Timedelta(days=30)
    assert _seasonal(_seasonal_days(years=1)).calibration(30, 0.95, duration=month) is None


def test_a_seasons_window_is_held_to_the_contract_of_the_whole_reference(tmp_path):
    """Nulls in the first half of every year only: a second-half window with 6 % nulls would break
    the not-null expectation learned from its season's rows alone (none: at most 5 %), and keeps
    the one of the whole reference (2.5 %: at most 7.5 %), as with the training strategy."""
    table = _seasonal_days(drop_day=10**6)
    day = np.arange(len(table))
    first_half = (day % 365) < 180
    table.loc[first_half & (day % 20 == 0), "wind"] = np.nan  # 5 %: 2.5 % of the whole reference
    table.loc[(day >= 5 * 365 + 200) & (day % 16 == 0), "wind"] = np.nan  # 6 % in the replayed second half
    runs = {s: _run(table, tmp_path, s, end="2005-12-31")["windows"] for s in ("training", "training_seasonal")}
    second_half = [i for i, w in enumerate(runs["training"]) if pd.Timestamp(w["start"]).dayofyear > 200]
    assert second_half and runs["training_seasonal"][second_half[0]]["reference"].startswith("training_seasonal (")
    for s, windows in runs.items():
        assert [w["contract_failures"] for w in windows if w["contract_failures"]] == [], s


def test_numeric_times_and_a_damaged_times_file_cost_the_times_only(tmp_path, caplog):
    from drift_checks.reference import TIMES_FILE, load_reference, save_reference

    table = _seasonal_days(years=2)
    numeric = save_reference(str(tmp_path), "m", 1, table[["wind"]].assign(timestamp=np.arange(len(table))))
    assert numeric.times is None and "holds numbers" in caplog.text
    save_reference(str(tmp_path), "m", 2, table.rename(columns={"ts": "timestamp"}))
    (tmp_path / "m" / "reference" / "v2" / TIMES_FILE).write_bytes(b"not parquet")
    damaged = load_reference(str(tmp_path), "m", 2, with_profile=False)
    assert damaged.times is None and len(damaged.frame) == len(table) and "not read" in caplog.text


def test_a_negative_period_is_refused_naming_the_variable_the_value_and_what_is_expected():
    from ground.exceptions import SettingsError
    from ground.settings_checks import settings_problems

    settings = Settings.from_env({"TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS": "-24"})
    assert settings_problems(settings) == ["TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS=-24.0: expected a number >= 0"]
    with pytest.raises(SettingsError, match="expected positive durations"):
        ReferenceStrategy(name="seasonal", period=pd.Timedelta(hours=-24).to_pytimedelta())
