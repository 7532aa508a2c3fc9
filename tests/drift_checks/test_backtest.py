"""``tritonflow drift backtest``: any Parquet/CSV table with a time column, reference
strategies on a daily cycle."""

import json

import numpy as np
import pandas as pd
import pytest

from drift_checks.backtest import BacktestWindow, run_backtest
from drift_checks.strategies import ReferenceStrategy
from ground.exceptions import DataError
from tritonflow import cli


def _table(n=2400, shift_at=1500, seed=0):
    rng = np.random.default_rng(seed)
    t = pd.date_range("2024-03-01", periods=n, freq="min", tz="UTC")
    x = rng.normal(size=n)
    x[shift_at:] += 2.5
    clicks = pd.array(rng.integers(0, 9, n), dtype="Int64")
    clicks[::17] = pd.NA
    return pd.DataFrame({"ts": t.strftime("%Y-%m-%dT%H:%M:%SZ"), "x": x, "y": rng.normal(size=n),
                         "plan": rng.choice(["basic", "pro"], n, p=[0.7, 0.3]), "clicks": clicks})


def test_backtest_command_on_a_csv_table_writes_every_window_and_the_summary(tmp_path, capsys):
    path = tmp_path / "history.csv"
    _table().to_csv(path, index=False)
    out = tmp_path / "bt"
    rc = cli.main(["drift", "backtest", "--data", str(path), "--time-column", "ts", "--reference-rows", "600",
                   "--window", "60", "--categorical", "plan", "--out", str(out), "--weighting", "uniform"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    doc = json.loads((out / "backtest.json").read_text())
    assert printed["windows"] == doc["summary"]["windows"] == 30
    assert doc["data"]["features"] == {"x": "float", "y": "float", "plan": "category", "clicks": "int"}
    w = doc["windows"][0]
    assert {"start", "end", "n_rows", "status", "severity", "alert", "dataset_drift", "dataset_score",
            "drifted", "threshold_phase"} <= set(w) and w["n_rows"] == 60
    shift_window = (1500 - 600) // 60
    alerts = doc["summary"]["alert_windows"]
    assert alerts and shift_window <= alerts[0] <= shift_window + 2 and not [a for a in alerts if a < shift_window]
    hit = doc["windows"][alerts[0]]
    cause = next(d for d in hit["drifted"] if d["feature"] == "x")
    assert cause["statistics"]
    assert {"statistic", "value", "threshold", "threshold_source"} <= set(cause["statistics"][0])
    assert {"static_phase", "dynamic_phase", "alerts_per_100_windows"} <= set(doc["summary"])
    assert (out / "index.html").is_file() and (out / "drift_x.png").is_file()
    assert "drift_x.png" in (out / "index.html").read_text()


def test_backtest_on_parquet_with_a_time_range_reference_and_duration_windows(tmp_path):
    table = _table()
    table["ts"] = pd.to_datetime(table["ts"], utc=True)
    table = table[~table["ts"].between("2024-03-02 12:00", "2024-03-02 12:59:59", inclusive="both")]
    path = tmp_path / "history.parquet"
    table.to_parquet(path, index=False)
    out = tmp_path / "bt"
    assert cli.main(["drift", "backtest", "--data", str(path), "--time-column", "ts", "--reference-range",
                     "2024-03-01T00:00:00Z", "2024-03-01T12:00:00Z", "--window", "1h", "--out", str(out),
                     "--no-html"]) == 0
    doc = json.loads((out / "backtest.json").read_text())
    assert doc["data"]["reference_rows"] == 720
    statuses = {w["start"][:16]: w["status"] for w in doc["windows"]}
    assert statuses["2024-03-02 12:00"] == "no_data" and doc["summary"]["no_data_windows"] == 1
    assert not (out / "index.html").exists()


def test_backtest_refuses_bad_options_with_a_clear_message(tmp_path):
    frame = _table(200)
    with pytest.raises(DataError, match="exactly one reference"):
        run_backtest(frame, time_column="ts", out_dir=tmp_path)
    with pytest.raises(DataError, match="--time-column 'when' is not a column"):
        run_backtest(frame, time_column="when", reference_rows=50, out_dir=tmp_path)
    with pytest.raises(DataError, match="--window 'soon'"):
        BacktestWindow.parse("soon")
    bad = frame.assign(ts=frame.ts.where(frame.index != 3, "not a time"))
    with pytest.raises(DataError, match="first offending values: \\['not a time'\\]"):
        run_backtest(bad, time_column="ts", reference_rows=50, out_dir=tmp_path)


def test_a_range_and_an_end_are_read_in_the_unit_of_a_numeric_time_column(tmp_path, capsys):
    """Days numbered 0..N (``--time-unit D``): ``--reference-range 0 200 --end 300`` means days,
    as the time column does; a value that is no time fails naming the option, the value and what
    reads, for a numeric column and a datetime one alike."""
    rng = np.random.default_rng(3)
    path = tmp_path / "days.csv"
    pd.DataFrame({"day": np.arange(400), "x": rng.normal(size=400)}).to_csv(path, index=False)
    rc = cli.main(["drift", "backtest", "--data", str(path), "--time-column", "day", "--time-unit", "D",
                   "--reference-range", "0", "200", "--end", "300", "--window", "20", "--no-html",
                   "--out", str(tmp_path / "bt")])
    assert rc == 0 and json.loads(capsys.readouterr().out.strip().splitlines()[-1])["windows"] == 5
    doc = json.loads((tmp_path / "bt" / "backtest.json").read_text())
    assert doc["data"]["reference_rows"] == 200
    table = pd.read_csv(path)
    with pytest.raises(DataError, match=r"--reference-range 'soon' is not a time .*or a number of 'D'"):
        run_backtest(table, time_column="day", time_unit="D", reference_range=("0", "soon"), out_dir=tmp_path)
    with pytest.raises(DataError, match=r"--end 'later' is not a time .*expected a datetime such as"):
        run_backtest(_table(200), time_column="ts", reference_rows=50, replay_end="later", out_dir=tmp_path)


def _daily_cycle(days=5, shift_day=3, seed=1):
    """One row per minute; x follows the hour of day (a daily cycle), +1.5 from 2024-01-04."""
    rng = np.random.default_rng(seed)
    t = pd.date_range("2024-01-01", periods=days * 1440, freq="min", tz="UTC")
    hours = t.hour + t.minute / 60
    x = np.asarray(2.0 * np.sin(2 * np.pi * hours / 24)) + rng.normal(0, 0.5, len(t))
    x[t >= t[0] + pd.Timedelta(days=shift_day)] += 1.5
    return pd.DataFrame({"ts": t, "x": x})


@pytest.mark.parametrize("strategy", ["training", "seasonal"])
def test_a_seasonal_reference_ignores_the_daily_cycle_and_still_sees_a_real_shift(tmp_path, strategy):
    """A reference of six morning hours: against it (training) the rest of the day is drift; the
    seasonal strategy (the same two hours yesterday) sees only the real shift on day 4."""
    spec = ReferenceStrategy(name=strategy, period=pd.Timedelta(hours=24).to_pytimedelta())
    doc = run_backtest(_daily_cycle(), time_column="ts", out_dir=tmp_path, window="2h",
                       reference_range=("2024-01-01T00:00Z", "2024-01-01T06:00Z"), strategy=spec,
                       replay_end="2024-01-05T00:00Z", html_report=False)
    windows = doc["windows"]
    shift = next(i for i, w in enumerate(windows) if w["start"].startswith("2024-01-04 00:00"))
    drifted_before = [i for i, w in enumerate(windows[:shift]) if w["dataset_drift"] and w["reference"] == strategy]
    alerts = doc["summary"]["alert_windows"]
    if strategy == "training":
        assert len(drifted_before) >= 10  # the daily cycle keeps leaving the morning reference
    else:
        assert drifted_before == [] and windows[shift]["reference"] == "seasonal"
        assert [a for a in alerts if shift <= a <= shift + 2], alerts


def test_a_trailing_reference_alerts_at_a_step_and_then_follows_the_new_level(tmp_path):
    rng = np.random.default_rng(2)
    t = pd.date_range("2024-01-01", periods=3 * 1440, freq="min", tz="UTC")
    x = rng.normal(size=len(t)) + np.where(t >= pd.Timestamp("2024-01-02T12:00Z"), 1.0, 0.0)
    table = pd.DataFrame({"ts": t, "x": x})
    runs = {}
    for name in ("training", "trailing"):
        spec = ReferenceStrategy(name=name, trailing=pd.Timedelta(hours=12).to_pytimedelta())
        runs[name] = run_backtest(table, time_column="ts", out_dir=tmp_path / name, window="1h",
                                  reference_range=("2024-01-01T00:00Z", "2024-01-01T12:00Z"), strategy=spec,
                                  html_report=False)["windows"]
    step = next(i for i, w in enumerate(runs["training"]) if w["start"].startswith("2024-01-02 12:00"))
    for name, windows in runs.items():
        assert any(w["alert"] for w in windows[step:step + 3]), name
        assert not any(w["alert"] for w in windows[:step]), name
    assert all(w["dataset_drift"] for w in runs["training"][-6:])  # still unlike the training data
    assert not any(w["dataset_drift"] for w in runs["trailing"][-6:])  # the new level is the norm now


@pytest.mark.parametrize("shift, feature", [(3000, "max_sustained_wind_speed"), (16000, "sea_level_pressure")])
def test_a_sustained_shift_on_a_minor_noaa_input_alerts_within_2_windows_and_its_quiet_stretch_never(
        tmp_path, shift, feature):
    """The benchmark's scenario (benchmarks/drift_quality.py): the wind drop at day 3,000 and the
    pressure fall at day 16,000 each move one input of importance about 0.05; the run rule alerts
    within 2 windows of the shift, and never in the quiet windows before it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from drift_quality import SCENARIOS, _champion_importance, _ts

    from drift_checks.verdict import CheckConfig
    from ground.settings import Settings
    from model_registry.datasets import FEATURE_COLUMNS, load_noaa

    noaa, features = load_noaa(), list(FEATURE_COLUMNS)
    quiet = SCENARIOS[shift]
    start = shift - quiet * 48
    importance = _champion_importance(noaa.iloc[start - 2000:start], features)
    assert importance[feature] < 0.1
    doc = run_backtest(noaa[["day", *features]], time_column="day", time_unit="D", out_dir=tmp_path,
                       reference_range=(_ts(start - 2000), _ts(start)), window="48", importance=importance,
                       config=CheckConfig.from_settings(Settings.from_env({})), replay_end=_ts(shift + 3 * 48),
                       html_report=False)
    alerts = doc["summary"]["alert_windows"]
    assert alerts and quiet <= alerts[0] <= quiet + 2 and not [a for a in alerts if a < quiet]
    hit = doc["windows"][alerts[0]]
    assert feature in hit["alert_features"] and "sustained drift" in hit["alert_reason"]
    assert doc["policy"]["sustained_windows"] == 5 and doc["policy"]["sustained_evidence"] == 4


def _stores(n=1300, seed=3):
    """Integer store ids (a category) and units sold, one row a minute, no shift."""
    rng = np.random.default_rng(seed)
    t = pd.date_range("2024-03-01", periods=n, freq="min", tz="UTC")
    return pd.DataFrame({"ts": t.strftime("%Y-%m-%dT%H:%M:%SZ"), "store_id": rng.choice([11, 17, 23], n),
                         "units": np.round(rng.gamma(4.0, 2.0, n), 2)})


@pytest.mark.parametrize("engine", ["exact", "streamed"])
def test_an_integer_column_declared_categorical_passes_every_window_of_the_backtest(tmp_path, engine):
    path = tmp_path / "stores.csv"
    _stores().to_csv(path, index=False)
    out = tmp_path / "bt"
    assert cli.main(["drift", "backtest", "--data", str(path), "--time-column", "ts", "--reference-rows", "100",
                     "--window", "100", "--categorical", "store_id", "--out", str(out), "--no-html",
                     "--engine", engine]) == 0
    doc = json.loads((out / "backtest.json").read_text())
    assert doc["data"]["features"] == {"store_id": "category", "units": "float"}
    assert doc["summary"]["windows"] == 12 and doc["summary"]["contract_failed_windows"] == 0
    assert {w["status"] for w in doc["windows"]} == {"ok"}
    assert all(w["contract_failures"] == [] for w in doc["windows"])


@pytest.mark.parametrize("engine", ["exact", "streamed"])
def test_a_word_in_a_numeric_column_fails_that_window_s_contract_naming_the_column_and_the_value(tmp_path, engine):
    table = _stores()
    table["units"] = table["units"].astype(object)
    table.loc[650, "units"] = "twelve"  # window (650 - 100) // 100 = 5; the CSV column is text throughout
    path = tmp_path / "stores.csv"
    table.to_csv(path, index=False)
    out = tmp_path / "bt"
    assert cli.main(["drift", "backtest", "--data", str(path), "--time-column", "ts", "--reference-rows", "100",
                     "--window", "100", "--categorical", "store_id", "--out", str(out), "--no-html",
                     "--engine", engine]) == 0
    doc = json.loads((out / "backtest.json").read_text())
    assert doc["data"]["features"]["units"] == "float"  # the reference rows are numbers
    assert [w["window"] for w in doc["windows"] if w["status"] != "ok"] == [5]
    (failure,) = doc["windows"][5]["contract_failures"]
    assert doc["windows"][5]["status"] == "contract_failed" and failure["column"] == "units"
    assert "'twelve'" in failure["message"] and "cannot be read as float" in failure["message"]


def test_a_suite_of_the_user_s_own_adds_to_the_derived_contract_of_every_backtest_window(tmp_path, capsys):
    table = _stores()
    table.loc[400:499, "units"] = np.nan  # window 3: the units feed is empty
    path = tmp_path / "stores.csv"
    table.to_csv(path, index=False)
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"name": "stores", "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "units", "mostly": 0.0}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "units", "min_value": 0,
                                                                 "max_value": 1000}}]}))
    out = tmp_path / "bt"
    args = ["drift", "backtest", "--data", str(path), "--time-column", "ts", "--reference-rows", "100",
            "--window", "100", "--categorical", "store_id", "--out", str(out), "--no-html"]
    assert cli.main(args + ["--suite", str(suite)]) == 0
    doc = json.loads((out / "backtest.json").read_text())
    assert [w["window"] for w in doc["windows"] if w["status"] != "ok"] == [3]
    (failure,) = doc["windows"][3]["contract_failures"]
    assert (failure["column"], failure["expectation"], failure["source"]) == (
        "units", "expect_column_values_to_not_be_null", "derived")
    suite.write_text('{"expectations": [{"kwargs": {}}]}')
    capsys.readouterr()
    assert cli.main(args + ["--suite", str(suite)]) == 1
    err = capsys.readouterr().err
    assert f"--suite {str(suite)!r}: expectation 0" in err and "expected" in err


@pytest.mark.parametrize("engine", ["exact", "streamed"])
def test_a_users_suite_is_judged_alike_by_both_engines_and_a_check_that_cannot_run_is_listed(tmp_path, engine):
    table = _stores()
    table.loc[450:459, "units"] = 2000.0  # window 3: ten readings far above the user's bound
    path = tmp_path / "stores.csv"
    table.to_csv(path, index=False)
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"name": "stores", "expectations": [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "units", "min_value": 0,
                                                                 "max_value": 1000}, "severity": "critical"},
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "store_id", "value_set": [11, 17, 23]}}]}))
    out = tmp_path / "bt"
    args = ["drift", "backtest", "--data", str(path), "--time-column", "ts", "--reference-rows", "100",
            "--window", "100", "--categorical", "store_id", "--out", str(out), "--no-html", "--engine", engine]
    assert cli.main(args + ["--suite", str(suite)]) == 0
    doc = json.loads((out / "backtest.json").read_text())
    assert [(w["window"], w["status"]) for w in doc["windows"] if w["status"] != "ok"] == [(3, "contract_failed")]
    assert doc["summary"]["check_error_windows"] == 0
    (failure,) = doc["windows"][3]["contract_failures"]
    assert (failure["column"], failure["expectation"], failure["source"]) == (
        "units", "expect_column_values_to_be_between", "user")
    assert failure["message"].startswith("column 'units': 10 of 100 values (10.00 %) are unexpected, first [2000.0]")
    # a range on the column declared categorical cannot apply: each window says so, naming it
    suite.write_text(json.dumps({"expectations": [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 0,
                                                                 "max_value": 100}}]}))
    assert cli.main(args + ["--suite", str(suite)]) == 0
    doc = json.loads((out / "backtest.json").read_text())
    assert doc["summary"]["check_error_windows"] == 12 and doc["summary"]["contract_failed_windows"] == 0
    for w in doc["windows"]:
        (error,) = w["contract_check_errors"]
        assert w["contract_failures"] == []  # the ids are all the reference's: no data is blamed
        assert (error["column"], error["source"]) == ("store_id", "user")
        assert "declared category" in error["message"]


@pytest.mark.parametrize("engine", ["exact", "streamed"])
def test_a_word_among_the_served_rows_fails_its_own_window_and_never_the_trailing_reference_of_later_ones(
        tmp_path, engine):
    table = _stores()
    table["units"] = table["units"].astype(object)
    table.loc[650, "units"] = "twelve"  # window 5; windows 6 and 7 compare with the 150 minutes before them
    path = tmp_path / "stores.csv"
    table.to_csv(path, index=False)
    out = tmp_path / "bt"
    assert cli.main(["drift", "backtest", "--data", str(path), "--time-column", "ts", "--reference-rows", "100",
                     "--window", "100", "--categorical", "store_id", "--out", str(out), "--no-html",
                     "--engine", engine, "--reference-strategy", "trailing", "--trailing", "150min"]) == 0
    doc = json.loads((out / "backtest.json").read_text())
    assert [w["window"] for w in doc["windows"] if w["status"] != "ok"] == [5]
    assert {doc["windows"][i]["reference"] for i in (6, 7)} == {"trailing"}
