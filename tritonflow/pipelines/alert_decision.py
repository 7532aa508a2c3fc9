"""The DAGs' drift-alert handling policy: every alert gets one decision with its reason.

Each decision is a small record ``{"model", "hour", "features", "decision", "reason", ...}``
that the deciding task pushes to XCom under :data:`XCOM_KEY` (one key for every DAG, so a client
collects them through the REST API) and records in MLflow as the registered model's tag
``tritonflow.alert_decision.<hour>.<stage>`` (:func:`record_decision`; the drift monitor records
every hour's decision but ``no_alert``).

Decisions, in the order the loop takes them:

=========================  ============================================================  =========
decision                   when                                                          where
=========================  ============================================================  =========
``alert``                  the alert policy fired (k consecutive windows / strong        drift_monitor
                           effect / sustained drift on one feature)
``cooldown``               the alert rule held but the model alerted on the same         drift_monitor
                           features within ``TRITONFLOW_DRIFT_ALERT_COOLDOWN_HOURS``
                           (logical time: the windows' hours, never the wall clock)
``no_alert``               no persistent, strong or sustained drift in the hour          drift_monitor
``contract_failed``        the hour broke its data contract (a data-quality alert)       drift_monitor
``no_reference``           the served version has no drift reference                     drift_monitor
``skip_retrain_running``   a retraining of the model is in flight                        shadow_evaluation
``skip_promotion_locked``  a canary/promotion of the model holds the promotion lock      shadow_evaluation
``promote``                the challenger won: canary                                    shadow_evaluation
``retrain``                the champion degraded: retraining                             shadow_evaluation
``retrain_cooldown``       retraining decided less than ``TRITONFLOW_RETRAIN_COOLDOWN_S``  shadow_evaluation
                           before this alert's hour (logical time), or for this hour
                           already (its challenger did not win)
``no_retrain``             the shadow evaluation found nothing wrong (or could not        shadow_evaluation
                           decide: inconclusive)
``challenger_rejected``    the challenger is tagged ``rejected`` (by a publish stage,     shadow_evaluation
                           the health sentinel or a canary): refused, the reason says
                           which and how it is lifted
``skip_already_champion``  the version ``model_publish`` handed over was promoted by       shadow_evaluation
                           another path meanwhile: nothing to evaluate
=========================  ============================================================  =========

Plain Python, no Airflow import.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any, Mapping, Sequence

from ground.settings import Settings, get_settings

log = logging.getLogger(__name__)

#: XCom key of a run's alert decision (every DAG).
XCOM_KEY = "alert_decision"
#: Prefix of the registered-model tags recording the decisions (``<prefix><YYYY-mm-ddTHH:MM>``).
TAG_PREFIX = "tritonflow.alert_decision."
DECISIONS = ("alert", "cooldown", "no_alert", "contract_failed", "no_reference", "skip_retrain_running",
             "skip_promotion_locked", "promote", "retrain", "retrain_cooldown", "no_retrain", "challenger_rejected",
             "skip_already_champion")


def _hour(value: Any) -> str:
    """ISO 8601 UTC of ``value`` (``''`` when empty)."""
    if value in (None, ""):
        return ""
    import pandas as pd

    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return ts.isoformat()


def make_decision(model: str, hour: Any, features: Sequence[str], decision: str, reason: str,
                  **extra: Any) -> dict[str, Any]:
    """One decision record (validated).

    Raises:
        ValueError: ``decision`` is not one of :data:`DECISIONS` or ``reason`` is empty.
    """
    if decision not in DECISIONS:
        raise ValueError(f"decision={decision!r}; expected one of {DECISIONS}")
    if not str(reason).strip():
        raise ValueError(f"decision {decision!r} of model {model!r} has no reason")
    return {"model": model, "hour": _hour(hour), "features": sorted(str(f) for f in features or ()),
            "decision": decision, "reason": str(reason)[:1000], **extra}


def drift_hour_decision(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The decision of the drift monitor on one model's hour, from its check summary."""
    model = str(summary.get("model") or "")
    hour = summary.get("window_start")
    feats = list(summary.get("alert_features") or [])
    status = summary.get("status")
    reason = str(summary.get("alert_reason") or "")
    if status == "no_reference":
        msg = "; ".join(a.get("message", "") for a in summary.get("alerts") or [] if isinstance(a, Mapping))
        return make_decision(model, hour, feats, "no_reference", msg or "no drift reference for the version")
    if status not in (None, "ok"):
        return make_decision(model, hour, feats, "contract_failed",
                             f"status {status}: the hour's data contract failed; a data-quality alert, "
                             "never a drift alert" + (f" ({reason})" if reason else ""))
    if summary.get("drift"):
        return make_decision(model, hour, feats, "alert", reason or "the alert policy fired")
    if feats and "cooldown" in reason:
        return make_decision(model, hour, feats, "cooldown", reason)
    return make_decision(model, hour, feats, "no_alert",
                         reason or "no persistent or strong drift in the hour (alert policy not met)")


