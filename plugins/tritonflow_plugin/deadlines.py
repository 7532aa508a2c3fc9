"""Deadline alerts of the canary, rollback and publish runs (Airflow 3's ``DeadlineAlert``).

:func:`run_deadline` gives a DAG the alert of its kind: it fires when a run has not ended
:func:`tritonflow.pipelines.run_deadlines.expected_run` seconds after it was queued, computed from
the settings the DAG file is parsed with (the environment only: no I/O), and the triggerer then
runs :class:`~tritonflow_plugin.notifications.TritonflowFailureNotifier`, which logs the run and
its state and posts them to ``TRITONFLOW_ALERT_WEBHOOK_URL``. ``TRITONFLOW_DEADLINE_ALERTS=false``
leaves the DAGs without one: Airflow 3.3.2's ``dag.test()`` fails at the end of a successful run of
a DAG with a deadline alert (it looks the alert up by an id only the dag-processor's serialisation
assigns), so tritonflow's ``dag.test()`` runs turn them off, and a DAG parsed by ``airflow dags test``
itself carries none (:func:`under_dags_test`): that command's run would otherwise stay ``running``.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

from airflow.sdk.definitions.callback import AsyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

from tritonflow_plugin.notifications import TritonflowFailureNotifier


def under_dags_test(argv: list[str] | None = None) -> bool:
    """Whether this process is the ``airflow dags test`` command (default: ``sys.argv``)."""
    args = sys.argv if argv is None else argv
    return len(args) >= 3 and Path(args[0]).name == "airflow" and args[1:3] == ["dags", "test"]


def run_deadline(kind: str, *, seconds: float | None = None) -> DeadlineAlert | None:
    """The deadline alert of a ``kind`` run (``canary``, ``rollback``, ``publish``).

    ``None`` when ``TRITONFLOW_DEADLINE_ALERTS`` is false, or in ``airflow dags test`` (see the module).

    Args:
        kind: One of :data:`tritonflow.pipelines.run_deadlines.RUN_KINDS`.
        seconds: The interval instead of the computed one (tests).

    Raises:
        ValueError: ``kind`` is unknown.
        SettingsError: A setting the computation reads holds a bad value.
    """
    from ground.settings import get_settings
    from tritonflow.pipelines.run_deadlines import expected_run

    settings = get_settings()
    expected, why = expected_run(kind, settings)  # a bad kind fails even when the alerts are off
    if not settings.deadline_alerts or under_dags_test():
        return None
    if seconds is not None:
        expected, why = seconds, f"{seconds:g} s"
    return DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=timedelta(seconds=expected),
                         callback=AsyncCallback(TritonflowFailureNotifier, kwargs={"expected": why}),
                         name=f"tritonflow {kind} run overran")


__all__ = ["run_deadline", "under_dags_test"]
