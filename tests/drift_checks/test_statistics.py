"""Drift statistics: values against scipy, direction, degenerate inputs, case H17."""

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


# ------------------------------------------------------------------ H17: chi-square scaling
H17_REF = {"approved": 240, "declined": 960}


@pytest.mark.parametrize("current,drift", [({"approved": 60, "declined": 240}, False),
                                           ({"approved": 90, "declined": 210}, True)])
def test_h17_chi_square_scales_expected_counts_to_the_window_size(current, drift):
    r = st.chi_square_p_value(st.CategoricalPair(H17_REF, current))
    if drift:
        assert r.value < 1e-3
    else:
        assert r.value == pytest.approx(1.0)
    assert st.REGISTRY["chi_square_p_value"].is_drift(r.value, 0.05) is drift


def test_h17_every_categorical_score_ignores_window_size_for_the_same_mix():
    small = st.score_categorical(H17_REF, {"approved": 6, "declined": 24})
    large = st.score_categorical(H17_REF, {"approved": 2400, "declined": 9600})
    for scores in (small, large):
        assert scores["jensen_shannon"].value == pytest.approx(0.0, abs=1e-9)
        assert scores["chi_square_p_value"].value == pytest.approx(1.0)
        assert scores["unseen_share"].value == 0.0


def test_h17_category_counts_from_raw_rows_equal_stored_histograms():
    rows = ["approved"] * 60 + ["declined"] * 240
    assert st.category_counts(rows) == {"approved": 60, "declined": 240}


def test_unseen_categories_are_counted_and_do_not_break_chi_square():
    scores = st.score_categorical({"a": 50, "b": 50}, {"a": 40, "b": 40, "new": 20})
    assert scores["unseen_share"].value == pytest.approx(0.2)
    assert scores["unseen_share"].extra["unseen"] == ["new"]
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
