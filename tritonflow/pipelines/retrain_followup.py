"""The follow-up retraining of a champion trained on few post-shift rows (plain Python, no Airflow).

A retraining after a shift records ``tritonflow.retrain_followup_at`` on its version when its
window held fewer than ``retrain_followup_factor * retrain_min_post_shift_rows`` post-shift rows
(:mod:`tritonflow.pipelines.retrain`). Once that version serves and the hour ``drift_monitor``
checked has reached that time, one follow-up retraining is due: its conf names the recorded change
point, so the new window is the rows since it.

``drift_monitor`` decides it from what it already reads, at no extra MLflow round-trip: its
``record`` stage reads the checked version's tags to write the hour's verdict, and
:func:`followup_conf` says from those tags whether the follow-up is due. Its last task
(``data_quality_gate``), once the hour passed, marks each due version
``tritonflow.retrain_followup_started`` (:func:`start_followups`, so each version asks once) and
hands the ``retrain`` triggers to the ``trigger_followup_retrain`` tasks. An hour with nothing due
costs nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from ground.settings import Settings, get_settings
from tritonflow.pipelines.loop_context import CHANGE_POINT_TAG

log = logging.getLogger(__name__)

#: Reason of a follow-up retraining (more post-shift labels arrived).
FOLLOWUP_REASON = "retrain_followup"
#: Version tags of the follow-up: when it is due, and the hour it was started (once per version).
FOLLOWUP_AT_TAG = "tritonflow.retrain_followup_at"
FOLLOWUP_STARTED_TAG = "tritonflow.retrain_followup_started"


def followup_conf(model: str, version: int | str, tags: Mapping[str, str], hour_end: Any) -> dict[str, Any] | None:
    """The follow-up retraining of ``model`` version ``version`` when it is due at ``hour_end``, else None.

    Args:
        model: Registered model name.
        version: The version whose tags these are (the served one).
        tags: Its tags.
        hour_end: End of the checked hour (logical time, ISO 8601/datetime, UTC).

    Returns:
        ``{"model", "version", "reason": "retrain_followup", "change_point", "window_end"}``, or
        None when the version asks for no follow-up, already started it, or its time has not come.

    Raises:
        WindowError: ``hour_end`` or the recorded due time is not a time.
    """
    due_at = tags.get(FOLLOWUP_AT_TAG, "")
    if not due_at or tags.get(FOLLOWUP_STARTED_TAG):
        return None
    from tritonflow.pipelines.shadow import utc

    end = utc(hour_end, "hour_end")
    if end < utc(due_at, FOLLOWUP_AT_TAG):
        return None
    return {"model": model, "version": int(version), "reason": FOLLOWUP_REASON,
            "change_point": tags.get(CHANGE_POINT_TAG, ""), "window_end": end.isoformat()}


def trigger_of(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The ``TriggerDagRunOperator`` kwargs of a due follow-up (:func:`followup_conf`).

    Once per version, so it cannot storm: the retrain cooldown (wall time, 6 h by default, longer
    than the follow-up's hours) would otherwise skip every follow-up, hence ``ignore_cooldown``.
    """
    return {"trigger_dag_id": "retrain",
            "conf": {**{k: conf[k] for k in ("model", "reason", "change_point", "window_end")},
                     "ignore_cooldown": True}}


def start_followups(due: Sequence[Mapping[str, Any]], settings: Settings | None = None) -> list[dict[str, Any]]:
    """Mark each due version as followed up and return the ``retrain`` triggers, by model name.

    Args:
        due: :func:`followup_conf` results (``None`` entries are skipped).
        settings: Settings (MLflow URI).

    Returns:
        :func:`trigger_of` of each version marked; a version whose mark could not be written is
        left out (logged): it is due again the next hour.
    """
    out: list[dict[str, Any]] = []
    todo = sorted((c for c in due if c), key=lambda c: str(c["model"]))
    if not todo:
        return out
    from mlflow import MlflowClient

    s = settings if settings is not None else get_settings()
    uri = s.resolved_mlflow_tracking_uri
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for conf in todo:
        try:
            client.set_model_version_tag(str(conf["model"]), str(conf["version"]), FOLLOWUP_STARTED_TAG,
                                         str(conf["window_end"]))
        except Exception as exc:  # noqa: BLE001 - MLflow raises its own RestException; asked again next hour
            log.warning("follow-up retraining of %s v%s not started: %s", conf["model"], conf["version"], exc)
            continue
        out.append(trigger_of(conf))
    return out


__all__ = ["CHANGE_POINT_TAG", "FOLLOWUP_AT_TAG", "FOLLOWUP_REASON", "FOLLOWUP_STARTED_TAG", "followup_conf",
           "start_followups", "trigger_of"]
