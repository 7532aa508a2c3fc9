"""The hourly check end to end: an all-null column, an empty window, reruns, hysteresis."""

import datetime as dt
import json

import numpy as np
import pandas as pd
import pytest

from drift_checks.contract_types import Contract
from drift_checks.history import HistoryStore
from drift_checks.inference_log import LogSchema
from drift_checks.reference import load_reference, save_reference
from drift_checks.thresholds import ThresholdPolicy
from drift_checks.verdict import CheckConfig, check_window, evidently_report_for_window, prepare_reference

SESSION_LOG_SCHEMA = LogSchema({"session_minutes": "float", "device": "category",
                        "promo_code": "category", "pages_viewed": "int"})
T0 = dt.datetime(2024, 5, 1, 13, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)


@pytest.fixture
def history(tmp_path):
    h = HistoryStore(f"sqlite:///{tmp_path / 'history.db'}")
    yield h
    h.engine.dispose()


def test_all_null_column_is_a_data_quality_failure_and_other_columns_get_drift_results(
        null_and_empty_windows, history, tmp_path):
    ref, all_null, _ = null_and_empty_windows
    prepared = prepare_reference(ref, SESSION_LOG_SCHEMA)
    out = check_window(model="shop", frame=all_null, start=T0, end=T0 + HOUR,
                       reference=prepared, history=history, artefact_dir=tmp_path / "art")
    assert out["features"]["promo_code"]["severity"] == "invalid"
    assert {"kind": "data_quality", "column": "promo_code"}.items() <= next(
        a for a in out["alerts"] if a.get("expectation") == "expect_column_values_to_not_be_null").items()
    for col in ("session_minutes", "device", "pages_viewed"):
        # the all-null column does not take the others down: each one is scored by every one of
        # its statistics (a finite value, status ok) and judged, not marked invalid or unscored
        info = out["features"][col]
        assert info["severity"] not in ("invalid", "unscored")
        assert info["statistics"] and all(
            s["status"] == "ok" and np.isfinite(s["value"]) for s in info["statistics"].values()), info
    assert out["evidently"] is None  # Evidently is its own step, off the hourly critical path
    ev = evidently_report_for_window(prepared, all_null, tmp_path / "art", sample_rows=5000)
    assert ev["status"] == "ok" and "promo_code" in ev["excluded"]
    assert set(ev["scores"]) == {"session_minutes", "device", "pages_viewed"}
    assert (tmp_path / "art" / "evidently_data_drift.html").is_file()
    assert len(json.dumps(out)) < 48 * 1024


def test_empty_window_is_no_data_with_an_alert_and_leaves_the_baseline_alone(null_and_empty_windows, history, tmp_path):
    ref, _, empty = null_and_empty_windows
    out = check_window(model="shop", frame=empty, start=T0, end=T0 + HOUR,
                       reference=prepare_reference(ref, SESSION_LOG_SCHEMA), history=history,
                       artefact_dir=tmp_path)
    assert out["status"] == "no_data" and out["drift"] is False
    assert out["alerts"][0]["kind"] == "data_availability"
    assert history.window("shop", T0)["status"] == "no_data"
    assert history.values("shop", "session_minutes", "psi") == []
    assert not (tmp_path / "evidently_data_drift.html").exists()


def _frame(rng, n, shift=0.0):
    return pd.DataFrame({"x": rng.normal(shift, 1.0, n), "c": rng.choice(["a", "b", "c"], n)})


SCHEMA = LogSchema({"x": "float", "c": "category"})


def test_rerun_of_the_same_hour_gives_identical_summary_and_one_row_per_statistic(history):
    rng = np.random.default_rng(0)
    ref = prepare_reference(_frame(rng, 5000), SCHEMA)
    cur = _frame(rng, 2000, 0.3)
    cfg = CheckConfig(evidently_sample_rows=0)
    a = check_window(model="m", frame=cur, start=T0, end=T0 + HOUR, reference=ref, history=history, config=cfg)
    b = check_window(model="m", frame=cur, start=T0, end=T0 + HOUR, reference=ref, history=history, config=cfg)
    assert a == b
    assert len(history.values("m", "x", "psi")) == 1


def test_statistics_recorded_every_hour_and_drift_needs_consecutive_flagged_windows(history):
    rng = np.random.default_rng(1)
    ref = prepare_reference(_frame(rng, 5000), SCHEMA)
    cfg = CheckConfig(evidently_sample_rows=0, policy=ThresholdPolicy(min_history=48))
    calm = check_window(model="m", frame=_frame(rng, 2000), start=T0, end=T0 + HOUR,
                        reference=ref, history=history, config=cfg)
    assert calm["severity"] == "ok" and len(history.values("m", "x", "psi")) == 1
    first = check_window(model="m", frame=_frame(rng, 2000, 0.3), start=T0 + HOUR, end=T0 + 2 * HOUR,
                         reference=ref, history=history, config=cfg)
    assert first["features"]["x"]["severity"] == "warning" and first["drift"] is False
    second = check_window(model="m", frame=_frame(rng, 2000, 0.3), start=T0 + 2 * HOUR,
                          end=T0 + 3 * HOUR, reference=ref, history=history, config=cfg)
    assert second["features"]["x"]["severity"] == "drift"
    assert second["features"]["c"]["severity"] == "ok"
    assert second["dataset_score"] == pytest.approx(0.5) and second["drift"] is True
    assert any(a["kind"] == "drift" and a["features"] == ["x"] for a in second["alerts"])


