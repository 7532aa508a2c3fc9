"""Wiring repeated across the DAG files, kept once: fire-and-forget triggers.

A DAG that starts another DAG and does not wait for it (the loop: ``shadow_evaluation`` ->
``retrain`` -> ``model_publish`` -> ``shadow_evaluation`` -> ``canary_promotion``) uses
:func:`fire_and_forget`. It is a ``TriggerDagRunOperator`` with ``wait_for_completion=False``
and ``deferrable=False``: a deferrable trigger that does not wait can stay DEFERRED forever
(checked by :func:`tritonflow_plugin.dag_integrity.check_trigger_deferrable`), and the short
timeout of :data:`tritonflow_plugin.dag_defaults.TIMEOUTS`. Cheap to import (DAG files use it at
parse time).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

from tritonflow_plugin.dag_defaults import TIMEOUTS

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


__all__ = ["FIRE_AND_FORGET", "fire_and_forget", "fire_and_forget_mapped"]
