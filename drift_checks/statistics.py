"""Registry of drift statistics: pure, deterministic functions with their metadata.

The ONE implementation of PSI, Kolmogorov-Smirnov, Wasserstein, Jensen-Shannon and chi-square
in tritonflow: the hourly drift check, the backtest, shadow evaluation and canary analysis call
these functions (arrays in, numbers out; see :func:`compare_numeric`, :func:`psi_value`,
:func:`ks_test` for two plain 1-D arrays, :func:`psi_from_counts` for stored or streamed bin
counts and :func:`score_categorical` for count histograms).

Every statistic compares a *reference* sample with a *current* window for one feature and
returns a :class:`StatisticResult`. Each registry entry (:class:`Statistic`) carries:

* ``kind``: ``"numeric"`` or ``"categorical"``;
* ``direction``: ``"p_value"`` (drift when ``value < threshold``: the bad tail is LOW) or
  ``"distance"`` (drift when ``value > threshold``: the bad tail is HIGH). Comparisons are
  STRICT: a value equal to its threshold is never drift (a statistic that sits at the same
  value hour after hour, or at its saturation cap, cannot alarm by equality);
* ``role`` in the per-feature vote (:mod:`drift_checks.policy`): ``"significance"`` (p-values:
  is the difference beyond sampling noise?), ``"effect"`` (distances: is it large enough to
  matter?) or ``"guard"`` (unseen-category share: fires on its own, abstains otherwise);
* ``default_threshold`` (the static threshold) and ``threshold_source``;
* ``minimum_effect``: no threshold of an effect or guard statistic is ever below it (the floor
  of :mod:`drift_checks.thresholds`); for p-values the static threshold is also the HIGHEST
  threshold ever used;
* ``strong_effect``: the size from which an effect is large (the ceiling of a learned
  threshold; a value above it always flags); ``None`` for p-values;
* degenerate-input behaviour: an empty side gives status ``"empty"``, a side whose values are all
  null gives ``"all_null"``; both with ``value=None`` (never a silent NaN). A constant reference
  column gives status ``"constant"`` with a value where the statistic is still defined.

Thresholds and their sources (static values):

* K-S p-value 0.05, chi-square p-value 0.05, PSI 0.1, normalised Wasserstein 0.1: Evidently 0.7's
  defaults (``evidently/legacy/calculations/stattests``); the issue-12 minimum effects.
* Jensen-Shannon distance 0.05 (Evidently: 0.1): a 20/80 -> 30/70 shift of a binary category has
  JS distance 0.082, a change any user wants to see once it is significant.
* Strong effects: PSI 0.25 (Siddiqi, *Credit Risk Scorecards*, 2006: "significant shift"),
  Wasserstein 0.5 reference standard deviations, JS 0.2, unseen share 0.2 (tritonflow choices).
* Unseen-category share 0.05 (tritonflow choice: 5 % of the window's rows in categories the
  reference never saw); minimum effect 0.01.

Numeric inputs are prepared once with :func:`prepare_numeric` (finite values, sorted; nulls and
infinities counted separately), so the reference side can be prepared once per model version and
reused every hour. All numeric statistics run in O(n log n) with numpy ``sort``/``searchsorted``;
results are bit-for-bit identical when the same window is scored twice (no sampling).
A window too large to hold in memory is scored from its streamed summary
(:mod:`drift_checks.summaries`): the current side is then a
:class:`drift_checks.sketches.SketchSample` (exact PSI bin counts, a KLL sketch for the ECDF),
scored by these same functions; KS and Wasserstein then carry the sketch's error bound
(``extra["error_bound"]``, see :mod:`drift_checks.sketches`).

PSI bins (:mod:`drift_checks.binning`, re-exported here): the reference's deciles; a reference
with at most :data:`PSI_BINS` distinct values gets one bin per distinct value plus one for every
other value. :func:`psi_edges` + :func:`bin_counts` + :func:`psi_from_counts` are the three
steps, so counts accumulated elsewhere (streamed windows, stored histograms) give the same PSI.

Categorical inputs are count histograms (``{category: count}``), so the same functions score raw
windows and stored hourly count histograms alike. Chi-square always scales the expected
frequencies to the current window's size.

Layout: :mod:`drift_checks.statistic_types` (results and registry entries),
:mod:`drift_checks.numeric_statistics` and :mod:`drift_checks.categorical_statistics` (the
statistics); this module holds the registry and the scoring entry points, and re-exports the
public names of the others (``from drift_checks import statistics as st`` is the usual import).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from drift_checks.binning import PSI_EPSILON, PsiBins, bin_counts, psi_cap, psi_edges, psi_from_counts
from drift_checks.categorical_statistics import (
    MAX_LISTED_CATEGORIES,
    CategoricalPair,
    category_counts,
    chi_square_p_value,
    jensen_shannon,
    unseen_share,
)
from drift_checks.numeric_statistics import (
    KS_EXACT_MAX_N,
    KS_KSTWO_MAX_EN,
    WASSERSTEIN_STD_FLOOR,
    NumericPair,
    NumericSample,
    ks_p_value,
    prepare_numeric,
    psi,
    wasserstein_normed,
)
from drift_checks.statistic_types import Direction, Kind, Role, Statistic, StatisticResult, Status

__all__ = [
    "CategoricalPair",
    "Direction",
    "KS_EXACT_MAX_N",
    "KS_KSTWO_MAX_EN",
    "Kind",
    "MAX_LISTED_CATEGORIES",
    "NumericPair",
    "NumericSample",
    "PSI_EPSILON",
    "PsiBins",
    "REGISTRY",
    "Role",
    "Statistic",
    "StatisticResult",
    "Status",
    "WASSERSTEIN_STD_FLOOR",
    "bin_counts",
    "category_counts",
    "chi_square_p_value",
    "compare_numeric",
    "jensen_shannon",
    "ks_p_value",
    "ks_test",
    "prepare_numeric",
    "psi",
    "psi_cap",
    "psi_edges",
    "psi_from_counts",
    "psi_value",
    "score_categorical",
    "score_numeric",
    "statistics_for",
    "unseen_share",
    "wasserstein_normed",
]


# ------------------------------------------------------------------------------ the registry
_EVIDENTLY = "Evidently 0.7 default stat-test threshold"
REGISTRY: dict[str, Statistic] = {
    s.name: s
    for s in [
        Statistic("ks_p_value", "numeric", "p_value", 0.05, _EVIDENTLY + " (K-S p-value)",
                  ks_p_value, "Two-sample Kolmogorov-Smirnov p-value (statistic D in extra)",
                  role="significance", minimum_effect=0.05),
        Statistic("psi", "numeric", "distance", 0.1, _EVIDENTLY + " (PSI; 0.25 = significant)",
                  psi, "Population Stability Index on reference deciles",
                  role="effect", minimum_effect=0.1, strong_effect=0.25),
        Statistic("wasserstein_normed", "numeric", "distance", 0.1,
                  _EVIDENTLY + " (Wasserstein distance, normed)", wasserstein_normed,
                  "Wasserstein-1 distance in reference standard deviations",
                  role="effect", minimum_effect=0.1, strong_effect=0.5),
        Statistic("jensen_shannon", "categorical", "distance", 0.05,
                  "tritonflow: a 20/80 -> 30/70 shift has JS 0.082 (Evidently's 0.1 misses it)",
                  jensen_shannon, "Jensen-Shannon distance between category proportions",
                  role="effect", minimum_effect=0.05, strong_effect=0.2),
        Statistic("chi_square_p_value", "categorical", "p_value", 0.05,
                  _EVIDENTLY + " (chi-square p-value)", chi_square_p_value,
                  "Chi-square homogeneity test p-value, expected counts scaled to window size",
                  role="significance", minimum_effect=0.05),
        Statistic("unseen_share", "categorical", "distance", 0.05,
                  "tritonflow choice: 5 % of rows in categories the reference never saw",
                  unseen_share, "Share of rows in categories unseen in the reference",
                  role="guard", minimum_effect=0.01, strong_effect=0.2),
    ]
}


def statistics_for(kind: Kind, names: Iterable[str] | None = None) -> list[Statistic]:
    """Registry entries of one kind, optionally restricted to ``names`` (order kept).

    Raises:
        KeyError: A name is not registered (message lists the registered names).
    """
    if names is None:
        return [s for s in REGISTRY.values() if s.kind == kind]
    out = []
    for n in names:
        if n not in REGISTRY:
            raise KeyError(f"statistic {n!r} is not registered; expected one of {sorted(REGISTRY)}")
        if REGISTRY[n].kind == kind:
            out.append(REGISTRY[n])
    return out


def score_numeric(
    reference: NumericSample, current: NumericSample, names: Iterable[str] | None = None
) -> dict[str, StatisticResult]:
    """Every numeric statistic for one feature (shared ECDF work).

    Returns:
        ``{statistic name: StatisticResult}``.
    """
    pair = NumericPair(reference, current)
    return {s.name: s.fn(pair) for s in statistics_for("numeric", names)}


def score_categorical(
    reference: Mapping[str, int],
    current: Mapping[str, int],
    *,
    reference_rows: int | None = None,
    current_rows: int | None = None,
    names: Iterable[str] | None = None,
) -> dict[str, StatisticResult]:
    """Every categorical statistic for one feature from count histograms.

    Returns:
        ``{statistic name: StatisticResult}``.
    """
    pair = CategoricalPair(reference, current, reference_rows, current_rows)
    return {s.name: s.fn(pair) for s in statistics_for("categorical", names)}


# ----------------------------------------------------------------- plain arrays (other callers)
def compare_numeric(reference: Any, current: Any,
                    names: Iterable[str] | None = None) -> dict[str, StatisticResult]:
    """Numeric statistics of two plain 1-D arrays (shadow evaluation, canary analysis, scripts).

    Args:
        reference: 1-D numbers, the baseline side (e.g. the champion's scores).
        current: 1-D numbers, the side judged against it (e.g. the challenger's scores).
        names: Statistics to compute (default: every numeric one).

    Returns:
        ``{statistic name: StatisticResult}``; nulls/NaN/inf are dropped first (counted in
        neither side), an empty side gives status ``"empty"``/``"all_null"`` with value ``None``.

    Example::

        res = compare_numeric(champion_scores, challenger_scores, ["psi", "ks_p_value"])
        res["psi"].value, res["ks_p_value"].value, res["ks_p_value"].extra["statistic"]
    """
    return score_numeric(prepare_numeric(reference), prepare_numeric(current), names)


def psi_value(reference: Any, current: Any) -> float:
    """PSI of ``current`` against ``reference`` (two plain 1-D arrays), see :func:`psi`.

    Raises:
        ValueError: A side has no finite value.
    """
    r = compare_numeric(reference, current, ["psi"])["psi"]
    if r.value is None:
        raise ValueError(f"psi_value: a side has no finite value ({r.status})")
    return float(r.value)


def ks_test(reference: Any, current: Any) -> tuple[float, float]:
    """Two-sample KS test of two plain 1-D arrays: ``(statistic D, p-value)``, see :func:`ks_p_value`.

    Raises:
        ValueError: A side has no finite value.
    """
    r = compare_numeric(reference, current, ["ks_p_value"])["ks_p_value"]
    if r.value is None:
        raise ValueError(f"ks_test: a side has no finite value ({r.status})")
    return float(r.extra["statistic"]), float(r.value)
