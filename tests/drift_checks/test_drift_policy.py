"""Drift decisions a user can trust: thresholds per reference, learning rules, floors and
ceilings, the per-feature vote, importance weighting, contracts vs drift, the alert policy."""

import datetime as dt
import math

import numpy as np
import pandas as pd
import pytest

from drift_checks import statistics as st
from drift_checks.contract_types import Contract, ExpectationSpec
from drift_checks.history import HistoryStore
from drift_checks.inference_log import LogSchema
from drift_checks.policy import (
    AlertPolicy,
    decide_alert,
    feature_verdict,
    season_sustained_features,
    sustained_features,
)
from drift_checks.thresholds import Threshold, ThresholdPolicy, resolve_thresholds
from drift_checks.verdict import CheckConfig, check_window, prepare_reference
from ground.exceptions import SettingsError

T0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)
NUM = LogSchema({"x": "float"})


@pytest.fixture
def history(tmp_path):
    h = HistoryStore(f"sqlite:///{tmp_path / 'history.db'}")
    yield h
    h.engine.dispose()


def _run(history, reference, frames, *, start=0, config=None, model="m", contract=None):
    """check_window over consecutive hours; returns the summaries."""
    cfg = config or CheckConfig(evidently_sample_rows=0)
    return [check_window(model=model, frame=f, start=T0 + (start + i) * HOUR, end=T0 + (start + i + 1) * HOUR,
                         reference=reference, history=history, config=cfg, contract=contract)
            for i, f in enumerate(frames)]


def _normal(rng, n, loc=0.0, col="x"):
    return pd.DataFrame({col: rng.normal(loc, 1.0, n)})


# ----------------------------------------------------------------------- thresholds per reference
def test_after_a_promotion_the_new_reference_judges_with_its_own_thresholds_not_the_old_history(history):
    """Hours served by v1 drifted far from v1's reference; v2 is trained on that new regime.
    A shift away from v2's reference must be judged by v2's thresholds (its reference chunks),
    never by the P95 learned from v1's drifted statistics."""
    rng = np.random.default_rng(0)
    v1 = prepare_reference(_normal(rng, 5000), NUM, reference_id="v1:training:a")
    cfg = CheckConfig(evidently_sample_rows=0, policy=ThresholdPolicy(min_history=5))
    _run(history, v1, [_normal(rng, 400, 1.0) for _ in range(8)], config=cfg)
    v2 = prepare_reference(_normal(rng, 5000, 1.0), NUM, reference_id="v2:training:b")
    (out,) = _run(history, v2, [_normal(rng, 400, 1.35)], start=8, config=cfg)
    x = out["features"]["x"]
    assert x["flagged"] and x["statistics"]["psi"]["threshold_source"] == "reference"
    assert out["reference_id"] == "v2:training:b"
    assert len(history.values("m", "x", "psi", reference_id="v1:training:a")) == 8
    assert len(history.values("m", "x", "psi", reference_id="v2:training:b")) == 1
    # once v2 has taught enough quiet hours, its own dynamic thresholds apply
    outs = _run(history, v2, [_normal(rng, 400, 1.0) for _ in range(6)], start=9, config=cfg)
    assert outs[-1]["features"]["x"]["statistics"]["psi"]["threshold_source"] == "dynamic"


def test_windows_drifted_from_the_first_hour_never_teach_their_drift_to_the_thresholds(history):
    rng = np.random.default_rng(1)
    ref = prepare_reference(_normal(rng, 5000), NUM, reference_id="v1")
    cfg = CheckConfig(evidently_sample_rows=0, policy=ThresholdPolicy(min_history=5))
    outs = _run(history, ref, [_normal(rng, 400, 0.35) for _ in range(15)], config=cfg)
    assert all(o["features"]["x"]["flagged"] for o in outs)
    assert outs[-1]["features"]["x"]["statistics"]["psi"]["threshold_source"] == "reference"


def test_a_drifted_history_cannot_raise_a_threshold_past_the_ceiling(history):
    history.bulk_load({"model": "m", "reference_id": "r", "feature": "x", "statistic": "psi",
                       "hour": T0 + i * HOUR, "value": 3.0} for i in range(60))
    (thr,) = resolve_thresholds(history, "m", T0 + 60 * HOUR, [("x", "psi")],
                                ThresholdPolicy(min_history=48), reference_id="r").values()
    assert thr.source == "dynamic" and thr.value == thr.ceiling == pytest.approx(0.25)


