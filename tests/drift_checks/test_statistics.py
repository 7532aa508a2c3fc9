"""Drift statistics: values against scipy, direction, degenerate inputs."""

import math

import numpy as np
import pytest
from scipy import stats

from drift_checks import statistics as st


def _pair(a, b):
    return st.NumericPair(st.prepare_numeric(a), st.prepare_numeric(b))


@pytest.mark.parametrize("n_ref,n_cur", [(300, 500), (20_000, 30_000)])
def test_ks_matches_scipy_ks_2samp_exact_and_asymptotic(n_ref, n_cur):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=n_ref), rng.normal(0.05, 1.0, size=n_cur)
    ours = st.ks_p_value(_pair(a, b))
    ref = stats.ks_2samp(a, b)
    assert ours.extra["statistic"] == pytest.approx(ref.statistic, abs=1e-12)
    assert ours.value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)


def test_wasserstein_normed_matches_scipy_divided_by_reference_std():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=5000), rng.normal(0.5, 2.0, size=7000)
    r = st.wasserstein_normed(_pair(a, b))
    assert r.value == pytest.approx(stats.wasserstein_distance(a, b) / np.std(a), rel=1e-9)


def test_psi_is_zero_for_identical_data_and_large_for_a_shift():
    rng = np.random.default_rng(3)
    a = rng.normal(size=10_000)
    assert st.psi(_pair(a, a)).value == pytest.approx(0.0, abs=1e-12)
    assert st.psi(_pair(a, a + 1.0)).value > 0.2


@pytest.mark.parametrize("fn", [st.ks_p_value, st.psi, st.wasserstein_normed])
def test_numeric_degenerate_inputs_get_explicit_status_never_nan(fn):
    assert fn(_pair([1.0, 2.0], [])).status == "empty"
    r = fn(_pair([1.0, 2.0], [np.nan, np.nan]))
    assert r.status == "all_null" and r.value is None
    const = fn(_pair([5.0] * 50, [5.0] * 40))
    assert const.status == "constant" and const.value is not None and math.isfinite(const.value)


def test_constant_reference_against_a_shifted_window_is_drift_not_nan():
    r = st.wasserstein_normed(_pair([5.0] * 50, [6.0] * 40))
    assert math.isfinite(r.value) and st.REGISTRY["wasserstein_normed"].is_drift(r.value, 0.1)


def test_same_window_scored_twice_gives_identical_results():
    rng = np.random.default_rng(4)
    ref, cur = st.prepare_numeric(rng.lognormal(size=50_000)), rng.lognormal(0.1, size=40_000)
    first = st.score_numeric(ref, st.prepare_numeric(cur))
    second = st.score_numeric(ref, st.prepare_numeric(cur.copy()))
    assert {k: v.to_dict() for k, v in first.items()} == {k: v.to_dict() for k, v in second.items()}


# ------------------------------------------------------------------ chi-square scaling
REFERENCE_APPROVAL_COUNTS = {"approved": 240, "declined": 960}


@pytest.mark.parametrize("current,drift", [({"approved": 60, "declined": 240}, False),
                                           ({"approved": 90, "declined": 210}, True)])
def test_chi_square_scales_expected_counts_to_the_window_size(current, drift):
    r = st.chi_square_p_value(st.CategoricalPair(REFERENCE_APPROVAL_COUNTS, current))
    if drift:
        assert r.value < 1e-3
    else:
        assert r.value == pytest.approx(1.0)
    assert st.REGISTRY["chi_square_p_value"].is_drift(r.value, 0.05) is drift


def test_every_categorical_score_ignores_window_size_for_the_same_mix():
    small = st.score_categorical(REFERENCE_APPROVAL_COUNTS, {"approved": 6, "declined": 24})
    large = st.score_categorical(REFERENCE_APPROVAL_COUNTS, {"approved": 2400, "declined": 9600})
    for scores in (small, large):
        assert scores["jensen_shannon"].value == pytest.approx(0.0, abs=1e-9)
        assert scores["chi_square_p_value"].value == pytest.approx(1.0)
        assert scores["unseen_share"].value == 0.0


