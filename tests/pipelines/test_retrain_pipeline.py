"""Retrain pipeline on real NOAA windows: the training window, the NOAA training run, the guard.

MLflow is the real tracking server of the ``mlflow_server`` fixture; the inference log is real
Parquet under a temporary folder (NOAA days mapped to logical timestamps 5 minutes apart, so a
few thousand days make a few hundred hourly partitions).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import mlflow
import numpy as np
import pandas as pd
import pytest

from drift_checks.inference_log import InferenceLogWriter
from ground.exceptions import ConcurrencyError, RetrainCooldownError, TrainingError, WindowError
from model_registry import datasets as ds
from model_registry import training as tr
from tests.conftest import make_settings
from tritonflow.pipelines import retrain as rp

#: Logical spacing of NOAA days in the test logs.
INTERVAL = timedelta(minutes=5)
#: Delay between a request and the arrival of its label.
LABEL_DELAY = timedelta(minutes=30)
#: Every n-th day gets no label (labels that never arrived).
UNLABELLED_EVERY = 7


def ts(day: int) -> pd.Timestamp:
    """Logical timestamp of a NOAA day in the test logs."""
    return ds.day_to_timestamp(day, interval=INTERVAL)


@pytest.fixture(scope="session")
def noaa() -> pd.DataFrame:
    return ds.load_noaa(with_timestamps=True, interval=INTERVAL)


def write_noaa_log(root: str, model: str, noaa: pd.DataFrame, start_day: int, end_day: int, *,
                   served_version: int = 1, labels: bool = True,
                   unlabelled_every: int | None = UNLABELLED_EVERY) -> pd.DataFrame:
    """Write NOAA days ``[start_day, end_day)`` as inference records (+ labels) of ``model``.

    Request ids are ``<model>-<day>``; labels arrive ``LABEL_DELAY`` after the request, except for
    every ``unlabelled_every``-th day. Returns the rows written (with ``request_id``).
    """
    rows = ds.window(noaa, start_day, end_day)
    records = pd.DataFrame({
        "request_id": [f"{model}-{d}" for d in rows[ds.DAY_COLUMN]],
        "timestamp": rows[ds.TIMESTAMP_COLUMN].to_numpy(),
        "model_version": np.full(len(rows), served_version, dtype=np.int64),
        **{c: rows[c].to_numpy() for c in ds.FEATURE_COLUMNS},
    })
    records["timestamp"] = pd.to_datetime(records["timestamp"], utc=True)
    writer = InferenceLogWriter(root, model)
    writer.write(records)
    if labels:
        keep = np.ones(len(rows), dtype=bool)
        if unlabelled_every:
            keep = (rows[ds.DAY_COLUMN].to_numpy() % unlabelled_every) != 0
        lab = pd.DataFrame({
            "request_id": records["request_id"][keep].to_numpy(),
            "timestamp": (records["timestamp"][keep] + LABEL_DELAY).to_numpy(),
            ds.LABEL_COLUMN: rows[ds.LABEL_COLUMN].to_numpy()[keep],
        })
        lab["timestamp"] = pd.to_datetime(lab["timestamp"], utc=True)
        writer.write_labels(lab)
    return records.assign(**{ds.LABEL_COLUMN: rows[ds.LABEL_COLUMN].to_numpy()})


# ------------------------------------------------------------------------- entry points (tests)
GATE = threading.Event()
STARTED = threading.Event()


def broken_training(window, *, params):
    """An entry point that fails after starting (stands in for a user's buggy training code)."""
    raise RuntimeError("feature store unreachable at epoch 3")


def gated_training(window, *, params):
    """The NOAA training, held until the test opens GATE (a long training run in flight)."""
    STARTED.set()
    assert GATE.wait(120), "the test never released the gated training"
    return tr.train_noaa(window, params=params)


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def env(tmp_path_factory, mlflow_server, noaa):
    """Settings (real MLflow, log root, one-hour cooldown) and a labelled log of days 14000-16000."""
    home = tmp_path_factory.mktemp("retrain-home")
    settings = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri,
                             inference_log_root=str(home / "logs"), retrain_cooldown_s=3600.0)
    model = f"noaa_rain_{uuid.uuid4().hex[:8]}"
    written = write_noaa_log(settings.inference_log_root, model, noaa, 14_000, 16_000)
    return {"settings": settings, "model": model, "written": written}


DRIFT_EVENT = {"model": "noaa", "version": 1, "features": ["sea_level_pressure"],
               "scores": {"sea_level_pressure": {"psi": 0.41}}}


