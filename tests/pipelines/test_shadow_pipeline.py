"""Shadow pipeline on real NOAA windows, a real MLflow server and a real Triton.

The champion is trained on days 0-8,000 and the challenger on days 12,000-16,000 (after the
concept drift at day 12,000), both logged and registered in MLflow (aliases ``champion`` and
``challenger``), converted to ONNX (ZipMap off, probabilities exposed), signed and pushed to a
folder repository, and served by one Triton in explicit mode. Days 16,000-16,600 are in the
inference log with their labels (every 7th label never arrived); days 17,000-17,300 without any.
"""

from __future__ import annotations

import json
import sys
import uuid

import mlflow
import numpy as np
import pandas as pd
import pytest

from ground.exceptions import ChallengerUnavailableError, DataError, WindowError
from model_registry import datasets as ds
from model_registry import training as tr
from repository_sync.triton.client import TritonModelControl
from tests.conftest import make_settings
from tests.pipelines.test_retrain_pipeline import INTERVAL, ts, write_noaa_log
from tritonflow.pipelines import shadow as sp
from tritonflow.pipelines.shadow_compare import EXPECTED_TAG, compare
from tritonflow.pipelines.shadow_replay import replay
from tritonflow.runtime.services import TritonServer

#: Replayed window (days) with labels, and one without labels.
LABELLED = (16_000, 16_600)
UNLABELLED = (17_000, 17_300)
#: A labelled window straddling the concept shift at day 12,000: 400 days before it, 300 after.
STRADDLING = (11_600, 12_300)


def publish_directly(settings, model: str, version: int, model_file_bytes: bytes, config) -> None:
    """Sign and push one version with repository_sync (the publish pipeline's last steps)."""
    from repository_sync.publish import publish_version

    path = settings.home / "staged" / f"{model}-{version}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model_file_bytes)
    publish_version(repository=settings.resolved_repository_uri, model_name=model, version=version,
                    model_file=path, config=config,
                    private_key=settings.home / "keys" / "model_signing.pem",
                    trusted_keys=str(sp.trusted_keys_dir(settings)))


def onnx_and_config(trained: tr.TrainedModel, model: str, settings):
    """skl2onnx conversion (ZipMap off) and a batched CPU config built with protobuf."""
    from model_registry.conversion.common import convert_sklearn
    from model_registry.triton_config import InstanceGroupSpec, build_config

    converted = convert_sklearn(
        trained.model, schema={"features": {"dtype": "float32", "shape": [-1, len(ds.FEATURE_COLUMNS)]}},
        model_name=model, settings=settings)
    config = build_config(model, converted.onnx_model, max_batch_size=32,
                          instance_groups=[InstanceGroupSpec("KIND_CPU", 1)])
    return converted.serialized(), config


@pytest.fixture(scope="module")
def noaa():
    return ds.load_noaa(with_timestamps=True, interval=INTERVAL)


@pytest.fixture(scope="module")
def serving(tmp_path_factory, mlflow_server, noaa):
    """Champion v1 (early rows) serving on Triton, challenger v2 (recent rows) in the repository."""
    from repository_sync.signing import generate_key_pair

    home = tmp_path_factory.mktemp("shadow-home")
    repo = home / "repository"
    repo.mkdir()
    generate_key_pair(home / "keys" / "model_signing.pem", home / "keys" / "trusted" / "test.pub")
    triton = TritonServer(make_settings(home / "triton"), repository=str(repo)).start()
    try:
        settings = make_settings(
            home, mlflow_tracking_uri=mlflow_server.tracking_uri, repository_uri=str(repo),
            triton_http_port=int(triton.http_url.rsplit(":", 1)[1]),
            inference_log_root=str(home / "logs"))
        model = f"noaa_shadow_{uuid.uuid4().hex[:8]}"
        trained = {}
        for version, (alias, (a, b)) in enumerate(
                [("champion", (0, 8_000)), ("challenger", (12_000, 16_000))], start=1):
            window = ds.window(noaa, a, b)
            trained[version] = tr.train_noaa(window)
            reg = tr.log_and_register(trained[version], window, name=model, alias=alias,
                                      tracking_uri=mlflow_server.tracking_uri,
                                      lineage=tr.Lineage("initial" if version == 1 else "manual"))
            assert reg.version == str(version)
            publish_directly(settings, model, version, *onnx_and_config(trained[version], model, settings))
        with TritonModelControl(settings.triton_http_url, repository=str(repo),
                                trusted_keys=str(sp.trusted_keys_dir(settings))) as control:
            control.load(model, 1)  # the champion serves
        labelled = write_noaa_log(settings.inference_log_root, model, noaa, *LABELLED)
        write_noaa_log(settings.inference_log_root, model, noaa, *UNLABELLED, labels=False)
        write_noaa_log(settings.inference_log_root, model, noaa, *STRADDLING)
        yield {"settings": settings, "model": model, "trained": trained, "labelled": labelled,
               "triton": triton}
    finally:
        triton.stop()


