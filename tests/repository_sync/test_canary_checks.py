"""Canary checks on what the challenger answered: expected behaviour, output health, quality
with labels and feature-space coverage (pure code, numpy and pandas inputs).

The analyses are judged from metrics text in Triton 2.51's format (the helper of
``test_canary.py``) plus logged requests built here; the same checks run against a real Triton and
NGINX in ``tests/pipelines/test_canary_analysis_pipeline.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from ground.exceptions import DataError
from repository_sync.canary.analysis import (
    CONTINUE,
    FAIL,
    INCONCLUSIVE,
    PASS,
    CoverageReference,
    analyse_step,
)
from repository_sync.canary.checks import (
    EXPECTED_SCORE_COLUMN,
    ExpectedBehaviour,
    Observations,
    binomial_lower_bound,
    coverage_check,
    important_features,
    ks_margin,
    quality_check,
    scores_of,
)
from repository_sync.canary.policy import CanaryPolicy
from tests.repository_sync.test_canary import MODEL, triton_metrics_text

POLICY = CanaryPolicy(steps=(50, 100), bake_s=60, min_requests=100, max_extensions=1,
                      max_mean_latency_ms=5000, max_latency_ratio=100, analysis_interval_s=5,
                      min_labels=40, coverage_min_requests=5)
HEALTHY = ({"6": {}, "7": {}}, {"6": {"success": 900, "duration_us": 900 * 1000},
                                "7": {"success": 300, "duration_us": 300 * 1000}})


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def log_rows(version: int, x: np.ndarray, score: np.ndarray, label=None) -> pd.DataFrame:
    frame = pd.DataFrame({"model_version": version, "x0": x[:, 0], "x1": x[:, 1], "probability": score})
    if label is not None:
        frame["label"] = label
    return frame


def observations(*frames, label=False) -> Observations:
    frame = pd.concat(frames, ignore_index=True)
    return Observations(frame, ("probability",), ("x0", "x1"), "label" if label else None)


def expected_from(x: np.ndarray, score: np.ndarray, with_inputs: bool = True) -> ExpectedBehaviour:
    frame = pd.DataFrame({EXPECTED_SCORE_COLUMN: score})
    if with_inputs:
        frame["x0"], frame["x1"] = x[:, 0], x[:, 1]
    return ExpectedBehaviour.from_frame(frame, source="shadow_replay", uri="memory://expected")


def analyse(obs=None, expected=None, final=True, before_after=HEALTHY, **kw):
    before, after = before_after
    return analyse_step(policy=kw.pop("policy", POLICY), model=MODEL, champion=6, challenger=7,
                        step=1, percent=50, attempt=1, window_start=0.0, window_end=60.0,
                        before_text=triton_metrics_text(before), after_text=triton_metrics_text(after),
                        observations=obs, expected=expected, final=final, **kw)


# ------------------------------------------------------------------------------ expected behaviour
def test_good_challenger_is_judged_against_its_own_predictions_not_the_stale_champion():
    rng = np.random.default_rng(1)
    x_shadow = rng.normal(size=(2000, 2))
    x_live = rng.normal(size=(300, 2))
    # after a concept drift the challenger predicts the opposite of the stale champion
    challenger = log_rows(7, x_live, sigmoid(-2 * x_live[:, 0]))
    champion = log_rows(6, x_live, sigmoid(2 * x_live[:, 0]))
    a = analyse(observations(challenger, champion), expected_from(x_shadow, sigmoid(-2 * x_shadow[:, 0])))
    assert a.verdict == PASS, a.reasons
    assert a.prediction_source == "shadow_replay" and a.prediction_ks < 0.2
    json.loads(a.to_json())


def test_challenger_that_serves_differently_from_its_evaluation_fails():
    rng = np.random.default_rng(2)
    x_shadow, x_live = rng.normal(size=(2000, 2)), rng.normal(size=(300, 2))
    # served with its features swapped: same model, wrong inputs
    served = log_rows(7, x_live, sigmoid(-2 * x_live[:, 1] + 1.5))
    a = analyse(observations(served), expected_from(x_shadow, sigmoid(-2 * x_shadow[:, 0])))
    assert a.verdict == FAIL
    assert any("vs the challenger's expected predictions (shadow_replay)" in r for r in a.reasons)


def test_expected_predictions_are_matched_on_inputs_when_the_input_mix_differs():
    """The replayed window had other inputs (another season): matched on inputs the same model
    passes, while a raw distribution comparison would have failed it."""
    rng = np.random.default_rng(3)
    x_shadow = rng.normal(0.0, 1.5, size=(3000, 2))
    x_live = rng.normal(1.2, 0.6, size=(400, 2))
    live = log_rows(7, x_live, sigmoid(2 * x_live[:, 0]))
    matched = analyse(observations(live), expected_from(x_shadow, sigmoid(2 * x_shadow[:, 0])))
    assert matched.verdict == PASS, matched.reasons
    assert matched.prediction_checks[0]["matched_on_inputs"] is True
    raw = analyse(observations(live), expected_from(x_shadow, sigmoid(2 * x_shadow[:, 0]), with_inputs=False))
    assert raw.verdict == FAIL and raw.prediction_checks[0]["matched_on_inputs"] is False


def test_small_samples_need_a_shift_beyond_the_sampling_margin():
    """Same distribution, 40 rows a side: the point estimates pass both thresholds (KS 0.25,
    PSI 1.2 from an empty decile), which is noise, not evidence."""
    assert ks_margin(40, 40, 0.95) > ks_margin(4000, 4000, 0.95)
    rng = np.random.default_rng(1)
    live, exp = rng.uniform(0.3, 0.7, size=40), rng.uniform(0.3, 0.7, size=40)
    x = rng.normal(size=(40, 2))
    a = analyse(observations(log_rows(7, x, live)), ExpectedBehaviour("mirror", exp),
                policy=CanaryPolicy(steps=(50, 100), min_requests=10, min_predictions=30,
                                    max_mean_latency_ms=5000, max_latency_ratio=100))
    assert a.prediction_ks > 0.2 and a.prediction_psi > 0.25
    assert a.verdict == PASS, a.reasons
    assert a.prediction_psi_margin is None  # too few rows per bin for the PSI to judge


def test_too_few_challenger_predictions_is_inconclusive():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(10, 2))
    a = analyse(observations(log_rows(7, x, sigmoid(x[:, 0]))), expected_from(x, sigmoid(x[:, 0])))
    assert a.verdict == INCONCLUSIVE and "fewer than min_predictions" in a.reasons[0]


def test_without_expected_behaviour_the_prediction_check_is_noted_not_passed_silently():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(200, 2))
    a = analyse(observations(log_rows(7, x, sigmoid(x[:, 0]))))
    assert a.verdict == PASS
    assert any("prediction check not evaluated" in r for r in a.reasons)


def test_scores_follow_the_shadow_evaluations_rule():
    frame = pd.DataFrame({"p0": [0.9, 0.2], "p1": [0.1, 0.8], "p2": [0.0, 0.0]})
    assert scores_of(frame, ["p1"]).tolist() == [0.1, 0.8]
    assert scores_of(frame, ["p0", "p1"]).tolist() == [0.1, 0.8]  # positive class
    assert scores_of(frame, ["p0", "p1", "p2"]) is None


def test_multi_class_outputs_are_compared_per_output_column():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(300, 2))
    probs = np.c_[sigmoid(x[:, 0]), 1 - sigmoid(x[:, 0]), np.zeros(300)]
    live = pd.DataFrame({"model_version": 7, "p0": probs[:, 0], "p1": probs[:, 1], "p2": probs[:, 2]})
    expected = ExpectedBehaviour("shadow_replay", np.zeros(0),
                                 columns={"p0": rng.uniform(size=500), "p1": sigmoid(rng.normal(size=500))})
    a = analyse(Observations(live, ("p0", "p1", "p2")), expected)
    assert [c["column"] for c in a.prediction_checks] == ["p0", "p1"]
    assert a.verdict == FAIL and any(r.startswith("p0: ") for r in a.reasons)


def softmax3(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    z = x @ w
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_multi_class_challenger_gets_a_per_class_shift_naming_the_class_that_moved():
    """The per-column checks judge; the classes together (predicted shares) name the culprit."""
    rng = np.random.default_rng(8)
    w = np.array([[2.0, -1.0, -1.0], [0.0, 1.5, -1.5]])
    x_shadow, x_live = rng.normal(size=(2000, 2)), rng.normal(size=(400, 2))
    cols = ["probability_0", "probability_1", "probability_2"]
    shadow = softmax3(x_shadow, w)
    frame = pd.DataFrame({EXPECTED_SCORE_COLUMN: shadow.argmax(axis=1).astype(float),
                          "x0": x_shadow[:, 0], "x1": x_shadow[:, 1]})
    for j, c in enumerate(cols):
        frame[f"expected.{c}"] = shadow[:, j]
    expected = ExpectedBehaviour.from_frame(frame, source="shadow_replay")

    def live(probs):
        out = pd.DataFrame({"model_version": 7, "x0": x_live[:, 0], "x1": x_live[:, 1]})
        out[cols] = probs
        return Observations(out, tuple(cols), ("x0", "x1"))

    same = analyse(live(softmax3(x_live, w)), expected)
    assert same.verdict == PASS, same.reasons
    classes = same.prediction_classes
    assert classes["columns"] == cols and classes["matched_on_inputs"] is True
    assert classes["max_ks"] < 0.15 and len(classes["per_class"]) == 3
    for row in classes["per_class"]:  # predicted shares agree within a few points
        assert abs(row["share_live"] - row["share_expected"]) < 0.06
    json.loads(same.to_json())
    # served with class 2's weights doubled: class 2 is predicted far more often
    moved = analyse(live(softmax3(x_live, w * np.array([1.0, 1.0, 3.0]))), expected)
    assert moved.verdict == FAIL
    assert moved.prediction_classes["worst_column"] == "probability_2"
    assert any(r.startswith("class probability_2 moved most") for r in moved.reasons), moved.reasons


def test_expected_predictions_without_the_score_column_are_refused():
    with pytest.raises(DataError, match="expected_score"):
        ExpectedBehaviour.from_frame(pd.DataFrame({"score": [0.1]}), source="shadow_replay")


# ------------------------------------------------------------------------------ hard output checks
def test_nan_outputs_roll_back_mid_bake():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(30, 2))
    a = analyse(observations(log_rows(7, x, np.full(30, np.nan))), final=False)
    assert a.verdict == FAIL and a.hard and not a.final
    assert "non-finite" in a.reasons[0] and a.predictions_nonfinite == 30


def test_a_single_nan_among_many_outputs_is_not_a_hard_failure():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(400, 2))
    score = sigmoid(x[:, 0])
    score[3] = np.nan
    a = analyse(observations(log_rows(7, x, score)), final=False)
    assert a.verdict == CONTINUE, a.reasons


def test_constant_outputs_roll_back_mid_bake_when_the_champion_varies():
    rng = np.random.default_rng(10)
    x = rng.normal(size=(50, 2))
    a = analyse(observations(log_rows(7, x, np.full(50, 0.5)), log_rows(6, x, sigmoid(x[:, 0]))), final=False)
    assert a.verdict == FAIL and a.hard and a.constant_outputs == ["probability"]
    few = analyse(observations(log_rows(7, x[:5], np.full(5, 0.5)), log_rows(6, x, sigmoid(x[:, 0]))),
                  final=False)
    assert few.verdict == CONTINUE  # 5 predictions are too few to call a model constant


def test_errors_roll_back_mid_bake_but_statistics_wait_for_the_end_of_the_bake():
    failing = ({"6": {}, "7": {}}, {"6": {"success": 100}, "7": {"success": 5, "failure": 30}})
    a = analyse(before_after=failing, final=False)
    assert a.verdict == FAIL and a.hard and "error rate" in a.reasons[0]
    low = ({"6": {}, "7": {}}, {"6": {"success": 100}, "7": {"success": 30}})
    assert analyse(before_after=low, final=False).verdict == CONTINUE  # 30 < min_requests: not yet
    assert analyse(before_after=low, final=True).verdict == INCONCLUSIVE


def test_one_failed_request_among_twenty_is_not_a_hard_failure():
    one = ({"6": {}, "7": {}}, {"6": {"success": 100}, "7": {"success": 24, "failure": 1}})
    assert analyse(before_after=one, final=False).verdict == CONTINUE
    assert binomial_lower_bound(1, 25, 0.95) < 0.01 < binomial_lower_bound(25, 25, 0.95)


def test_recent_errors_are_not_diluted_by_a_healthy_start_of_the_step():
    before = triton_metrics_text({"6": {}, "7": {}})
    recent = triton_metrics_text({"6": {"success": 5000}, "7": {"success": 5000}})
    after = triton_metrics_text({"6": {"success": 5100}, "7": {"success": 5000, "failure": 40}})
    a = analyse_step(policy=POLICY, model=MODEL, champion=6, challenger=7, step=1, percent=50,
                     attempt=1, window_start=0, window_end=30, before_text=before, after_text=after,
                     recent_before_text=recent, final=False)
    assert a.canary_error_rate < POLICY.max_error_rate  # 40 / 5040 over the whole step
    assert a.verdict == FAIL and "over the last interval" in a.reasons[0]


# ------------------------------------------------------------------------------ quality with labels
def test_flipped_challenger_fails_on_quality_when_labels_arrive():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(600, 2))
    y = (rng.uniform(size=600) < sigmoid(2 * x[:, 0])).astype(float)
    champ = log_rows(6, x[:300], sigmoid(2 * x[:300, 0]), y[:300])
    chal = log_rows(7, x[300:], sigmoid(-2 * x[300:, 0]), y[300:])
    a = analyse(observations(champ, chal, label=True))
    assert a.verdict == FAIL
    assert a.quality["metric"] == "auc" and a.quality["ci_high"] < -POLICY.max_quality_drop
    same = analyse(observations(champ, log_rows(7, x[300:], sigmoid(2 * x[300:, 0]), y[300:]), label=True))
    assert same.verdict == PASS and same.quality["evaluated"], same.reasons


def test_quality_needs_enough_labels_on_both_sides():
    q = quality_check([1, 0] * 5, [0.9, 0.1] * 5, [1, 0] * 50, [0.9, 0.1] * 50, metric="auc",
                      min_labels=40, confidence=0.95, max_drop=0.02)
    assert not q.evaluated and not q.failed and "fewer than min_labels=40" in q.note
    with pytest.raises(DataError, match="binary"):
        quality_check([2] * 50, [0.5] * 50, [1] * 50, [0.5] * 50, metric="auc", min_labels=2,
                      confidence=0.95, max_drop=0.02)


# ------------------------------------------------------------------------------ coverage
def test_bins_the_challenger_should_have_filled_make_the_step_inconclusive():
    rng = np.random.default_rng(12)
    reference = pd.DataFrame({"x0": rng.normal(size=5000), "x1": rng.normal(size=5000)})
    traffic = pd.DataFrame({"x0": rng.normal(size=2000), "x1": rng.normal(size=2000)})
    chal = np.zeros(2000, dtype=bool)
    chal[:200] = True
    traffic.loc[:199, "x0"] = np.abs(traffic.loc[:199, "x0"])  # the challenger only saw x0 >= 0
    cov = coverage_check(reference, ["x0", "x1"], traffic, chal, min_requests=5)
    assert not cov.covered and "x0 bins [0, 1, 2, 3" in cov.note
    assert cov.features[1].covered == cov.features[1].required == 10


def test_bins_live_traffic_does_not_reach_are_not_required():
    rng = np.random.default_rng(13)
    reference = pd.DataFrame({"x0": rng.uniform(-1, 1, size=5000)})
    traffic = pd.DataFrame({"x0": rng.uniform(0, 1, size=1000)})  # only one half of the space
    cov = coverage_check(reference, ["x0"], traffic, np.arange(1000) % 4 == 0, min_requests=5)
    assert cov.covered and 0.5 <= cov.reached_ratio <= 0.6  # the decile holding 0 is shared
    assert cov.features[0].required == 5


def test_uncovered_feature_space_extends_the_step_through_the_analysis():
    rng = np.random.default_rng(14)
    ref = pd.DataFrame({"x0": rng.normal(size=3000), "x1": rng.normal(size=3000)})
    x = rng.normal(size=(1000, 2))
    served = np.arange(1000) < 150
    x[served, 1] = np.abs(x[served, 1])
    frame = pd.concat([log_rows(7, x[served], sigmoid(x[served, 0])),
                       log_rows(6, x[~served], sigmoid(x[~served, 0]))], ignore_index=True)
    a = analyse(observations(frame), coverage_reference=CoverageReference(ref, ("x1", "x0")))
    assert a.verdict == INCONCLUSIVE and "feature space not covered" in a.reasons[0]
    assert a.coverage["features"][0]["feature"] == "x1" and a.coverage_ratio < 1


def test_important_features_are_ranked_by_importance_or_all_kept():
    assert important_features(["a", "b", "c"], {"c": 0.7, "a": 0.2}, 2) == ["c", "a"]
    assert important_features(["a", "b", "c"], None, 2) == ["a", "b", "c"]
    assert important_features(["a", "b"], {"b": 1.0}, 0) == ["a", "b"]


def test_a_fail_from_what_could_not_be_measured_is_unjudged_a_measured_one_is_not():
    """Only a measured failure may reject the challenger (canary_promotion tags it rejected)."""
    failing = ({"6": {}, "7": {}}, {"6": {"success": 100}, "7": {"success": 5, "failure": 30}})
    assert not analyse(before_after=failing, final=False).unjudged
    blind = analyse(final=True, metrics_error="connection refused")
    assert blind.verdict == FAIL and blind.unjudged
    no_log = analyse(final=True, observations_error="log unreadable")
    assert no_log.verdict == FAIL and no_log.unjudged
    both = analyse(before_after=failing, final=True, observations_error="log unreadable")
    assert both.verdict == FAIL and not both.unjudged  # the error rate judged it
    assert not analyse(final=True).unjudged  # a pass