def retrain_in_flight(model: str, settings: Settings | None = None) -> str:
    """The holder of an in-flight retraining of ``model`` (``''`` when none)."""
    from model_registry.training import RetrainGuard

    s = settings or get_settings()
    guard = RetrainGuard.from_settings(s)
    row = guard.status(model) or {}
    if row.get("status") != "running":
        return ""
    import time

    if time.time() - float(row.get("started_at") or 0) >= guard.stale_after_s:
        return ""
    return str(row.get("holder") or "?")


def promotion_holder(model: str, settings: Settings | None = None) -> str:
    """The holder of ``model``'s promotion lease in the shared database (``''`` when free).

    Read only, never taken. An expired lease, or one whose holder process on this host has died,
    counts as free (as :meth:`ground.coordination.CoordinationStore.try_acquire` would).
    """
    from ground.coordination import PROMOTION, coordination_store, holder_died

    s = settings or get_settings()
    rec = coordination_store(s).holder_of(PROMOTION, model)
    if not rec or holder_died(rec):
        return ""
    return str(rec.get("holder") or "?")


def admission(model: str, hour: Any, features: Sequence[str], settings: Settings | None = None,
              *, retrain_holder: str | None = None, promotion: str | None = None,
              handed_over: str | int | None = None) -> dict[str, Any] | None:
    """A skip decision when there is nothing to evaluate now, else ``None``.

    Skips (in this order): the version handed over by another loop DAG is already the champion
    (``skip_already_champion``: another path, e.g. a shadow evaluation's own publish and canary,
    promoted it while ``model_publish`` was still profiling it; a race, not bad input), a
    retraining is in flight, or the promotion lock is held.

    Args:
        model: Registered model name.
        hour: The alert's hour.
        features: The alert's features.
        settings: Settings (default: from the environment).
        retrain_holder: Overrides the retraining lookup (tests).
        promotion: Overrides the promotion-lock lookup (tests).
        handed_over: The challenger version a loop DAG handed over (``None``: the run was not
            started by another loop DAG, so a challenger given by a person is judged by
            :func:`~tritonflow.pipelines.shadow.resolve_versions`, which refuses the champion).
    """
    s = settings or get_settings()
    if handed_over not in (None, "") and str(handed_over).strip().isdigit():
        champion = _registry(s).champion(model)
        if champion is not None and int(str(handed_over).strip()) == int(champion.version):
            return make_decision(model, hour, features, "skip_already_champion",
                                 f"version {champion.version} handed over for evaluation is already the champion "
                                 "(promoted by another path meanwhile): nothing to evaluate")
    holder = retrain_in_flight(model, s) if retrain_holder is None else retrain_holder
    if holder:
        return make_decision(model, hour, features, "skip_retrain_running",
                             f"a retraining of {model!r} is already running (holder {holder}); its "
                             "challenger will be evaluated when it is published")
    holder = promotion_holder(model, s) if promotion is None else promotion
    if holder:
        return make_decision(model, hour, features, "skip_promotion_locked",
                             f"the promotion lock of {model!r} is held by {holder}: a canary or rollback "
                             "is changing what serves")
    return None


def _registry(s: Settings):
    """The :class:`~model_registry.registry.RegistryClient` of the settings' tracking server (= registry)."""
    from model_registry.registry import RegistryClient

    uri = s.resolved_mlflow_tracking_uri
    return RegistryClient(tracking_uri=uri, registry_uri=uri)


def _client(s: Settings):
    """The MLflow client of :class:`~model_registry.registry.RegistryClient` (tracking server = registry)."""
    return _registry(s).client


def last_retrain_hour(model: str, before: Any, settings: Settings | None = None,
                      tags: Mapping[str, str] | None = None) -> dt.datetime | None:
    """The latest hour a retraining was decided for, at or before ``before`` (logical time).

    A retraining decided for an alert's hour holds for every later shadow evaluation of that same
    hour: the evaluation of the challenger it produced hands the alert's hour on, and a challenger
    that did not beat a degraded champion must not start another retraining on the same rows (the
    follow-up retraining, :mod:`tritonflow.pipelines.retrain_followup`, waits for new labels). The
    hour's record is overwritten by that evaluation's ``retrain_cooldown`` decision, which keeps
    the hour it deferred to as ``retrain_hour``.

    Args:
        model: Registered model name.
        before: The alert's hour (ISO 8601 or timestamp).
        settings: Settings for the MLflow client (only when ``tags`` is None).
        tags: The registered model's tags, already read (None: read them).

    Returns:
        The hour (UTC datetime), or None when no retraining was decided at or before ``before``.
    """
    import pandas as pd

    if tags is None:
        tags = _model_tags(model, settings or get_settings())
    limit = pd.Timestamp(_hour(before))
    best = None
    for key, value in (tags or {}).items():
        if not key.startswith(TAG_PREFIX):
            continue
        try:
            rec = json.loads(value)
        except ValueError:
            continue
        hour = rec.get("hour") if rec.get("decision") == "retrain" else rec.get("retrain_hour")
        if not hour:
            continue
        at = pd.Timestamp(hour)
        if at <= limit and (best is None or at > best):
            best = at
    return None if best is None else best.to_pydatetime()