def _control(serving) -> TritonModelControl:
    s = serving["settings"]
    return TritonModelControl(s.triton_http_url, repository=s.resolved_repository_uri,
                              trusted_keys=str(sp.trusted_keys_dir(s)))


def _version_tags(serving, version: int) -> dict:
    client = mlflow.MlflowClient(tracking_uri=serving["settings"].resolved_mlflow_tracking_uri)
    return client.get_model_version(serving["model"], str(version)).tags


def test_challenger_trained_after_the_shift_wins_with_the_stated_confidence(serving, noaa):
    s, model = serving["settings"], serving["model"]
    resolved = sp.resolve_versions(model, settings=s)
    assert (resolved["champion"]["version"], resolved["challenger"]["version"]) == (1, 2)
    assert resolved["champion"]["input_columns"] == list(ds.FEATURE_COLUMNS)
    assert resolved["champion"]["reference_metrics"]["auc"] > 0.8
    published = sp.ensure_challenger_published(resolved, settings=s)
    assert published["action"] == "already_in_repository"

    replayed = replay(model, resolved["champion"], resolved["challenger"],
                         ts(LABELLED[0]), ts(LABELLED[1]), settings=s, concurrency=3)
    assert replayed["rows"] == LABELLED[1] - LABELLED[0] and replayed["invalid_rows"] == 0
    assert replayed["challenger_loaded"] and replayed["challenger_unloaded"]
    with _control(serving) as control:
        assert control.ready_versions(model) == [1]  # challenger unloaded, champion untouched
    # Triton's answers are the models' own probabilities (float32 ONNX vs float64 sklearn)
    preds = pd.read_parquet(replayed["uri"])
    rows = ds.window(noaa, *LABELLED)
    for version, column in ((1, "champion_score"), (2, "challenger_score")):
        np.testing.assert_allclose(preds[column], serving["trained"][version].predict_scores(rows),
                                   atol=1e-4)

    decision = compare(replayed, settings=s, rule_overrides={"confidence": 0.99})
    assert decision["verdict"] == "challenger_wins"
    assert decision["outcome"] == "promote_challenger"
    # the challenger's expected predictions: its replay scores and inputs, recorded on its
    # version and passed to the canary
    expected = pd.read_parquet(replayed["expected_uri"])
    np.testing.assert_allclose(expected["expected_score"], preds["challenger_score"])
    assert list(expected.columns[4:]) == list(ds.FEATURE_COLUMNS) and set(expected["source"]) == {"shadow_replay"}
    conf = decision["canary_conf"]
    assert {k: conf[k] for k in ("model", "challenger")} == {"model": model, "challenger": "2"}
    assert conf["expected_predictions"] == _version_tags(serving, 2)[EXPECTED_TAG]
    assert conf["expected_predictions"] == decision["recorded"]["challenger"]["expected_uri"]
    n_labelled = int((rows[ds.DAY_COLUMN] % 7 != 0).sum())
    assert decision["n_labelled"] == n_labelled
    primary = decision["primary"]
    assert primary["name"] == "auc" and primary["ci_low"] >= 0.01  # lower 99 % bound >= margin
    assert decision["champion_degraded"] is True  # AUC far below its hold-out reference

    for version, role, other in ((1, "champion", "2"), (2, "challenger", "1")):
        tags = _version_tags(serving, version)
        assert tags["tritonflow.shadow.outcome"] == "promote_challenger"
        assert tags["tritonflow.shadow.role"] == role
        assert tags["tritonflow.shadow.compared_with"] == other
        evidence = json.loads(tags["tritonflow.shadow.evidence"])
        assert evidence["rule"]["confidence"] == 0.99 and evidence["n_labelled"] == n_labelled
        report = mlflow.artifacts.download_artifacts(artifact_uri=tags["tritonflow.shadow.report_uri"],
                                                     tracking_uri=s.resolved_mlflow_tracking_uri)
        text = open(report).read()
        assert "**Outcome: `promote_challenger`**" in text and f"{model} v2 (challenger)" in text


