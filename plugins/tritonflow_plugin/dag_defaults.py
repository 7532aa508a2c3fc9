"""Defaults every tritonflow DAG shares: task arguments, assets and the DAG tag.

Cheap to import (``datetime``, ``airflow.sdk`` and tritonflow's settings module, which reads nothing
at import), so DAG files can use it at parse time.

* :data:`DEFAULT_ARGS` -- every task has an ``execution_timeout`` (a hang becomes a failure within
  minutes), two retries for flaky systems (bad data fails at once through
  ``fail_fast_on_bad_data``), the failure notifier, and applies the Airflow connections of
  MLflow, Triton, the gateway and S3 when it starts (:mod:`tritonflow_plugin.connections`).
* :data:`DRIFT_ALERTS` -- the Asset the drift monitor emits an event on when a model's inputs
  drifted; the event's ``extra`` carries ``model``, ``version``, ``features``, ``scores`` and the
  window. ``shadow_evaluation`` is scheduled on it.
* :data:`MODEL_PUBLISHED` -- emitted by ``model_publish`` when a version is READY in Triton.
* :data:`CHAMPION_CHANGED` -- emitted by ``canary_promotion`` and ``canary_rollback`` (``extra``:
  ``model``, ``champion``, ``changed``); ``champion_sentinel`` is scheduled on it and restarts the
  sentinel of each model whose champion changed.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import Asset

from tritonflow_plugin.connections import apply_connections
from tritonflow_plugin.notifications import TritonflowFailureNotifier

#: ``start_date`` of every tritonflow DAG. A run dated before it gets no tasks, so logical dates
#: (backfills, the demo's replay) must not be earlier.
START_DATE = datetime(2025, 1, 1, tzinfo=timezone.utc)
#: Tag on every tritonflow DAG (filter in the Airflow UI).
TAG = "tritonflow"
#: Default per-task timeout; tasks that profile or train set a longer one explicitly.
TASK_TIMEOUT = timedelta(minutes=15)


class TIMEOUTS:  # noqa: N801 - a constant table, read as TIMEOUTS.short
    """Every task timeout of the tritonflow DAGs, in one table (``execution_timeout`` values).

    A hang becomes a failure within the task's budget; a task's own external timeout (Model
    Analyzer's ``TRITONFLOW_ANALYZER_TIMEOUT_S``, the READY wait ``TRITONFLOW_LOAD_TIMEOUT_S``)
    is shorter than its row here.
    """

    #: Registry reads, decisions, fire-and-forget triggers.
    short = timedelta(minutes=10)
    #: Listing models (a registry search).
    listing = timedelta(minutes=5)
    #: Small decisions on a summary (notify, gate, alert decision, asset event).
    decision = timedelta(minutes=5)
    #: One model-hour's drift check, Evidently report or whylogs profile.
    check = timedelta(minutes=15)
    #: One drift stage over a batch of models (``TRITONFLOW_DRIFT_MODELS_PER_TASK``): at most the
    #: hour until the next hourly run.
    drift_batch = timedelta(hours=1)
    #: Mapping a registry event to the DAG runs it starts.
    event_mapping = timedelta(minutes=2)
    #: Starting the mapped runs of a registry event.
    event_fire = timedelta(minutes=5)
    #: One promotion's bookkeeping tasks (plan, pre-flight, side-by-side load).
    promotion_step = TASK_TIMEOUT
    #: Conversion, validation and the parity gate (loads the source model).
    convert = timedelta(minutes=30)
    #: Model Analyzer profiling.
    profile = timedelta(minutes=45)
    #: Signing and pushing to the repository (large models on S3).
    push = timedelta(minutes=30)
    #: Load + READY wait + smoke inference.
    load = timedelta(minutes=20)
    #: Publishing a challenger from shadow evaluation (the whole publish pipeline).
    publish = timedelta(minutes=45)
    #: Replaying a window through champion and challenger.
    replay = timedelta(minutes=30)
    #: Comparing champion and challenger (bootstrap intervals, report).
    compare = timedelta(minutes=20)
    #: Building the training window (reading the log and the labels).
    training_window = timedelta(minutes=30)
    #: Training a challenger.
    train = timedelta(hours=3)
    #: The longest canary the params allow (steps x bake x extensions; checked when it starts).
    canary = timedelta(hours=4)
    #: A rollback (gateway first, then aliases).
    rollback = timedelta(minutes=15)

DEFAULT_ARGS = {
    "owner": "tritonflow",
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "execution_timeout": TASK_TIMEOUT,
    "on_failure_callback": TritonflowFailureNotifier(),
    # Airflow connections (MLflow, Triton, gateway, S3) override the matching TRITONFLOW_* settings
    # of the task's process when it starts; see tritonflow_plugin.connections
    "on_execute_callback": apply_connections,
}

DRIFT_ALERTS = Asset(name="tritonflow_drift_alerts", uri="tritonflow://drift/alerts")
MODEL_PUBLISHED = Asset(name="tritonflow_model_published", uri="tritonflow://registry/published")
CHAMPION_CHANGED = Asset(name="tritonflow_champion_changed", uri="tritonflow://registry/champion")
