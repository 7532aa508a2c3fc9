"""The retraining window after a confirmed shift, through the retrain pipeline, a real MLflow and a real log.

The inference log holds NOAA days 10,560-12,175 at the demo's pace (48 days per logical hour), scored
by the demo's champion (trained on days 0-7,999) in the demo's score column, with labels; the
concept shift is at day 12,000, 176 days before the window's end. MLflow is the ``mlflow_server``
fixture's real tracking server.
"""

from __future__ import annotations

import uuid

import numpy as np
import pandas as pd
import pytest

from drift_checks.inference_log import InferenceLogWriter
from model_registry import datasets as ds
from model_registry.noaa_model import train_noaa
from model_registry.registry import RegistryClient
from tests.conftest import make_settings
from tritonflow.pipelines import retrain as rp

START = pd.Timestamp("2025-01-01", tz="UTC")
SCORE = "probability_rain"
#: The policy's span in the demo: 10 logical hours.
SPAN_DAYS = 10 / 24


def stamp(day):
    """Logical time of a day (or days): 48 days per hour (75 s apart) from day 8,000."""
    return START + pd.to_timedelta((np.asarray(day) - 8_000) * 75, unit="s")


END = stamp(12_176)


@pytest.fixture(scope="module")
def env(tmp_path_factory, mlflow_server):
    """Settings on the real MLflow and a champion-scored, labelled log of days 10,560-12,175."""
    home = tmp_path_factory.mktemp("retrain-evidence")
    settings = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri,
                             inference_log_root=str(home / "logs"), retrain_cooldown_s=0.0,
                             retrain_score_column=SCORE)
    model = f"noaa_shift_{uuid.uuid4().hex[:8]}"
    data = ds.load_noaa()
    champion = train_noaa(data[data[ds.DAY_COLUMN] < 8_000])
    rows = data[(data[ds.DAY_COLUMN] >= 10_560) & (data[ds.DAY_COLUMN] < 12_176)].reset_index(drop=True)
    records = pd.DataFrame({"request_id": [f"{model}-{d}" for d in rows[ds.DAY_COLUMN]],
                            "timestamp": stamp(rows[ds.DAY_COLUMN].to_numpy()),
                            "model_version": np.ones(len(rows), dtype=np.int64),
                            **{c: rows[c].to_numpy() for c in ds.FEATURE_COLUMNS},
                            SCORE: champion.predict_scores(rows)})
    writer = InferenceLogWriter(settings.inference_log_root, model)
    writer.write(records)
    writer.write_labels(pd.DataFrame({"request_id": records["request_id"],
                                      "timestamp": records["timestamp"] + pd.Timedelta(minutes=1),
                                      ds.LABEL_COLUMN: rows[ds.LABEL_COLUMN].to_numpy()}))
    return {"settings": settings, "model": model}


@pytest.fixture(scope="module")
def first_challenger(env):
    """The retraining a degraded champion asked for at day 12,176, registered in MLflow."""
    s, model = env["settings"], env["model"]
    window = rp.training_window(model, days=SPAN_DAYS, end=END.isoformat(), reason="champion_degraded",
                                settings=s)
    result = rp.run_training(model, window, reason="champion_degraded", settings=s)
    return {"window": window, "result": result}


def test_a_degraded_champion_retrains_on_the_rows_since_the_shift_with_the_floor(first_challenger):
    lineage = first_challenger["window"]["lineage"]
    assert lineage["window_rule"] == "floor" and first_challenger["window"]["rows"] == 200
    post = int(lineage["post_shift_rows"])
    assert 150 <= post <= 200
    change = pd.Timestamp(lineage["change_point"])
    assert abs((change - stamp(12_000)) / pd.Timedelta(seconds=75)) <= 48  # within one logical hour
    frame = pd.read_parquet(first_challenger["window"]["uri"])
    assert pd.to_datetime(frame["timestamp"], utc=True).min() >= END - pd.Timedelta(seconds=75 * 200)


def test_the_choice_and_its_reason_are_tags_of_the_registered_version(env, first_challenger):
    version = first_challenger["result"]["version"]
    tags = RegistryClient(env["settings"].resolved_mlflow_tracking_uri).get_version(env["model"], version).tags
    assert tags["tritonflow.window_rule"] == "floor"
    assert "loss rose" in tags["tritonflow.window_reason"] and "below the floor of 200" in tags[
        "tritonflow.window_reason"]
    assert tags["tritonflow.change_point"] == first_challenger["window"]["lineage"]["change_point"]
    assert pd.Timestamp(tags["tritonflow.retrain_followup_at"]) == END + pd.Timedelta(hours=4)


def test_the_follow_up_is_due_once_after_its_hours_and_reuses_the_change_point(env, first_challenger):
    s, model = env["settings"], env["model"]
    registry = RegistryClient(s.resolved_mlflow_tracking_uri)
    assert rp.followup_due(model, END + pd.Timedelta(hours=5), settings=s) is None  # not serving yet
    registry.client.set_registered_model_alias(model, "champion", first_challenger["result"]["version"])
    assert rp.followup_due(model, END + pd.Timedelta(hours=3), settings=s) is None
    hour = [{"model": model, "window_end": (END + pd.Timedelta(hours=4)).isoformat()},
            {"model": f"{model}_unregistered", "window_end": END.isoformat()}]  # lookup fails: left out
    (trigger,) = rp.followup_triggers(hour, settings=s)  # what drift_monitor's followups task returns
    conf = trigger["conf"]
    assert trigger["trigger_dag_id"] == "retrain" and conf["reason"] == "retrain_followup"
    assert conf["ignore_cooldown"] is True  # once per version; the wall-time cooldown would skip it
    assert conf["change_point"] == first_challenger["window"]["lineage"]["change_point"]
    assert rp.followup_triggers(hour, settings=s) == []  # once per version
    window = rp.training_window(model, days=SPAN_DAYS, end=END.isoformat(), reason=conf["reason"],
                                change_point=conf["change_point"], settings=s)
    assert window["lineage"]["window_rule"] == "floor"  # still 176 post-shift rows: the floor again
    assert window["lineage"]["window_reason"].startswith("change point ")


def test_a_drift_alert_without_confirmed_degradation_keeps_the_policys_span(env):
    window = rp.training_window(env["model"], days=SPAN_DAYS, end=END.isoformat(), reason="drift",
                                settings=env["settings"])
    assert window["lineage"]["window_rule"] == "span" and window["rows"] == 480
    assert "not a confirmed shift" in window["lineage"]["window_reason"]