def test_constant_and_all_null_numeric_columns_never_read_as_ok(history):
    ref = prepare_reference(pd.DataFrame({"x": [np.nan] * 10, "c": ["a"] * 10}), SCHEMA)
    out = check_window(model="m", frame=pd.DataFrame({"x": [1.0] * 5, "c": ["a"] * 5}), start=T0,
                       end=T0 + HOUR, reference=ref, history=history,
                       config=CheckConfig(evidently_sample_rows=0))
    assert out["features"]["x"]["severity"] == "unscored"
    assert "reference has no value" in out["features"]["x"]["reason"]
    assert any(a["kind"] == "data_quality_warning" and a["column"] == "x" for a in out["alerts"])
    # a reference 95 % null allows any null share (no null expectation is derived, and a user's
    # suite can no longer switch the derived ones off): the undefined statistic still says invalid
    ref = prepare_reference(pd.DataFrame({"x": [1.0, 2.0] + [np.nan] * 38, "c": ["a"] * 40}), SCHEMA)
    out = check_window(model="m", frame=pd.DataFrame({"x": [np.nan] * 5, "c": ["a"] * 5}),
                       start=T0 + HOUR, end=T0 + 2 * HOUR, reference=ref, history=history,
                       config=CheckConfig(evidently_sample_rows=0))
    assert out["status"] == "ok" and out["contract"]["sources"] == {"derived": 9, "user": 0}
    assert out["features"]["x"]["severity"] == "invalid" and "all_null" in out["features"]["x"]["reason"]


def test_reference_is_stored_with_its_profile_and_loaded_back(tmp_path):
    rng = np.random.default_rng(2)
    frame = _frame(rng, 500)
    saved = save_reference(str(tmp_path), "m", 7, frame, SCHEMA, max_rows=200)
    loaded = load_reference(str(tmp_path), "m", 7)
    assert len(loaded.frame) == 200 and loaded.schema == SCHEMA
    pd.testing.assert_frame_equal(loaded.frame, saved.frame)
    assert loaded.profile.get_column("x").get_metric("counts").n.value == 200
    from ground.exceptions import WindowError

    with pytest.raises(WindowError, match="no reference stored for 'm' v8"):
        load_reference(str(tmp_path), "m", 8)


@pytest.mark.parametrize("engine", ["exact", "streamed"])
def test_an_hour_with_infinite_values_fails_its_contract_and_never_enters_a_statistic_or_the_history(
        null_and_empty_windows, history, engine):
    from drift_checks.summaries import summarize_frame

    ref, _, _ = null_and_empty_windows
    prepared = prepare_reference(ref, SESSION_LOG_SCHEMA)
    cur = ref.assign(session_minutes=ref.session_minutes.where(ref.index % 4 > 0, np.inf))  # 5 of 20 rows
    frame = summarize_frame(cur, prepared) if engine == "streamed" else cur
    out = check_window(model="shop", frame=frame, start=T0, end=T0 + HOUR, reference=prepared, history=history)
    assert out["status"] == "contract_failed" and out["drift"] is False
    info = out["features"]["session_minutes"]
    assert info["severity"] == "invalid" and info["statistics"] == {}
    (alert,) = [a for a in out["alerts"] if a["kind"] == "data_quality"]
    assert alert["column"] == "session_minutes" and "5 infinite values" in alert["message"]
    assert "(25.00 %)" in alert["message"]
    for statistic in ("psi", "ks_p_value", "wasserstein_normed"):
        assert history.values("shop", "session_minutes", statistic) == []
    assert history.values("shop", "pages_viewed", "psi")  # the other features are still scored
    assert history.window("shop", T0)["status"] == "contract_failed"


