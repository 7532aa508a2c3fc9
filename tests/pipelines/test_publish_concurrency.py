"""Two publishes of one model version at once: one does the work, the other returns its record.

In the full replay on the real deployment, ``model_publish`` and ``shadow_evaluation``'s own
publish of the same challenger ran at the same time in one staging folder and clobbered each
other (conversion wipes the folder, profiling rewrites it); later each got its own folder but both
converted and profiled. Now the first claims the version in the coordination database
(:mod:`tritonflow.pipelines.publish_claim`) and the second waits and joins. Here two publishes of
one version overlap in threads of this process, ordered by events so the overlap does not depend on
timing. Real MLflow server, real conversion, signing, push and (for the full publish) Triton;
profiling is off here (the processes and the profile are in ``test_publish_once.py``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from model_registry.registry.client import pinned_mlflow_uris
from tests.conftest import make_settings
from tests.pipelines.test_publish_pipeline import churn_data, register, unique
from tritonflow.pipelines import publish as pipeline
from tritonflow.pipelines import publish_common, publish_profile, publish_signing, publish_validate

BARRIER_TIMEOUT_S = 300


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


_pinned_mlflow = pinned_mlflow_uris  # restores MLflow's globals and its environment variables


def _run_both(work, n: int = 2) -> list:
    """Run ``work(i)`` in ``n`` threads; the results in order, or the first error re-raised."""
    results: list = [None] * n
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads)
    return results


def _model():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = churn_data()
    return make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), X


def _verify_in_repository(settings, repo: Path, name: str, version: int) -> str:
    """The version's folder verifies against the trusted keys; returns its signature digest."""
    from repository_sync.layout import plan_version
    from repository_sync.signing import verify_version

    vdir = repo / name / str(version)
    assert sorted(p.name for p in vdir.iterdir()) == ["config.pbtxt.intended", "model.onnx", "model.onnx.sig"]
    assert [p.name for p in (repo / name).iterdir() if p.name.startswith(".staging")] == []
    keys = publish_signing.ensure_signing_keys(settings, create=False)
    layout = plan_version(name, version, "model.onnx")
    return verify_version(vdir, str(keys.trusted_dir), signature_file=layout.signature_filename).signature_digest


# ------------------------------------------------------------------------------- no services
def test_each_attempt_gets_its_own_folder_under_the_version(tmp_path):
    settings = make_settings(tmp_path / "home")
    a, b = publish_common.new_attempt(), publish_common.new_attempt()
    assert a != b
    da, db = (publish_common.staging_dir(settings, "churn", 3, t) for t in (a, b))
    assert da != db and da.parent == db.parent == Path(settings.home) / "staging" / "churn" / "3"
    for bad in ("", "..", "x/y"):
        with pytest.raises(ValueError, match="attempt="):
            publish_common.staging_dir(settings, "churn", 3, bad)


def test_ending_a_publish_removes_its_folder_only_and_the_sweep_spares_running_attempts(tmp_path):
    settings = make_settings(tmp_path / "home")
    mine, other = ({"staging_dir": str(publish_common.staging_dir(settings, "churn", 3, publish_common.new_attempt()))}
                   for _ in range(2))
    for state in (mine, other):
        (publish_common.enter_staging(state) / "model.onnx").write_bytes(b"x")
    assert publish_common.remove_staging(mine) is True
    assert not Path(mine["staging_dir"]).exists() and (Path(other["staging_dir"]) / "model.onnx").is_file()
    assert publish_common.remove_staging(mine) is False  # already gone: nothing to do, no error

    # an abandoned attempt (old marker), a file of the layout before attempts, and a running attempt
    # whose folder is old but whose marker was touched when its current stage started
    version_dir = Path(settings.home) / "staging" / "churn" / "3"
    old = time.time() - publish_common.STAGING_MAX_AGE_S - 60
    abandoned = publish_common.enter_staging({"staging_dir": str(version_dir / "20250101T000000Z-abandoned")})
    os.utime(abandoned / publish_common.STAGING_MARKER, (old, old))
    legacy = version_dir / "model.onnx"
    legacy.write_bytes(b"old layout")
    os.utime(legacy, (old, old))
    running = Path(other["staging_dir"])
    os.utime(running, (old, old))
    removed = publish_common.sweep_staging(settings)
    assert sorted(removed) == sorted([str(abandoned), str(legacy)])
    assert (running / "model.onnx").is_file()

    # once the last attempt is old too, its folder and the emptied version/model folders go
    os.utime(running / publish_common.STAGING_MARKER, (old, old))
    assert publish_common.sweep_staging(settings, now=time.time() + 10) == [str(running)]
    for folder in (version_dir, version_dir.parent):
        os.utime(folder, (old, old))
    publish_common.sweep_staging(settings)
    assert list((Path(settings.home) / "staging").iterdir()) == []


