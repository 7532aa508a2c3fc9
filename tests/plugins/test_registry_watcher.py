"""Registry watcher against a real MLflow server: diff, dedup, restart safety, event trigger."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tritonflow_plugin.event_mapping import (
    ALIAS_DELETED,
    ALIAS_SET,
    STAGE_CHANGED,
    TAG_SET,
    VERSION_CREATED,
    load_mapping,
)
from tritonflow_plugin.registry_watcher import (
    RegistryEventTrigger,
    SeenStateStore,
    diff_facts,
    poll_once,
    take_snapshot,
)

#: The mapping the registry_events DAG's watcher uses (every change -> registry_events).
WATCH_ALL = Path(__file__).resolve().parents[2] / "dags" / "registry_events_watch_all.json"


@pytest.fixture()
def registry(mlflow_tracking_uri):
    client = MlflowClient(tracking_uri=mlflow_tracking_uri, registry_uri=mlflow_tracking_uri)
    name = f"churn_{uuid.uuid4().hex[:8]}"
    client.create_registered_model(name)
    return client, name


def _new_version(client, name):
    return client.create_model_version(name, source=f"s3://tritonflow-tests/{name}/model", run_id=None).version


def _kinds(changes):
    return [(c.kind, c.version, c.alias or c.stage) for c in changes]


def test_first_poll_is_a_baseline_then_each_transition_is_reported_once(registry, tmp_path):
    client, name = registry
    v1 = _new_version(client, name)
    store = SeenStateStore(tmp_path / "state.sqlite")
    assert store.advance("canary_promotion", take_snapshot(client, [name])) == []

    v2 = _new_version(client, name)
    client.set_registered_model_alias(name, "challenger", v2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client.transition_model_version_stage(name, v1, "Production")
    changes = store.advance("canary_promotion", take_snapshot(client, [name]))
    assert _kinds(changes) == [
        (VERSION_CREATED, v2, None), (STAGE_CHANGED, v1, "Production"), (ALIAS_SET, v2, "challenger"),
    ]
    assert all(c.model == name and c.source == "watcher" for c in changes)
    # same registry state: nothing again, also from a restarted watcher (new store object)
    assert store.advance("canary_promotion", take_snapshot(client, [name])) == []
    assert SeenStateStore(tmp_path / "state.sqlite").advance(
        "canary_promotion", take_snapshot(client, [name])) == []


def test_alias_move_is_set_and_alias_removal_is_deleted(registry, tmp_path):
    client, name = registry
    v1, v2 = _new_version(client, name), _new_version(client, name)
    client.set_registered_model_alias(name, "champion", v1)
    store = SeenStateStore(tmp_path / "state.sqlite")
    store.advance("c", take_snapshot(client, [name]))
    client.set_registered_model_alias(name, "champion", v2)
    assert _kinds(store.advance("c", take_snapshot(client, [name]))) == [(ALIAS_SET, v2, "champion")]
    client.delete_registered_model_alias(name, "champion")
    assert _kinds(store.advance("c", take_snapshot(client, [name]))) == [(ALIAS_DELETED, v2, "champion")]
    # moving the alias back to v1 is a new transition and is reported
    client.set_registered_model_alias(name, "champion", v1)
    assert _kinds(store.advance("c", take_snapshot(client, [name]))) == [(ALIAS_SET, v1, "champion")]


def test_consumers_keep_separate_state(registry, tmp_path):
    client, name = registry
    store = SeenStateStore(tmp_path / "state.sqlite")
    store.advance("model_publish", take_snapshot(client, [name]))
    store.advance("canary_rollback", take_snapshot(client, [name]))
    v = _new_version(client, name)
    assert _kinds(store.advance("model_publish", take_snapshot(client, [name]))) == [(VERSION_CREATED, v, None)]
    assert _kinds(store.advance("canary_rollback", take_snapshot(client, [name]))) == [(VERSION_CREATED, v, None)]


def test_poll_once_returns_only_the_consumers_dag_runs(registry, tmp_path):
    client, name = registry
    store = SeenStateStore(tmp_path / "state.sqlite")
    rules = load_mapping("")
    assert poll_once(client, store, "canary_promotion", rules, [name]) == []
    v = _new_version(client, name)
    client.set_registered_model_alias(name, "champion", v)
    (conf,) = poll_once(client, store, "canary_promotion", rules, [name])
    assert conf["model_name"] == name and conf["model_version"] == v and conf["alias"] == "champion"
    assert poll_once(client, store, "canary_promotion", rules, [name]) == []


def test_event_trigger_fires_once_per_mapped_transition(registry, tmp_path, mlflow_tracking_uri):
    client, name = registry
    kwargs = dict(dag_id="canary_promotion", tracking_uri=mlflow_tracking_uri, models=[name],
                  poll_interval_s=0.01, state_path=str(tmp_path / "state.sqlite"), mapping_path="",
                  max_polls=1)

    async def collect(trigger):
        return [ev async for ev in trigger.run()]

    assert asyncio.run(collect(RegistryEventTrigger(**kwargs))) == []  # baseline
    v = _new_version(client, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client.transition_model_version_stage(name, v, "Production")
    classpath, restored = RegistryEventTrigger(**kwargs).serialize()
    assert classpath.endswith("registry_watcher.RegistryEventTrigger")
    events = asyncio.run(collect(RegistryEventTrigger(**restored)))
    assert [e.payload["registry_event"]["stage"] for e in events] == ["Production"]
    assert asyncio.run(collect(RegistryEventTrigger(**restored))) == []


def test_a_batching_trigger_yields_one_event_per_poll_with_every_change(registry, tmp_path, mlflow_tracking_uri):
    """registry_events batches: Airflow would split events written together across runs."""
    from tritonflow_plugin.registry_watcher import BATCH_KEY

    client, name = registry
    kwargs = dict(dag_id="registry_events", tracking_uri=mlflow_tracking_uri, models=[name],
                  poll_interval_s=0.01, state_path=str(tmp_path / "state.sqlite"),
                  mapping_path=str(WATCH_ALL), max_polls=1, batch=True)

    async def collect(trigger):
        return [ev async for ev in trigger.run()]

    assert asyncio.run(collect(RegistryEventTrigger(**kwargs))) == []  # baseline: no empty event
    v = _new_version(client, name)
    client.set_registered_model_alias(name, "canary", v)
    _classpath, restored = RegistryEventTrigger(**kwargs).serialize()
    assert restored["batch"] is True
    [event] = asyncio.run(collect(RegistryEventTrigger(**restored)))
    changes = [(c["registry_event"]["kind"], c["registry_event"]["alias"]) for c in event.payload[BATCH_KEY]]
    assert changes == [(VERSION_CREATED, None), (ALIAS_SET, "canary")]
    assert asyncio.run(collect(RegistryEventTrigger(**restored))) == []  # nothing new: no event


#: The tag keys a mapping with a ``tag_set`` rule on ``validation_status`` has the reconciler read.
WATCHED = frozenset({"validation_status"})


def _advance(store, client, name, tag_keys):
    """One reconciler poll of consumer ``c`` reading ``tag_keys``, as ``poll_once`` makes it."""
    return store.advance("c", take_snapshot(client, [name], tag_keys), tag_keys)


def _tags(changes):
    return [(c.kind, c.version, c.tag_key, c.tag_value) for c in changes]


def test_a_mapped_tag_set_changed_and_set_back_is_reported_each_time_and_other_tags_never(registry, tmp_path):
    client, name = registry
    v1 = _new_version(client, name)
    store = SeenStateStore(tmp_path / "state.sqlite")
    assert _advance(store, client, name, WATCHED) == []
    client.set_model_version_tag(name, v1, "validation_status", "passed")
    client.set_model_version_tag(name, v1, "owner", "alice")  # a tag no rule names
    assert _tags(_advance(store, client, name, WATCHED)) == [
        (TAG_SET, v1, "validation_status", "passed")]
    assert _advance(store, client, name, WATCHED) == []
    for value in ("failed", "passed"):
        client.set_model_version_tag(name, v1, "validation_status", value)
        assert _tags(_advance(store, client, name, WATCHED)) == [
            (TAG_SET, v1, "validation_status", value)]
    # a mapping with a tag_set rule that names no key has every tag read
    assert _advance(store, client, name, None) == []  # newly read keys: a baseline
    client.set_model_version_tag(name, v1, "owner", "bob")
    assert _tags(_advance(store, client, name, None)) == [(TAG_SET, v1, "owner", "bob")]


def test_the_trigger_reads_the_tags_of_the_event_mapping_and_starts_each_mapped_tag_change_once(
        registry, tmp_path, mlflow_tracking_uri, monkeypatch):
    import json

    client, name = registry
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps({"rules": [{"on": "tag_set", "tag_key": "validation_status",
                                              "tag_value": "passed", "dags": ["model_publish"]}]}))
    monkeypatch.setenv("TRITONFLOW_EVENT_MAPPING_PATH", str(mapping))
    v = _new_version(client, name)
    kwargs = dict(dag_id="registry_events", tracking_uri=mlflow_tracking_uri, models=[name],
                  poll_interval_s=0.01, state_path=str(tmp_path / "state.sqlite"),
                  mapping_path=str(WATCH_ALL), max_polls=1, batch=True)

    async def collect():
        return [ev async for ev in RegistryEventTrigger(**kwargs).run()]

    assert asyncio.run(collect()) == []  # baseline
    client.set_model_version_tag(name, v, "validation_status", "passed")
    client.set_model_version_tag(name, v, "owner", "alice")
    [event] = asyncio.run(collect())
    from tritonflow_plugin.registry_watcher import BATCH_KEY

    assert [(c["registry_event"]["kind"], c["registry_event"]["tag_key"], c["registry_event"]["tag_value"])
            for c in event.payload[BATCH_KEY]] == [(TAG_SET, "validation_status", "passed")]
    assert asyncio.run(collect()) == []


def _tagged_champion(client, name: str) -> str:
    """A new version of ``name`` holding ``champion`` and tag ``validation_status=passed``."""
    version = _new_version(client, name)
    client.set_registered_model_alias(name, "champion", version)
    client.set_model_version_tag(name, version, "validation_status", "passed")
    return version


def test_a_model_deleted_and_created_again_between_two_polls_has_its_new_version_1_reported(registry, tmp_path):
    """MLflow numbers the new model's versions from 1 again; the same facts by number are new facts."""
    client, name = registry
    old = _tagged_champion(client, name)
    store = SeenStateStore(tmp_path / "state.sqlite")
    assert _advance(store, client, name, WATCHED) == []
    client.delete_registered_model(name)
    client.create_registered_model(name)
    new = _tagged_champion(client, name)
    assert new == old

    changes = _advance(store, client, name, WATCHED)
    assert [(c.kind, c.version, c.alias or c.tag_key) for c in changes] == [
        (VERSION_CREATED, new, None), (TAG_SET, new, "validation_status"), (ALIAS_SET, new, "champion")]
    created = client.get_model_version(name, new).creation_timestamp
    assert {c.version_created_ms for c in changes} == {created}
    assert _advance(store, client, name, WATCHED) == []