@pytest.fixture(scope="module")
def challenger_v1(env):
    """The NOAA training run on the 7 days before day 16000: version 1 with alias challenger."""
    s, model = env["settings"], env["model"]
    event = {**DRIFT_EVENT, "model": model, "window_start": ts(15_988).isoformat(),
             "window_end": ts(16_000).isoformat()}
    window = rp.training_window(model, days=7, drift_event=event, settings=s)
    result = rp.run_training(model, window, reason="champion_degraded", drift_event=event,
                             settings=s)
    return {"window": window, "result": result, "event": event}


def _client(env):
    return mlflow.MlflowClient(tracking_uri=env["settings"].resolved_mlflow_tracking_uri)


def _versions(env) -> list[int]:
    return sorted(int(v.version) for v in
                  _client(env).search_model_versions(f"name='{env['model']}'"))


# --------------------------------------------------------------------------------------- tests
def test_training_window_joins_labels_by_request_id_and_records_lineage(env):
    s, model, written = env["settings"], env["model"], env["written"]
    end = ts(14_600)
    out = rp.training_window(model, days=600 * 5 / 60 / 24, end=end.isoformat(),
                             drift_event={"model": model, "window_end": "ignored: end given"},
                             settings=s)
    frame = pd.read_parquet(out["uri"])
    expected = written[(written["timestamp"] >= ts(14_000)) & (written["timestamp"] < end)]
    labelled = expected[expected["request_id"].str.rsplit("-", n=1).str[1].astype(int)
                        % UNLABELLED_EVERY != 0]
    assert out["rows"] == len(frame) == len(labelled) < len(expected) == 600
    # every row's label is the one logged for its request id
    merged = frame.merge(labelled[["request_id", ds.LABEL_COLUMN]], on="request_id",
                         suffixes=("", "_truth"))
    assert len(merged) == len(frame)
    assert (merged[ds.LABEL_COLUMN] == merged[f"{ds.LABEL_COLUMN}_truth"]).all()
    lin = out["lineage"]
    assert lin["log_rows"] == 600 and lin["labelled_log_rows"] == len(labelled)
    assert lin["window_rows"] == len(frame) and lin["reference_rows"] == 0
    assert lin["data_sha256"] == tr.data_sha256(frame)
    assert pd.Timestamp(lin["requested_end"]) == end
    assert pd.Timestamp(lin["window_end"]) < end <= pd.Timestamp(lin["window_end"]) + INTERVAL * 2
    assert '"window_end":"ignored: end given"' in lin["drift_event"]
    assert out["label_column"] == ds.LABEL_COLUMN


def test_training_window_without_labels_is_refused_naming_the_window(tmp_path, noaa):
    s = make_settings(tmp_path, inference_log_root=str(tmp_path / "logs"))
    write_noaa_log(s.inference_log_root, "unlabelled", noaa, 15_000, 15_100, labels=False)
    with pytest.raises(WindowError, match="no label of model 'unlabelled' arrived in"):
        rp.training_window("unlabelled", days=1, end=ts(15_100), settings=s)


def test_noaa_training_registers_a_challenger_with_reason_and_lineage(env, challenger_v1):
    result, window = challenger_v1["result"], challenger_v1["window"]
    assert result["version"] == "1" and result["alias"] == "challenger"
    assert result["publish_conf"] == {"model": env["model"], "version_or_alias": "1",
                                      "then": ["shadow_evaluation"], "dataset_uri": window["uri"]}
    mv = _client(env).get_model_version_by_alias(env["model"], "challenger")
    assert mv.version == "1"
    tags = mv.tags
    assert tags["tritonflow.reason"] == "champion_degraded"
    assert tags["tritonflow.data_sha256"] == window["lineage"]["data_sha256"]
    assert tags["tritonflow.training_window_uri"] == window["uri"]
    assert tags["tritonflow.entry_point"] == "model_registry.training:train_noaa"
    assert '"sea_level_pressure"' in tags["tritonflow.drift_event"]
    assert int(tags["tritonflow.window_rows"]) == window["rows"]
    # the recent window trains a usable model (hold-out AUC recorded as the reference metric)
    assert float(tags["tritonflow.reference_auc"]) > 0.75


