"""Publish outcomes across paths, on a real MLflow server (and a real Triton where something is served).

* a failure of our tools (Model Analyzer) is an infrastructure error: the version is not rejected;
* a version rejected by one path is never published by a shadow evaluation nor promoted by a canary;
* a new publish of a version replaces its earlier publish-stage rejection tags; a sentinel's or a
  canary's rejection makes ``model_publish`` refuse the version and stays;
* a version published without real data gets no drift reference (never the perturbed input example);
* Model Analyzer profiles from a worker whose environment has nothing of ours (``env -i``);
* a host too busy to measure any config stably keeps the generated config and rejects nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from ground.exceptions import DataError, RegistryError, ToolingError
from tests.conftest import make_settings
from tests.pipelines.test_publish_pipeline import register, unique, version_tags
from tritonflow.pipelines import publish as pipeline
from tritonflow.pipelines import publish_common, publish_profile, publish_record, publish_validate

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def classifier():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from tests.pipelines.test_publish_pipeline import churn_data

    X, y = churn_data(n=200, seed=5)
    return make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), X


@pytest.fixture(scope="module")
def settings(tmp_path_factory, mlflow_server):
    home = tmp_path_factory.mktemp("outcomes_home")
    (home / "repository").mkdir()
    return make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri,
                         repository_uri=str(home / "repository"))


def _reject(settings, name, version, stage="profile", reason="ProfilingError: no stable config"):
    import mlflow

    client = mlflow.MlflowClient(settings.resolved_mlflow_tracking_uri)
    for key, value in {"tritonflow.status": "rejected", "tritonflow.rejected_stage": stage,
                       "tritonflow.rejection_reason": reason,
                       "tritonflow.rejected_at": "2025-03-01T10:00:00+00:00"}.items():
        client.set_model_version_tag(name, str(version), key, value)


def test_model_analyzer_failure_is_an_infrastructure_error_and_never_rejects(settings, classifier, tmp_path,
                                                                             monkeypatch):
    from model_registry.profiling import analyzer
    from tritonflow.runtime.triton_tools import triton_tools

    # the real model-analyzer, given a config it cannot run, exits non-zero: a tool failure
    bad = tmp_path / "profile.yaml"
    bad.write_text("profile_models: {}\nmodel_repository: /nonexistent\n")
    if not analyzer.analyzer_binary(settings).is_file():
        pytest.skip(f"model-analyzer is not installed at {analyzer.analyzer_binary(settings)}")
    with pytest.raises(ToolingError, match="model-analyzer profile failed"):
        analyzer.run_profile(bad, tools=triton_tools(settings), settings=settings, timeout_s=300,
                             log_path=tmp_path / "ma.log")

    model, X = classifier
    name = unique("outcome_tool")
    version = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="challenger")
    state = pipeline.resolve(f"{name}/{version}", settings=settings)
    state = publish_validate.convert_and_validate(state, max_batch_size=8, settings=settings)

    def broken_environment(*args, **kwargs):  # what profile_model raises when its Triton measured nothing
        raise ToolingError("model 'x': Model Analyzer measured no config (its Triton or perf_analyzer failed); "
                           "ModuleNotFoundError: No module named 'numpy'")

    monkeypatch.setattr(publish_profile, "profiling_unavailable_reason", lambda s=None: "")
    monkeypatch.setattr(analyzer, "profile_model", broken_environment)
    with pytest.raises(ToolingError):
        publish_profile.profile(state, enabled=True, settings=settings)
    tags = version_tags(settings.resolved_mlflow_tracking_uri, name, version)
    assert tags.get("tritonflow.status") != "rejected" and "tritonflow.rejected_stage" not in tags


def test_a_rejected_challenger_is_never_published_by_the_shadow_path_nor_promoted(settings, classifier, tmp_path):
    from tritonflow.pipelines import canary, shadow

    model, X = classifier
    name = unique("outcome_rej")
    champion = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="champion")
    challenger = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="challenger")
    _reject(settings, name, challenger)

    # found through the alias: the champion is evaluated alone, and the note says why
    resolved = shadow.resolve_versions(name, settings=settings)
    assert resolved["challenger"] is None
    assert any("rejected at stage profile" in n for n in resolved["notes"])
    # named explicitly: refused, naming the stage and the reason
    with pytest.raises(RegistryError, match="rejected at stage profile.*no stable config"):
        shadow.resolve_versions(name, str(challenger), settings=settings)

    # resolved before the rejection, published after it: the shadow path refuses and publishes nothing
    calls = []
    stale = {"model": name, "champion": {"version": champion},
             "challenger": {"version": challenger, "triton_model_name": name, "triton_model_version": challenger}}
    with pytest.raises(RegistryError, match="never published or promoted"):
        shadow.ensure_challenger_published(stale, settings=settings, publish=lambda *a, **k: calls.append(a))
    assert calls == [] and not (Path(settings.resolved_repository_uri) / name).exists()

    gateway = types.SimpleNamespace(url="http://127.0.0.1:9", conf_dir=tmp_path / "gateway", reload=lambda: None)
    env = canary.CanaryEnvironment.from_settings(settings, gateway=gateway)
    with pytest.raises(DataError, match="never promoted"):
        canary.resolve(name, str(challenger), env=env)


@pytest.mark.parametrize("stage, refused", [("sentinel", True), ("canary", True), ("load_and_smoke", False)])
def test_model_publish_refuses_a_sentinel_or_canary_rejection_and_leaves_it_in_place(settings, classifier, stage,
                                                                                     refused):
    """A republish (by hand, or from a registry event) never lifts a sentinel's or a canary's rejection;
    a publish-stage rejection is for a new publish to replace."""
    model, X = classifier
    name = unique("outcome_lasting")
    version = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="challenger")
    _reject(settings, name, version, stage=stage, reason="health sentinel rolled version back: NaN outputs")
    if refused:
        with pytest.raises(RegistryError, match=f"rejected at stage {stage}.*NaN outputs.*tritonflow.status"):
            pipeline.resolve(f"{name}@challenger", settings=settings)
    else:
        assert pipeline.resolve(f"{name}@challenger", settings=settings)["version"] == version
    tags = version_tags(settings.resolved_mlflow_tracking_uri, name, version)
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == stage


@pytest.mark.parametrize("gate", [True, False])
def test_the_shadow_paths_challenger_publish_follows_the_profile_and_p99_gate_settings(settings, classifier, gate):
    """TRITONFLOW_PUBLISH_PERF_GATE=false turned model_publish's gate off but not the shadow path's, and the
    shadow path never profiled: both settings hold for it as for model_publish."""
    import dataclasses

    from tritonflow.pipelines import shadow

    model, X = classifier
    name = unique("outcome_gate")
    champion = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="champion")
    challenger = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="challenger")
    calls = []
    resolved = {"model": name, "champion": {"version": champion},
                "challenger": {"version": challenger, "triton_model_name": name, "triton_model_version": challenger}}
    with pytest.raises(DataError, match="not in the repository"):  # the stand-in publishes nothing
        shadow.ensure_challenger_published(
            resolved, settings=dataclasses.replace(settings, publish_perf_gate=gate, publish_profile=gate),
            publish=lambda ref, **kw: calls.append((ref, kw)))
    [(ref, kwargs)] = calls
    assert ref == f"{name}/{challenger}" and kwargs["perf_gate_enabled"] is gate and kwargs["profile_enabled"] is gate


def test_a_new_publish_replaces_the_rejection_and_stores_no_reference_without_real_data(
        settings, classifier, triton_factory):
    model, X = classifier
    name = unique("outcome_pub")
    version = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="champion")
    _reject(settings, name, version, stage="load_and_smoke", reason="ModelLoadRefusedError: earlier attempt")
    triton = triton_factory(settings.resolved_repository_uri)
    summary = pipeline.publish(f"{name}/{version}", triton_url=triton.http_url, settings=settings,
                               max_batch_size=8, profile_enabled=False)
    tags = version_tags(settings.resolved_mlflow_tracking_uri, name, version)
    assert tags["tritonflow.status"] == "published"
    assert not [k for k in tags if k.startswith("tritonflow.rejected") or k == "tritonflow.rejection_reason"]
    assert sorted(summary["stale_tags_cleared"]) == sorted(publish_record.REJECTION_TAGS)
    # published from the input example: no drift reference, and the tag says why
    assert tags["tritonflow.reference_uri"] == "" and "without real data" in tags["tritonflow.reference_source"]


#: Profile runs the minimal-environment test makes before it accepts an inconclusive verdict.
PROFILE_ATTEMPTS = 3
#: Seconds one such profile run (a fresh worker process) may take.
PROFILE_ATTEMPT_TIMEOUT_S = 900


@pytest.mark.slow
@pytest.mark.timeout(PROFILE_ATTEMPTS * PROFILE_ATTEMPT_TIMEOUT_S + 300)
def test_profiling_runs_from_a_worker_with_a_minimal_environment(settings, classifier, tmp_path):
    """The profile stage in a process started with ``env -i PATH=/usr/bin:/bin``: only tritonflow's own
    settings are passed; the Triton tools' Python environment comes from the settings, not the worker.

    A loaded shared machine can make every confirmation pass unstable (seen on the 2-core CI host at
    load 30), and then the stage's verdict is ``inconclusive``: the run is repeated, in a fresh
    worker, up to PROFILE_ATTEMPTS times. When every attempt is inconclusive the test asserts that
    verdict in full (reason, generated config kept, nothing rejected) and is reported skipped,
    never passed: it showed the environment but not a profiled choice.
    """
    reason = publish_profile.profiling_unavailable_reason(settings)
    if reason:
        pytest.skip(f"Model Analyzer cannot run here: {reason}")
    model, X = classifier
    name = unique("outcome_envi")
    version = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="challenger")
    state = pipeline.resolve(f"{name}/{version}", settings=settings)
    state = publish_validate.convert_and_validate(state, max_batch_size=8, settings=settings)
    generated = (Path(state["staging_dir"]) / publish_common.CONFIG_FILENAME).read_text()
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(state))
    script = ("import json, sys\n"
              "from tritonflow.pipelines import publish_profile\n"
              "state = json.load(open(sys.argv[1]))\n"
              "out = publish_profile.profile(state, enabled=True)\n"
              "print('PROFILE ' + json.dumps(out['profile']))\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "TRITONFLOW_HOME": str(settings.home),
           "TRITONFLOW_MLFLOW_TRACKING_URI": settings.resolved_mlflow_tracking_uri,
           "TRITONFLOW_ANALYZER_MAX_BATCH_SIZES": "8", "TRITONFLOW_ANALYZER_INSTANCE_COUNTS": "1",
           "TRITONFLOW_ANALYZER_QUEUE_DELAYS_US": "100", "TRITONFLOW_ANALYZER_CONCURRENCY": "1",
           "TRITONFLOW_ANALYZER_MEASUREMENT_MS": "1000", "TRITONFLOW_ANALYZER_STABILITY_CV": "0.5",
           "TRITONFLOW_ANALYZER_TIMEOUT_S": "500"}
    from model_registry.profiling.analyzer import results_path
    from model_registry.profiling.analyzer_results import read_results_csv

    verdicts = []
    for _attempt in range(PROFILE_ATTEMPTS):
        proc = subprocess.run([sys.executable, "-c", script, str(state_path)], env=env, capture_output=True,
                              text=True, timeout=PROFILE_ATTEMPT_TIMEOUT_S, cwd=str(tmp_path))
        # the environment is what is under test: Model Analyzer's Triton loaded the model through the
        # Python backend stub (numpy, onnxruntime imported) and perf_analyzer measured it
        assert "ToolingError" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr, proc.stderr[-5000:]
        export = Path(state["staging_dir"]) / "profile" / "run" / "export"
        assert [r for r in read_results_csv(results_path(export)) if r.throughput > 0], proc.stderr[-5000:]
        lines = [line for line in proc.stdout.splitlines() if line.startswith("PROFILE ")]
        assert proc.returncode == 0 and lines, proc.stderr[-5000:]
        prof = json.loads(lines[-1][len("PROFILE "):])
        assert prof["status"] in ("profiled", "inconclusive"), prof
        if prof["status"] == "profiled":
            break
        # no config is chosen from noise, and the model is not judged by it
        assert "measured stably" in prof["reason"], prof
        assert (Path(state["staging_dir"]) / publish_common.CONFIG_FILENAME).read_text() == generated
        tags = version_tags(settings.resolved_mlflow_tracking_uri, name, version)
        assert tags.get("tritonflow.status") != "rejected" and "tritonflow.rejected_stage" not in tags, tags
        verdicts.append(prof["reason"])
    else:
        pytest.skip(f"profiling from the minimal environment ran, but all {PROFILE_ATTEMPTS} attempts were "
                    f"inconclusive on this host (asserted as such; no profiled choice shown): {verdicts[-1][:300]}")
    assert prof["throughput"] > 0 and prof["best"], prof
    assert os.environ.get("PATH")  # the test process itself is untouched


@pytest.mark.slow
def test_a_host_too_busy_to_measure_keeps_the_generated_config_and_rejects_nothing(settings, classifier):
    """Model Analyzer measures for real; every confirmation pass then reports what perf_analyzer says
    on a busy host ("Failed to obtain stable measurement"). Nothing is chosen from those numbers and
    the model version is not judged by them: the generated config is kept, the profile says why."""
    from model_registry.profiling.perf import PerfPass

    reason = publish_profile.profiling_unavailable_reason(settings)
    if reason:
        pytest.skip(f"Model Analyzer cannot run here: {reason}")
    model, X = classifier
    name = unique("outcome_busy")
    version = register(settings.resolved_mlflow_tracking_uri, name, model, X, alias="challenger")
    state = pipeline.resolve(f"{name}/{version}", settings=settings)
    state = publish_validate.convert_and_validate(state, max_batch_size=8, settings=settings)
    generated = (Path(state["staging_dir"]) / publish_common.CONFIG_FILENAME).read_text()

    def busy_host_passes(configs, concurrency):
        return {c: [PerfPass(c, concurrency, 100.0 * (i + 1), 5.0, stable=False) for i in range(3)]
                for c in configs}

    out = publish_profile.profile(state, enabled=True, settings=settings, pass_runner=busy_host_passes,
                           bounds={"max_batch_sizes": "8", "instance_counts": "1", "queue_delays_us": "100",
                                   "concurrency": "1", "stability_cv": 0.5, "timeout_s": 500})
    assert out["profile"]["status"] == "inconclusive"
    assert "could not obtain a stable measurement" in out["profile"]["reason"]
    assert (Path(state["staging_dir"]) / publish_common.CONFIG_FILENAME).read_text() == generated
    tags = version_tags(settings.resolved_mlflow_tracking_uri, name, version)
    assert tags.get("tritonflow.status") != "rejected" and "tritonflow.rejected_stage" not in tags