# ----------------------------------------------------------------------- no degenerate thresholds
def test_a_feature_identical_in_every_window_never_alarms_until_it_really_changes(history):
    rng = np.random.default_rng(2)
    base = rng.normal(size=400)
    ref = prepare_reference(pd.DataFrame({"x": np.tile(base, 10)}), NUM, reference_id="r")
    cfg = CheckConfig(evidently_sample_rows=0, policy=ThresholdPolicy(min_history=10))
    outs = _run(history, ref, [pd.DataFrame({"x": base}) for _ in range(25)], config=cfg)
    assert [o["features"]["x"]["severity"] for o in outs] == ["ok"] * 25
    assert outs[-1]["features"]["x"]["statistics"]["psi"]["threshold_source"] == "dynamic"
    assert outs[-1]["features"]["x"]["statistics"]["psi"]["threshold"] == pytest.approx(0.1)  # the floor
    (changed,) = _run(history, ref, [pd.DataFrame({"x": base + 0.5})], start=25, config=cfg)
    assert changed["features"]["x"]["flagged"]


def test_a_category_share_that_never_moves_does_not_tilt_the_vote(history):
    schema = LogSchema({"plan": "category"})
    ref = prepare_reference(pd.DataFrame({"plan": ["a"] * 600 + ["b"] * 400}), schema, reference_id="r")
    cfg = CheckConfig(evidently_sample_rows=0, policy=ThresholdPolicy(min_history=10))
    same = pd.DataFrame({"plan": ["a"] * 60 + ["b"] * 40})
    outs = _run(history, ref, [same] * 15, config=cfg)
    assert [o["features"]["plan"]["severity"] for o in outs] == ["ok"] * 15
    unseen = outs[-1]["features"]["plan"]["statistics"]["unseen_share"]
    assert unseen["value"] == 0.0 and unseen["threshold"] >= 0.01 and "abstains" in unseen


def test_a_saturated_statistic_abstains_and_the_others_still_decide():
    rng = np.random.default_rng(3)
    results = st.compare_numeric(rng.normal(size=5000), rng.normal(3.0, 1.0, 300))
    cap = results["psi"].extra["cap"]
    thresholds = {"psi": Threshold(cap, "dynamic", 100, 0.95, 0.1, cap),
                  "ks_p_value": Threshold(0.05, "static", 0), "wasserstein_normed": Threshold(0.1, "static", 0)}
    v = feature_verdict(results, thresholds)
    psi_vote = next(x for x in v.votes if x.name == "psi")
    assert psi_vote.flagged is None and "cap" in psi_vote.reason
    assert v.flagged  # K-S and Wasserstein carry the vote
    quiet = st.compare_numeric(rng.normal(size=5000), rng.normal(size=300))
    assert not feature_verdict(quiet, thresholds).flagged


# ----------------------------------------------------------------------- the vote reaches real shifts
@pytest.mark.parametrize("current,flagged", [({"approved": 60, "declined": 240}, False),
                                             ({"approved": 90, "declined": 210}, True)])
def test_a_clear_category_shift_is_flagged_and_the_same_mix_is_not(history, current, flagged):
    schema = LogSchema({"decision": "category"})
    ref = prepare_reference(pd.DataFrame({"decision": ["approved"] * 240 + ["declined"] * 960}), schema)
    frame = pd.DataFrame({"decision": [k for k, n in current.items() for _ in range(n)]})
    outs = _run(history, ref, [frame, frame])
    assert outs[0]["features"]["decision"]["flagged"] is flagged
    assert outs[1]["features"]["decision"]["severity"] == ("drift" if flagged else "ok")
    assert outs[1]["drift"] is flagged  # k = 2 consecutive dataset-drift windows


def test_rescoring_the_same_hour_gives_the_same_decision_and_one_unusual_hour_is_no_alert(history):
    rng = np.random.default_rng(4)
    ref = prepare_reference(pd.DataFrame({"x": rng.lognormal(3, 0.6, 6000)}), NUM)
    window = pd.DataFrame({"x": rng.lognormal(3.08, 0.6, 600)})
    a = _run(history, ref, [window])[0]
    b = _run(history, ref, [window.copy()])[0]
    assert a == b and a["drift"] is False