def test_a_state_stored_before_versions_were_told_apart_goes_on_without_reporting_them_again(registry, tmp_path):
    """Seen facts stored by an earlier tritonflow (versions by number, no tags): no storm after the upgrade."""
    client, name = registry
    v1 = _tagged_champion(client, name)
    store = SeenStateStore(tmp_path / "state.sqlite")
    store.store.set_state(SeenStateStore.SCOPE, "c", {"baseline_at": 1.0, "facts": [
        [name, v1, "alias", "champion"], [name, v1, "stage", "None"], [name, v1, "version", ""]]})
    v2 = _new_version(client, name)

    assert _kinds(_advance(store, client, name, WATCHED)) == [(VERSION_CREATED, v2, None)]
    client.set_model_version_tag(name, v1, "validation_status", "failed")
    assert _tags(_advance(store, client, name, WATCHED)) == [
        (TAG_SET, v1, "validation_status", "failed")]


def test_diff_of_identical_fact_sets_is_empty():
    facts = {("m", "1", "version", ""), ("m", "1", "alias", "champion")}
    assert diff_facts(facts, set(facts)) == []


def _event(extra):
    import types

    return types.SimpleNamespace(extra=extra, timestamp="t")


def test_a_run_that_consumed_several_registry_changes_fails_naming_them_instead_of_acting_on_one():
    """Airflow folds queued asset events into one run; acting on the last would drop the others."""
    from ground.exceptions import DataError
    from tritonflow_plugin.registry_watcher import registry_conf_from_context

    v4 = {"model_name": "churn", "model_version": "4", "registry_event": {"kind": "version_created", "version": "4"}}
    v5 = {"model_name": "churn", "model_version": "5", "registry_event": {"kind": "version_created", "version": "5"}}
    folded = {"dag_run": None, "triggering_asset_events": {"asset": [_event(v4), _event({"payload": v5})]}}
    with pytest.raises(DataError, match='hold 2 registry changes.*"version": "4".*"version": "5"'):
        registry_conf_from_context(folded)
    # The same change delivered twice, or one change, is one change; a conf wins over events.
    assert registry_conf_from_context({"triggering_asset_events": {"a": [_event(v4), _event(v4)]}}) == v4
    assert registry_conf_from_context({**folded, "dag_run": type("R", (), {"conf": v5})()}) == v5
    assert registry_conf_from_context({"triggering_asset_events": {}}) == {}


