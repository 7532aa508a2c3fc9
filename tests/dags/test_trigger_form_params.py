"""The trigger form of every DAG in dags/, as the Airflow API server sees it (no browser).

Each DAG is serialized and deserialized the way the API server loads it, and submitted confs are
validated with the server-side params (``SerializedParamsDict``), which is what decides between a
created run and HTTP 400. Guards: a form that opens in an error state (an empty required field),
an optional choice that cannot be cleared (the form sends null), refusals that quote regular
expressions, unknown conf keys used silently, params without titles, DAGs without a one-line
description, and ``doc_md`` written for developers.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.plugins import airflow_env
from tritonflow_plugin.dag_integrity import EXPECTED_DAG_IDS, check_doc_for_users, check_trigger_form

DAGS = airflow_env.REPO / "dags"


@pytest.fixture(scope="module")
def bag():
    from airflow.dag_processing.dagbag import DagBag

    parsed = DagBag(dag_folder=str(DAGS), safe_mode=False)
    assert parsed.import_errors == {}
    assert set(EXPECTED_DAG_IDS) <= set(parsed.dags)
    return parsed


@pytest.fixture(scope="module")
def served(bag):
    """dag_id -> the DAG as the API server holds it (serialized to JSON and back)."""
    from airflow.serialization.serialized_objects import DagSerialization

    return {dag_id: DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag))))
            for dag_id, dag in bag.dags.items()}


def _submit(served_dag, conf: dict):
    """Validate ``conf`` like a trigger request: the params' defaults merged with it."""
    return served_dag.params.deep_merge(conf).validate()


def _refusal(served_dag, conf: dict) -> str:
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError) as err:
        _submit(served_dag, conf)
    return str(err.value)


def test_every_dag_form_has_titles_one_line_descriptions_and_valid_defaults(bag):
    assert check_trigger_form(bag.dags.values()) == []


def test_every_dag_doc_speaks_to_users(bag):
    assert check_doc_for_users(bag.dags.values()) == []


def test_the_form_checks_catch_an_unusable_form():
    """The checks above can fail: a stand-in DAG with each fault is reported for each."""
    from airflow.sdk import DAG, Param

    bad = DAG("bad_form", schedule=None, description="line one\nline two", params={
        "model": Param("", type="string", title="Model", description="required, empty"),
        "stage": Param("", type="string", enum=["", "Production"], title="Stage", description="optional"),
        "strategy": Param(None, type=["null", "string"], enum=[None, "training"], title="S", description="d"),
        "version": Param("1", type="string", pattern=r"^[0-9]+$", description="no title"),
    }, doc_md="Calls `tritonflow.pipelines.publish.resolve()` and pushes an XCom.")
    problems = check_trigger_form([bad])
    for expected in ("bad_form: description=", "bad_form.model: default ''", "bad_form.stage: optional enum",
                     "bad_form.strategy: enum holds None", "bad_form.version: no title", "bad_form.version: pattern"):
        assert any(p.startswith(expected) for p in problems), (expected, problems)
    assert len(check_doc_for_users([bad])) >= 2


def test_every_form_submits_untouched_except_the_required_model(served):
    """The form's defaults are a valid run; only a model has to be typed where one is needed."""
    for dag_id, dag in served.items():
        values = _submit(dag, {})
        assert set(values) == set(dag.params), dag_id


@pytest.mark.parametrize("dag_id, param", [("registry_events", "stage"),
                                           ("drift_monitor", "reference_strategy")])
def test_a_cleared_optional_choice_submits_null_and_is_accepted(served, dag_id, param):
    dag = served[dag_id]
    schema = dag.params.get_param(param).schema
    assert "enum" not in schema and schema.get("examples"), schema  # choices offered, no null enum
    assert _submit(dag, {param: None})[param] is None
    assert _submit(dag, {param: schema["examples"][0]})[param] == schema["examples"][0]
    message = _refusal(dag, {param: "Prod"})
    assert "one of " + ", ".join(schema["examples"]) in message


@pytest.mark.parametrize("dag_id, param, value, words", [
    ("model_publish", "version_or_alias", "3; drop", "version number (e.g. 3) or alias"),
    ("model_publish", "model", "churn model!", "model name (letters, digits"),
    ("registry_events", "model_version", "v3", "version number (digits"),
    ("registry_events", "alias", "my alias", "alias name (letters"),
])
def test_a_refused_value_is_explained_in_words_not_a_regex(served, dag_id, param, value, words):
    message = _refusal(served[dag_id], {param: value})
    assert f"Invalid input for param {param}" in message and words in message, message
    assert "pattern" not in message and "^" not in message and "[0-9]" not in message, message