def test_a_users_own_suite_adds_to_the_derived_contract_and_the_all_null_column_still_fails(
        null_and_empty_windows, history):
    ref, all_null, _ = null_and_empty_windows
    user = Contract.from_dict({"expectations": [  # as a GX 1.x suite stores it: snake-case types
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "session_minutes",
                                                                 "min_value": 0, "max_value": 500}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "promo_code", "mostly": 0.0}},
    ]})
    out = check_window(model="shop", frame=all_null, start=T0, end=T0 + HOUR,
                       reference=prepare_reference(ref, SESSION_LOG_SCHEMA), history=history, contract=user)
    assert out["status"] == "contract_failed" and out["features"]["promo_code"]["severity"] == "invalid"
    (failure,) = [a for a in out["alerts"] if a["kind"] == "data_quality"]
    assert (failure["column"], failure["expectation"], failure["source"]) == (
        "promo_code", "expect_column_values_to_not_be_null", "derived")  # the user's looser one passed beside it
    contract = out["contract"]
    assert contract["sources"]["user"] == 2 and contract["sources"]["derived"] > 2
    assert [(u["column"], u["expectation"], u["success"]) for u in contract["user_expectations"]] == [
        ("session_minutes", "expect_column_values_to_be_between", True),
        ("promo_code", "expect_column_values_to_not_be_null", True)]
    # the derived type and null checks still apply to a column the user's suite never mentions
    bad = all_null.assign(pages_viewed=all_null.pages_viewed.astype(object).where(all_null.index != 2, "lots"))
    out = check_window(model="shop", frame=bad, start=T0 + HOUR, end=T0 + 2 * HOUR,
                       reference=prepare_reference(ref, SESSION_LOG_SCHEMA), history=history, contract=user)
    assert {(a["column"], a["expectation"], a["source"]) for a in out["alerts"] if a["kind"] == "data_quality"} == {
        ("promo_code", "expect_column_values_to_not_be_null", "derived"),
        ("pages_viewed", "expect_column_values_to_be_in_type_list", "derived")}


# A suite as Great Expectations 1.24 writes it (ExpectationSuite.to_json_dict()): snake-case types,
# every expectation with its severity (critical, warning or info), null ids, suite meta and notes.
GX_SUITE_JSON = """{"name": "shop", "id": null, "notes": null,
 "meta": {"great_expectations_version": "1.24.1"},
 "expectations": [
  {"type": "expect_column_values_to_be_between", "kwargs": {"column": "session_minutes",
   "min_value": 0.0, "max_value": 30.0}, "meta": {}, "severity": "info"},
  {"type": "expect_column_max_to_be_between", "kwargs": {"column": "pages_viewed",
   "min_value": "a", "max_value": "b"}, "meta": {}, "severity": "critical"},
  {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "promo_code", "mostly": 0.0},
   "meta": {}, "severity": "critical"}]}"""


def test_a_gx_suite_is_read_whole_and_one_of_its_checks_that_cannot_run_never_hides_the_derived_failure(
        null_and_empty_windows, history):
    ref, all_null, _ = null_and_empty_windows
    user = Contract.from_dict(json.loads(GX_SUITE_JSON))
    assert [e.severity for e in user.expectations] == ["info", "critical", "critical"]
    out = check_window(model="shop", frame=all_null, start=T0, end=T0 + HOUR,
                       reference=prepare_reference(ref, SESSION_LOG_SCHEMA), history=history, contract=user)
    # the all-null column is bad data, proven by the derived null check: the window failed its contract,
    # and the user's expectation that could not be evaluated is listed beside it, not in its place
    assert out["status"] == "contract_failed" and out["features"]["promo_code"]["severity"] == "invalid"
    (failure,) = [a for a in out["alerts"] if a["kind"] == "data_quality"]
    assert (failure["column"], failure["source"]) == ("promo_code", "derived")
    (error,) = [a for a in out["alerts"] if a["kind"] == "contract_check_error"]
    assert (error["column"], error["expectation"], error["source"]) == (
        "pages_viewed", "expect_column_max_to_be_between", "user")
    # the info expectation only reports; its failure names the column, the values and what was expected
    (info,) = [a for a in out["alerts"] if a["kind"] == "data_quality_warning" and a["source"] == "user"]
    assert info["column"] == "session_minutes" and info["expectation"] == "expect_column_values_to_be_between"
    assert info["message"] == ("column 'session_minutes': 5 of 20 values (25.00 %) are unexpected, first "
                               "[37.49, 63.15, 32.93, 79.59, 39.21]; expected "
                               "ExpectColumnValuesToBeBetween(min_value=0.0, max_value=30.0)")
    # without the all-null column, the critical check that cannot run makes it an error of the check
    ok = all_null.assign(promo_code="VIP5")
    again = check_window(model="shop", frame=ok, start=T0 + HOUR, end=T0 + 2 * HOUR,
                         reference=prepare_reference(ref, SESSION_LOG_SCHEMA), history=history, contract=user)
    assert again["status"] == "check_error" and again["contract"]["failures"] == []


def test_a_copy_of_the_derived_contract_in_a_user_suite_is_run_once(null_and_empty_windows):
    from drift_checks.contracts import derive_contract, run_contract, with_derived

    ref, all_null, _ = null_and_empty_windows
    derived = derive_contract(ref, SESSION_LOG_SCHEMA)
    stored = Contract.from_dict(json.loads(json.dumps(derived.to_dict())))
    merged = with_derived(stored, derived)
    assert merged.expectations == derived.expectations
    assert {e.source for e in merged.expectations} == {"derived"}
    assert run_contract(merged, all_null).invalid_columns == ["promo_code"]
