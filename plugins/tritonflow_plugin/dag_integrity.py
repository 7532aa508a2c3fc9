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
* :func:`missing_dag_ids` -- expected DAG ids absent from a parse (a DAG over the
  import timeout silently disappears).
"""

from __future__ import annotations

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


def missing_dag_ids(parsed_ids: Iterable[str], expected: Iterable[str] = EXPECTED_DAG_IDS) -> list[str]:
    """Expected DAG ids absent from ``parsed_ids`` (sorted)."""
    return sorted(set(expected) - set(parsed_ids))
