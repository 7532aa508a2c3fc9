"""Hourly drift stages (tritonflow.pipelines.drift) on real NOAA rows, a real MLflow server and a
temporary inference log."""

from __future__ import annotations

import datetime as dt
import uuid

import numpy as np
import pandas as pd
import pytest

from drift_checks.inference_log import InferenceLogWriter, LogSchema
from drift_checks.reference import save_reference
from ground.exceptions import ContractViolation, RegistryError
from model_registry.datasets import FEATURE_COLUMNS, load_noaa
from tritonflow.pipelines import drift

HOUR = dt.timedelta(hours=1)
T0 = dt.datetime(2025, 3, 1, 0, tzinfo=dt.timezone.utc)
SCHEMA = LogSchema({c: "float" for c in FEATURE_COLUMNS}, {"p_rain": "float"})
#: Reference = days 0-2999 (before the first known shift); quiet = a year inside it; shifted =
#: years after the 12,000 / 16,000 shifts (5 of 8 features move in both).
QUIET, SHIFT_A, SHIFT_B = (1000, 1365), (13000, 13365), (16500, 16865)


def hour_frame(noaa: pd.DataFrame, days: tuple[int, int], start: dt.datetime) -> pd.DataFrame:
    """NOAA rows ``days`` replayed as one hour of inference records starting at ``start``."""
    rows = noaa.iloc[days[0]:days[1]].reset_index(drop=True)
    n = len(rows)
    out = rows[list(FEATURE_COLUMNS)].copy()
    out.insert(0, "request_id", [f"{start:%Y%m%d%H}-{i}" for i in range(n)])
    out.insert(1, "timestamp", pd.Timestamp(start) + pd.to_timedelta(np.arange(n) * (3599 / n), unit="s"))
    out.insert(2, "model_version", 1)
    out["p_rain"] = 0.3
    return out


@pytest.fixture(scope="module")
def noaa():
    return load_noaa()