def shadow_decision(model: str, hour: Any, features: Sequence[str], outcome: str, reasons: Sequence[str],
                    settings: Settings | None = None, *, tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Decide what follows a shadow evaluation.

    The decision after a shadow evaluation: promote, retrain (unless in the logical cooldown), or
    no retraining when it found nothing wrong.
    """
    import pandas as pd

    s = settings or get_settings()
    why = "; ".join(str(r) for r in reasons or [])[:600]
    if outcome == "promote_challenger":
        return make_decision(model, hour, features, "promote", why or "the challenger won the shadow evaluation",
                             outcome=outcome)
    if outcome == "retrain":
        last = last_retrain_hour(model, hour, s, tags) if hour else None
        if last is not None:
            since = pd.Timestamp(_hour(hour)) - pd.Timestamp(last)
            if since.total_seconds() <= 0:  # this alert's own retraining: never again, whatever the cooldown
                return make_decision(
                    model, hour, features, "retrain_cooldown",
                    f"retraining was already decided for this alert's hour {last.isoformat()}: its challenger "
                    "did not win; a follow-up retraining waits for new labels",
                    outcome=outcome, retrain_hour=_hour(last))
            if since.total_seconds() < float(s.retrain_cooldown_s):
                return make_decision(
                    model, hour, features, "retrain_cooldown",
                    f"retraining was decided for the hour {last.isoformat()}, {since} before this alert's "
                    f"hour (< TRITONFLOW_RETRAIN_COOLDOWN_S={s.retrain_cooldown_s:g} s, logical time)",
                    outcome=outcome, retrain_hour=_hour(last))
        return make_decision(model, hour, features, "retrain", why or "the champion degraded", outcome=outcome)
    return make_decision(model, hour, features, "no_retrain",
                         f"shadow evaluation {outcome}: nothing wrong found" + (f" ({why})" if why else ""),
                         outcome=outcome)


def rejected_challenger_decision(model: str, hour: Any, features: Sequence[str],
                                 error: BaseException) -> dict[str, Any]:
    """The decision of a shadow evaluation that refused a rejected challenger (``challenger_rejected``).

    Args:
        model: Registered model name.
        hour: The alert's hour (ISO 8601 or timestamp; ``''`` when none).
        features: The alert's features.
        error: The :class:`~ground.exceptions.RejectedVersionError` (its message names the
            version, the rejecting stage, the reason and how a person lifts it).
    """
    return make_decision(model, hour, features, "challenger_rejected", f"challenger refused: {error}")


def _model_tags(model: str, s: Settings) -> dict[str, str]:
    client = _client(s)
    return dict(client.get_registered_model(model).tags or {})


#: Decisions taken by the shadow evaluation (tag suffix ``.shadow``; the drift monitor's: ``.drift``).
SHADOW_DECISIONS = ("skip_retrain_running", "skip_promotion_locked", "promote", "retrain", "retrain_cooldown",
                    "no_retrain", "challenger_rejected", "skip_already_champion")


def record_decision(decision: Mapping[str, Any], settings: Settings | None = None) -> str:
    """Record an alert decision as a tag of the registered model.

    Record ``decision`` as the registered model's tag ``tritonflow.alert_decision.<hour>.<stage>``
    (``<hour>`` as ``YYYY-mm-ddTHH-MM``, ``<stage>`` ``drift`` or ``shadow``).

    A failure to record is logged (warning) and returns ``''``: the decision itself stands (it
    is in XCom).
    """
    s = settings or get_settings()
    stage = "shadow" if decision.get("decision") in SHADOW_DECISIONS else "drift"
    key = f"{TAG_PREFIX}{(decision.get('hour') or 'none')[:16].replace(':', '-')}.{stage}"
    try:
        client = _client(s)
        client.set_registered_model_tag(decision["model"], key, json.dumps(dict(decision), sort_keys=True)[:4900])
    except Exception as exc:  # noqa: BLE001 - the decision stands without its MLflow copy
        log.warning("alert decision of %s not recorded in MLflow (%s): %s", decision.get("model"), exc,
                    json.dumps(dict(decision), sort_keys=True))
        return ""
    log.info("alert decision %s", json.dumps(dict(decision), sort_keys=True))
    return key


__all__ = ["DECISIONS", "TAG_PREFIX", "XCOM_KEY", "admission", "drift_hour_decision", "last_retrain_hour",
           "make_decision", "promotion_holder", "record_decision", "rejected_challenger_decision", "retrain_in_flight",
           "shadow_decision"]