# ----------------------------------------------------------------------- importance weighting
def test_the_dataset_verdict_weighs_features_by_the_model_s_importance(history):
    rng = np.random.default_rng(5)
    schema = LogSchema({c: "float" for c in "abcd"})
    frame = pd.DataFrame({c: rng.normal(size=4000) for c in "abcd"})
    imp = {"a": 0.85, "b": 0.05, "c": 0.05, "d": 0.05}
    ref = prepare_reference(frame, schema, importance=imp, reference_id="r")
    important = frame.sample(400, random_state=1).assign(a=lambda d: d.a + 0.35)
    minor = frame.sample(400, random_state=2).assign(b=lambda d: d.b + 0.35, c=lambda d: d.c + 0.35,
                                                      d=lambda d: d.d + 0.35)
    out_important = _run(history, ref, [important])[0]
    out_minor = _run(history, ref, [minor], start=5)[0]
    assert out_important["weighting"] == "importance"
    assert out_important["dataset_drift"] and out_important["dataset_score"] == pytest.approx(0.85)
    assert not out_minor["dataset_drift"] and out_minor["dataset_score"] == pytest.approx(0.15)
    uniform = CheckConfig(evidently_sample_rows=0, alerts=AlertPolicy(weighting="uniform"))
    assert _run(history, ref, [minor], start=9, config=uniform)[0]["dataset_drift"]


def test_permutation_importance_finds_the_inputs_the_model_uses():
    from sklearn.linear_model import LogisticRegression

    from drift_checks.importance import permutation_importances

    rng = np.random.default_rng(6)
    X = pd.DataFrame({"used": rng.normal(size=3000), "ignored": rng.normal(size=3000),
                      "weak": rng.normal(size=3000)})
    y = (X.used + 0.2 * X.weak + rng.normal(0, 0.3, 3000) > 0).astype(int)
    model = LogisticRegression().fit(X, y)
    imp = permutation_importances(model.predict_proba, X)
    assert sum(imp.values()) == pytest.approx(1.0)
    assert imp["used"] > 0.7 and imp["used"] > imp["weak"] > imp["ignored"]
    assert permutation_importances(model.predict_proba, X) == imp  # seeded: a rerun agrees


# ----------------------------------------------------------------------- contracts vs drift
def test_a_failed_contract_raises_a_data_quality_alert_and_never_a_drift_alert(history):
    rng = np.random.default_rng(7)
    schema = LogSchema({"x": "float", "y": "float"})
    ref = prepare_reference(pd.DataFrame({"x": rng.normal(size=3000), "y": rng.normal(size=3000)}), schema)
    bad = pd.DataFrame({"x": rng.normal(4.0, 1.0, 300), "y": [np.nan] * 300})
    outs = _run(history, ref, [bad, bad])
    for out in outs:
        assert out["status"] == "contract_failed" and out["drift"] is False
        assert not [a for a in out["alerts"] if a["kind"] == "drift"]
        assert out["features"]["y"]["severity"] == "invalid"
    # the invalid feature stays in the denominator and counts against the dataset
    assert outs[0]["dataset_score"] == pytest.approx(1.0)


def test_a_strongly_shifted_valid_feature_is_drift_not_invalid(history):
    rng = np.random.default_rng(8)
    ref = prepare_reference(_normal(rng, 3000), NUM)
    (out,) = _run(history, ref, [_normal(rng, 300, 40.0)])  # far outside the learned range
    assert out["status"] == "ok" and out["features"]["x"]["severity"] == "drift"
    assert out["drift"] is True  # a strong effect alerts in one window
    assert any(a["kind"] == "data_quality_warning" and a["column"] == "x" for a in out["alerts"])


def test_the_all_null_alert_gives_the_reference_missing_share_beside_the_window_s(history, null_and_empty_windows):
    ref, all_null, _ = null_and_empty_windows
    schema = LogSchema({"session_minutes": "float", "device": "category", "promo_code": "category",
                        "pages_viewed": "int"})
    (out,) = _run(history, prepare_reference(ref, schema), [all_null])
    (alert,) = [a for a in out["alerts"] if a["kind"] == "data_quality" and a["column"] == "promo_code"]
    assert alert["window_missing_share"] == 1.0 and alert["reference_missing_share"] == pytest.approx(0.45)


def test_a_declared_range_still_fails_the_contract(history):
    rng = np.random.default_rng(9)
    ref = prepare_reference(_normal(rng, 3000), NUM)
    contract = Contract((ExpectationSpec("ExpectColumnMaxToBeBetween", {"column": "x", "max_value": 10.0}),))
    (out,) = _run(history, ref, [_normal(rng, 300, 40.0)], contract=contract)
    assert out["status"] == "contract_failed" and out["features"]["x"]["severity"] == "invalid"


# ----------------------------------------------------------------------- alert policy
def _decide(policy, hour, drift=False, previous=(), strong=(), persistent=(), last=None):
    return decide_alert(policy, window_start=T0 + hour * HOUR, dataset_drift=drift,
                        previous_drift=list(previous), strong_features=list(strong),
                        persistent_features=list(persistent), last_alert=last)