@pytest.fixture
def env(tmp_path, monkeypatch, mlflow_server, noaa):
    """Settings for one model ``rain-<uid>`` with champion v1 and its reference recorded."""
    from mlflow import MlflowClient

    from ground.settings import Settings

    monkeypatch.setenv("TRITONFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRITONFLOW_INFERENCE_LOG_ROOT", str(tmp_path / "logs"))
    monkeypatch.setenv("TRITONFLOW_DRIFT_HISTORY_DB_URL", f"sqlite:///{tmp_path / 'history.db'}")
    monkeypatch.setenv("TRITONFLOW_MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    monkeypatch.setenv("TRITONFLOW_MONITORED_MODELS", "")
    settings = Settings.from_env()
    model = f"rain-{uuid.uuid4().hex[:8]}"
    client = MlflowClient(mlflow_server.tracking_uri)
    client.create_registered_model(model)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    client.create_model_version(model, f"{run.info.artifact_uri}/model", run.info.run_id)
    client.set_registered_model_alias(model, "champion", "1")
    save_reference(drift.log_root(settings), model, 1, noaa.iloc[0:3000][list(FEATURE_COLUMNS)], max_rows=3000)
    writer = InferenceLogWriter(drift.log_root(settings), model, SCHEMA)
    return settings, model, client, writer


def test_monitored_models_lists_champions_and_honours_the_filter(env):
    settings, model, client, _ = env
    assert {"model": model, "version": 1} in drift.monitored_models(settings)
    assert drift.monitored_models(settings, only=[model]) == [{"model": model, "version": 1}]
    client.create_registered_model(f"{model}-nochamp")
    with pytest.raises(RegistryError, match="no 'champion' alias"):
        drift.monitored_models(settings, only=[f"{model}-nochamp"])


def test_quiet_hour_is_recorded_in_history_and_mlflow_without_a_drift_event(env, noaa):
    settings, model, client, writer = env
    writer.write(hour_frame(noaa, QUIET, T0))
    summary = drift.check_model_hour(model, 1, T0, T0 + HOUR, settings)
    assert summary["status"] == "ok" and summary["drift"] is False and summary["n_rows"] == 365
    assert drift.drift_event(summary) is None
    rec = drift.record_in_mlflow(summary, settings)
    run = client.get_run(rec["run_id"])
    assert run.data.tags["tritonflow.model"] == model and run.data.tags["tritonflow.model_version"] == "1"
    assert "visibility.psi" in run.data.metrics and rec["metrics"] > 20
    hist = client.get_metric_history(rec["run_id"], "temperature.psi")
    assert [m.step for m in hist] == [int(T0.timestamp() // 3600)]
    tags = client.get_model_version(model, "1").tags
    assert tags["tritonflow.drift.severity"] == summary["severity"]
    # rerun of the same hour: same MLflow points, one history row per statistic
    drift.record_in_mlflow(drift.check_model_hour(model, 1, T0, T0 + HOUR, settings), settings)
    assert len(client.get_metric_history(rec["run_id"], "temperature.psi")) == 1
    from drift_checks.history import HistoryStore

    assert len(HistoryStore(settings.drift_history_db_url).values(model, "temperature", "psi")) == 1


def test_later_hours_log_to_the_run_the_version_names_and_find_a_due_follow_up_from_its_tags(env, noaa,
                                                                                             monkeypatch):
    from tritonflow.pipelines import drift_batches
    from tritonflow.pipelines import retrain_followup as rf

    settings, model, client, writer = env
    for h in range(3):
        writer.write(hour_frame(noaa, (1000 + 48 * h, 1048 + 48 * h), T0 + h * HOUR))

    def hour(h: int) -> dict:
        return drift.record_in_mlflow(drift.check_model_hour(model, 1, T0 + h * HOUR, T0 + (h + 1) * HOUR,
                                                             settings), settings)

    first = hour(0)
    tags = client.get_model_version(model, "1").tags
    assert (tags["tritonflow.drift.run_id"], tags["tritonflow.drift.experiment_id"]) == (first["run_id"],
                                                                                         first["experiment_id"])
    assert first["followup"] is None
    # a retraining on few post-shift rows asked for a follow-up at the end of hour 1
    client.set_model_version_tag(model, "1", rf.FOLLOWUP_AT_TAG, (T0 + 2 * HOUR).isoformat())
    client.set_model_version_tag(model, "1", rf.CHANGE_POINT_TAG, "2025-02-20T00:00:00+00:00")
    looked: list = []
    real = drift._looked_up_run
    monkeypatch.setattr(drift, "_looked_up_run", lambda *a: looked.append(a) or real(*a))
    second = hour(1)  # the version's tags name the run: no experiment lookup, no run search
    assert looked == [] and second["run_id"] == first["run_id"]
    assert len(client.get_metric_history(first["run_id"], "temperature.psi")) == 2
    assert second["followup"] == {"model": model, "version": 1, "reason": "retrain_followup",
                                  "change_point": "2025-02-20T00:00:00+00:00",
                                  "window_end": (T0 + 2 * HOUR).isoformat()}
    # what the gate does once the hour passed: mark the version, hand over the retrain trigger
    (trigger,) = rf.start_followups(drift_batches.due_followups([[{"model": model, **second}]]), settings)
    assert trigger == {"trigger_dag_id": "retrain", "conf": {
        "model": model, "reason": "retrain_followup", "change_point": "2025-02-20T00:00:00+00:00",
        "window_end": (T0 + 2 * HOUR).isoformat(), "ignore_cooldown": True}}
    assert client.get_model_version(model, "1").tags[rf.FOLLOWUP_STARTED_TAG] == (T0 + 2 * HOUR).isoformat()
    assert hour(2)["followup"] is None  # once per version
    # the run the tags name was deleted: the next hour finds (creates) the version's run again
    client.delete_run(first["run_id"])
    again = hour(2)
    assert len(looked) == 1 and again["run_id"] != first["run_id"]
    assert client.get_model_version(model, "1").tags["tritonflow.drift.run_id"] == again["run_id"]


def test_a_strongly_shifted_hour_alerts_with_an_event_payload_naming_the_features(env, noaa):
    settings, model, _, writer = env
    writer.write(hour_frame(noaa, SHIFT_A, T0))
    writer.write(hour_frame(noaa, SHIFT_B, T0 + HOUR))
    first = drift.check_model_hour(model, 1, T0, T0 + HOUR, settings)
    assert first["drift"] is True and first["reference_strategy"].startswith("training")
    event = drift.drift_event(first)
    assert set(event) == {"model", "version", "features", "scores", "window_start", "window_end", "severity"}
    assert event["model"] == model and event["version"] == 1 and event["severity"] == "drift"
    assert event["features"] == first["alert_features"] and set(event["features"]) <= set(FEATURE_COLUMNS)
    assert all("psi" in event["scores"][f] for f in event["features"])
    assert event["window_start"] == pd.Timestamp(T0).isoformat()
    (alert,) = [a for a in first["alerts"] if a["kind"] == "drift"]
    assert alert["causes"] and all({"feature", "statistic", "value", "threshold"} <= set(c) for c in alert["causes"])
    out = drift.alert(first, settings)
    assert out["logged"] and out["alerts"] >= 1 and out["webhook_status"] is None
    # the next hour still drifts, but inside the per-model cooldown only new features re-alert
    second = drift.check_model_hour(model, 1, T0 + HOUR, T0 + 2 * HOUR, settings)
    assert second["severity"] == "drift"
    assert second["drift"] is bool(set(second["alert_features"]) - set(first["alert_features"]))


def test_a_window_above_the_exact_limit_is_streamed_stored_once_and_decided_like_the_exact_path(env, noaa):
    import dataclasses

    settings, model, _, writer = env
    writer.write(hour_frame(noaa, SHIFT_A, T0))
    writer.write(hour_frame(noaa, QUIET, T0 + HOUR))
    exact = [drift.check_model_hour(model, 1, T0 + i * HOUR, T0 + (i + 1) * HOUR, settings) for i in (0, 1)]
    streamed_settings = dataclasses.replace(settings, drift_exact_max_rows=100,
                                            drift_history_db_url=settings.drift_history_db_url + "-streamed")
    streamed = [drift.check_model_hour(model, 1, T0 + i * HOUR, T0 + (i + 1) * HOUR, streamed_settings)
                for i in (0, 1)]
    keys = ("status", "severity", "drift", "dataset_drift", "dataset_score", "alert_features", "n_rows")
    assert [{k: s[k] for k in keys} for s in exact] == [{k: s[k] for k in keys} for s in streamed]
    assert "summary computed" in streamed[0]["engine"] and "engine" not in exact[0]
    rerun = drift.check_model_hour(model, 1, T0, T0 + HOUR, streamed_settings)
    assert "stored, reused" in rerun["engine"] and rerun["severity"] == streamed[0]["severity"]
    ev = drift.evidently_for_hour(model, 1, T0, T0 + HOUR, streamed_settings, sample_rows=100)
    assert ev["status"] == "ok"
    prof = drift.profile_for_hour(model, 1, T0, T0 + HOUR, streamed_settings)
    assert prof["created"] and prof["n_rows"] == 365


def test_a_trailing_reference_is_read_from_the_served_log(env, noaa):
    settings, model, _, writer = env
    writer.write(hour_frame(noaa, QUIET, T0))
    writer.write(hour_frame(noaa, (QUIET[0] + 30, QUIET[1] + 30), T0 + HOUR))
    summary = drift.check_model_hour(model, 1, T0 + HOUR, T0 + 2 * HOUR, settings, reference_strategy="trailing")
    assert summary["reference_strategy"].startswith("trailing")
    assert summary["reference_id"] == "v1:trailing:168h" and summary["drift"] is False
    cold = drift.check_model_hour(model, 1, T0, T0 + HOUR, settings, reference_strategy="seasonal")
    assert "the training reference applies" in cold["reference_strategy"]  # nothing served a week ago
    timeless = drift.check_model_hour(model, 1, T0, T0 + HOUR, settings, reference_strategy="training_seasonal")
    assert "stores no row times" in timeless["reference_strategy"]  # no timestamp column: the whole one
    assert timeless["status"] == "ok" and timeless["reference_id"].startswith("v1:training")


def test_a_seasonally_matched_reference_compares_the_hour_with_the_rows_of_its_season(env, noaa, monkeypatch):
    """The reference's ``timestamp`` column is kept as its row times; with a 4-hour period, the
    hour 00:00-01:00 is compared with the reference rows of every 00:00-01:00 of that cycle."""
    from ground.settings import Settings

    settings, model, _, writer = env
    rows = noaa.iloc[0:3000][list(FEATURE_COLUMNS)].copy()
    rows["timestamp"] = pd.Timestamp(T0) - pd.Timedelta(days=21) + pd.to_timedelta(np.arange(3000) * 600, unit="s")
    saved = save_reference(drift.log_root(settings), model, 1, rows, max_rows=3000)
    assert "timestamp" not in saved.schema.features and saved.times is not None
    monkeypatch.setenv("TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS", "4")
    seasonal = Settings.from_env()
    writer.write(hour_frame(noaa, (QUIET[0], QUIET[0] + 100), T0))  # small enough for 10 reference chunks
    summary = drift.check_model_hour(model, 1, T0, T0 + HOUR, seasonal, reference_strategy="training_seasonal")
    assert summary["reference_strategy"] == "training_seasonal (750 rows from 125 cycles)"
    assert summary["reference_id"].endswith(":seasonal") and summary["status"] == "ok"
    assert summary["threshold_sources"].get("reference")  # calibrated on the chunks, each against its season
    kept = list(drift.reference_cache_dir(seasonal).glob("*-season-*.calibration-*.json"))
    assert kept  # the seasonal calibration outlives the task process, keyed apart from the whole one's


def test_under_the_training_strategy_the_hour_is_also_scored_against_its_season_for_the_run_rule(
        env, noaa, monkeypatch):
    """A reference with row times and a period it covers twice: the hour is judged against the whole
    reference, and its statistics against its season are stored under the season's id, the evidence
    the season-matched run rule reads in the hours after."""
    import sqlalchemy as sa

    from ground.settings import Settings

    settings, model, _, writer = env
    rows = noaa.iloc[0:3000][list(FEATURE_COLUMNS)].copy()
    rows["timestamp"] = pd.Timestamp(T0) - pd.Timedelta(days=21) + pd.to_timedelta(np.arange(3000) * 600, unit="s")
    save_reference(drift.log_root(settings), model, 1, rows, max_rows=3000)
    monkeypatch.setenv("TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS", "4")
    seasonal = Settings.from_env()
    writer.write(hour_frame(noaa, (QUIET[0], QUIET[0] + 100), T0))
    summary = drift.check_model_hour(model, 1, T0, T0 + HOUR, seasonal, reference_strategy="training")
    assert summary["reference_id"].startswith("v1:training") and not summary["reference_id"].endswith(":seasonal")
    sid = summary["season_reference_id"]
    assert sid == summary["reference_id"] + ":seasonal"
    history = drift._history(seasonal)
    with history.engine.connect() as conn:
        refs = dict(conn.execute(sa.select(history.stats.c.reference_id, sa.func.count())
                                 .where(history.stats.c.model == model).group_by(history.stats.c.reference_id)).all())
    assert set(refs) == {summary["reference_id"], sid} and refs[sid] == refs[summary["reference_id"]]
    monkeypatch.setenv("TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS", "168")  # a week declared: 3 cycles of 6 rows
    weekly = drift.check_model_hour(model, 1, T0, T0 + HOUR, Settings.from_env(), reference_strategy="training")
    assert "season_reference_id" not in weekly  # fewer than 30 rows in the hour's season: no rule
    monkeypatch.delenv("TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS")  # undeclared: three weeks of times give a day
    daily = drift.check_model_hour(model, 1, T0, T0 + HOUR, Settings.from_env(), reference_strategy="training")
    assert daily["season_reference_id"] == sid
    matched = drift.check_model_hour(model, 1, T0, T0 + HOUR, Settings.from_env(),
                                     reference_strategy="training_seasonal")
    assert matched["reference_strategy"] == "training_seasonal (126 rows from 21 cycles of 24 h, from its times)"
    monkeypatch.setenv("TRITONFLOW_DRIFT_SEASONAL_RUN_WINDOWS", "0")
    off = drift.check_model_hour(model, 1, T0, T0 + HOUR, Settings.from_env(), reference_strategy="training")
    assert "season_reference_id" not in off and off["reference_id"] == summary["reference_id"]


def test_missing_reference_is_an_explicit_status_with_an_alert(env, noaa):
    settings, model, _, writer = env
    writer.write(hour_frame(noaa, QUIET, T0))
    summary = drift.check_model_hour(model, 2, T0, T0 + HOUR, settings)
    assert summary["status"] == "no_reference" and summary["alerts"][0]["kind"] == "no_reference"
    assert "no reference stored" in summary["alerts"][0]["message"]
    assert drift.data_quality_gate(summary)["passed"]


def test_contract_violation_keeps_the_window_and_fails_the_gate(env, noaa):
    settings, model, _, writer = env
    bad = hour_frame(noaa, QUIET, T0)
    bad["temperature"] = np.nan  # the sensor feed broke
    writer.write(bad)
    summary = drift.check_model_hour(model, 1, T0, T0 + HOUR, settings)
    assert summary["status"] == "contract_failed" and summary["drift"] is False
    assert drift.drift_event(summary) is None  # a failed contract is never a drift event
    assert summary["features"]["temperature"]["severity"] == "invalid"
    kept = pd.read_parquet(summary["artefacts"]["window_parquet"])
    assert len(kept) == 365 and kept["temperature"].isna().all()
    with pytest.raises(ContractViolation, match="temperature: expect_column_values_to_not_be_null"):
        drift.data_quality_gate(summary)


def test_a_unit_error_outside_the_learned_range_is_scored_as_drift_not_a_failed_contract(env, noaa):
    settings, model, _, writer = env
    bad = hour_frame(noaa, QUIET, T0)
    bad["temperature"] = bad["temperature"] * 1000
    writer.write(bad)
    summary = drift.check_model_hour(model, 1, T0, T0 + HOUR, settings)
    assert summary["status"] == "ok" and summary["features"]["temperature"]["severity"] == "drift"
    assert any(a["kind"] == "data_quality_warning" and a["column"] == "temperature" for a in summary["alerts"])
    assert drift.data_quality_gate(summary)["passed"]


def test_evidently_sample_report_is_its_own_step(env, noaa):
    settings, model, _, writer = env
    writer.write(hour_frame(noaa, QUIET, T0))
    ev = drift.evidently_for_hour(model, 1, T0, T0 + HOUR, settings, sample_rows=300)
    assert ev["status"] == "ok" and set(ev["scores"]) == set(FEATURE_COLUMNS)
    assert ev["html_path"].endswith(".html")
    assert drift.evidently_for_hour(model, 1, T0, T0 + HOUR, settings, sample_rows=0)["status"] == "disabled"


# ------------------------------------------------------------------ drift_monitor path vs the backtest
STORES_SCHEMA = LogSchema({"store_id": "category", "units": "float"}, {"p_sold_out": "float"})


@pytest.fixture
def stores(tmp_path, monkeypatch):
    """Settings without MLflow (check_model_hour reads the log and the reference only) and a store table.

    The table: 600 reference rows, then 4 hours of 300 rows from T0; integer store ids declared
    categorical, in hour 2 a store id the reference never saw (40 of 300 rows), in hour 3 six
    ``+inf`` units.
    """
    from ground.settings import Settings

    monkeypatch.setenv("TRITONFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRITONFLOW_INFERENCE_LOG_ROOT", str(tmp_path / "logs"))
    monkeypatch.setenv("TRITONFLOW_DRIFT_HISTORY_DB_URL", f"sqlite:///{tmp_path / 'history.db'}")
    settings = Settings.from_env()
    rng = np.random.default_rng(11)
    n_ref, n_hour, hours = 600, 300, 4
    ref_t = pd.Timestamp(T0) - pd.to_timedelta(np.arange(n_ref, 0, -1) * 5, unit="s")
    hour_t = [pd.Timestamp(T0) + h * pd.Timedelta(HOUR) + pd.to_timedelta(np.arange(n_hour) * (3599 / n_hour), unit="s")
              for h in range(hours)]
    table = pd.DataFrame({"ts": np.concatenate([ref_t.to_numpy(), *[t.to_numpy() for t in hour_t]]),
                          "store_id": rng.choice([11, 17, 23], n_ref + hours * n_hour),
                          "units": np.round(rng.gamma(4.0, 2.0, n_ref + hours * n_hour), 2)})
    table["ts"] = pd.to_datetime(table["ts"], utc=True)
    table.loc[n_ref + 2 * n_hour:n_ref + 2 * n_hour + 39, "store_id"] = 99  # 40 rows of a new store in hour 2
    table.loc[n_ref + 3 * n_hour + 10:n_ref + 3 * n_hour + 15, "units"] = np.inf  # 6 rows of +inf in hour 3
    return settings, f"stores-{uuid.uuid4().hex[:8]}", table, n_ref, hours


def _drift_monitor_hours(settings, model, table, n_ref, hours, **overrides):
    import dataclasses

    s = dataclasses.replace(settings, **overrides)
    root = drift.log_root(s)
    save_reference(root, model, 1, table.iloc[:n_ref].drop(columns="ts"), STORES_SCHEMA)
    log = table.iloc[n_ref:].reset_index(drop=True)
    frame = pd.DataFrame({"request_id": [f"r{i}" for i in range(len(log))], "timestamp": log["ts"],
                          "model_version": 1, "store_id": log["store_id"], "units": log["units"],
                          "p_sold_out": 0.1})
    InferenceLogWriter(root, model, STORES_SCHEMA).write(frame)
    return [drift.check_model_hour(model, 1, T0 + i * HOUR, T0 + (i + 1) * HOUR, s) for i in range(hours)]


def test_one_table_through_drift_monitor_and_through_the_backtest_gets_the_same_verdicts(stores, tmp_path):
    from drift_checks.backtest import run_backtest
    from drift_checks.verdict import CheckConfig

    settings, model, table, n_ref, hours = stores
    doc = run_backtest(table, time_column="ts", out_dir=tmp_path / "bt", categorical=["store_id"],
                       reference_rows=n_ref, window="1h", html_report=False,
                       config=CheckConfig.from_settings(settings, evidently_sample_rows=0))
    exact = _drift_monitor_hours(settings, model, table, n_ref, hours)
    streamed = _drift_monitor_hours(settings, model + "-s", table, n_ref, hours, drift_exact_max_rows=100,
                                    drift_history_db_url=settings.drift_history_db_url + "-streamed")
    assert "streamed" in streamed[0]["engine"] and "engine" not in exact[0]
    keys = ("status", "severity", "dataset_drift", "dataset_score", "n_rows")
    backtest = [{"status": w["status"], "severity": w["severity"], "dataset_drift": w["dataset_drift"],
                 "dataset_score": w["dataset_score"], "n_rows": w["n_rows"]} for w in doc["windows"]]
    assert backtest == [{k: s[k] for k in keys} for s in exact] == [{k: s[k] for k in keys} for s in streamed]
    assert [w["status"] for w in doc["windows"]] == ["ok"] * 3 + ["contract_failed"]  # store ids: categories
    unseen = [a for a in exact[2]["alerts"] if a.get("expectation") == "expect_column_values_to_be_in_set"]
    assert unseen and unseen[0]["column"] == "store_id" and unseen[0]["observed"]["partial_unexpected_list"] == ["99"]
    assert exact[2]["features"]["store_id"]["severity"] in ("warning", "drift")
    assert [s["severity"] for s in exact[:3]].count("ok") == 2
    for summary in (exact[3], streamed[3]):  # +inf fails the hour by name, in both paths, and is never scored
        (failure,) = [a for a in summary["alerts"] if a["kind"] == "data_quality"]
        assert failure["column"] == "units" and "6 infinite values (+inf 6, -inf 0) in 300 rows" in failure["message"]
        units = summary["features"]["units"]
        assert units["severity"] == "invalid" and units["statistics"] == {}
    assert doc["windows"][3]["contract_failures"][0]["message"] == failure["message"]


def test_a_word_in_a_numeric_feature_of_another_writer_s_log_file_fails_the_hour_as_the_backtest_s_window(
        stores, tmp_path):
    import dataclasses

    import pyarrow as pa
    import pyarrow.parquet as pq

    from drift_checks.backtest import run_backtest
    from drift_checks.inference_log import partition_prefix
    from drift_checks.verdict import CheckConfig

    settings, model, table, n_ref, hours = stores
    table = table.assign(units=table["units"].astype(object))
    table.loc[n_ref + 3 * 300 + 10:n_ref + 3 * 300 + 15, "units"] = 7.5  # no +inf: hour 3 is clean here
    table.loc[n_ref + 300 + 7, "units"] = "twelve"  # hour 1 holds a word among its numbers
    doc = run_backtest(table, time_column="ts", out_dir=tmp_path / "bt", categorical=["store_id"],
                       reference_rows=n_ref, window="1h", html_report=False,
                       config=CheckConfig.from_settings(settings, evidently_sample_rows=0))
    assert [w["status"] for w in doc["windows"]] == ["ok", "contract_failed", "ok", "ok"]
    for name, overrides in (("exact", {}), ("streamed", {"drift_exact_max_rows": 100})):
        s = dataclasses.replace(settings, drift_history_db_url=f"{settings.drift_history_db_url}-{name}", **overrides)
        m = f"{model}-{name}"
        root = drift.log_root(s)
        save_reference(root, m, 1, table.iloc[:n_ref].drop(columns="ts").astype({"units": "float64"}), STORES_SCHEMA)
        log = table.iloc[n_ref:].reset_index(drop=True)
        frame = pd.DataFrame({"request_id": [f"r{i}" for i in range(len(log))], "timestamp": log["ts"],
                              "model_version": 1, "store_id": log["store_id"], "units": log["units"],
                              "p_sold_out": 0.1})
        hour1 = ((frame["timestamp"] >= T0 + HOUR) & (frame["timestamp"] < T0 + 2 * HOUR)).to_numpy()
        foreign = hour1 & (np.cumsum(hour1) <= 100)  # the first 100 rows of hour 1, the word among them
        InferenceLogWriter(root, m, STORES_SCHEMA).write(frame[~foreign].astype({"units": "float64"}))
        # another producer wrote them with their units as text (one word made the whole column text)
        raw = frame[foreign].astype({"units": str}).reset_index(drop=True)
        target = tmp_path / "logs" / partition_prefix(m, T0 + HOUR) / "other-writer.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(raw, preserve_index=False), target)
        summaries = [drift.check_model_hour(m, 1, T0 + i * HOUR, T0 + (i + 1) * HOUR, s) for i in range(hours)]
        assert [x["status"] for x in summaries] == [w["status"] for w in doc["windows"]], name
        (failure,) = [a for a in summaries[1]["alerts"] if a["kind"] == "data_quality"]
        assert failure["column"] == "units"
        assert failure["message"] == doc["windows"][1]["contract_failures"][0]["message"]
        assert "'twelve'" in failure["message"] and "cannot be read as float" in failure["message"]
        if name == "exact":  # the window as checked is kept, numbers and text alike
            kept = pd.read_parquet(summaries[1]["artefacts"]["window_parquet"])["units"]
            assert len(kept) == 300 and "twelve" in kept.tolist()
            # a trailing reference over hours 0-2 leaves the word out instead of refusing every later hour
            later = drift.check_model_hour(m, 1, T0 + 3 * HOUR, T0 + 4 * HOUR, s, reference_strategy="trailing")
            assert later["reference_strategy"].startswith("trailing") and later["status"] == "ok"