def test_reference_rows_are_mixed_in_at_the_requested_share(env, challenger_v1):
    s, model = env["settings"], env["model"]
    out = rp.training_window(model, days=1, end=ts(14_600), mix_reference_fraction=0.25,
                             reference_version=1, settings=s)
    lin = out["lineage"]
    assert lin["reference_source"] == challenger_v1["window"]["uri"]
    assert lin["reference_rows"] == round(0.25 / 0.75 * lin["labelled_log_rows"]) > 0
    assert out["rows"] == lin["labelled_log_rows"] + lin["reference_rows"]
    frame = pd.read_parquet(out["uri"])
    # reference rows first, the window's labelled rows last (a time-ordered hold-out stays recent)
    recent = frame.iloc[-lin["labelled_log_rows"]:]
    assert recent["timestamp"].min() >= ts(14_600) - pd.Timedelta(days=1)
    assert recent["timestamp"].is_monotonic_increasing and recent["timestamp"].max() < ts(14_600)
    reference_ids = set(pd.read_parquet(challenger_v1["window"]["uri"])["request_id"])
    assert set(frame["request_id"].iloc[:lin["reference_rows"]]) <= reference_ids


def test_mixed_reference_rows_carry_their_stored_times(env, noaa):
    """A version without a training-window tag mixes in its stored reference; rows that kept their
    times bring them, so the new version's reference keeps row times too."""
    from drift_checks.reference import save_reference

    s = env["settings"]
    model = f"noaa_ref_{uuid.uuid4().hex[:8]}"
    client = mlflow.MlflowClient(s.mlflow_tracking_uri)
    client.create_registered_model(model)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    client.create_model_version(model, f"{run.info.artifact_uri}/model", run.info.run_id)
    rows = noaa.iloc[14_000:14_200][[*ds.FEATURE_COLUMNS, "rain"]].assign(
        timestamp=[ts(d) for d in range(14_000, 14_200)])
    save_reference(s.inference_log_root, model, 1, rows)
    frame, _ = rp.reference_rows(model, 1, label_column="rain", settings=s)
    assert list(frame["timestamp"]) == list(rows["timestamp"]) and "rain" in frame.columns


def test_failing_entry_point_leaves_the_registry_unchanged(env, challenger_v1):
    s, model = env["settings"], env["model"]
    before = (_versions(env), _client(env).get_registered_model(model).aliases)
    with pytest.raises(TrainingError, match="feature store unreachable at epoch 3"):
        rp.run_training(model, challenger_v1["window"],
                        entry_point="tests.pipelines.test_retrain_pipeline:broken_training",
                        reason="manual", ignore_cooldown=True, settings=s)
    assert (_versions(env), _client(env).get_registered_model(model).aliases) == before
    assert tr.RetrainGuard.from_settings(s).status(model)["status"] == "failed"


def test_retrain_within_the_cooldown_is_refused(env, challenger_v1):
    s, model = env["settings"], env["model"]
    before = _versions(env)
    with pytest.raises(RetrainCooldownError, match="cooldown is 3600 s"):
        rp.run_training(model, challenger_v1["window"], reason="drift", settings=s)
    assert _versions(env) == before


def test_a_second_concurrent_retrain_is_refused(env, challenger_v1):
    s, model = env["settings"], env["model"]
    GATE.clear()
    STARTED.clear()
    outcome: dict = {}

    def first() -> None:
        try:
            outcome["result"] = rp.run_training(
                model, challenger_v1["window"],
                entry_point="tests.pipelines.test_retrain_pipeline:gated_training",
                reason="manual", ignore_cooldown=True, holder="first", settings=s)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert STARTED.wait(120), outcome
        with pytest.raises(ConcurrencyError, match="already in flight \\(holder 'first'"):
            rp.run_training(model, challenger_v1["window"], reason="manual",
                            ignore_cooldown=True, holder="second", settings=s)
    finally:
        GATE.set()
        thread.join(300)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"]["alias"] == "challenger"
    assert _client(env).get_model_version_by_alias(model, "challenger").version == \
        outcome["result"]["version"] == "2"


def test_per_model_entry_point_wins_over_the_default_and_bad_config_is_refused(tmp_path):
    s = make_settings(tmp_path, retrain_entry_points='{"wind": "my_pkg.train:fit_wind"}')
    assert rp.entry_point_for("wind", s) == "my_pkg.train:fit_wind"
    assert rp.entry_point_for("rain", s) == "model_registry.training:train_noaa"
    from ground.exceptions import SettingsError

    with pytest.raises(SettingsError, match="TRITONFLOW_RETRAIN_ENTRY_POINTS='wind=x' is not JSON"):
        rp.entry_point_for("wind", make_settings(tmp_path, retrain_entry_points="wind=x"))
