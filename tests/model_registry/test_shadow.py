"""Shadow evaluation on real NOAA windows: a champion trained before the concept drift at day
12,000 against a challenger trained after it, scored on a late window (days 16,000-17,000)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from drift_checks import shadow_metrics
from ground.exceptions import DataError
from ground.settings import Settings
from model_registry import datasets as ds
from model_registry import shadow as sh
from model_registry.noaa_model import train_noaa


@pytest.fixture(scope="module")
def noaa():
    return ds.load_noaa(with_timestamps=True)


@pytest.fixture(scope="module")
def early(noaa):
    """Trained before the drift (days 0-8,000)."""
    return train_noaa(ds.window(noaa, 0, 8000))


@pytest.fixture(scope="module")
def recent(noaa):
    """Trained after the drift (days 12,000-16,000)."""
    return train_noaa(ds.window(noaa, 12_000, 16_000))


@pytest.fixture(scope="module")
def late(noaa, early, recent):
    """Late window (days 16,000-17,000): labels and both versions' scores."""
    w = ds.window(noaa, 16_000, 17_000)
    return (w[ds.LABEL_COLUMN].to_numpy().astype(float), early.predict_scores(w),
            recent.predict_scores(w))


RULE = sh.DecisionRule(confidence=0.95, margin=0.05, min_labels=200, n_boot=1000, seed=7)


def test_challenger_trained_after_the_shift_wins_with_the_stated_confidence(late, early):
    y, champion, challenger = late
    decision = sh.evaluate(y, champion, challenger, rule=RULE,
                           champion_reference=early.metrics["validation_auc"])
    assert decision.verdict is sh.Verdict.CHALLENGER_WINS
    assert decision.outcome is sh.Outcome.PROMOTE_CHALLENGER
    auc = decision.comparisons["auc"]
    assert auc.ci_low >= RULE.margin  # the rule, at 95 %
    assert auc.challenger == pytest.approx(roc_auc_score(y, challenger))
    assert auc.champion == pytest.approx(roc_auc_score(y, champion))
    assert decision.champion_degraded is True  # far below its own hold-out AUC
    assert decision.n_labelled == 1000 and decision.n_rows == 1000


def test_reverse_comparison_early_challenger_against_recent_champion_loses(late, recent):
    y, early_scores, recent_scores = late
    decision = sh.evaluate(y, recent_scores, early_scores, rule=RULE,
                           champion_reference=recent.metrics["validation_auc"])
    assert decision.verdict is sh.Verdict.CHALLENGER_LOSES
    assert decision.comparisons["auc"].ci_high < 0
    assert decision.champion_degraded is False
    assert decision.outcome is sh.Outcome.NOTHING


@pytest.mark.parametrize("labels", ["none", "all_nan"])
def test_window_without_labels_is_inconclusive_never_a_win(late, labels):
    y, champion, challenger = late
    given = None if labels == "none" else np.full_like(y, np.nan)
    decision = sh.evaluate(given, champion, challenger, rule=RULE)
    assert decision.verdict is sh.Verdict.INCONCLUSIVE
    assert decision.outcome is sh.Outcome.INCONCLUSIVE
    assert decision.comparisons == {} and decision.champion_degraded is None
    assert decision.n_labelled == 0
    # the output comparison still runs on the unlabelled rows
    assert decision.agreement is not None and decision.output_shift["psi"] > 0
    assert "only 0 labelled rows" in decision.reasons[0]


def test_fewer_labels_than_min_labels_is_inconclusive_even_with_a_large_gap(late):
    y, champion, challenger = late
    partial = y.copy()
    partial[RULE.min_labels - 1:] = np.nan  # labels arrived for 199 rows only
    assert sh.evaluate(partial, champion, challenger, rule=RULE).verdict is sh.Verdict.INCONCLUSIVE
    partial = y.copy()
    partial[RULE.min_labels + 100:] = np.nan
    decision = sh.evaluate(partial, champion, challenger, rule=RULE)
    assert decision.n_labelled == RULE.min_labels + 100
    assert decision.verdict is sh.Verdict.CHALLENGER_WINS