def test_model_publish_opens_with_an_empty_version_meaning_champion_else_latest(served):
    dag = served["model_publish"]
    assert dag.params.get_param("version_or_alias").value is None
    assert dag.params.get_param("model").value is None
    assert _submit(dag, {"model": "churn"})["version_or_alias"] is None
    assert "latest version" in dag.params.get_param("version_or_alias").description


@pytest.mark.parametrize("dag_id", EXPECTED_DAG_IDS)
def test_an_unknown_conf_key_is_refused_naming_the_closest_param(bag, dag_id):
    from ground.exceptions import SettingsError
    from tritonflow_plugin.params import refuse_unknown_conf_keys

    dag = bag.dags[dag_id]
    name = next(iter(dag.params))
    typo = name + name[-1]  # a doubled last letter, e.g. 'modell'
    context = {"dag": dag, "dag_run": SimpleNamespace(dag_id=dag_id, conf={typo: "x"})}
    with pytest.raises(SettingsError, match=f"'{typo}' is not a parameter of DAG '{dag_id}' "
                                            rf"\(did you mean '{name}'\?\)"):
        refuse_unknown_conf_keys(context)
    refuse_unknown_conf_keys({"dag": dag, "dag_run": SimpleNamespace(dag_id=dag_id, conf={name: None})})


def test_model_publish_refuses_the_typo_verison():
    from ground.exceptions import SettingsError
    from tritonflow.pipelines.loop_context import check_conf_keys

    with pytest.raises(SettingsError, match=r"'verison'.*did you mean 'version_or_alias'"):
        check_conf_keys({"model": "churn", "verison": "3"}, ["model", "version_or_alias"], "model_publish")


@pytest.mark.parametrize("dag_id", EXPECTED_DAG_IDS)
def test_every_dag_checks_its_conf_keys_when_a_run_starts(dag_id):
    """The first task of every DAG refuses unknown keys (directly, or through the loop context)."""
    source = (DAGS / f"{dag_id}.py").read_text()
    assert "refuse_unknown_conf_keys(" in source or "loop_context(context)" in source, dag_id


def test_the_canary_shows_one_grid_box_per_traffic_step(bag):
    dag = bag.dags["canary_promotion"]
    step = dag.get_task("canary_step")
    assert type(step).__name__.endswith("MappedOperator")
    assert step.trigger_rule == "all_done" and "canary" in step.upstream_task_ids
    assert "traffic_steps" in step.upstream_task_ids
    assert step.partial_kwargs.get("map_index_template") == "{{ task.op_kwargs['percent'] }} %"  # e.g. "25 %"


def test_every_rule_a_dag_uses_is_known_to_a_process_that_only_loads_the_plugin(bag):
    """The API server validates triggers without importing DAG files: importing the plugin
    package (as its plugin entry does) must register every format the DAGs' params use."""
    import subprocess
    import sys

    formats = sorted({dag.params.get_param(name).schema["format"] for dag in bag.dags.values()
                      for name in dag.params if "format" in dag.params.get_param(name).schema})
    assert len(formats) >= 5, formats
    code = ("import json, sys, jsonschema, tritonflow_plugin\n"
            "from tritonflow_plugin.params import VERSION_OR_ALIAS as R\n"
            "c = jsonschema.FormatChecker()\n"
            "assert not c.conforms('3; drop', R.words) and c.conforms('3', R.words) and c.conforms(None, R.words)\n"
            "print(json.dumps(sorted(set(json.loads(sys.argv[1])) - set(c.checkers))))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(formats)], env=airflow_env.subprocess_env(),
                          cwd=str(Path(__file__).resolve().parents[2]), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [], "formats unknown to the API server"


def test_a_rule_the_api_server_would_not_know_is_refused_when_the_dag_is_written():
    from tritonflow_plugin.params import TextRule, choice_rule, optional_choice, text

    with pytest.raises(ValueError, match="not listed in tritonflow_plugin.params.RULES"):
        text("Colour", "A colour.", rule=TextRule("colour name", "[a-z]+"))
    with pytest.raises(ValueError, match="not a choice rule listed"):
        optional_choice("Colour", "A colour.", choice_rule(["red", "blue"]))