def test_champion_trained_after_the_shift_beats_an_older_challenger(serving):
    """The reverse: the recent model as champion, the early model as challenger -> it loses."""
    s, model = serving["settings"], serving["model"]
    resolved = sp.resolve_versions(model, settings=s)
    replayed = replay(model, resolved["challenger"], resolved["champion"],
                         ts(LABELLED[0]), ts(LABELLED[1]), settings=s)
    decision = compare(replayed, settings=s, record=False)
    assert decision["verdict"] == "challenger_loses"
    assert decision["outcome"] in ("nothing", "retrain")
    assert decision["primary"]["ci_high"] < 0


def test_a_challenger_fitted_after_a_recorded_change_point_is_judged_on_the_rows_since_it(serving, noaa):
    """A window straddling the shift: the challenger (trained after it) loses over the whole window,
    mostly the concept the shift replaced, and wins on the rows since the change point it records."""
    s, model = serving["settings"], serving["model"]
    client = mlflow.MlflowClient(tracking_uri=s.resolved_mlflow_tracking_uri)
    resolved = sp.resolve_versions(model, settings=s)
    assert resolved["challenger"]["change_point"] == ""  # no recorded change point: the whole window
    replayed = replay(model, resolved["champion"], resolved["challenger"], ts(STRADDLING[0]), ts(STRADDLING[1]),
                      settings=s)
    whole = compare(replayed, settings=s, record=False)
    assert whole["verdict"] == "challenger_loses"
    assert json.loads(open(whole["evidence_uri"]).read())["judged"]["since"] == ""

    days = ds.window(noaa, *STRADDLING)[ds.DAY_COLUMN].to_numpy()
    try:
        client.set_model_version_tag(model, "2", "tritonflow.change_point", ts(12_000).isoformat())
        resolved = sp.resolve_versions(model, settings=s)
        replayed = replay(model, resolved["champion"], resolved["challenger"], ts(STRADDLING[0]),
                          ts(STRADDLING[1]), settings=s)
        since = compare(replayed, settings=s, record=False)
        assert (since["verdict"], since["outcome"]) == ("challenger_wins", "promote_challenger")
        after = days >= 12_000
        assert since["n_rows"] == int(after.sum())
        assert since["n_labelled"] == int((after & (days % 7 != 0)).sum())
        judged = json.loads(open(since["evidence_uri"]).read())["judged"]
        assert judged["since"] == ts(12_000).isoformat() and judged["recorded_by"] == 2
        assert judged["rows_before"] == int((~after).sum())
        assert "follow the replaced concept" in open(since["report_uri"]).read()

        # too few labelled rows after the change point (< min_labels=200): the whole window again
        client.set_model_version_tag(model, "2", "tritonflow.change_point", ts(12_150).isoformat())
        resolved = sp.resolve_versions(model, settings=s)
        replayed = replay(model, resolved["champion"], resolved["challenger"], ts(STRADDLING[0]),
                          ts(STRADDLING[1]), settings=s)
        late = compare(replayed, settings=s, record=False)
        judged = json.loads(open(late["evidence_uri"]).read())["judged"]
        assert judged["since"] == "" and judged["labelled_since"] == int(((days >= 12_150) & (days % 7 != 0)).sum())
        assert "fewer than min_labels=200" in judged["reason"] and late["n_rows"] == len(days)
    finally:
        client.delete_model_version_tag(model, "2", "tritonflow.change_point")


def test_window_without_labels_is_inconclusive(serving):
    s, model = serving["settings"], serving["model"]
    resolved = sp.resolve_versions(model, "challenger", settings=s)
    replayed = replay(model, resolved["champion"], resolved["challenger"],
                         ts(UNLABELLED[0]), ts(UNLABELLED[1]), settings=s)
    assert replayed["rows"] == UNLABELLED[1] - UNLABELLED[0]
    decision = compare(replayed, settings=s)
    assert (decision["verdict"], decision["outcome"]) == ("inconclusive", "inconclusive")
    assert decision["n_labelled"] == 0 and decision["champion_degraded"] is None
    assert any("min_labels=200" in r for r in decision["reasons"])
    assert _version_tags(serving, 2)["tritonflow.shadow.outcome"] == "inconclusive"