def test_same_model_twice_shows_no_difference_and_full_agreement(late):
    y, _, scores = late
    decision = sh.evaluate(y, scores, scores.copy(), rule=RULE)
    assert decision.verdict is sh.Verdict.NO_DIFFERENCE
    assert decision.outcome is sh.Outcome.NOTHING
    assert decision.agreement == 1.0
    assert decision.output_shift["ks_statistic"] == 0.0 and decision.output_shift["psi"] == 0.0
    assert decision.comparisons["auc"].ci_low == decision.comparisons["auc"].ci_high == 0.0


def test_guardrail_worse_than_tolerance_makes_a_better_auc_challenger_lose(late):
    y, champion, challenger = late
    # same ranking as the recent model (same AUC) but every score >= 0.5: predicts "rain" always
    squashed = 0.5 + 0.5 * challenger
    decision = sh.evaluate(y, champion, squashed, rule=RULE)
    assert decision.comparisons["auc"].ci_low >= RULE.margin
    assert decision.comparisons["accuracy"].improvement < -RULE.guardrail_tolerance
    assert decision.verdict is sh.Verdict.CHALLENGER_LOSES
    assert any("guardrail accuracy" in r for r in decision.reasons)
    without = sh.DecisionRule(**{**RULE.as_dict(), "guardrail_metrics": ()})
    assert sh.evaluate(y, champion, squashed, rule=without).verdict is sh.Verdict.CHALLENGER_WINS


def test_degraded_champion_without_challenger_asks_for_retraining(noaa, early):
    reference = early.metrics["validation_auc"]
    late_w = ds.window(noaa, 16_000, 17_000)
    decision = sh.evaluate(late_w[ds.LABEL_COLUMN].to_numpy(), early.predict_scores(late_w), None,
                           rule=RULE, champion_reference=reference)
    assert decision.verdict is sh.Verdict.NO_CHALLENGER
    assert decision.champion_degraded is True and decision.outcome is sh.Outcome.RETRAIN
    pre_drift = ds.window(noaa, 9000, 10_000)  # same concept as its training rows
    healthy = sh.evaluate(pre_drift[ds.LABEL_COLUMN].to_numpy(), early.predict_scores(pre_drift),
                          None, rule=RULE, champion_reference=reference)
    assert healthy.champion_degraded is False and healthy.outcome is sh.Outcome.NOTHING


def test_champion_floor_flags_degradation_without_a_reference(late, recent):
    y, _, recent_scores = late
    auc = roc_auc_score(y, recent_scores)
    high_floor = sh.DecisionRule(champion_floor=auc + 0.01, n_boot=200)
    low_floor = sh.DecisionRule(champion_floor=auc - 0.01, n_boot=200)
    assert sh.evaluate(y, recent_scores, None, rule=high_floor).outcome is sh.Outcome.RETRAIN
    assert sh.evaluate(y, recent_scores, None, rule=low_floor).outcome is sh.Outcome.NOTHING


def test_loser_against_a_degraded_champion_triggers_retraining(late, early):
    y, early_scores, _ = late
    rng = np.random.default_rng(3)
    noisy = np.clip(early_scores + rng.normal(0, 0.05, early_scores.size), 0, 1)
    decision = sh.evaluate(y, early_scores, noisy, rule=RULE,
                           champion_reference=early.metrics["validation_auc"])
    assert decision.verdict in (sh.Verdict.NO_DIFFERENCE, sh.Verdict.CHALLENGER_LOSES)
    assert decision.outcome is sh.Outcome.RETRAIN


