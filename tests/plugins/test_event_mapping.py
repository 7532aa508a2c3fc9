"""Registry change -> DAG mapping: defaults, file loading, validation errors naming the key."""

from __future__ import annotations

import json

import pytest

from ground.exceptions import SettingsError
from tritonflow_plugin.event_mapping import (
    ALIAS_DELETED,
    ALIAS_SET,
    STAGE_CHANGED,
    TAG_SET,
    VERSION_CREATED,
    RegistryChange,
    actions_for,
    load_mapping,
    mapped_dag_ids,
)


def _dags(change, rules):
    return [(a.dag_id, a.then) for a in actions_for(change, rules)]


def test_default_mapping_routes_registry_changes_to_product_dags(monkeypatch):
    monkeypatch.delenv("TRITONFLOW_EVENT_MAPPING_PATH", raising=False)
    rules = load_mapping()
    new = RegistryChange(kind=VERSION_CREATED, model="churn", version="3")
    assert _dags(new, rules) == [("model_publish", ("shadow_evaluation",))]
    challenger = RegistryChange(kind=ALIAS_SET, model="churn", version="3", alias="challenger")
    assert _dags(challenger, rules) == [("model_publish", ("shadow_evaluation",))]
    champion = RegistryChange(kind=ALIAS_SET, model="churn", version="3", alias="champion")
    assert _dags(champion, rules) == [("canary_promotion", ())]
    prod = RegistryChange(kind=STAGE_CHANGED, model="churn", version="3", stage="Production")
    assert _dags(prod, rules) == [("canary_promotion", ())]
    archived = RegistryChange(kind=STAGE_CHANGED, model="churn", version="2", stage="Archived")
    assert _dags(archived, rules) == [("canary_rollback", ())]
    deleted = RegistryChange(kind=ALIAS_DELETED, model="churn", alias="champion")
    assert _dags(deleted, rules) == [("canary_rollback", ())]
    other_alias = RegistryChange(kind=ALIAS_SET, model="churn", version="3", alias="nightly")
    assert _dags(other_alias, rules) == []
    assert mapped_dag_ids(rules) <= {
        "model_publish", "shadow_evaluation", "canary_promotion", "canary_rollback"
    }


def test_action_conf_carries_the_event_for_the_dag_run():
    rules = load_mapping("")
    (action,) = actions_for(RegistryChange(kind=VERSION_CREATED, model="churn", version="7"), rules)
    assert action.conf["model_name"] == "churn" and action.conf["model_version"] == "7"
    assert action.conf["registry_event"]["kind"] == VERSION_CREATED
    assert action.conf["then"] == ["shadow_evaluation"]
    json.dumps(action.conf)


def test_mapping_file_in_yaml_replaces_the_default(tmp_path, monkeypatch):
    path = tmp_path / "mapping.yaml"
    path.write_text(
        "rules:\n"
        "  - on: tag_set\n    model: 'churn*'\n    tag_key: validation_status\n"
        "    tag_value: passed\n    dags: [model_publish]\n"
    )
    monkeypatch.setenv("TRITONFLOW_EVENT_MAPPING_PATH", str(path))
    rules = load_mapping()
    hit = RegistryChange(kind=TAG_SET, model="churn_v2", version="1", tag_key="validation_status",
                         tag_value="passed")
    assert _dags(hit, rules) == [("model_publish", ())]
    assert _dags(RegistryChange(kind=TAG_SET, model="fraud", version="1", tag_key="validation_status",
                                tag_value="passed"), rules) == []
    assert _dags(RegistryChange(kind=VERSION_CREATED, model="churn", version="2"), rules) == []


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"rules": [{"on": "stage_moved", "dags": ["x"]}]}, "rules[0].on"),
        ({"rules": [{"on": "alias_set", "dags": []}]}, "rules[0].dags"),
        ({"rules": [{"on": "version_created"}]}, "rules[0].dags"),
        ({"rules": [{"on": "version_created", "dags": ["a"], "stage": "Production"}]}, "rules[0].stage"),
        ({"rules": [{"on": "alias_set", "dags": ["a"], "alias": 3}]}, "rules[0].alias"),
        ({"rules": [{"on": "alias_set", "dags": ["a"], "when": "x"}]}, "rules[0]"),
        ({"rulez": []}, "rulez"),
    ],
)
def test_invalid_mapping_error_names_the_key(tmp_path, doc, key):
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SettingsError) as err:
        load_mapping(path)
    assert key in str(err.value) and str(path) in str(err.value)


def test_missing_mapping_file_is_refused(tmp_path):
    with pytest.raises(SettingsError, match="TRITONFLOW_EVENT_MAPPING_PATH"):
        load_mapping(tmp_path / "nope.yaml")
