"""The publish pipeline end to end, on real services: MLflow server, Triton (folder and S3), moto S3.

A scikit-learn classifier is logged and registered in a real MLflow server, resolved by alias,
converted (ZipMap off), parity-gated against the MLflow pyfunc, signed, pushed, verified at the
destination, loaded in Triton's explicit mode and smoke-tested; the MLflow model version carries
the publish record. Nothing is mocked.

Triton is started once per module with the same runtime class the ``triton_factory`` fixture uses
(``tritonflow.runtime.services.TritonServer``): the factory is function-scoped and a Triton start
costs seconds on this machine. The S3 test uses ``triton_factory`` itself, because Triton refuses to
start on an empty S3 prefix, so the push has to happen before the server starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import ParityError, RegistryError, SignatureVerificationError
from tests.conftest import make_settings
from tritonflow.pipelines import publish as pipeline
from tritonflow.pipelines import publish_common, publish_profile, publish_record, publish_signing, publish_validate

pytestmark = pytest.mark.integration

FEATURES = ["tenure_months", "monthly_fee", "support_calls", "discount"]


# ------------------------------------------------------------------------------------ helpers
@contextlib.contextmanager
def _tracking(uri: str):
    import mlflow

    prev = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(prev)


def churn_data(n: int = 300, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Tabular churn-like data: two integer and two float columns, a binary label."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({
        "tenure_months": rng.integers(1, 72, n).astype(np.int64),
        "monthly_fee": rng.uniform(10, 120, n).round(2),
        "support_calls": rng.integers(0, 10, n).astype(np.int64),
        "discount": rng.uniform(0, 0.3, n),
    })
    logit = -0.05 * X.tenure_months + 0.02 * X.monthly_fee + 0.4 * X.support_calls - 3 * X.discount - 1
    y = (logit + rng.normal(scale=0.5, size=n) > 0).astype(np.int64).to_numpy()
    return X, y


def register(tracking_uri: str, name: str, model, X: pd.DataFrame, *, alias: str | None = "champion",
             signature: bool = True) -> int:
    """Log ``model`` (with signature and input example unless ``signature=False``) and register it."""
    import mlflow
    import mlflow.sklearn
    import sklearn
    from mlflow.models import infer_signature

    with _tracking(tracking_uri), mlflow.start_run():
        info = mlflow.sklearn.log_model(
            model, name="model",
            signature=infer_signature(X, model.predict(X)) if signature else None,
            input_example=X.head(5) if signature else None,
            registered_model_name=name, pip_requirements=[f"scikit-learn=={sklearn.__version__}"],
        )
    version = int(info.registered_model_version)
    if alias:
        mlflow.MlflowClient(tracking_uri).set_registered_model_alias(name, alias, str(version))
    return version


def version_tags(tracking_uri: str, name: str, version: int) -> dict[str, str]:
    import mlflow

    return dict(mlflow.MlflowClient(tracking_uri).get_model_version(name, str(version)).tags)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclasses.dataclass
class Stack:
    settings: object
    repo: Path
    triton: object
    tracking_uri: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mlflow_server):
    from tritonflow.runtime.services import TritonServer

    home = tmp_path_factory.mktemp("publish_home")
    repo = home / "model_repository"
    repo.mkdir()
    settings = make_settings(home, mlflow_tracking_uri=mlflow_server.tracking_uri, repository_uri=str(repo))
    triton = TritonServer(make_settings(tmp_path_factory.mktemp("triton")), repository=str(repo)).start()
    yield Stack(settings, repo, triton, mlflow_server.tracking_uri)
    triton.stop()


@pytest.fixture(scope="module")
def classifier():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = churn_data()
    return make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), X


@pytest.fixture(scope="module")
def published(stack, classifier):
    """One classifier registered as ``champion`` and published through every stage (profile off)."""
    model, X = classifier
    name = unique("churn_clf")
    version = register(stack.tracking_uri, name, model, X)
    # the training rows: the validation dataset and the drift reference (an input example is none),
    # with the time each row was logged (no model input: the reference keeps it as its row times)
    dataset = Path(stack.settings.home) / "datasets" / f"{name}.parquet"
    dataset.parent.mkdir(parents=True, exist_ok=True)
    X.assign(timestamp=pd.Timestamp("2026-01-01", tz="UTC") + pd.to_timedelta(np.arange(len(X)), unit="h")
             ).to_parquet(dataset)
    summary = pipeline.publish(f"{name}@champion", triton_url=stack.triton.http_url, settings=stack.settings,
                               max_batch_size=16, profile_enabled=False, dataset_uri=str(dataset))
    return name, version, summary


def control(stack):
    from repository_sync.triton.client import TritonModelControl

    keys = publish_signing.ensure_signing_keys(stack.settings, create=False)
    return TritonModelControl(stack.triton.http_url, repository=str(stack.repo),
                              trusted_keys=str(keys.trusted_dir), load_timeout_s=60)


# ------------------------------------------------------------------------------------ tests
def test_model_reference_accepts_versions_aliases_and_stages_and_names_a_bad_selector():
    assert pipeline.model_reference("churn", 3) == "churn/3"
    assert pipeline.model_reference("churn", "challenger") == "churn@challenger"
    assert pipeline.model_reference("churn", "production") == "churn/Production"
    from ground.exceptions import SettingsError

    with pytest.raises(SettingsError, match="version_or_alias='3x!'"):
        pipeline.model_reference("churn", "3x!")


def test_classifier_resolved_by_alias_is_published_served_and_recorded(stack, classifier, published):
    model, X = classifier
    name, version, summary = published
    assert summary["status"] == "published" and summary["triton_model_version"] == version

    # layout: <model>/<MLflow version>/ with the model, its signed intended config and the signature
    vdir = stack.repo / name / str(version)
    assert sorted(p.name for p in vdir.iterdir()) == ["config.pbtxt.intended", "model.onnx", "model.onnx.sig"]
    from model_registry.triton_config import parse_config

    cfg = parse_config((vdir / "config.pbtxt.intended").read_text())
    outputs = {o.name: o for o in cfg.output}  # plain tensors, never a ZipMap
    assert set(outputs) == {"label", "probabilities"} and list(outputs["probabilities"].dims) == [2]
    assert cfg.max_batch_size == 16

    # Triton serves it like the source model
    with control(stack) as ctl:
        assert ctl.is_ready(name, version)
        rows = X.iloc[:40]
        served = ctl.infer(name, version, {"features": rows.to_numpy(dtype=np.float32)})
    np.testing.assert_allclose(served["probabilities"], model.predict_proba(rows), atol=1e-5)
    assert served["label"].reshape(-1).tolist() == model.predict(rows).tolist()

    # the MLflow model version carries the publish record
    tags = version_tags(stack.tracking_uri, name, version)
    assert tags["tritonflow.status"] == "published"
    assert tags["tritonflow.repository_uri"] == str(stack.repo)
    assert tags["tritonflow.triton_model_name"] == name and tags["tritonflow.triton_model_version"] == str(version)
    assert tags["tritonflow.signature_digest"] == summary["signature_digest"] != ""
    assert tags["tritonflow.signature_key_id"] == summary["key_id"] != ""
    parity = json.loads(tags["tritonflow.parity_errors"])
    assert parity["label"]["label_agreement"] == 1.0 and parity["probabilities"]["max_abs"] <= 1e-5
    assert json.loads(tags["tritonflow.config_summary"])["max_batch_size"] == 16
    assert set(json.loads(tags["tritonflow.timings_s"])) >= set(publish_common.STAGES) | {"total"}
    assert json.loads(tags["tritonflow.profile"])["status"] == "skipped"
    assert any(k.startswith("tritonflow.artifact.publish/parity_report.json") for k in tags)

    # the drift reference sample of this version is stored
    from drift_checks.reference import load_reference

    ref = load_reference(publish_record.reference_root(stack.settings), name, version, with_profile=False)
    assert list(ref.frame.columns) == FEATURES and len(ref.frame) > 0
    assert ref.times is not None and len(ref.times) == len(ref.frame)  # for training_seasonal
    assert tags["tritonflow.reference_uri"] == ref.uri
    # with each input's importance for this version (the drift check's dataset weights)
    assert set(ref.importance) == set(FEATURES) and sum(ref.importance.values()) == pytest.approx(1.0, abs=1e-5)
    assert json.loads(tags["tritonflow.drift_importance"]) == ref.importance
    assert ref.reference_id.startswith(f"v{version}:training:")


def test_signing_key_is_generated_on_first_use_and_never_logged(stack, published, caplog):
    keys = publish_signing.ensure_signing_keys(stack.settings, create=False)
    assert keys.private_key == Path(stack.settings.home) / "keys" / "model_signing.pem"
    assert list(keys.trusted_dir.glob("tritonflow-generated-*.pub"))
    secret = keys.private_key.read_text()
    body = "".join(secret.splitlines()[1:-1])
    with caplog.at_level(logging.DEBUG):
        fresh = make_settings(Path(stack.settings.home).parent / "fresh_home")
        generated = publish_signing.ensure_signing_keys(fresh)
    assert generated.generated and "generated an ECDSA P-256 key pair" in caplog.text
    new_secret = "".join(generated.private_key.read_text().splitlines()[1:-1])
    assert body[:40] not in caplog.text and new_secret[:40] not in caplog.text


def test_rerunning_the_same_publish_is_idempotent(stack, published):
    name, version, first = published
    vdir = stack.repo / name / str(version)
    before = {p.name: sha(p) for p in vdir.iterdir()}
    serving = sha(stack.repo / name / "config.pbtxt")
    again = pipeline.publish(f"{name}/{version}", triton_url=stack.triton.http_url, settings=stack.settings,
                             max_batch_size=16)
    assert again["already_published"] is True and again["config_differs"] is False
    assert again["signature_digest"] == first["signature_digest"]
    assert {p.name: sha(p) for p in vdir.iterdir()} == before  # immutable: not rewritten
    assert sha(stack.repo / name / "config.pbtxt") == serving
    assert [p.name for p in (stack.repo / name).iterdir() if p.name.startswith(".staging")] == []
    with control(stack) as ctl:
        assert ctl.ready_versions(name) == [version]
    assert version_tags(stack.tracking_uri, name, version)["tritonflow.status"] == "published"


def test_tampered_artifact_at_the_destination_refuses_the_load_and_rejects_the_version(stack, classifier):
    model, X = classifier
    name = unique("churn_tamper")
    version = register(stack.tracking_uri, name, model, X, alias="challenger")
    s = stack.settings
    state = pipeline.resolve(f"{name}@challenger", settings=s)
    state = publish_validate.convert_and_validate(state, max_batch_size=8, settings=s)
    state = publish_profile.profile(state, enabled=False, settings=s)
    state = publish_signing.sign_and_push(state, settings=s)
    loaded = pipeline.load_and_smoke(state, triton_url=stack.triton.http_url, settings=s)
    assert loaded["load"]["versions"] == [version]

    # someone swaps the served config of the READY version at the destination
    intended = stack.repo / name / str(version) / "config.pbtxt.intended"
    intended.write_text(intended.read_text().replace("max_batch_size: 8", "max_batch_size: 64"))
    with pytest.raises(SignatureVerificationError, match="modified file\\(s\\): config.pbtxt.intended"):
        pipeline.load_and_smoke(state, triton_url=stack.triton.http_url, settings=s)
    with control(stack) as ctl:
        assert not ctl.is_ready(name, version)  # the tampered version does not stay loaded
    tags = version_tags(stack.tracking_uri, name, version)
    assert tags["tritonflow.status"] == "rejected"
    assert tags["tritonflow.rejected_stage"] == "load_and_smoke"
    assert "config.pbtxt.intended" in tags["tritonflow.rejection_reason"]


def test_converted_outputs_that_differ_fail_the_parity_gate_and_nothing_is_pushed(stack, tmp_path):
    """A timestamp feature (~1.7e9 s) loses its last 7 bits in float32, the ONNX input type: the
    converted model's probabilities and labels differ from the float64 source model."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    n = 200
    X = pd.DataFrame({"event_time_s": 1.7e9 + np.arange(n, dtype=np.float64),
                      "amount": np.random.default_rng(1).normal(size=n)})
    y = (np.arange(n) >= n // 2).astype(np.int64)
    model = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    name = unique("events_clf")
    version = register(stack.tracking_uri, name, model, X)
    dataset = tmp_path / "validation.csv"
    X.assign(label=y).to_csv(dataset, index=False)

    state = pipeline.resolve(f"{name}@champion", settings=stack.settings)
    with pytest.raises(ParityError) as err:
        publish_validate.convert_and_validate(state, dataset_uri=str(dataset), settings=stack.settings)
    message = str(err.value)
    assert f"model {name!r}" in message and "output 'probabilities'" in message
    assert "max abs error" in message and "worst rows" in message
    assert not (stack.repo / name).exists()  # nothing pushed
    report = json.loads((Path(state["staging_dir"]) / publish_common.PARITY_REPORT_FILENAME).read_text())
    assert report["passed"] is False and report["outputs"]["probabilities"]["max_abs_error"] > 1e-3
    tags = version_tags(stack.tracking_uri, name, version)
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "convert_and_validate"
    assert "ParityError" in tags["tritonflow.rejection_reason"]


def test_model_logged_without_signature_is_refused_with_a_clear_error_and_nothing_is_pushed(stack, classifier):
    model, X = classifier
    name = unique("churn_nosig")
    version = register(stack.tracking_uri, name, model, X, signature=False)
    state = pipeline.resolve(f"{name}/{version}", settings=stack.settings)
    with pytest.raises(RegistryError, match="logged without a signature"):
        publish_validate.convert_and_validate(state, settings=stack.settings)
    assert not (stack.repo / name).exists()
    assert version_tags(stack.tracking_uri, name, version)["tritonflow.status"] == "rejected"


def test_bad_parameters_are_refused_before_anything_runs(stack, published):
    from ground.exceptions import SettingsError

    name, version, _ = published
    state = pipeline.resolve(f"{name}/{version}", settings=stack.settings)
    with pytest.raises(SettingsError, match="atol=-1"):
        publish_validate.convert_and_validate(state, atol=-1, settings=stack.settings)
    with pytest.raises(SettingsError, match="max_batch_size=5000"):
        publish_validate.convert_and_validate(state, max_batch_size=5000, settings=stack.settings)
    assert version_tags(stack.tracking_uri, name, version)["tritonflow.status"] == "published"


def test_publish_to_an_s3_repository_is_served_from_s3(tmp_path, mlflow_server, s3_server, triton_factory, classifier):
    import boto3

    model, X = classifier
    bucket = f"tf-publish-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    url = f"s3://{s3_server.endpoint_url}/{bucket}/triton"
    settings = make_settings(tmp_path / "home", mlflow_tracking_uri=mlflow_server.tracking_uri, repository_uri=url)
    name = unique("churn_s3")
    version = register(mlflow_server.tracking_uri, name, model, X)

    state = pipeline.resolve(f"{name}@champion", settings=settings)
    state = publish_validate.convert_and_validate(state, max_batch_size=8, settings=settings)
    state = publish_profile.profile(state, enabled=False, settings=settings)
    state = publish_signing.sign_and_push(state, settings=settings)
    keys = {o["Key"] for o in boto3.client("s3", endpoint_url=s3_server.endpoint_url)
            .list_objects_v2(Bucket=bucket)["Contents"]}
    assert {f"triton/{name}/{version}/model.onnx", f"triton/{name}/{version}/model.onnx.sig",
            f"triton/{name}/{version}/config.pbtxt.intended", f"triton/{name}/config.pbtxt"} <= keys

    triton = triton_factory(url)  # Triton refuses an empty S3 prefix: start it after the first push
    state = pipeline.load_and_smoke(state, triton_url=triton.http_url, settings=settings)
    summary = publish_record.record(state, settings=settings)
    assert state["smoke"]["rows_sent"] > 0 and state["load"]["versions"] == [version]
    tags = version_tags(mlflow_server.tracking_uri, name, version)
    assert tags["tritonflow.status"] == "published" and tags["tritonflow.repository_uri"] == summary["repository_uri"]
    assert summary["repository_uri"].startswith("s3://http://127.0.0.1:")
