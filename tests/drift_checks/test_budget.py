"""The declared false-alarm budget: the setting, the calibration on the reference's own windows,
and the realised rate the backtest reports beside it (issue 31, item 4)."""

import datetime as dt
import json

import numpy as np
import pandas as pd
import pytest

from drift_checks import statistics as st
from drift_checks.backtest import run_backtest
from drift_checks.budget import WINDOWS_PER_WEEK, calibrate_to_budget, expected_per_week, realised_rate
from drift_checks.history import HistoryStore
from drift_checks.inference_log import LogSchema
from drift_checks.policy import AlertPolicy
from drift_checks.thresholds import ThresholdPolicy, calibrate_from_reference, reference_thresholds
from drift_checks.verdict import CheckConfig, check_window, prepare_reference
from ground.exceptions import SettingsError
from ground.settings import DEFAULTS, Settings
from ground.settings_checks import settings_problems

T0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)
FEATURES = ("a", "b", "c", "d")


def _null(rng, n):
    """Rows with nothing drifting: four independent standard normals."""
    return pd.DataFrame({c: rng.normal(0.0, 1.0, n) for c in FEATURES})


def _calibration(frame, rows):
    numeric = {c: st.prepare_numeric(frame[c]) for c in frame.columns}
    return calibrate_from_reference(frame, numeric, {}, rows)


# ------------------------------------------------------------------------------------ the setting
def test_the_budget_is_a_setting_with_a_default_of_one_false_alert_per_model_week():
    assert DEFAULTS.drift_false_alarm_budget_per_week == 1.0
    assert AlertPolicy().false_alarm_budget_per_week == 1.0
    s = Settings.from_env({"TRITONFLOW_DRIFT_FALSE_ALARM_BUDGET_PER_WEEK": "0.25"})
    assert AlertPolicy.from_settings(s).false_alarm_budget_per_week == 0.25
    assert CheckConfig.from_settings(s).alerts.false_alarm_budget_per_week == 0.25


@pytest.mark.parametrize("value", ["0", "-1", "inf"])
def test_a_budget_that_is_not_a_finite_positive_number_is_refused_by_name(value):
    s = Settings.from_env({"TRITONFLOW_DRIFT_FALSE_ALARM_BUDGET_PER_WEEK": value})
    problems = [p for p in settings_problems(s) if "FALSE_ALARM_BUDGET" in p]
    assert problems and "finite number > 0" in problems[0]
    with pytest.raises(SettingsError, match="false_alarm_budget_per_week"):
        AlertPolicy.from_settings(s)


# ---------------------------------------------------------------------------------- calibration
def test_a_tighter_budget_calibrates_a_higher_quantile_and_stricter_thresholds():
    rng = np.random.default_rng(3)
    cal = _calibration(_null(rng, 6000), 40)  # 150 chunks of 40 rows
    policy = ThresholdPolicy()
    loose = calibrate_to_budget(cal, policy, AlertPolicy(false_alarm_budget_per_week=1.0))
    tight = calibrate_to_budget(cal, policy, AlertPolicy(false_alarm_budget_per_week=0.01))
    assert loose.met and loose.expected_per_week <= 1.0
    assert tight.quantile > loose.quantile
    # each quantile tried, in order, expects no more false alerts than the one before
    expected = [e for _, e in tight.tried]
    assert expected == sorted(expected, reverse=True)
    at = {b: reference_thresholds([("a", "psi"), ("a", "ks_p_value")], ThresholdPolicy(quantile=b.quantile),
                                  cal.at_quantile(b.quantile)) for b in (loose, tight)}
    assert at[tight][("a", "psi")].value > at[loose][("a", "psi")].value
    assert at[tight][("a", "ks_p_value")].value < at[loose][("a", "ks_p_value")].value
    assert tight.to_dict()["budget_per_week"] == 0.01 and json.dumps(tight.to_dict())


def test_the_expected_rate_counts_the_run_rule_only_while_it_is_on():
    rng = np.random.default_rng(4)
    cal = _calibration(_null(rng, 6000), 40)
    on = expected_per_week(cal, ThresholdPolicy(), AlertPolicy())
    off = expected_per_week(cal, ThresholdPolicy(), AlertPolicy(sustained_windows=0))
    assert 0 <= off < on < WINDOWS_PER_WEEK