def test_alert_policy_needs_k_consecutive_drifted_windows_or_one_strong_window():
    policy = AlertPolicy(consecutive_windows=3)
    assert not _decide(policy, 5, drift=True, previous=[False, True]).fire
    d = _decide(policy, 5, drift=True, previous=[True, True], persistent=["x"])
    assert d.fire and d.features == ("x",) and "3 consecutive" in d.reason
    s = _decide(policy, 5, strong=["y"])
    assert s.fire and s.features == ("y",) and "strong effect" in s.reason


def test_alert_policy_cooldown_in_logical_time_lets_only_new_features_through():
    policy = AlertPolicy(cooldown=dt.timedelta(hours=6))
    last = (T0 + 10 * HOUR, ["x"])
    assert not _decide(policy, 13, strong=["x"], last=last).fire
    assert _decide(policy, 13, strong=["x", "y"], last=last).fire
    assert _decide(policy, 16, strong=["x"], last=last).fire  # cooldown over


def test_every_alert_names_features_statistics_values_and_thresholds(history):
    rng = np.random.default_rng(10)
    ref = prepare_reference(_normal(rng, 3000), NUM)
    (out,) = _run(history, ref, [_normal(rng, 300, 2.0)])
    (alert,) = [a for a in out["alerts"] if a["kind"] == "drift"]
    assert alert["features"] == ["x"] and alert["causes"]
    for cause in alert["causes"]:
        assert cause["feature"] == "x" and math.isfinite(cause["value"]) and math.isfinite(cause["threshold"])
        assert cause["threshold_source"] in ("reference", "static", "dynamic")
    # the next hour is inside the cooldown: the state is still drift but no second event
    (again,) = _run(history, ref, [_normal(rng, 300, 2.0)], start=1)
    assert again["severity"] == "drift" and again["drift"] is False and "cooldown" in again["alert_reason"]


# ----------------------------------------------------------------------- sustained drift (run rule)
def _minor_input_model(rng):
    """A reference large enough for reference-chunk thresholds; input ``b`` weighs 0.05."""
    schema = LogSchema({c: "float" for c in "abcd"})
    frame = pd.DataFrame({c: rng.normal(size=6000) for c in "abcd"})
    return prepare_reference(frame, schema, importance={"a": 0.85, "b": 0.05, "c": 0.05, "d": 0.05},
                             reference_id="r")


def _windows(rng, shifts):
    """One 400-row window per entry of ``shifts``: fresh N(0, 1) inputs, ``b`` moved by the entry."""
    return [pd.DataFrame({c: rng.normal(size=400) + (s if c == "b" else 0.0) for c in "abcd"}) for s in shifts]


def test_a_sustained_shift_on_a_minor_input_alerts_whatever_its_weight(history):
    """A moderate shift (flagged, not strong) that stays on an input of weight 0.05 never reaches
    the dataset share; it alerts once it has shown evidence in 4 of 5 windows, naming that input."""
    rng = np.random.default_rng(11)
    ref = _minor_input_model(rng)
    outs = _run(history, ref, _windows(rng, [0.35] * 6))
    assert [o["features"]["b"]["flagged"] for o in outs] == [True] * 6
    assert not any(o["features"]["b"]["strong"] or o["dataset_drift"] for o in outs)
    assert [o["drift"] for o in outs] == [False, False, False, True, False, False]  # then the cooldown
    alert = outs[3]
    assert alert["alert_features"] == ["b"] and "sustained drift on b" in alert["alert_reason"]
    assert alert["features"]["b"]["severity"] == "drift" and "sustained" in alert["features"]["b"]["reason"]
    (drift_alert,) = [a for a in alert["alerts"] if a["kind"] == "drift"]
    assert {c["statistic"] for c in drift_alert["causes"]} >= {"ks_p_value"}


def test_without_the_run_rule_a_sustained_minor_shift_never_alerts(history):
    rng = np.random.default_rng(11)
    ref = _minor_input_model(rng)
    off = CheckConfig(evidently_sample_rows=0, alerts=AlertPolicy(sustained_windows=0))
    outs = _run(history, ref, _windows(rng, [0.35] * 6), config=off)
    assert all(o["features"]["b"]["flagged"] for o in outs) and not any(o["drift"] for o in outs)


def test_isolated_flags_on_a_minor_input_never_alert(history):
    """Shifted every other window (2 or 3 of 5 with evidence): not sustained, no alert."""
    rng = np.random.default_rng(12)
    ref = _minor_input_model(rng)
    outs = _run(history, ref, _windows(rng, [0.35, 0.0] * 4))
    assert [o["features"]["b"]["flagged"] for o in outs][::2] == [True] * 4
    assert not any(o["drift"] for o in outs)


