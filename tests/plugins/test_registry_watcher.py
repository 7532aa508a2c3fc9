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
