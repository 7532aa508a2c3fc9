"""The DAGs' alert-handling policy: every drift alert gets one decision with a reason.

The retraining guard (SQLite) and the promotion lock are the real ones, held by another process
where that matters; the MLflow record is exercised by the DAG tests.
"""

from __future__ import annotations

import json
import multiprocessing

import pytest

from model_registry.training import RetrainGuard
from tests.conftest import make_settings
from tritonflow.pipelines import alert_decision as ad

HOUR = "2025-03-01T10:00:00+00:00"


def _summary(**kw):
    base = {"model": "churn", "window_start": HOUR, "status": "ok", "drift": False, "alert_features": [],
            "alert_reason": ""}
    return {**base, **kw}


@pytest.mark.parametrize("summary, decision", [
    (_summary(drift=True, alert_features=["tenure"], alert_reason="strong effect on tenure"), "alert"),
    (_summary(alert_features=["tenure"],
              alert_reason="strong effect on tenure; within the cooldown "
                           "(2:00:00 after the previous alert, no new feature)"), "cooldown"),
    (_summary(), "no_alert"),
    (_summary(status="contract_failed"), "contract_failed"),
    (_summary(status="no_reference", alerts=[{"message": "'churn' v3: no reference"}]), "no_reference"),
])
def test_every_drift_hour_gets_a_decision_with_a_reason(summary, decision):
    made = ad.drift_hour_decision(summary)
    assert made["decision"] == decision and made["reason"].strip()
    assert made["hour"] == HOUR and made["model"] == "churn"
    json.dumps(made)  # an XCom value


def test_shadow_outcomes_map_to_promote_retrain_or_no_retrain(tmp_path):
    s = make_settings(tmp_path)
    decision = ad.shadow_decision("churn", HOUR, ["tenure"], "promote_challenger", ["won"], s, tags={})
    assert decision["decision"] == "promote"
    assert ad.shadow_decision("churn", HOUR, ["tenure"], "retrain", ["degraded"], s, tags={})["decision"] == "retrain"
    for outcome in ("nothing", "inconclusive"):
        made = ad.shadow_decision("churn", HOUR, ["tenure"], outcome, [], s, tags={})
        assert made["decision"] == "no_retrain" and "nothing wrong" in made["reason"]


def test_the_retrain_cooldown_counts_in_logical_time_not_wall_clock(tmp_path):
    s = make_settings(tmp_path, retrain_cooldown_s=6 * 3600)
    earlier = ad.make_decision("churn", "2025-03-01T06:00:00+00:00", ["tenure"], "retrain", "degraded")
    tags = {ad.TAG_PREFIX + "2025-03-01T06-00.shadow": json.dumps(earlier),
            ad.TAG_PREFIX + "2025-03-01T09-00.drift": json.dumps(
                ad.make_decision("churn", "2025-03-01T09:00:00+00:00", [], "alert", "x"))}
    # 4 h of logical time after the hour retraining was decided for: within 6 h
    made = ad.shadow_decision("churn", HOUR, ["tenure"], "retrain", ["degraded"], s, tags=tags)
    assert made["decision"] == "retrain_cooldown" and "logical time" in made["reason"]
    # a backfilled alert 7 h later in logical time is outside the cooldown, whatever the wall clock says
    later = ad.shadow_decision("churn", "2025-03-01T13:00:00+00:00", ["tenure"], "retrain", [], s, tags=tags)
    assert later["decision"] == "retrain"
    # decisions recorded for later hours do not count for an earlier (replayed) hour
    assert ad.last_retrain_hour("churn", "2025-03-01T05:00:00+00:00", s, tags) is None


@pytest.mark.parametrize("cooldown_s", [6 * 3600, 0])
def test_a_retrained_challenger_that_does_not_win_starts_no_second_retraining_for_the_same_alert(tmp_path,
                                                                                                 cooldown_s):
    # the chain alert -> retrain -> publish -> shadow evaluation of the challenger hands the alert's
    # hour on; a challenger no better than a degraded champion used to start another retraining
    # on the same rows, again and again while no new hour arrived; with no cooldown (the main job's
    # setting) it still did: 137 retrainings of one alert's rows in a full replay
    s = make_settings(tmp_path, retrain_cooldown_s=cooldown_s)
    first = ad.shadow_decision("churn", HOUR, ["tenure"], "retrain", ["degraded"], s, tags={})
    assert first["decision"] == "retrain"
    key = ad.TAG_PREFIX + "2025-03-01T10-00.shadow"
    tags = {key: json.dumps(first)}
    second = ad.shadow_decision("churn", HOUR, ["tenure"], "retrain", ["no difference"], s, tags=tags)
    assert second["decision"] == "retrain_cooldown"
    assert second["retrain_hour"] == first["hour"]
    # the second decision overwrites the hour's tag; the retraining it deferred to still counts
    tags[key] = json.dumps(second)
    third = ad.shadow_decision("churn", HOUR, ["tenure"], "retrain", ["no difference"], s, tags=tags)
    assert third["decision"] == "retrain_cooldown"
    later = ad.shadow_decision("churn", "2025-03-01T17:00:00+00:00", ["tenure"], "retrain", [], s, tags=tags)
    assert later["decision"] == "retrain"
    if not cooldown_s:  # the next hour's alert may retrain at once
        nxt = ad.shadow_decision("churn", "2025-03-01T11:00:00+00:00", ["tenure"], "retrain", [], s, tags=tags)
        assert nxt["decision"] == "retrain"