def test_sustained_features_counts_evidence_in_the_windows_before():
    policy = AlertPolicy()  # 4 of 5
    assert sustained_features(policy, {"x": True, "y": True, "z": False},
                              {"x": [False, True, True, True], "y": [True, False, True, False],
                               "z": [True] * 4}) == ["x"]
    assert sustained_features(policy, {"x": True}, {"x": [True] * 10 + [False, False, True, True]}) == []
    assert sustained_features(AlertPolicy(sustained_windows=0), {"x": True}, {"x": [True] * 4}) == []
    assert sustained_features(AlertPolicy(sustained_windows=2, sustained_evidence=2), {"x": True},
                              {"x": [True]}) == ["x"]


def test_the_season_run_rule_needs_evidence_against_the_season_in_every_window_before():
    policy = AlertPolicy()  # 4 of 4
    evidence = {"x": [False, True, True, True], "y": [True, True, False, True], "z": [True, True]}
    assert season_sustained_features(policy, {"x": True, "y": True, "z": True}, evidence) == ["x"]
    assert season_sustained_features(policy, {"x": False}, evidence) == []  # the vote now decides
    assert season_sustained_features(AlertPolicy(seasonal_run_windows=0), {"x": True}, evidence) == []
    decision = decide_alert(policy, window_start=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
                            dataset_drift=False, previous_drift=[False], strong_features=[],
                            persistent_features=[], last_alert=None, season_sustained=["x"])
    assert decision.fire and decision.features == ("x",) and "against the season on x" in decision.reason


def test_an_hour_scored_against_its_season_keeps_those_values_apart_and_untaught_when_strong(history):
    """The season's statistics are stored under its own id, never in the hour's own series, and a
    strong effect against the season teaches the season's thresholds nothing (as for the hour's own)."""
    import sqlalchemy as sa

    rng = np.random.default_rng(5)
    reference = prepare_reference(_normal(rng, 3000), NUM, reference_id="r")
    season = prepare_reference(_normal(rng, 3000, loc=3.0), NUM, reference_id="r:seasonal")
    cfg = CheckConfig(evidently_sample_rows=0)
    for i in range(3):
        summary = check_window(model="m", frame=_normal(rng, 200), start=T0 + i * HOUR, end=T0 + (i + 1) * HOUR,
                               reference=reference, history=history, config=cfg, season=season)
        assert summary["season_reference_id"] == "r:seasonal" and summary["drift"] is False
    t = history.stats
    with history.engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.reference_id, t.c.taught, sa.func.count())
                            .group_by(t.c.reference_id, t.c.taught)).all()
    counts = {(ref, bool(taught)): n for ref, taught, n in rows}
    assert set(counts) == {("r", True), ("r:seasonal", False)} and counts[("r", True)] == counts[("r:seasonal", False)]
    assert max(v for _, v in history.values("m", "x", "psi", reference_id="r")) < 0.5


@pytest.mark.parametrize("fields, field", [({"sustained_windows": 1}, "sustained_windows=1"),
                                           ({"sustained_evidence": 6}, "sustained_evidence=6"),
                                           ({"sustained_evidence": 1}, "sustained_evidence=1"),
                                           ({"seasonal_run_windows": 1}, "seasonal_run_windows=1")])
def test_a_bad_run_rule_is_refused_naming_the_field_and_value(fields, field):
    with pytest.raises(SettingsError, match=field):
        AlertPolicy(**fields)


def test_previous_evidence_is_any_statistic_beyond_its_threshold_in_hour_order(history):
    from drift_checks.history import StatisticRow

    def psi(value, source="reference"):
        return StatisticRow("f", "psi", value, threshold=0.2, source=source)

    def ks(value):
        return StatisticRow("f", "ks_p_value", value, threshold=0.05, source="static")

    rows = {0: [psi(0.3), ks(0.5)],  # an effect beyond a calibrated threshold
            1: [psi(0.1), ks(0.5)],
            2: [psi(0.1), ks(0.01)],  # a p-value beyond its threshold
            3: [psi(0.2)],  # equal to its threshold: no evidence
            4: [psi(0.9, "static"), ks(0.5)]}  # an effect beyond a static threshold: noise on small windows
    for h, stats in rows.items():
        history.record_hour("m", T0 + h * HOUR, status="ok", n_rows=10, statistics=stats, reference_id="r")
    assert history.previous_evidence("m", ["f", "g"], T0 + 6 * HOUR, 6, reference_id="r") == {
        "f": [True, False, True, False, False, False], "g": [False] * 6}
    assert history.previous_evidence("m", ["f"], T0 + 6 * HOUR, 6, reference_id="other") == {"f": [False] * 6}
