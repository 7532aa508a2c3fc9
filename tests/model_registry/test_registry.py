"""Registry client against a real MLflow tracking server."""

from __future__ import annotations

import json
import threading
import warnings

import numpy as np
import pytest
import requests

from ground.exceptions import ConcurrencyError, RegistryError
from model_registry.registry import (
    ACCEPTED_FORMS,
    DatabaseLock,
    ModelVersionRef,
    PublishRecord,
    RegistryClient,
    parse_model_reference,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry(registry_tracking_uri) -> RegistryClient:
    return RegistryClient(tracking_uri=registry_tracking_uri, lock_timeout_s=30)


@pytest.fixture(scope="module")
def raw(registry_tracking_uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=registry_tracking_uri)


def _run_concurrently(*calls):
    """Run callables in threads released together; returns [(result | exception)] in order."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def body(i, fn):
        barrier.wait()
        try:
            results[i] = fn()
        except Exception as exc:  # noqa: BLE001 - collected for assertions
            results[i] = exc

    threads = [threading.Thread(target=body, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


# ------------------------------------------------------------------------------ reference parsing
@pytest.mark.parametrize(
    "text, name, version, alias, stage",
    [
        ("models:/churn@champion", "churn", None, "champion", None),
        ("models:/churn/7", "churn", 7, None, None),
        ("churn@challenger", "churn", None, "challenger", None),
        ("churn/12", "churn", 12, None, None),
        ("models:/churn/Production", "churn", None, None, "Production"),
        ("churn/staging", "churn", None, None, "Staging"),
    ],
)
def test_every_accepted_reference_form_parses_to_name_and_one_selector(text, name, version, alias, stage):
    ref = parse_model_reference(text)
    assert (ref.name, ref.version, ref.alias, ref.stage) == (name, version, alias, stage)


@pytest.mark.parametrize(
    "text", ["", "models:/churn", "churn", "runs:/abc/model", "s3://bucket/model", "churn@", "@champion",
             "churn/latest", "churn/0", "churn/Foo", "models:/a/b/c", "churn@v3", "churn@bad alias"],
)
def test_bad_reference_is_refused_naming_the_uri_and_the_accepted_forms(text):
    with pytest.raises(RegistryError) as err:
        parse_model_reference(text)
    assert repr(text) in str(err.value)
    for form in ACCEPTED_FORMS:
        assert form in str(err.value)


# ------------------------------------------------------------------------------ reading
def test_version_alias_and_stage_references_resolve_to_the_same_model_version(registry, raw, register_versions,
                                                                             logged_sklearn_model):
    name = register_versions(2)
    raw.set_registered_model_alias(name, "challenger", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        raw.transition_model_version_stage(name, "2", "Staging")

    by_version = registry.resolve(f"models:/{name}/2")
    assert isinstance(by_version, ModelVersionRef)
    assert by_version.version == 2 and isinstance(by_version.version, int)
    assert by_version.run_id == logged_sklearn_model["run_id"]
    assert by_version.aliases == ("challenger",)
    assert by_version.stage == "Staging"
    assert by_version.status == "READY"
    assert by_version.uri == f"models:/{name}/2"
    for text in (f"{name}/2", f"models:/{name}@challenger", f"{name}@challenger", f"models:/{name}/Staging"):
        assert registry.resolve(text).version == 2, text
    assert registry.resolve(f"{name}/1").version == 1
    assert ModelVersionRef.from_dict(json.loads(json.dumps(by_version.to_dict()))) == by_version


def test_unknown_version_and_unset_alias_give_errors_naming_them(registry, register_versions):
    name = register_versions(1)
    with pytest.raises(RegistryError, match=rf"'{name}' has no version 5"):
        registry.resolve(f"{name}/5")
    with pytest.raises(RegistryError, match=r"no alias 'champion'"):
        registry.resolve(f"{name}@champion")
    with pytest.raises(RegistryError, match="does not exist"):
        registry.resolve("no-such-model-xyz@champion")


def test_model_io_reads_signature_names_dtypes_shapes_and_the_input_example(registry, register_versions,
                                                                            logged_sklearn_model):
    name = register_versions(1)
    io = registry.model_io(f"models:/{name}/1")
    assert io.has_signature
    assert io.input_kind == "columns"
    assert io.input_names == ("temp", "pressure")
    assert [t.dtype for t in io.inputs] == ["float64", "float64"]
    assert [t.shape for t in io.inputs] == [(-1,), (-1,)]
    assert io.output_kind == "tensors"
    assert io.outputs[0].dtype == "float64" and io.outputs[0].shape == (-1, 2)
    expected = logged_sklearn_model["X"].head(3)
    assert list(io.input_example.columns) == ["temp", "pressure"]
    np.testing.assert_allclose(io.input_example.to_numpy(), expected.to_numpy())


def test_model_logged_without_signature_is_refused_unless_the_caller_brings_a_schema(
        registry, registry_tracking_uri, raw, logged_sklearn_model):
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(registry_tracking_uri)
    try:
        with mlflow.start_run():
            info = mlflow.sklearn.log_model(logged_sklearn_model["model"], name="nosig",
                                            pip_requirements=["scikit-learn"])
    finally:
        mlflow.set_tracking_uri(previous)
    name = f"nosig-{info.model_id[-8:]}"
    raw.create_registered_model(name)
    raw.create_model_version(name, source=info.model_uri, model_id=info.model_id)
    with pytest.raises(RegistryError, match=r"without a signature.*infer_signature"):
        registry.model_io(f"{name}/1")
    io = registry.model_io(f"{name}/1", require_signature=False)
    assert not io.has_signature and io.inputs == ()


# ------------------------------------------------------------------------------ writing back
def test_record_publish_writes_every_field_as_tritonflow_tags_on_the_version(registry, raw, register_versions):
    name = register_versions(1)
    ref = registry.resolve(f"{name}/1")
    record = PublishRecord(
        repository_uri="s3://http://127.0.0.1:9000/models/prod",
        triton_model_name="churn_onnx",
        triton_model_version=4,
        signature_digest="sha256:" + "ab" * 32,
        signature_key_id="key-2026-01",
        parity_errors={"probabilities": {"max_abs": 1.5e-7, "max_rel": 3e-6}},
        config_summary={"max_batch_size": 64, "instance_count": 2, "kind": "KIND_CPU"},
        timings_s={"convert": 1.25, "push": 0.5},
    )
    registry.record_publish(ref, record)
    tags = raw.get_model_version(name, "1").tags
    assert tags["tritonflow.repository_uri"] == record.repository_uri
    assert tags["tritonflow.triton_model_name"] == "churn_onnx"
    assert tags["tritonflow.triton_model_version"] == "4"
    assert tags["tritonflow.signature_digest"] == record.signature_digest
    assert tags["tritonflow.signature_key_id"] == "key-2026-01"
    assert json.loads(tags["tritonflow.parity_errors"]) == {"probabilities": {"max_abs": 1.5e-7, "max_rel": 3e-6}}
    assert json.loads(tags["tritonflow.config_summary"])["instance_count"] == 2
    assert json.loads(tags["tritonflow.timings_s"]) == {"convert": 1.25, "push": 0.5}
    assert tags["tritonflow.status"] == "published" and tags["tritonflow.published_at"]


def test_the_version_description_says_in_sentences_what_the_tags_say_and_drops_a_stale_outcome(
        registry, raw, register_versions):
    name = register_versions(1)
    ref = registry.resolve(f"{name}/1")
    registry.record_rejection(ref, "ProfilingError: no stable config\nTraceback ...", "profile")
    text = raw.get_model_version(name, "1").description
    assert text.startswith("**Rejected**")
    assert "at stage `profile`: ProfilingError: no stable config" in text and "Traceback" not in text
    registry.record_publish(ref, PublishRecord(
        "/srv/models", "churn_onnx", 4, "sha256:" + "ab" * 32, "key-2026-01",
        parity_errors={"probabilities": {"max_abs": 1.5e-7}, "label": {"max_abs": 0.0}},
        config_summary={"max_batch_size": 32, "backend": "onnxruntime",
                        "instance_groups": [{"kind": "KIND_CPU", "count": 2}],
                        "dynamic_batching": {"max_queue_delay_us": 500}},
    ))
    text = raw.get_model_version(name, "1").description
    assert text.startswith("**Published, not serving**")
    assert "Triton model `churn_onnx` version 4 in `/srv/models`" in text
    assert "max abs difference 1.5e-07 over `probabilities`" in text
    assert "Config: 2 CPU instances, max batch 32, dynamic batching 500 us (onnxruntime)." in text
    assert "Signed by key `key-2026-01`" in text
    assert "Rejected" not in text


def test_record_publish_refuses_an_empty_field_naming_it(registry, register_versions):
    ref = registry.resolve(f"{register_versions(1)}/1")
    with pytest.raises(RegistryError, match=r"PublishRecord.signature_key_id is empty"):
        registry.record_publish(ref, PublishRecord("/repo", "m", 1, "sha256:00", " "))


def test_artifact_is_logged_against_the_version_and_the_version_is_tagged_with_its_uri(
        registry, raw, register_versions, tmp_path, registry_tracking_uri):
    import mlflow

    name = register_versions(1)
    ref = registry.resolve(f"{name}/1")
    report = tmp_path / "analyzer_results.csv"
    report.write_text("config,throughput\nc1,120.5\n")
    uri = registry.log_version_artifact(ref, report, "model_analyzer")
    tags = raw.get_model_version(name, "1").tags
    assert tags["tritonflow.artifact.model_analyzer/analyzer_results.csv"] == uri
    run_id = tags["tritonflow.publish_run_id"]
    assert raw.get_run(run_id).data.tags["tritonflow.model_version"] == "1"
    fetched = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp_path / "dl"),
                                                  tracking_uri=registry_tracking_uri)
    assert open(fetched).read() == report.read_text()
    second = tmp_path / "chosen_config.pbtxt"
    second.write_text('name: "m"\n')
    registry.log_version_artifact(ref, second)
    assert raw.get_model_version(name, "1").tags["tritonflow.publish_run_id"] == run_id  # same run reused


# ------------------------------------------------------------------------------ promotion
def test_promotion_moves_champion_and_keeps_previous_champion(registry, raw, register_versions):
    name = register_versions(3)
    first = registry.promote(name, 1)
    assert first.changed and first.previous_champion is None
    registry.promote(name, 2)
    result = registry.promote(name, "3")
    assert (result.champion, result.previous_champion) == (3, 2)
    assert raw.get_registered_model(name).aliases == {"champion": "3", "previous_champion": "2"}
    again = registry.promote(name, 3)
    assert not again.changed
    outcomes = [e.outcome for e in registry.audit_log(name)]
    assert outcomes == ["promoted", "promoted", "promoted", "unchanged"]
    assert raw.get_model_version(name, "3").tags["tritonflow.replaced_version"] == "2"


def test_promoting_a_missing_version_is_refused_and_audited(registry, register_versions):
    name = register_versions(1)
    with pytest.raises(RegistryError, match="has no version 9"):
        registry.promote(name, 9)
    (entry,) = registry.audit_log(name)
    assert entry.outcome == "refused" and entry.record["requested_version"] == 9


def test_two_concurrent_promotions_are_serialised_one_champion_and_both_attempts_audited(
        registry_tracking_uri, raw, register_versions, tmp_path):
    """Without the lock both would read champion=1 and both set previous_champion=1."""
    client = RegistryClient(tracking_uri=registry_tracking_uri, lock_timeout_s=60,
                            lock=DatabaseLock(f"sqlite:///{tmp_path / 'coordination.db'}"))
    name = register_versions(3)
    client.promote(name, 1)
    results = _run_concurrently(lambda: client.promote(name, 2), lambda: client.promote(name, 3))
    assert not any(isinstance(r, Exception) for r in results), results
    aliases = raw.get_registered_model(name).aliases
    winner = int(aliases["champion"])
    assert winner in (2, 3)
    assert int(aliases["previous_champion"]) == 5 - winner  # the other one, not version 1
    assert [v for v in (1, 2, 3) if "champion" in raw.get_model_version(name, str(v)).aliases] == [winner]
    log = client.audit_log(name)
    assert sorted(e.record["requested_version"] for e in log[1:]) == [2, 3]
    assert [e.outcome for e in log] == ["promoted"] * 3


def test_concurrent_promotions_with_compare_and_set_let_one_win_and_refuse_the_other(
        registry, raw, register_versions):
    name = register_versions(3)
    registry.promote(name, 1)
    results = _run_concurrently(lambda: registry.promote(name, 2, expected_champion=1),
                                lambda: registry.promote(name, 3, expected_champion=1))
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], ConcurrencyError)
    winner = next(r for r in results if not isinstance(r, Exception)).champion
    assert f"champion is version {winner}, not the expected version 1" in str(errors[0])
    assert raw.get_registered_model(name).aliases == {"champion": str(winner), "previous_champion": "1"}
    outcomes = sorted(e.outcome for e in registry.audit_log(name)[1:])
    assert outcomes == ["conflict", "promoted"]


def test_promotion_waiting_on_a_held_lock_fails_naming_the_holder_and_is_audited(
        registry_tracking_uri, raw, register_versions, tmp_path):
    lock = DatabaseLock(f"sqlite:///{tmp_path / 'coordination.db'}")
    client = RegistryClient(tracking_uri=registry_tracking_uri, lock_timeout_s=0.5, lock=lock)
    name = register_versions(2)
    client.promote(name, 1)
    with lock.store().hold(DatabaseLock.PURPOSE, name, holder="canary_promotion/run_7"):
        with pytest.raises(ConcurrencyError, match=r"model .* held by 'canary_promotion/run_7' .*since"):
            client.promote(name, 2)
    assert raw.get_registered_model(name).aliases == {"champion": "1"}
    assert [e.outcome for e in client.audit_log(name)] == ["promoted", "lock_timeout"]


def test_stage_promotion_archives_the_old_version_so_exactly_one_is_in_production(
        registry, raw, register_versions):
    name = register_versions(3)
    registry.promote(name, 1, use_stages=True)
    _run_concurrently(lambda: registry.promote(name, 2, use_stages=True),
                      lambda: registry.promote(name, 3, use_stages=True))
    stages = {v.version: v.current_stage for v in raw.search_model_versions(f"name='{name}'")}
    assert sorted(stages.values()) == ["Archived", "Archived", "Production"]
    champion = raw.get_registered_model(name).aliases["champion"]
    assert stages[champion] == "Production"
    assert registry.check_production_consistency(name).version == int(champion)


def test_consistency_check_fails_loudly_on_two_or_zero_production_versions(registry, raw, register_versions):
    name = register_versions(3)
    with pytest.raises(RegistryError, match=r"exactly one version in stage 'Production', found 0"):
        registry.check_production_consistency(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        raw.transition_model_version_stage(name, "2", "Production")  # MLflow's default: no archiving
        raw.transition_model_version_stage(name, "3", "Production")
    with pytest.raises(RegistryError, match=r"found 2 \(versions: 2, 3\)"):
        registry.check_production_consistency(name)
    with pytest.raises(RegistryError, match=r"found 2"):
        registry.resolve(f"models:/{name}/Production")  # never "pick the latest one"


# ------------------------------------------------------------------------------ rollback
def test_rollback_target_is_the_previous_champion_and_rollback_moves_champion_back(registry, raw,
                                                                                    register_versions):
    name = register_versions(3)
    registry.promote(name, 1)
    registry.promote(name, 2)
    assert registry.rollback_target(name).version == 1
    result = registry.rollback(name)
    assert result.champion == 1
    assert raw.get_registered_model(name).aliases == {"champion": "1"}
    assert raw.get_model_version(name, "2").tags["tritonflow.rolled_back_to"] == "1"
    with pytest.raises(RegistryError, match="'previous_champion' is not set"):
        registry.rollback_target(name)  # a second rollback does not re-promote version 2


def test_rollback_to_an_explicit_version_needs_a_published_signed_one_and_names_an_unsigned_one(
        registry, raw, register_versions):
    name = register_versions(4)
    for v in ("1", "2"):
        raw.set_model_version_tag(name, v, "tritonflow.signature_digest", f"sha256:{v * 8}")
        raw.set_model_version_tag(name, v, "tritonflow.status", "published")
    raw.set_model_version_tag(name, "2", "tritonflow.status", "rejected")
    raw.set_model_version_tag(name, "2", "tritonflow.rejected_stage", "sentinel")
    registry.promote(name, 3)
    registry.promote(name, 4)  # champion=4, previous_champion=3 (unsigned)
    with pytest.raises(RegistryError, match=r"version 3 refused: the version is not published and signed.*\[1, 2\]"):
        registry.rollback(name, version=3, reason="bad")
    with pytest.raises(RegistryError, match="version 9"):
        registry.rollback_target(name, 9)
    rows = {r["version"]: r for r in registry.signed_versions(name)}
    assert sorted(rows) == [1, 2] and rows[2]["rejected_stage"] == "sentinel" and rows[1]["rejected_stage"] is None
    result = registry.rollback(name, version=1, reason="v4 drifts; v1 is the last good one")
    assert result.champion == 1
    assert raw.get_registered_model(name).aliases == {"champion": "1"}  # previous_champion cleared
    assert raw.get_model_version(name, "4").tags["tritonflow.rolled_back_to"] == "1"
    with pytest.raises(RegistryError, match="already is the champion"):
        registry.rollback(name, version=1, reason="again")


def test_rollback_stops_naming_alias_and_version_when_the_previous_champion_was_deleted(
        registry, raw, register_versions, registry_tracking_uri):
    name = register_versions(3)
    registry.promote(name, 1)
    registry.promote(name, 2)
    # A cleanup job outside tritonflow deletes version 1 through REST (version sent as a string).
    requests.delete(f"{registry_tracking_uri}/api/2.0/mlflow/model-versions/delete",
                    json={"name": name, "version": "1"}, timeout=30).raise_for_status()
    with pytest.raises(RegistryError) as err:
        registry.rollback_target(name)
    message = str(err.value)
    assert "'previous_champion'" in message and "version 1" in message
    assert "not falling back" in message.lower()
    with pytest.raises(RegistryError, match="'previous_champion'"):
        registry.rollback(name)
    assert raw.get_registered_model(name).aliases["champion"] == "2"  # nothing moved to "latest" (3)
    assert registry.audit_log(name)[-1].outcome == "refused"


def test_cleanup_never_deletes_an_aliased_or_deployed_version(registry, raw, register_versions):
    name = register_versions(5)
    registry.promote(name, 1)
    registry.promote(name, 2)  # champion=2, previous_champion=1
    plan = registry.plan_garbage_collection(name, deployed_versions={"3"}, keep_latest=1)
    assert plan.delete == (4,)
    assert "previous_champion" in plan.keep[1] and "'champion'" in plan.keep[2]
    assert "deployed" in plan.keep[3] and "newest" in plan.keep[5]
    for version, why in [(1, "previous_champion"), (2, "champion"), (3, "deployed")]:
        with pytest.raises(RegistryError, match=rf"refusing to delete model '{name}' version {version}.*{why}"):
            registry.safe_delete_version(name, version, deployed_versions={3})
    assert registry.apply_garbage_collection(plan, deployed_versions={3}) == [4]
    assert sorted(int(v.version) for v in raw.search_model_versions(f"name='{name}'")) == [1, 2, 3, 5]
    assert registry.rollback_target(name).version == 1
