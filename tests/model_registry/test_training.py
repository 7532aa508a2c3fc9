"""NOAA training, MLflow logging/registration with lineage, entry points and the retrain guard.

MLflow tests run against the real tracking server of the ``mlflow_server`` fixture."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import mlflow
import mlflow.sklearn
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ground.exceptions import (
    ConcurrencyError,
    DataError,
    RegistryError,
    RetrainCooldownError,
    TrainingError,
    WindowError,
)
from model_registry import datasets as ds
from model_registry import training as tr
from model_registry.registry_client import pinned_mlflow_uris

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def noaa():
    return ds.load_noaa(with_timestamps=True)


@pytest.fixture(scope="module")
def recent_window(noaa):
    return ds.window(noaa, 14_000, 16_000)


def _auc(model, frame):
    return roc_auc_score(frame[ds.LABEL_COLUMN], model.predict_scores(frame))


def _versions(client, name):
    return sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))


# ------------------------------------------------------------------------------- the NOAA model
def test_model_trained_before_the_shift_fails_after_it_and_retraining_recovers(noaa):
    early = tr.train_noaa(ds.window(noaa, 0, 8000))
    recent = tr.train_noaa(ds.window(noaa, 12_000, 16_000))
    pre_drift, late = ds.window(noaa, 8000, 12_000), ds.window(noaa, 16_000, ds.N_DAYS)
    assert _auc(early, pre_drift) > 0.8
    assert _auc(early, late) < 0.5  # worse than chance after the concept drift
    assert _auc(recent, late) > 0.75
    assert early.metrics["validation_auc"] > 0.8
    assert early.metrics["train_rows"] == 8000
    assert list(early.model.named_steps) == ["scale", "classify"]


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda w: w.drop(columns=["dew_point"]), "lacks columns \\['dew_point'\\]"),
        (lambda w: w.assign(visibility=w["visibility"].where(w.index != w.index[5])),
         "column 'visibility' row 14005"),
        (lambda w: w.assign(rain=0), "holds only \\[0\\]"),
        (lambda w: w.assign(rain=w["rain"] * 3), "expected 0/1"),
        (lambda w: w.head(50), "has 50 rows"),
    ],
    ids=["missing-feature", "nan-feature", "one-class", "non-binary", "too-few-rows"],
)
def test_train_noaa_refuses_a_bad_window_naming_the_problem(recent_window, mutate, fragment):
    with pytest.raises(WindowError, match=fragment):
        tr.train_noaa(mutate(recent_window))


def test_training_params_are_validated(recent_window):
    with pytest.raises(DataError, match=r"\['learning_rate'\] are unknown"):
        tr.train_noaa(recent_window, params={"learning_rate": 0.1})
    with pytest.raises(DataError, match="C=-1.0 must be > 0"):
        tr.train_noaa(recent_window, params={"C": "-1"})
    model = tr.train_noaa(recent_window, params={"C": "0.5", "max_iter": 200})
    assert model.params["C"] == 0.5 and model.model.named_steps["classify"].C == 0.5


def test_data_hash_follows_content_not_index(recent_window):
    digest = tr.data_sha256(recent_window)
    assert len(digest) == 64 and digest == tr.data_sha256(recent_window.copy())
    assert tr.data_sha256(recent_window.reset_index(drop=True)) == digest
    changed = recent_window.copy()
    changed.iloc[7, changed.columns.get_loc("temperature")] += 1e-9
    assert tr.data_sha256(changed) != digest
    info = tr.window_lineage(recent_window)
    assert info["window_start"] == ds.day_to_timestamp(14_000).isoformat()
    assert info["window_end"] == ds.day_to_timestamp(15_999).isoformat()
    assert info["window_rows"] == 2000
    assert info["window_positive_rows"] == int(recent_window[ds.LABEL_COLUMN].sum())


# ------------------------------------------------------------------------------- entry points
def test_entry_point_specs_parse_and_resolve():
    ep = tr.EntryPoint.parse("model_registry.training:train_noaa")
    assert (ep.kind, tr.resolve_callable(ep.target)) == ("callable", tr.train_noaa)
    proj = tr.EntryPoint.parse("project:/srv/noaa-project#train")
    assert (proj.kind, proj.target, proj.entry_point) == ("project", "/srv/noaa-project", "train")
    mapped = tr.EntryPoint.parse({"project_uri": "https://example.org/p.git", "entry_point": "fit",
                                  "parameters": {"C": 2}})
    assert mapped.parameters == {"C": 2} and mapped.entry_point == "fit"
    with pytest.raises(DataError, match="expected 'module:function'"):
        tr.EntryPoint.parse("just_a_module")
    with pytest.raises(DataError, match="module 'no_such_pkg_xyz' cannot be imported"):
        tr.resolve_callable("no_such_pkg_xyz:fit")
    with pytest.raises(DataError, match="has no attribute 'nope'"):
        tr.resolve_callable("model_registry.training:nope")
    with pytest.raises(DataError, match="not callable"):
        tr.resolve_callable("model_registry.training:TAG_PREFIX")
    with pytest.raises(DataError, match="expected 'module:function', 'project:<uri>"):
        tr.EntryPoint.parse({"something": 1})


# ------------------------------------------------------------------------------- MLflow
def failing_training(window, *, params):
    """Entry point that fails half-way, after opening an MLflow run."""
    mlflow.start_run()
    mlflow.log_param("started", "yes")
    raise RuntimeError("solver diverged")


def returns_nothing(window, *, params):
    return None


@pytest.fixture(scope="module")
def registered(mlflow_server, recent_window):
    """One retraining through the callable entry point ``model_registry.training:train_noaa``."""
    name = f"noaa-{uuid.uuid4().hex[:8]}"
    lineage = tr.Lineage(reason="drift", drift_event="drift_asset_event:42",
                         extra={"dag_run_id": "manual__1"})
    result = tr.run_entry_point("model_registry.training:train_noaa", recent_window,
                                tracking_uri=mlflow_server.tracking_uri, name=name,
                                lineage=lineage, params={"C": 1.0})
    return name, result


def test_retraining_registers_a_challenger_with_lineage(mlflow_server, registered, recent_window):
    name, result = registered
    client = mlflow.MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    mv = client.get_model_version_by_alias(name, "challenger")
    assert mv.version == result.version == "1"
    digest = tr.data_sha256(recent_window)
    tags = mv.tags
    assert tags["tritonflow.reason"] == "drift"
    assert tags["tritonflow.drift_event"] == "drift_asset_event:42"
    assert tags["tritonflow.data_sha256"] == digest
    assert tags["tritonflow.window_rows"] == "2000"
    assert tags["tritonflow.window_start"] == ds.day_to_timestamp(14_000).isoformat()
    assert tags["tritonflow.dag_run_id"] == "manual__1"
    assert 0.5 < float(tags["tritonflow.reference_auc"]) <= 1.0
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["data_sha256"] == digest
    assert run.data.params["window_end"] == ds.day_to_timestamp(15_999).isoformat()
    assert run.data.params["retrain_reason"] == "drift"
    assert run.data.params["model_C"] == "1.0"
    assert run.data.tags["tritonflow.drift_event"] == "drift_asset_event:42"
    assert "validation_auc" in run.data.metrics


def test_an_inherited_registry_uri_does_not_redirect_a_registration(mlflow_server, recent_window, monkeypatch):
    """A worker that inherited MLFLOW_REGISTRY_URI (another tool's, a dead server's) still registers
    on the server it was given, and leaves the environment its children inherit as it was."""
    dead = "http://127.0.0.1:9"  # discard port: nothing answers
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", dead)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)
    name = f"noaa-{uuid.uuid4().hex[:8]}"
    result = tr.run_entry_point("model_registry.training:train_noaa", recent_window,
                                tracking_uri=mlflow_server.tracking_uri, name=name,
                                lineage=tr.Lineage(reason="schedule"), params={"C": 1.0})
    client = mlflow.MlflowClient(tracking_uri=mlflow_server.tracking_uri, registry_uri=mlflow_server.tracking_uri)
    assert client.get_model_version_by_alias(name, "challenger").version == result.version
    assert os.environ["MLFLOW_REGISTRY_URI"] == dead and os.environ["MLFLOW_TRACKING_URI"] == dead


def test_registered_challenger_loads_with_signature_and_predicts_like_the_trained_model(
        mlflow_server, registered, recent_window):
    name, result = registered
    uri = f"models:/{name}@challenger"
    with pinned_mlflow_uris(mlflow_server.tracking_uri):
        info = mlflow.models.get_model_info(uri)
        loaded = mlflow.sklearn.load_model(uri)
    assert [c.name for c in info.signature.inputs] == list(ds.FEATURE_COLUMNS)
    assert info.saved_input_example_info is not None
    expected = tr.train_noaa(recent_window, params={"C": 1.0})
    X = recent_window.loc[:, list(ds.FEATURE_COLUMNS)]
    np.testing.assert_allclose(loaded.predict_proba(X), expected.model.predict_proba(X))


def test_failed_training_leaves_the_registry_unchanged(mlflow_server, registered, recent_window):
    name, result = registered
    client = mlflow.MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    before = _versions(client, name)
    for target, match in [("tests.model_registry.test_training:failing_training", "solver diverged"),
                          ("tests.model_registry.test_training:returns_nothing", "returned NoneType")]:
        with pytest.raises(TrainingError, match=match):
            tr.run_entry_point(target, recent_window, tracking_uri=mlflow_server.tracking_uri,
                               name=name, lineage=tr.Lineage(reason="manual"))
    assert _versions(client, name) == before
    assert client.get_model_version_by_alias(name, "challenger").version == result.version
    failed = client.search_runs([client.get_experiment_by_name("Default").experiment_id],
                                filter_string="params.started = 'yes'")
    assert failed and all(r.info.status == "FAILED" for r in failed)
    assert mlflow.active_run() is None


def test_registration_failure_deletes_the_new_version(mlflow_server, recent_window):
    client = mlflow.MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    name = f"noaa-{uuid.uuid4().hex[:8]}"
    model = tr.train_noaa(recent_window)
    # MLflow reserves aliases of the form v<number>: setting it fails after the version exists
    with pytest.raises(RegistryError, match="nothing was left registered"):
        tr.log_and_register(model, recent_window, tracking_uri=mlflow_server.tracking_uri,
                            name=name, lineage=tr.Lineage(reason="manual"), alias="v1")
    assert client.search_model_versions(f"name='{name}'") == []
    assert client.search_registered_models(filter_string=f"name='{name}'") == []


@pytest.mark.slow
def test_mlflow_project_entry_point_trains_and_registers(mlflow_server, tmp_path, recent_window):
    project = tmp_path / "noaa_project"
    project.mkdir()
    (project / "MLproject").write_text(textwrap.dedent(f"""\
        name: noaa
        entry_points:
          train:
            parameters:
              window: path
              C: {{type: float, default: 1.0}}
            command: "PYTHONPATH={PROJECT_ROOT} {sys.executable} train.py {{window}} {{C}}"
        """))
    (project / "train.py").write_text(textwrap.dedent("""\
        import sys
        import mlflow, mlflow.sklearn, pandas as pd
        from model_registry.training import sklearn_requirements, train_noaa
        window = pd.read_parquet(sys.argv[1])
        model = train_noaa(window, params={"C": float(sys.argv[2])})
        with mlflow.start_run():
            mlflow.log_metrics(model.metrics)
            mlflow.sklearn.log_model(model.model, name="model",
                                     pip_requirements=sklearn_requirements())
        """))
    name = f"noaa-{uuid.uuid4().hex[:8]}"
    result = tr.run_entry_point(
        {"project_uri": str(project), "entry_point": "train", "parameters": {"C": 0.5}},
        recent_window, tracking_uri=mlflow_server.tracking_uri, name=name,
        lineage=tr.Lineage(reason="schedule"),
    )
    client = mlflow.MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    mv = client.get_model_version_by_alias(name, "challenger")
    assert mv.version == result.version
    assert mv.tags["tritonflow.data_sha256"] == tr.data_sha256(recent_window)
    run = client.get_run(result.run_id)
    assert run.data.params["C"] == "0.5" and run.data.params["retrain_reason"] == "schedule"
    with pinned_mlflow_uris(mlflow_server.tracking_uri):
        loaded = mlflow.sklearn.load_model(f"models:/{name}@challenger")
    assert loaded.named_steps["classify"].C == 0.5
    with pytest.raises(TrainingError, match="entry point 'nope' failed"):
        tr.run_entry_point({"project_uri": str(project), "entry_point": "nope"}, recent_window,
                           tracking_uri=mlflow_server.tracking_uri, name=name,
                           lineage=tr.Lineage(reason="schedule"))
    assert _versions(client, name) == [int(result.version)]


# ------------------------------------------------------------------------------- the guard
class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_only_one_retraining_per_model_is_in_flight(tmp_path):
    guard = tr.RetrainGuard(tmp_path / "guard.sqlite", cooldown_s=60, stale_after_s=3600)
    lease = guard.acquire("noaa", holder="run-a")
    with pytest.raises(ConcurrencyError, match="already in flight \\(holder 'run-a'"):
        guard.acquire("noaa", holder="run-b", ignore_cooldown=True)
    guard.acquire("other-model")  # other models are independent
    guard.release(lease, succeeded=False)
    guard.acquire("noaa", holder="run-b")  # a failure does not start the cooldown


def test_cooldown_runs_from_the_last_successful_retraining(tmp_path):
    clock = Clock()
    guard = tr.RetrainGuard(tmp_path / "guard.sqlite", cooldown_s=600, stale_after_s=3600,
                            clock=clock)
    with guard.hold("noaa"):
        pass
    clock.now += 599
    with pytest.raises(RetrainCooldownError, match="cooldown is 600 s"):
        guard.acquire("noaa")
    manual = guard.acquire("noaa", ignore_cooldown=True)  # an operator may force it
    guard.release(manual, succeeded=True)
    clock.now += 601
    with guard.hold("noaa") as lease:
        assert guard.status("noaa")["status"] == "running" and lease.holder
    assert guard.status("noaa")["status"] == "succeeded"


def test_failed_block_releases_the_lock_without_cooldown(tmp_path):
    guard = tr.RetrainGuard(tmp_path / "guard.sqlite", cooldown_s=3600, stale_after_s=3600)
    with pytest.raises(RuntimeError):
        with guard.hold("noaa"):
            raise RuntimeError("boom")
    assert guard.status("noaa")["status"] == "failed"
    assert guard.status("noaa")["last_success_at"] is None
    with guard.hold("noaa"):
        pass


def test_abandoned_lock_is_taken_over_after_stale_after_s(tmp_path):
    clock = Clock()
    guard = tr.RetrainGuard(tmp_path / "guard.sqlite", cooldown_s=0, stale_after_s=100,
                            clock=clock)
    crashed = guard.acquire("noaa", holder="crashed-worker")
    clock.now += 101
    taken = guard.acquire("noaa", holder="new-worker")
    guard.release(crashed, succeeded=True)  # the late release of the old holder is ignored
    assert guard.status("noaa")["holder"] == "new-worker"
    assert guard.status("noaa")["status"] == "running"
    guard.release(taken, succeeded=True)


def test_concurrent_acquirers_in_separate_connections_get_exactly_one_lease(tmp_path):
    path = tmp_path / "guard.sqlite"
    tr.RetrainGuard(path, cooldown_s=60, stale_after_s=3600)
    barrier, won, lost = threading.Barrier(6), [], []

    def contend(i: int) -> None:
        guard = tr.RetrainGuard(path, cooldown_s=60, stale_after_s=3600)
        barrier.wait()
        try:
            won.append(guard.acquire("noaa", holder=f"worker-{i}"))
        except ConcurrencyError:
            lost.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 5


def test_guard_refuses_invalid_settings_and_reads_them(tmp_path, settings_factory):
    with pytest.raises(DataError, match="cooldown_s=-1 must be >= 0"):
        tr.RetrainGuard(tmp_path / "g.sqlite", cooldown_s=-1, stale_after_s=10)
    settings = settings_factory(retrain_cooldown_s=42.0)
    guard = tr.RetrainGuard.from_settings(settings)
    assert guard.cooldown_s == 42.0 and guard.url == f"sqlite:///{settings.home / 'drift' / 'history.db'}"


def test_retrain_in_cooldown_registers_nothing(mlflow_server, tmp_path, recent_window):
    client = mlflow.MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    name = f"noaa-{uuid.uuid4().hex[:8]}"
    guard = tr.RetrainGuard(tmp_path / "guard.sqlite", cooldown_s=3600, stale_after_s=3600)
    first = tr.retrain("model_registry.training:train_noaa", recent_window, name=name,
                       tracking_uri=mlflow_server.tracking_uri,
                       lineage=tr.Lineage(reason="champion_degraded"), guard=guard)
    with pytest.raises(RetrainCooldownError):
        tr.retrain("model_registry.training:train_noaa", recent_window, name=name,
                   tracking_uri=mlflow_server.tracking_uri,
                   lineage=tr.Lineage(reason="champion_degraded"), guard=guard)
    assert _versions(client, name) == [int(first.version)]
    assert guard.status(name)["status"] == "succeeded"
