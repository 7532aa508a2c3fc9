"""The Celery workers' preload: task libraries imported once, in the worker, before any task forks.

A Celery worker of the CeleryExecutor runs each task as a process forked from it (Airflow's
supervisor, ``BaseExecutor.run_workload``), so whatever the worker imported before the task is
inherited copy-on-write instead of imported again: the same saving as the LocalExecutor's
forkserver preload (:data:`tritonflow.runtime.airflow_config.DEFAULT_TASK_PRELOAD_MODULES`, whose
module list this reuses; ``mlflow`` alone costs 3-13 s a task on two cores).

Airflow imports ``[celery] celery_config_options`` when it builds the Celery app, so the workers
name this module's :data:`CELERY_CONFIG` (Airflow's own configuration, unchanged)::

    AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS=tritonflow.runtime.celery_preload.CELERY_CONFIG

Importing the module only connects :func:`preload` to Celery's ``worker_init`` signal, sent in a
worker's main process before its pool starts: the scheduler, the api-server and the workers'
healthcheck (``celery inspect ping``), which build the same app, pay nothing. A module that fails
to import is skipped and listed in :data:`SKIPPED`, as ``multiprocessing`` does.
"""

from __future__ import annotations

import importlib
import logging

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import worker_init

from tritonflow.runtime.airflow_config import DEFAULT_TASK_PRELOAD_MODULES

log = logging.getLogger(__name__)

#: Modules not preloaded here: the forkserver's own last step (``gc.freeze()`` in a forkserver only).
NOT_FOR_CELERY = ("tritonflow.runtime.forkserver_preload", "airflow.executors.local_executor")


def preload(modules: tuple[str, ...] = DEFAULT_TASK_PRELOAD_MODULES) -> tuple[list[str], list[str]]:
    """Import ``modules`` (but :data:`NOT_FOR_CELERY`); returns ``(imported, skipped)``."""
    imported, skipped = [], []
    for name in modules:
        if name in NOT_FOR_CELERY:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a missing optional library is skipped, as multiprocessing does
            log.warning("celery preload: %s not preloaded: %s", name, exc)
            skipped.append(name)
        else:
            imported.append(name)
    return imported, skipped


#: Modules the worker preloaded, and those it could not (filled when the worker starts).
PRELOADED: list[str] = []
SKIPPED: list[str] = []


@worker_init.connect
def preload_on_worker_init(**_: object) -> None:
    """Celery ``worker_init`` handler: :func:`preload` in the worker, before its pool forks."""
    imported, skipped = preload()
    PRELOADED[:], SKIPPED[:] = imported, skipped
    log.info("celery preload: %d modules imported, %d skipped", len(imported), len(skipped))


#: Airflow's own Celery configuration, unchanged.
CELERY_CONFIG = DEFAULT_CELERY_CONFIG
