"""Profile reuse, at the decision: when a challenger may start from its champion's measured config.

Real MLflow server, real conversions of real scikit-learn models and a real signed repository; no
Triton and no Model Analyzer here (the decision needs neither: the real-profiling publish is in
``test_publish_once.py``). Each champion is published through the real stages up to the record;
its profile is recorded as the profiling stage records a measured config (the sweep itself is what
this file does not pay for).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from model_registry.registry.client import pinned_mlflow_uris
from tests.conftest import make_settings
from tests.pipelines.test_publish_pipeline import churn_data, register, unique, version_tags
from tritonflow.pipelines import publish as pipeline
from tritonflow.pipelines import publish_profile, publish_record, publish_signing, publish_validate
from tritonflow.pipelines.publish_reuse import (
    SOURCE_FLAVOR_TAG,
    reuse_decision,
    size_difference,
    tensor_difference,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def settings(tmp_path_factory, mlflow_server):
    home = tmp_path_factory.mktemp("reuse_home")
    (home / "model_repository").mkdir()
    s = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri,
                      repository_uri=str(home / "model_repository"))
    with pinned_mlflow_uris(mlflow_server.tracking_uri):
        yield s


def _logistic(seed: int = 0, columns: int = 4):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = churn_data(seed=seed)
    X = X.iloc[:, :columns]
    return make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), X


def _network(seed: int = 0):
    """The same inputs and outputs as :func:`_logistic`, many times its size."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = churn_data(seed=seed)
    network = MLPClassifier((256, 64), solver="lbfgs", max_iter=50, random_state=seed)
    return make_pipeline(StandardScaler(), network).fit(X, y), X


def _staged(settings, name: str, fitted, alias: str) -> dict:
    model, X = fitted
    version = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias=alias)
    state = pipeline.resolve(f"{name}/{version}", settings=settings)
    return publish_validate.convert_and_validate(state, max_batch_size=8, settings=settings)


def _champion(settings, name: str, fitted, profile_status: str = "profiled") -> dict:
    """Publish ``fitted`` as ``name``'s champion up to the record, its profile as given."""
    state = _staged(settings, name, fitted, "champion")
    state = {**state, "profile": {"status": profile_status, "best": f"{name}_config_1", "concurrency": 1,
                                  "throughput": 900.0, "p99_latency_ms": 2.5}}
    state = publish_signing.sign_and_push(state, settings=settings)
    publish_record.record(state, settings=settings)
    return state


def _decide(settings, state, tmp_path, *, perf_gate_enabled: bool = True):
    work = tmp_path / f"work_{state['version']}_{len(list(tmp_path.iterdir()))}"
    return reuse_decision(state, work, perf_gate_enabled=perf_gate_enabled, repository_uri=None,
                          settings=settings)


def test_a_like_challenger_reuses_the_champions_measured_config_and_the_record_says_why(settings, tmp_path):
    name = unique("reuse_like")
    champion = _champion(settings, name, _logistic(seed=0))
    tags = version_tags(settings.resolved_mlflow_tracking_uri, name, champion["version"])
    assert tags[SOURCE_FLAVOR_TAG] == "sklearn"
    challenger = _staged(settings, name, _logistic(seed=1), "challenger")
    decision = _decide(settings, challenger, tmp_path)
    assert decision.reuse and decision.decision == "reused", decision.why
    assert decision.champion_version == champion["version"]
    assert "same flavour 'sklearn'" in decision.why and "confirmed by the p99 gate" in decision.why
    intended = Path(settings.resolved_repository_uri) / name / str(champion["version"]) / "config.pbtxt.intended"
    assert decision.champion_config == intended.read_text()

    # the gate that confirms it must run, and a setting forces the sweep
    off = _decide(settings, challenger, tmp_path, perf_gate_enabled=False)
    assert not off.reuse and "p99 gate is off" in off.why
    forced = _decide(dataclasses.replace(settings, profile_force_sweep=True), challenger, tmp_path)
    assert not forced.reuse and forced.decision == "swept" and "TRITONFLOW_PROFILE_FORCE_SWEEP" in forced.why

    if publish_profile.profiling_unavailable_reason(settings):
        return  # the stage itself reports 'unavailable' first on a host without the Triton tools
    out = publish_profile.profile(challenger, enabled=True, settings=settings)
    prof = out["profile"]
    assert prof["status"] == "reused" and prof["decision"] == "reused"
    assert prof["champion_version"] == champion["version"]
    assert prof["concurrency"] == 1 and prof["confirmed_by"] == "perf_gate" and prof["decision_reason"] == decision.why
    assert Path(out["config_path"]).read_text() == intended.read_text()  # same model name: the same config
    assert "timings_s" in out and out["timings_s"]["profile"] < 60


def test_a_challenger_unlike_its_champion_is_swept_and_the_reason_names_the_difference(settings, tmp_path):
    name = unique("reuse_unlike")
    _champion(settings, name, _logistic(seed=0))
    fewer_inputs = _staged(settings, name, _logistic(seed=2, columns=3), "challenger")
    decision = _decide(settings, fewer_inputs, tmp_path)
    assert not decision.reuse and decision.why.startswith("tensors differ"), decision.why

    bigger = _staged(settings, name, _network(seed=3), "challenger")
    decision = _decide(settings, bigger, tmp_path)
    assert not decision.reuse and "model sizes differ" in decision.why, decision.why
    assert "TRITONFLOW_PROFILE_REUSE_SIZE_FACTOR=1.5" in decision.why
    # a wide enough factor accepts the same model
    wide = dataclasses.replace(settings, profile_reuse_size_factor=10_000.0)
    assert _decide(wide, bigger, tmp_path).reuse


def test_without_a_measured_champion_there_is_nothing_to_reuse(settings, tmp_path):
    name = unique("reuse_none")
    first = _staged(settings, name, _logistic(seed=0), "challenger")
    assert "no champion" in _decide(settings, first, tmp_path).why

    unprofiled = unique("reuse_unmeasured")
    champion = _champion(settings, unprofiled, _logistic(seed=0), profile_status="skipped")
    challenger = _staged(settings, unprofiled, _logistic(seed=1), "challenger")
    decision = _decide(settings, challenger, tmp_path)
    assert not decision.reuse and "was not measured (profile status 'skipped')" in decision.why
    assert "this version is the champion" in _decide(settings, champion, tmp_path).why


def test_size_and_tensor_comparisons_name_both_sides():
    from model_registry.triton_config import parse_config

    assert size_difference(1000, 1400, 1.5) == ""
    assert "2.00x (challenger 2000 B, champion 1000 B)" in size_difference(2000, 1000, 1.5)
    a = parse_config('name: "m"\ninput [{ name: "x" data_type: TYPE_FP32 dims: [4] }]\n'
                     'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]\n')
    b = parse_config('name: "m"\ninput [{ name: "x" data_type: TYPE_FP64 dims: [4] }]\n'
                     'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]\n')
    assert tensor_difference(a, a) == ""
    why = tensor_difference(a, b)
    assert "TYPE_FP32" in why and "TYPE_FP64" in why or "FP32" in why and "FP64" in why