# ------------------------------------------------------------------------------- real services
def _wait_until(predicate, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.integration
def test_a_second_publish_of_a_version_being_published_waits_and_returns_the_first_ones_record(
        tmp_path, mlflow_server):
    """Two publishes of one version overlap (as two DAG runs' tasks do): the first converts and holds
    the version; the second's conversion waits for it instead of converting again, and once the first
    has pushed and recorded, the second returns that record. One folder, one push, one record."""
    from tritonflow.pipelines import publish_record
    from tritonflow.pipelines.publish_claim import JOINED_KEY, read_claim

    home = tmp_path / "home"
    repo = home / "model_repository"
    repo.mkdir(parents=True)
    settings = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri, repository_uri=str(repo))
    model, X = _model()
    name = unique("churn_twice")
    version = register(mlflow_server.tracking_uri, name, model, X, alias="challenger")
    converted, second_waits = threading.Event(), threading.Event()
    folders: list[str] = []

    def one_publish(i: int) -> dict:
        if i == 1:
            assert converted.wait(BARRIER_TIMEOUT_S)  # the first holds the version now
        state = pipeline.resolve(f"{name}/{version}", settings=settings)
        if i == 1:
            second_waits.set()
        state = publish_validate.convert_and_validate(state, max_batch_size=8, settings=settings)
        if state.get(JOINED_KEY):
            assert not Path(state["staging_dir"]).exists()  # nothing converted here
        else:
            folders.append(state["staging_dir"])
            converted.set()
            assert second_waits.wait(BARRIER_TIMEOUT_S)
            time.sleep(1.0)  # the second is in its conversion, waiting
        state = publish_profile.profile(state, enabled=False, settings=settings)
        state = publish_signing.sign_and_push(state, settings=settings)
        return publish_record.record(state, settings=settings)

    with _pinned_mlflow(mlflow_server.tracking_uri):
        first, second = _run_both(one_publish)
    assert len(folders) == 1 and first["already_published"] is False
    assert second == {**first, "joined_attempt": read_claim(settings, name, version)["attempt"]}
    assert first["signature_digest"] == _verify_in_repository(settings, repo, name, version)
    assert _sha(repo / name / str(version) / "model.onnx") == _sha(Path(folders[0]) / "model.onnx")
    assert read_claim(settings, name, version)["status"] == "published"
    publish_common.remove_staging({"staging_dir": folders[0]})


@pytest.mark.integration
def test_model_publish_and_the_shadow_publish_of_one_challenger_at_once_publish_it_once(
        tmp_path, mlflow_server, triton_factory, monkeypatch):
    """``model_publish`` (all stages, here in one process) and ``shadow_evaluation``'s
    :func:`ensure_challenger_published` publish the same challenger at once: the shadow publish
    starts while the other is converting. One conversion; both end published with the same record,
    the version is in the repository once, signed, READY, and no staging folder is left."""
    from repository_sync.triton.client import TritonModelControl
    from tritonflow.pipelines.shadow import ensure_challenger_published

    home = tmp_path / "home"
    repo = home / "model_repository"
    repo.mkdir(parents=True)
    settings = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri, repository_uri=str(repo),
                             publish_perf_gate=False, publish_profile=False)
    triton = triton_factory(str(repo))
    model, X = _model()
    name = unique("churn_race")
    version = register(mlflow_server.tracking_uri, name, model, X, alias="challenger")
    from model_registry import gate

    converting = threading.Event()
    conversions: list[str] = []
    real_convert = gate.validate_model

    def observed_convert(model_uri, *args, **kwargs):  # the real conversion and parity gate, counted
        converting.set()
        conversions.append(model_uri)
        return real_convert(model_uri, *args, **kwargs)

    monkeypatch.setattr(gate, "validate_model", observed_convert)
    resolved = {"model": name, "challenger": {"version": version, "triton_model_name": name,
                                              "triton_model_version": version}}

    def work(i: int) -> dict:
        if i == 0:
            return pipeline.publish(f"{name}/{version}", triton_url=triton.http_url, settings=settings,
                                    max_batch_size=8, perf_gate_enabled=False)
        assert converting.wait(BARRIER_TIMEOUT_S)
        return ensure_challenger_published(
            resolved, settings=settings,
            publish=lambda ref, **kw: pipeline.publish(ref, triton_url=triton.http_url, max_batch_size=8, **kw))

    with _pinned_mlflow(mlflow_server.tracking_uri):
        direct, shadow = _run_both(work)
    assert len(conversions) == 1  # one conversion
    assert direct["status"] == "published" and shadow["action"] == "published"
    assert shadow["publish"] == {**direct, "joined_attempt": shadow["publish"]["joined_attempt"]}
    assert direct["signature_digest"] == _verify_in_repository(settings, repo, name, version)
    with TritonModelControl(triton.http_url) as ctl:
        assert ctl.ready_versions(name) == [version]
    assert not (Path(settings.home) / "staging" / name / str(version)).exists() or not any(
        (Path(settings.home) / "staging" / name / str(version)).iterdir())


@pytest.mark.integration
def test_two_writers_of_the_same_new_version_tags_at_once_both_succeed(mlflow_server):
    """Both publishes write the same new ``tritonflow.*`` tags; MLflow's store inserts a new tag, so
    the second insert of a pair hits the unique key. The write is repeated as the update it is."""
    from model_registry.registry import RegistryClient

    model, X = _model()
    name = unique("churn_tags")
    version = register(mlflow_server.tracking_uri, name, model, X, alias=None)
    tags = {f"tritonflow.race.k{i}": f"v{i}" for i in range(40)}
    start = threading.Barrier(2, timeout=BARRIER_TIMEOUT_S)

    def write(i: int) -> dict:
        reg = RegistryClient(tracking_uri=mlflow_server.tracking_uri, registry_uri=mlflow_server.tracking_uri)
        ref = reg.get_version(name, version)
        start.wait()
        return reg.set_version_tags(ref, tags)

    assert _run_both(write) == [tags, tags]
    from tests.pipelines.test_publish_pipeline import version_tags

    assert {k: v for k, v in version_tags(mlflow_server.tracking_uri, name, version).items() if k in tags} == tags