def test_challenger_that_cannot_be_loaded_leaves_the_champion_serving(serving, noaa):
    s, model = serving["settings"], serving["model"]
    client = mlflow.MlflowClient(tracking_uri=s.resolved_mlflow_tracking_uri)
    v2 = client.get_model_version(model, "2")
    broken = client.create_model_version(model, v2.source, run_id=v2.run_id,
                                          model_id=v2.source.rsplit("/", 1)[-1])
    assert broken.version == "3"
    _, config = onnx_and_config(serving["trained"][2], model, s)
    publish_directly(s, model, 3, b"not an onnx model", config)  # signed, but not loadable
    resolved = sp.resolve_versions(model, "3", settings=s)

    with pytest.raises(ChallengerUnavailableError, match="v3 .*could not be loaded: .*refused"):
        replay(model, resolved["champion"], resolved["challenger"],
                  ts(LABELLED[0]), ts(LABELLED[1]), settings=s)
    with _control(serving) as control:
        assert 1 in control.ready_versions(model) and 3 not in control.ready_versions(model)
        x = ds.window(noaa, 16_000, 16_004)[list(ds.FEATURE_COLUMNS)].to_numpy(np.float32)
        out = control.infer(model, 1, {"features": x}, ["probabilities"])
    assert out["probabilities"].shape == (4, 2)  # the champion still answers


def test_missing_challenger_without_the_publish_pipeline_fails_clearly(serving, monkeypatch):
    s, model = serving["settings"], serving["model"]
    client = mlflow.MlflowClient(tracking_uri=s.resolved_mlflow_tracking_uri)
    v2 = client.get_model_version(model, "2")
    unpublished = client.create_model_version(model, v2.source, run_id=v2.run_id,
                                          model_id=v2.source.rsplit("/", 1)[-1])
    monkeypatch.setitem(sys.modules, "tritonflow.pipelines.publish", None)  # not importable
    resolved = sp.resolve_versions(model, unpublished.version, settings=s)
    with pytest.raises(DataError, match=f"v{unpublished.version} is not in the repository .*"
                                        "publish it with the model_publish DAG first"):
        sp.ensure_challenger_published(resolved, settings=s)


def test_replaying_an_empty_window_is_refused(serving):
    s, model = serving["settings"], serving["model"]
    with pytest.raises(WindowError, match="has no record in .*nothing to replay"):
        replay(model, 1, None, ts(10), ts(20), settings=s)


# ------------------------------------------------------------------ planning (no services needed)
def test_drift_window_is_widened_to_the_configured_hours_and_keeps_the_drifted_hour(tmp_path):
    s = make_settings(tmp_path, shadow_window_hours=24.0)
    event = {"model": "m", "window_start": "2024-03-01T10:00:00+00:00",
             "window_end": "2024-03-01T11:00:00+00:00"}
    assert sp.evaluation_window(drift_event=json.dumps(event), settings=s) == {
        "window_start": "2024-02-29T11:00:00+00:00", "window_end": "2024-03-01T11:00:00+00:00"}
    # a span shorter than the drifted window still covers the drifted window
    assert sp.evaluation_window(drift_event=event, window_hours=0.5, settings=s)[
        "window_start"] == "2024-03-01T10:00:00+00:00"
    with pytest.raises(WindowError, match="window_hours=0; expected a positive number"):
        sp.evaluation_window(drift_event=event, window_hours=0, settings=s)
    with pytest.raises(DataError, match="drift_event='not json' is not JSON"):
        sp.evaluation_window(drift_event="not json", settings=s)


def test_latest_drift_event_of_the_model_is_chosen_among_asset_events():
    from types import SimpleNamespace

    events = [
        SimpleNamespace(extra={"model": "rain", "window_end": "2024-03-01T11:00:00+00:00"}, timestamp=1),
        SimpleNamespace(extra={"model": "wind", "window_end": "2024-03-01T13:00:00+00:00"}, timestamp=3),
        SimpleNamespace(extra={"model": "rain", "window_end": "2024-03-01T12:00:00+00:00"}, timestamp=2),
        SimpleNamespace(extra={}, timestamp=4),
    ]
    assert sp.latest_drift_event(events)["model"] == "wind"
    assert sp.latest_drift_event(events, "rain")["window_end"] == "2024-03-01T12:00:00+00:00"
    assert sp.latest_drift_event(events, "snow") is None