def test_bootstrap_is_seeded_paired_and_reproducible(late):
    y, champion, challenger = late
    run = lambda seed: sh.paired_bootstrap(y, champion, challenger, metrics=["auc", "f1"],  # noqa: E731
                                           n_boot=300, seed=seed)
    first, again, other = run(1), run(1), run(2)
    assert first == again
    assert first["auc"].ci_low != other["auc"].ci_low
    assert first["auc"].ci_low < first["auc"].improvement < first["auc"].ci_high
    assert first["auc"].n_boot_used == 300


def test_vectorised_bootstrap_auc_equals_sklearn_roc_auc_score_on_resamples(late):
    y, champion, _ = late
    idx = np.random.default_rng(5).integers(0, y.size, size=(20, y.size))
    vectorised = shadow_metrics.bootstrap_metric("auc", y, champion, idx, 0.5)
    np.testing.assert_allclose(vectorised, [roc_auc_score(y[i], champion[i]) for i in idx])
    f1 = shadow_metrics.bootstrap_metric("f1", y, champion, idx, 0.5)
    from sklearn.metrics import f1_score
    np.testing.assert_allclose(f1, [f1_score(y[i], champion[i] >= 0.5) for i in idx])


def test_psi_is_zero_for_the_same_outputs_and_large_across_the_drift(noaa, early):
    before = early.predict_scores(ds.window(noaa, 9000, 10_000))
    after = early.predict_scores(ds.window(noaa, 16_000, 17_000))
    assert sh.psi(before, before) == 0.0
    assert sh.psi(before, after) > 0.1  # at least a "moderate shift" (Siddiqi 2006)
    shift = sh.output_shift(before, after)
    assert shift["ks_pvalue"] < 0.01


def test_regression_improvement_is_sign_adjusted_so_lower_rmse_wins(noaa):
    y = ds.window(noaa, 16_000, 17_000)["maximum_temperature"].to_numpy()
    rng = np.random.default_rng(11)
    champion = y + rng.normal(0, 0.5, y.size)
    challenger = y + rng.normal(0, 0.1, y.size)
    rule = sh.DecisionRule(task="regression", primary_metric="rmse", guardrail_metrics=("mae",),
                           n_boot=300)
    decision = sh.evaluate(y, champion, challenger, rule=rule)
    rmse = decision.comparisons["rmse"]
    assert rmse.challenger < rmse.champion and rmse.improvement > 0
    assert decision.verdict is sh.Verdict.CHALLENGER_WINS
    assert decision.agreement == pytest.approx(np.mean(np.abs(champion - challenger)))
    assert sh.evaluate(y, challenger, champion, rule=rule).verdict is sh.Verdict.CHALLENGER_LOSES


def test_evidence_is_strict_json_and_the_report_states_outcome_and_interval(late):
    y, champion, challenger = late
    decision = sh.evaluate(y, champion, challenger, rule=RULE)
    evidence = json.loads(decision.evidence_json())
    assert evidence["outcome"] == "promote_challenger"
    assert evidence["rule"]["confidence"] == 0.95
    assert evidence["comparisons"]["auc"]["ci_low"] == decision.comparisons["auc"].ci_low
    report = decision.report_markdown("noaa v1", "noaa v2")
    assert "**Outcome: `promote_challenger`**" in report
    assert f"{decision.comparisons['auc'].ci_low:+.4f}" in report
    assert "| auc (higher is better) | primary | " in report
    undefined = sh.evaluate(np.zeros(300), champion[:300], challenger[:300], rule=RULE)
    assert undefined.verdict is sh.Verdict.INCONCLUSIVE  # one class only: AUC undefined
    json.loads(undefined.evidence_json())