def test_a_change_its_consumer_has_not_confirmed_is_sent_again_after_the_grace_period_and_then_no_more(
        registry, tmp_path, mlflow_tracking_uri, monkeypatch):
    """registry_events confirms its changes: one whose event Airflow left for a later run comes again."""
    import time

    from tritonflow_plugin.change_ledger import ChangeLedger
    from tritonflow_plugin.registry_watcher import BATCH_KEY

    client, name = registry
    monkeypatch.setenv("TRITONFLOW_REGISTRY_RESEND_AFTER_S", "1")
    _classpath, kwargs = RegistryEventTrigger(
        dag_id="registry_events", tracking_uri=mlflow_tracking_uri, models=[name], poll_interval_s=0.01,
        state_path=str(tmp_path / "state.sqlite"), mapping_path=str(WATCH_ALL), max_polls=1, batch=True,
        await_confirmation=True).serialize()
    assert kwargs["await_confirmation"] is True

    def sent() -> list[str]:
        async def collect():
            return [ev async for ev in RegistryEventTrigger(**kwargs).run()]

        return [c["registry_event"]["change_key"] for ev in asyncio.run(collect()) for c in ev.payload[BATCH_KEY]]

    assert sent() == []  # baseline
    _new_version(client, name)
    (key,) = sent()
    assert sent() == []  # within the grace period: its run may still be on its way
    time.sleep(1.1)
    assert sent() == [key]  # still not confirmed: the same change again
    ChangeLedger(tmp_path / "state.sqlite").mark_started(key, ["registry__version_created__x"])
    time.sleep(1.1)
    assert sent() == []