def test_category_counts_from_raw_rows_equal_stored_histograms():
    rows = ["approved"] * 60 + ["declined"] * 240
    assert st.category_counts(rows) == {"approved": 60, "declined": 240}


def test_unseen_categories_are_counted_and_do_not_break_chi_square():
    scores = st.score_categorical({"a": 50, "b": 50}, {"a": 40, "b": 40, "new": 20})
    assert scores["unseen_share"].value == pytest.approx(0.2)
    assert scores["unseen_share"].extra["unseen"] == {"new": pytest.approx(0.2)}
    assert 0 <= scores["chi_square_p_value"].value < 1e-3


def test_categorical_degenerate_inputs_get_explicit_status():
    assert st.jensen_shannon(st.CategoricalPair({"a": 3}, {}, current_rows=0)).status == "empty"
    r = st.chi_square_p_value(st.CategoricalPair({"a": 3}, {}, current_rows=5))
    assert r.status == "all_null" and r.value is None


def test_registry_metadata_gives_direction_and_documented_threshold():
    for s in st.REGISTRY.values():
        assert s.direction in ("p_value", "distance") and s.threshold_source
    assert st.REGISTRY["ks_p_value"].is_drift(0.01, 0.05) is True
    assert st.REGISTRY["psi"].is_drift(0.01, 0.1) is False
    assert st.REGISTRY["psi"].is_drift(float("nan"), 0.1) is None
    with pytest.raises(KeyError, match="not registered"):
        st.statistics_for("numeric", ["nope"])


def test_ks_and_wasserstein_match_scipy_on_tied_integer_values():
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 12, 4000).astype(float), rng.integers(1, 14, 6000).astype(float)
    pair = _pair(a, b)
    assert st.ks_p_value(pair).extra["statistic"] == pytest.approx(stats.ks_2samp(a, b).statistic, abs=1e-12)
    assert st.wasserstein_normed(pair).extra["wasserstein"] == pytest.approx(
        stats.wasserstein_distance(a, b), rel=1e-9)


def test_large_window_ks_p_value_stays_within_documented_error_of_the_finite_n_distribution():
    rng = np.random.default_rng(6)
    n = 2 * st.KS_KSTWO_MAX_EN + 4000  # effective size above the kstwo cut-off
    a, b = rng.normal(size=n), rng.normal(0.01, 1.0, size=n)
    ours = st.ks_p_value(_pair(a, b))
    exact = stats.kstwo.sf(ours.extra["statistic"], round(n * n / (2 * n)))
    assert ours.extra["statistic"] == pytest.approx(stats.ks_2samp(a, b).statistic, abs=1e-12)
    assert abs(ours.value - exact) < 1e-3


# ------------------------------------------------------------------ one implementation, strictness
def test_shadow_evaluation_scores_psi_and_ks_with_the_registry_on_tied_values():
    """Shadow evaluation and the drift check give the same PSI and KS on the same arrays, also
    when many values sit exactly on a bin edge (rounded scores)."""
    from model_registry import shadow

    rng = np.random.default_rng(7)
    champion = np.round(rng.beta(2, 5, 3000), 1)
    challenger = np.round(rng.beta(2.5, 5, 3000), 1)
    ours = st.compare_numeric(champion, challenger, ["psi", "ks_p_value"])
    assert shadow.psi(champion, challenger) == pytest.approx(ours["psi"].value, rel=1e-12)
    shift = shadow.output_shift(champion, challenger)
    assert shift["psi"] == pytest.approx(ours["psi"].value, rel=1e-12)
    assert shift["ks_statistic"] == pytest.approx(ours["ks_p_value"].extra["statistic"], abs=1e-12)
    assert shift["ks_pvalue"] == pytest.approx(ours["ks_p_value"].value, rel=1e-9)


def test_psi_of_a_discrete_reference_gives_each_value_its_own_bin_and_new_values_count():
    ref = np.repeat([0.0, 1.0, 2.0], [500, 300, 200])
    same = np.repeat([0.0, 1.0, 2.0], [250, 150, 100])
    assert st.psi_value(ref, same) == pytest.approx(0.0, abs=1e-12)
    moved = np.repeat([0.0, 1.0, 2.0], [200, 150, 150])
    expected = st.psi_from_counts([500, 300, 200, 0], [200, 150, 150, 0])
    assert st.psi_value(ref, moved) == pytest.approx(expected, rel=1e-12)
    # values the reference never had go to their own bin instead of hiding in a neighbour
    assert st.psi_value(ref, np.full(100, 3.0)) > 5


