"""Static checks of tritonflow DAGs, shared by CI tests and the runtime expected-ids check.

Each ``check_*`` function takes parsed DAG objects (``airflow.sdk.DAG``) and returns a list of
human-readable problems (empty when fine), so a test can assert ``== []`` and show every
offender at once.

* :func:`check_execution_timeouts` -- every task has ``execution_timeout`` (a hang
  becomes a failure within minutes).
* :func:`check_trigger_deferrable` -- a ``TriggerDagRunOperator`` sets ``deferrable=True`` only
  together with ``wait_for_completion=True``.
* :func:`check_docs_and_tags`, :func:`check_param_descriptions` -- the UI trigger form and DAG
  list explain themselves.
* :func:`check_trigger_form` -- the trigger form opens without errors and reads like a form
  for people: every param has a title, an empty field is accepted (nullable) or the default is
  valid, an optional choice can be cleared, no refusal quotes a regular expression, each DAG has
  a one-line description.
* :func:`check_doc_for_users` -- ``doc_md`` speaks to users (no module paths or XCom keys).
* :func:`missing_dag_ids` -- expected DAG ids absent from a parse (a DAG over the
  import timeout silently disappears).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

#: DAG ids tritonflow ships (dags/).
EXPECTED_DAG_IDS = (
    "model_publish",
    "drift_monitor",
    "shadow_evaluation",
    "retrain",
    "canary_promotion",
    "canary_rollback",
    "registry_events",
    "champion_sentinel",
)


def check_execution_timeouts(dags: Iterable[Any]) -> list[str]:
    """Tasks without ``execution_timeout``, as ``"dag.task"`` problems."""
    return [
        f"{dag.dag_id}.{task.task_id}: execution_timeout is None: expected a timedelta"
        for dag in dags
        for task in dag.tasks
        if getattr(task, "execution_timeout", None) is None
    ]


def check_xcom_limits(dags: Iterable[Any]) -> list[str]:
    """Python tasks whose return value is not checked against the XCom size limit.

    Every task that returns data passes it through XCom; a bulky value can hang the consumer
    (apache/airflow#48852), so each task callable must be wrapped by
    :func:`tritonflow_plugin.xcom.limit_xcom_size` (found through any other decorator).
    """
    from tritonflow_plugin.xcom import XCOM_LIMITED_ATTR

    return [
        f"{dag.dag_id}.{task.task_id}: return value not checked against the XCom size limit: "
        "expected @limit_xcom_size under @task"
        for dag in dags
        for task in dag.tasks
        if getattr(task, "python_callable", None) is not None
        and not getattr(task.python_callable, XCOM_LIMITED_ATTR, False)
    ]


def check_trigger_deferrable(dags: Iterable[Any]) -> list[str]:
    """TriggerDagRunOperators with ``deferrable=True`` but ``wait_for_completion=False``."""
    problems = []
    for dag in dags:
        for task in dag.tasks:
            if type(task).__name__ != "TriggerDagRunOperator":
                continue
            if getattr(task, "deferrable", False) and not getattr(task, "wait_for_completion", False):
                problems.append(
                    f"{dag.dag_id}.{task.task_id}: deferrable=True with wait_for_completion=False: "
                    "expected deferrable only together with wait_for_completion=True "
                    "(fire-and-forget triggers can stay DEFERRED, apache/airflow#60049)"
                )
    return problems


def check_docs_and_tags(dags: Iterable[Any]) -> list[str]:
    """DAGs without ``doc_md`` or without tags."""
    problems = []
    for dag in dags:
        if not (dag.doc_md or "").strip():
            problems.append(f"{dag.dag_id}: doc_md is empty: expected a description for the UI")
        if not dag.tags:
            problems.append(f"{dag.dag_id}: tags are empty: expected at least one tag")
    return problems


def check_param_descriptions(dags: Iterable[Any]) -> list[str]:
    """DAG ``Param``s without a description."""
    problems = []
    for dag in dags:
        params = dag.params
        for name in params.keys():
            param = params.get_param(name) if hasattr(params, "get_param") else None
            if param is None or not (getattr(param, "description", None) or "").strip():
                problems.append(f"{dag.dag_id}: Param {name!r} has no description: expected one")
    return problems


#: Longest DAG ``description`` (one line in the DAG list).
MAX_DESCRIPTION_CHARS = 120


def _params(dag: Any) -> list[tuple[str, Any]]:
    params = dag.params
    return [(name, params.get_param(name)) for name in params.keys()]


def check_trigger_form(dags: Iterable[Any]) -> list[str]:
    """Params and DAG descriptions that make the Airflow 3 trigger form hard to use.

    Problems reported:

    * a DAG without a one-line ``description`` (at most :data:`MAX_DESCRIPTION_CHARS`);
    * a param without ``title`` (the form would show the raw key);
    * a required param (its type does not allow null) whose default does not validate: the form
      opens in an error state (an empty text field counts as null);
    * an ``enum`` holding ``None`` (the Airflow 3.1 form does not render it) or an optional
      ``enum`` (default empty) that refuses null: a cleared dropdown sends null, so the run is
      refused;
    * a ``pattern``: its refusal quotes the regular expression (use a rule in words,
      :mod:`tritonflow_plugin.params`).
    """
    from jsonschema import FormatChecker, validate
    from jsonschema.exceptions import ValidationError

    problems = []
    for dag in dags:
        description = (getattr(dag, "description", None) or "").strip()
        if not description or "\n" in description or len(description) > MAX_DESCRIPTION_CHARS:
            problems.append(f"{dag.dag_id}: description={description!r}: expected one line of at most "
                            f"{MAX_DESCRIPTION_CHARS} characters")
        for name, param in _params(dag):
            schema = dict(getattr(param, "schema", None) or {})
            where = f"{dag.dag_id}.{name}"
            if not str(schema.get("title") or "").strip():
                problems.append(f"{where}: no title: expected Param(title=...) (the form's label)")
            types = schema.get("type")
            nullable = isinstance(types, list) and "null" in types
            value = getattr(param, "value", None)
            if not nullable:
                try:
                    validate(None if value == "" else value, schema, format_checker=FormatChecker())
                except ValidationError as exc:
                    problems.append(f"{where}: default {value!r} is invalid in the form ({exc.message}): "
                                    "expected a valid default, or type ['null', ...] with default None")
            enum = schema.get("enum")
            if enum is not None and None in enum:
                problems.append(f"{where}: enum holds None: expected no None (use an optional choice)")
            elif enum is not None and value in ("", None):
                problems.append(f"{where}: optional enum {enum}: a cleared dropdown sends null, which the "
                                "enum refuses: expected an optional choice (no enum) or a real default")
            if "pattern" in schema:
                problems.append(f"{where}: pattern {schema['pattern']!r}: a refusal would quote it: expected "
                                "a rule in words (tritonflow_plugin.params.TextRule)")
    return problems


#: What a DAG's ``doc_md`` must not show its readers: module paths, function calls, XCom keys.
DEVELOPER_TERMS = re.compile(r"\b(?:tritonflow|tritonflow_plugin|model_registry|repository_sync|drift_checks|ground)"
                             r"\.\w[\w.]*"
                             r"|\b[a-z_]+\(\)|\w+\([a-z_]+(?:, [a-z_]+)*\)|\bXCom\b|\bconf\.loop\b")


def check_doc_for_users(dags: Iterable[Any]) -> list[str]:
    """``doc_md`` passages written for developers (module paths, calls, XCom), quoted."""
    problems = []
    for dag in dags:
        for match in DEVELOPER_TERMS.finditer(dag.doc_md or ""):
            problems.append(f"{dag.dag_id}: doc_md mentions {match.group(0)!r}: expected words for the "
                            "people who trigger and watch the DAG")
    return problems


def missing_dag_ids(parsed_ids: Iterable[str], expected: Iterable[str] = EXPECTED_DAG_IDS) -> list[str]:
    """Expected DAG ids absent from ``parsed_ids`` (sorted)."""
    return sorted(set(expected) - set(parsed_ids))
