"""Wiring repeated across the DAG files, kept once: the DAG header, data tasks, fire-and-forget triggers.

Every tritonflow DAG is declared with :func:`tritonflow_dag` (start date, no catch-up, the shared
``default_args`` and the ``tritonflow`` tag) and most of its tasks with :func:`data_task` (``@task``
whose callable fails at once on bad data and keeps its XCom under the size limit).

A DAG that starts another DAG and does not wait for it (the loop: ``shadow_evaluation`` ->
``retrain`` -> ``model_publish`` -> ``shadow_evaluation`` -> ``canary_promotion``) uses
:func:`fire_and_forget`. It is a ``TriggerDagRunOperator`` with ``wait_for_completion=False``
and ``deferrable=False``: a deferrable trigger that does not wait can stay DEFERRED forever
(checked by :func:`tritonflow_plugin.dag_integrity.check_trigger_deferrable`), and the short
timeout of :data:`tritonflow_plugin.dag_defaults.TIMEOUTS`. Cheap to import (DAG files use it at
parse time).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import dag, task

from tritonflow_plugin.dag_defaults import DEFAULT_ARGS, START_DATE, TAG, TIMEOUTS
from tritonflow_plugin.errors import fail_fast_on_bad_data, when_lock_held
from tritonflow_plugin.links import task_with_links
from tritonflow_plugin.xcom import limit_xcom_size

#: Arguments every fire-and-forget trigger shares.
FIRE_AND_FORGET: dict[str, Any] = {"wait_for_completion": False, "deferrable": False}


def fire_and_forget(task_id: str, **kwargs: Any) -> TriggerDagRunOperator:
    """A trigger that starts a run of another DAG and does not wait for it.

    Args:
        task_id: The task id.
        **kwargs: ``TriggerDagRunOperator`` arguments (``trigger_dag_id``, ``conf``, ...);
            ``execution_timeout`` defaults to ``TIMEOUTS.short``.

    Returns:
        The operator.
    """
    kwargs.setdefault("execution_timeout", TIMEOUTS.short)
    return TriggerDagRunOperator(task_id=task_id, **FIRE_AND_FORGET, **kwargs)


def fire_and_forget_mapped(task_id: str, **kwargs: Any) -> Any:
    """The partial of :func:`fire_and_forget`, to ``expand_kwargs`` over several target runs.

    Args:
        task_id: The task id.
        **kwargs: Arguments shared by every mapped trigger; ``execution_timeout`` defaults to
            ``TIMEOUTS.short``.

    Returns:
        ``TriggerDagRunOperator.partial(...)``.
    """
    kwargs.setdefault("execution_timeout", TIMEOUTS.short)
    return TriggerDagRunOperator.partial(task_id=task_id, **FIRE_AND_FORGET, **kwargs)


def tritonflow_dag(dag_id: str, *, schedule: Any, topics: Sequence[str], description: str, doc_md: str,
                   params: dict[str, Any], max_active_runs: int = 1, **kwargs: Any) -> Any:
    """``@dag`` with what every tritonflow DAG shares.

    The shared part: ``start_date`` :data:`~tritonflow_plugin.dag_defaults.START_DATE`,
    ``catchup=False``, ``default_args`` :data:`~tritonflow_plugin.dag_defaults.DEFAULT_ARGS`
    (timeouts, retries, the failure notifier, the Connections) and the ``tritonflow`` tag.

    Args:
        dag_id: The DAG id.
        schedule: Airflow's ``schedule`` (an asset, a timetable, a cron string or ``None``).
        topics: Tags after ``tritonflow`` (``["canary"]``), for the UI's tag filter.
        description: One line shown in the DAG list.
        doc_md: The DAG's documentation for users (Markdown).
        params: The trigger form's ``Param`` objects.
        max_active_runs: Runs of the DAG at once (1: runs of one DAG never overlap).
        **kwargs: Any other ``@dag`` argument (``max_active_tasks``,
            ``render_template_as_native_obj``, ...).

    Returns:
        The ``@dag`` decorator.
    """
    return dag(dag_id=dag_id, schedule=schedule, start_date=START_DATE, catchup=False,
               max_active_runs=max_active_runs, default_args=DEFAULT_ARGS, tags=[TAG, *topics],
               description=description, doc_md=doc_md, params=params, **kwargs)


def data_task(*, links: bool = False, when_locked: str | None = None, **task_kwargs: Any) -> Callable[[Any], Any]:
    """``@task`` whose callable fails at once on bad data and keeps its XCom under the limit.

    The stack it stands for, outermost first: ``@task`` (or ``@task_with_links``),
    :func:`~tritonflow_plugin.errors.fail_fast_on_bad_data`, optionally
    :func:`~tritonflow_plugin.errors.when_lock_held`, and
    :func:`~tritonflow_plugin.xcom.limit_xcom_size`.

    Args:
        links: Declare tritonflow's extra links (:func:`tritonflow_plugin.links.task_with_links`).
        when_locked: ``"fail"`` or ``"skip"``: what the task does when another run holds the
            model's lock (:func:`~tritonflow_plugin.errors.when_lock_held`); ``None``: no policy.
        **task_kwargs: ``@task`` arguments (``execution_timeout``, ``outlets``,
            ``map_index_template``, ``trigger_rule``, ...).

    Returns:
        A decorator for the task callable; the result supports ``.partial()``/``.expand()``.

    Raises:
        ValueError: ``when_locked`` is neither ``"fail"``, ``"skip"`` nor ``None`` (at parse time).
    """
    lock_policy = when_lock_held(when_locked) if when_locked is not None else None

    def decorate(func: Any) -> Any:
        wrapped = limit_xcom_size(func)
        if lock_policy is not None:
            wrapped = lock_policy(wrapped)
        wrapped = fail_fast_on_bad_data(wrapped)
        return (task_with_links if links else task)(**task_kwargs)(wrapped)

    return decorate


__all__ = ["FIRE_AND_FORGET", "data_task", "fire_and_forget", "fire_and_forget_mapped", "tritonflow_dag"]