def _hold_promotion_lock(home: str, model: str, ready, release) -> None:
    from ground.settings import get_settings
    from repository_sync.locks import promotion_lock

    with promotion_lock(model, settings=get_settings(home=home), holder="canary_promotion/run_1/canary"):
        ready.set()
        release.wait(30)


def test_a_held_promotion_lock_or_a_running_retrain_skips_the_alert_naming_the_holder(tmp_path):
    s = make_settings(tmp_path)
    assert ad.admission("churn", HOUR, ["tenure"], s) is None
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_promotion_lock, args=(str(s.home), "churn", ready, release))
    proc.start()
    try:
        assert ready.wait(60)
        made = ad.admission("churn", HOUR, ["tenure"], s)
        assert made["decision"] == "skip_promotion_locked" and "canary_promotion/run_1/canary" in made["reason"]
    finally:
        release.set()
        proc.join(30)
    assert ad.admission("churn", HOUR, ["tenure"], s) is None  # released: nothing held any more

    lease = RetrainGuard.from_settings(s).acquire("churn", holder="retrain/manual_1")
    made = ad.admission("churn", HOUR, ["tenure"], s)
    assert made["decision"] == "skip_retrain_running" and "retrain/manual_1" in made["reason"]
    RetrainGuard.from_settings(s).release(lease, succeeded=True)
    assert ad.admission("churn", HOUR, ["tenure"], s) is None


def test_a_decision_without_a_reason_or_unknown_is_refused():
    with pytest.raises(ValueError, match="no reason"):
        ad.make_decision("churn", HOUR, [], "alert", " ")
    with pytest.raises(ValueError, match="expected one of"):
        ad.make_decision("churn", HOUR, [], "maybe", "x")


def test_a_refused_rejected_challenger_is_a_shadow_decision_naming_the_rejection():
    from ground.exceptions import RejectedVersionError

    error = RejectedVersionError("challenger='2' of model 'churn' is version 2, rejected at stage sentinel "
                                 "(2025-03-01T10:00:00+00:00): health sentinel rolled version 2 back to version 1")
    made = ad.rejected_challenger_decision("churn", HOUR, ["tenure"], error)
    assert made["decision"] == "challenger_rejected" and made["decision"] in ad.SHADOW_DECISIONS
    assert "rejected at stage sentinel" in made["reason"] and made["hour"] == HOUR
    json.dumps(made)  # an XCom value


def test_a_handed_over_version_promoted_meanwhile_is_skipped_not_failed(tmp_path, monkeypatch):
    """model_publish hands version 2 over while a shadow evaluation's own publish already promoted it.

    A process-wide registry URI (another library's, another test's) must not redirect the lookup.
    """
    import mlflow

    s = make_settings(tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(mlflow.tracking._model_registry.utils, "_registry_uri", f"sqlite:///{tmp_path / 'other.db'}")
    uri = s.resolved_mlflow_tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("churn")
    for _ in range(2):
        client.create_model_version("churn", source=str(tmp_path / "model"))
    client.set_registered_model_alias("churn", "champion", "1")
    assert ad.admission("churn", HOUR, ["tenure"], s, handed_over="2", retrain_holder="", promotion="") is None
    client.set_registered_model_alias("churn", "champion", "2")
    made = ad.admission("churn", HOUR, ["tenure"], s, handed_over="2", retrain_holder="", promotion="")
    assert made["decision"] == "skip_already_champion" and "version 2" in made["reason"]
    # not handed over by a loop DAG (a person asked): resolve_versions judges it, admission does not skip
    assert ad.admission("churn", HOUR, ["tenure"], s, handed_over=None, retrain_holder="", promotion="") is None