def test_psi_from_streamed_bin_counts_equals_psi_of_the_raw_window():
    rng = np.random.default_rng(8)
    ref = st.prepare_numeric(rng.normal(size=20_000))
    window = rng.normal(0.3, 1.0, 6000)
    bins = st.psi_edges(ref.values)
    streamed = sum(st.bin_counts(part, bins) for part in np.array_split(window, 7))
    reference_counts = st.bin_counts(ref.values, bins, is_sorted=True)
    assert st.psi_from_counts(reference_counts, streamed) == pytest.approx(
        st.psi_value(ref.values, window), rel=1e-12)


def test_a_value_equal_to_its_threshold_is_never_drift():
    for s in st.REGISTRY.values():
        assert s.is_drift(0.3, 0.3) is False
    assert st.REGISTRY["psi"].is_drift(0.31, 0.3) and st.REGISTRY["ks_p_value"].is_drift(0.01, 0.05)


def test_thresholds_are_bounded_by_the_minimum_effect_of_each_statistic():
    assert st.REGISTRY["psi"].bounded(0.0) == 0.1
    assert st.REGISTRY["wasserstein_normed"].bounded(0.02) == 0.1
    assert st.REGISTRY["ks_p_value"].bounded(0.4) == 0.05  # never above the static alpha
    assert st.REGISTRY["ks_p_value"].bounded(1e-6) == 1e-6


def test_psi_reports_its_saturation_cap():
    rng = np.random.default_rng(9)
    r = st.compare_numeric(rng.normal(size=5000), np.full(200, 50.0), ["psi"])["psi"]
    assert r.value == pytest.approx(r.extra["cap"], rel=1e-12)


# ------------------------------------------------------------------ types: nulls, infinities
def test_infinite_values_are_reported_as_infinite_not_as_null():
    s = st.prepare_numeric([1.0, np.inf, np.nan, None, -np.inf, np.inf, 2.0])
    assert (s.n_null, s.n_pos_inf, s.n_neg_inf, s.n_infinite) == (2, 2, 1, 3)
    assert list(s.values) == [1.0, 2.0]


def test_nullable_integer_columns_are_scored_like_numbers():
    import pandas as pd

    col = pd.Series([1, None, 3, 4, None], dtype="Int64")
    s = st.prepare_numeric(col)
    assert list(s.values) == [1.0, 3.0, 4.0] and s.n_null == 2


# ------------------------------------------------------------------ categories: unseen and vanished
def test_vanished_categories_are_listed_beside_unseen_ones_with_shares():
    r = st.score_categorical({"a": 50, "b": 30, "c": 20}, {"a": 60, "new": 40})["unseen_share"]
    assert r.extra["unseen"] == {"new": pytest.approx(0.4)}
    assert r.extra["vanished"] == {"b": pytest.approx(0.3), "c": pytest.approx(0.2)}
    assert (r.extra["n_unseen"], r.extra["n_vanished"]) == (1, 2)


def test_a_small_window_against_a_large_reference_gives_scipy_s_ks_and_wasserstein():
    """The binary-search path (window much smaller than the reference) equals scipy, ties too."""
    rng = np.random.default_rng(10)
    for trial in range(40):
        m = int(rng.integers(200, 3000))
        n = int(rng.integers(1, m // 8 + 1))
        if trial % 2:
            a, b = rng.integers(0, 15, m).astype(float), rng.integers(-3, 18, n).astype(float)
        else:
            a, b = rng.normal(size=m), rng.normal(rng.normal(), rng.uniform(0.2, 3), n)
        d, w = _pair(a, b).d_and_w1
        assert d == pytest.approx(stats.ks_2samp(a, b).statistic, abs=1e-12)
        assert w == pytest.approx(stats.wasserstein_distance(a, b), rel=1e-9, abs=1e-12)
