"""A Celery app whose one task holds the promotion lease of a model (used by test_coordination).

Each worker is started with its own ``TRITONFLOW_HOME`` (as a worker on another host would have)
and the shared ``TRITONFLOW_COORDINATION_DB_URL``; the broker and result backend come from
``TRITONFLOW_TEST_CELERY_BROKER``.
"""

from __future__ import annotations

import os
import socket
import time

from celery import Celery

app = Celery("tritonflow_promotion_race", broker=os.environ.get("TRITONFLOW_TEST_CELERY_BROKER"),
             backend=os.environ.get("TRITONFLOW_TEST_CELERY_BROKER"))
app.conf.update(task_acks_late=False, worker_prefetch_multiplier=1, task_serializer="json",
                result_serializer="json", accept_content=["json"])


@app.task(name="promote")
def promote(model: str, start_at: float, hold_s: float) -> dict:
    """Wait until ``start_at``, then try to take the promotion lease of ``model`` and hold it."""
    from ground.exceptions import LeaseBusyError
    from ground.settings import get_settings
    from repository_sync.locks import promotion_lock

    settings = get_settings()
    me = f"{os.environ.get('TRITONFLOW_TEST_WORKER', '?')}@{socket.gethostname()}:{os.getpid()}"
    while time.time() < start_at:
        time.sleep(0.001)
    try:
        with promotion_lock(model, settings=settings, holder=me):
            time.sleep(hold_s)
        return {"won": me, "home": str(settings.home)}
    except LeaseBusyError as exc:
        return {"lost": me, "holder": exc.holder, "error": str(exc), "home": str(settings.home)}