def test_bad_inputs_are_refused_naming_field_and_value(late):
    y, champion, challenger = late
    with pytest.raises(DataError, match="challenger outputs have 999 rows, champion outputs 1000"):
        sh.evaluate(y, champion, challenger[:-1])
    bad = y.copy()
    bad[3] = 2
    with pytest.raises(DataError, match=r"labels\[3\]=2.0 is not a binary label"):
        sh.evaluate(bad, champion, challenger, rule=RULE)
    broken = champion.copy()
    broken[10] = np.nan
    with pytest.raises(DataError, match=r"champion outputs\[10\]=nan is not finite"):
        sh.evaluate(y, broken, challenger)
    with pytest.raises(DataError, match="confidence=1.5 is invalid"):
        sh.DecisionRule(confidence=1.5)
    with pytest.raises(DataError, match="primary_metric='rmse' is not a classification metric"):
        sh.DecisionRule(primary_metric="rmse")
    with pytest.raises(DataError, match="shape"):
        sh.evaluate(None, np.zeros((5, 3)), None)


def test_rule_reads_the_shadow_settings():
    settings = Settings.from_env({
        "TRITONFLOW_SHADOW_MIN_LABELS": "500", "TRITONFLOW_SHADOW_CONFIDENCE": "0.9",
        "TRITONFLOW_SHADOW_MARGIN": "0.03", "TRITONFLOW_SHADOW_N_BOOT": "250",
    })
    rule = sh.DecisionRule.from_settings(settings)
    assert (rule.min_labels, rule.confidence, rule.margin, rule.n_boot) == (500, 0.9, 0.03, 250)
    assert rule.champion_floor is None  # NaN default: floor off
    floored = Settings.from_env({"TRITONFLOW_SHADOW_CHAMPION_FLOOR": "0.7"})
    assert sh.DecisionRule.from_settings(floored, primary_metric="f1").champion_floor == 0.7


# ------------------------------------------------------------------------------- class order
def test_onnx_classifier_names_its_classes_in_probability_column_order():
    from mlflow.models import infer_signature
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    from drift_checks.multiclass import onnx_class_labels
    from ground.settings import get_settings
    from model_registry.conversion import convert_sklearn

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    names = np.array(["virginica", "setosa", "versicolor"])[y]  # sklearn sorts: setosa, versicolor, virginica
    for target, want in ((y, [0, 1, 2]), (names, ["setosa", "versicolor", "virginica"])):
        clf = LogisticRegression(max_iter=500).fit(X, target)
        onnx_model = convert_sklearn(clf, infer_signature(X, clf.predict_proba(X)), model_name="m",
                                     settings=get_settings()).onnx_model
        assert onnx_class_labels(onnx_model) == want == list(clf.classes_)


def test_labels_are_mapped_to_class_indices_and_an_unknown_one_is_named():
    from drift_checks.multiclass import class_indices

    classes = ["setosa", "versicolor", "virginica"]
    got = class_indices(["virginica", None, "setosa", float("nan"), "versicolor"], classes)
    np.testing.assert_array_equal(got, [2, np.nan, 0, np.nan, 1])
    np.testing.assert_array_equal(class_indices([3, 1.0, "2"], [1, 2, 3]), [2, 0, 1])  # class values
    with pytest.raises(DataError, match=r"labels\[1\]='unicorn' is not a class of the model; known classes.*"
                                        r"\['setosa', 'versicolor', 'virginica'\]"):
        class_indices(["setosa", "unicorn"], classes)
    np.testing.assert_array_equal(class_indices([0, 2, None], None), [0, 2, np.nan])  # indices already
    with pytest.raises(DataError, match="'setosa' is not a class index and the model's class order is unknown"):
        class_indices(["setosa"], None)


def test_a_challenger_in_another_class_order_is_reordered_and_other_classes_are_refused():
    from tritonflow.pipelines.shadow_classes import align

    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])  # columns: c, a, b
    np.testing.assert_array_equal(align(["a", "b", "c"], ["c", "a", "b"], p, "m"), p[:, [1, 2, 0]])
    assert align(["a", "b", "c"], None, p, "m") is p  # unknown order: taken as is
    with pytest.raises(DataError, match=r"m: the challenger's classes \['a', 'b', 'd'\] differ"):
        align(["a", "b", "c"], ["a", "b", "d"], p, "m")