def test_without_ten_reference_chunks_nothing_is_calibrated():
    rng = np.random.default_rng(5)
    cal = _calibration(_null(rng, 300), 40)  # 7 chunks
    assert calibrate_to_budget(cal, ThresholdPolicy(), AlertPolicy()) is None
    assert calibrate_to_budget(None, ThresholdPolicy(), AlertPolicy()) is None


def test_two_model_weeks_of_null_windows_stay_within_the_budget_and_every_summary_states_it(tmp_path):
    """336 hourly windows drawn from the reference's own distribution: nothing drifts, so every
    alert is a false one; the calibrated policy raises at most its budget (1 per week)."""
    rng = np.random.default_rng(11)
    schema = LogSchema({c: "float" for c in FEATURES})
    reference = prepare_reference(_null(rng, 4000), schema, reference_id="v1:training:null")
    history = HistoryStore(f"sqlite:///{tmp_path / 'history.db'}")
    cfg = CheckConfig(evidently_sample_rows=0)
    alerts = 0
    try:
        for i in range(2 * WINDOWS_PER_WEEK):
            out = check_window(model="m", frame=_null(rng, 40), start=T0 + i * HOUR, end=T0 + (i + 1) * HOUR,
                               reference=reference, history=history, config=cfg)
            alerts += bool(out["drift"])
            budget = out["false_alarm_budget"]
            assert budget["budget_per_week"] == 1.0 and budget["calibrated"] and budget["met"]
    finally:
        history.engine.dispose()
    assert alerts <= 2
    assert realised_rate(alerts, 2 * WINDOWS_PER_WEEK, 1.0)["per_week"] <= 1.0


# ----------------------------------------------------------------------------- the realised rate
def test_the_realised_rate_has_the_exact_clopper_pearson_bound():
    none = realised_rate(0, WINDOWS_PER_WEEK, 1.0)
    # no alert in n windows: the upper bound is 1 - alpha ** (1 / n) (about 3 / n, the rule of three)
    assert none["per_week"] == 0
    assert none["per_week_upper"] == pytest.approx(WINDOWS_PER_WEEK * (1 - 0.05 ** (1 / WINDOWS_PER_WEEK)), abs=1e-3)
    assert none["within_budget"] is False  # one week without alerts cannot prove a budget of 1 per week
    long = realised_rate(1, 20 * WINDOWS_PER_WEEK, 1.0)
    assert long["per_week"] == 0.05 and long["per_week_upper"] < 1.0 and long["within_budget"]
    assert realised_rate(5, 5)["per_100_windows_upper"] == 100.0
    assert realised_rate(0, 0, 1.0)["within_budget"] is None
    assert [realised_rate(k, 100)["per_100_windows_upper"] for k in range(4)] == sorted(
        realised_rate(k, 100)["per_100_windows_upper"] for k in range(4))


def test_the_backtest_reports_the_realised_rate_of_its_quiet_windows_beside_the_budget(tmp_path):
    rng = np.random.default_rng(2)
    n_ref, rows, n_win = 2000, 40, 30
    frame = _null(rng, n_ref + rows * n_win)
    frame.loc[n_ref + rows * 20:, "a"] += 3.0  # windows 20.. shift: not quiet
    frame["t"] = np.arange(len(frame), dtype="float64")
    cfg = CheckConfig(alerts=AlertPolicy(false_alarm_budget_per_week=0.5))
    doc = run_backtest(frame, time_column="t", out_dir=tmp_path, reference_rows=n_ref, window=str(rows),
                       config=cfg, html_report=False, quiet_windows=range(20))
    s = doc["summary"]
    assert doc["policy"]["false_alarm_budget_per_week"] == 0.5
    assert s["false_alarms"]["windows"] == 20 and s["false_alarms"]["budget_per_week"] == 0.5
    assert s["false_alarms"]["alerts"] == sum(w["alert"] for w in doc["windows"][:20])
    assert s["alerts"] > s["false_alarms"]["alerts"]  # the shift alerted, and is not counted as false
    assert {"per_week", "per_week_upper", "per_100_windows_upper"} <= set(s["static_phase"]["false_alarms"])
    assert all(w["window"] < 20 or w["window"] not in s["quiet_windows"] for w in doc["windows"])
