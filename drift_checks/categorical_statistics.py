"""Categorical drift statistics on count histograms: Jensen-Shannon, chi-square and unseen share.

Inputs are ``{category: count}`` histograms (:func:`category_counts`), so raw windows and stored
hourly histograms are scored alike; chi-square scales the expected frequencies to the current
window's size. Registered, with thresholds and sources, in :mod:`drift_checks.statistics`.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from drift_checks.binning import PSI_EPSILON
from drift_checks.statistic_types import StatisticResult, Status, degenerate_result

#: Most categories listed by name in a result (unseen / vanished), largest share first.
MAX_LISTED_CATEGORIES = 20


# ------------------------------------------------------------------------- categorical inputs
def category_counts(values: Iterable[Any]) -> dict[str, int]:
    """Count categories of a column (nulls dropped; categories compared as strings).

    Args:
        values: 1-D array-like (pandas Series preferred).

    Returns:
        ``{category: count}`` sorted by category, so results are order-independent.
    """
    import pandas as pd

    # Count raw values first (hash-based, fast on large windows), then merge the keys that share
    # a string form (e.g. 1 and "1"): same result as converting every row to str first.
    vc = pd.Series(values).value_counts(dropna=True, sort=False)
    counts: dict[str, int] = {}
    for k, v in vc.items():
        if v == 0:  # categorical dtypes list unused categories
            continue
        key = str(k)
        counts[key] = counts.get(key, 0) + int(v)
    return {k: counts[k] for k in sorted(counts)}


class CategoricalPair:
    """Reference and current count histograms of one categorical feature.

    Args:
        reference: ``{category: count}`` of the reference.
        current: ``{category: count}`` of the current window.
        reference_rows / current_rows: Rows including nulls (to tell "empty" from "all_null");
            default: the histogram's total.
    """

    def __init__(
        self,
        reference: Mapping[str, int],
        current: Mapping[str, int],
        reference_rows: int | None = None,
        current_rows: int | None = None,
    ):
        self.reference = {str(k): int(v) for k, v in reference.items() if v}
        self.current = {str(k): int(v) for k, v in current.items() if v}
        self.reference_rows = sum(self.reference.values()) if reference_rows is None else reference_rows
        self.current_rows = sum(self.current.values()) if current_rows is None else current_rows
        self.categories = sorted(set(self.reference) | set(self.current))

    @property
    def degenerate(self) -> Status | None:
        """``empty`` / ``all_null`` when either side has no row / no counted category, else ``None``."""
        for rows, counts in ((self.current_rows, self.current), (self.reference_rows, self.reference)):
            if rows == 0:
                return "empty"
            if not counts:
                return "all_null"
        return None

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """Counts of reference and current over the union of categories (sorted)."""
        r = np.array([self.reference.get(c, 0) for c in self.categories], dtype="float64")
        c = np.array([self.current.get(c, 0) for c in self.categories], dtype="float64")
        return r, c


def jensen_shannon(pair: CategoricalPair) -> StatisticResult:
    """Jensen-Shannon distance between category proportions, as Evidently's ``jensenshannon`` test.

    ``scipy.spatial.distance.jensenshannon``, natural log, range [0, sqrt(ln 2)]. Proportions are
    floored at :data:`PSI_EPSILON` like Evidently.

    Returns:
        value >= 0 (direction ``distance``).
    """
    if (status := pair.degenerate) is not None:
        return degenerate_result("jensen_shannon", status)
    from scipy.spatial import distance

    r, c = pair.vectors()
    p = np.where(r == 0, PSI_EPSILON, r / r.sum())
    q = np.where(c == 0, PSI_EPSILON, c / c.sum())
    value = float(distance.jensenshannon(p, q))
    status = "constant" if len(pair.reference) == 1 else "ok"
    return StatisticResult("jensen_shannon", value if math.isfinite(value) else 0.0, status)


def chi_square_p_value(pair: CategoricalPair) -> StatisticResult:
    """Pearson chi-square test of homogeneity on the 2 x k table (reference, current).

    Over the union of categories (``scipy.stats.chi2_contingency(correction=False)``).

    The expected counts of each row are scaled to that row's total, so a current window with
    the reference's mix gives p ~ 1 whatever its size (whylogs#492). Categories unseen
    in the reference are part of the table (no division by zero). A single category on both
    sides gives p = 1 with status ``"constant"``.

    Returns:
        value = p-value (direction ``p_value``); ``extra["statistic"]``, ``extra["dof"]``.
    """
    if (status := pair.degenerate) is not None:
        return degenerate_result("chi_square_p_value", status)
    if len(pair.categories) < 2:
        return StatisticResult("chi_square_p_value", 1.0, "constant", {"statistic": 0.0, "dof": 0})
    from scipy import stats

    r, c = pair.vectors()
    res = stats.chi2_contingency(np.vstack([r, c]), correction=False)
    return StatisticResult(
        "chi_square_p_value",
        float(res.pvalue),
        "ok",
        {"statistic": float(res.statistic), "dof": int(res.dof)},
    )


def _top_shares(counts: Mapping[str, int], keys: Iterable[str], total: int) -> dict[str, float]:
    rows = sorted(((k, counts[k] / total) for k in keys), key=lambda kv: (-kv[1], kv[0]))
    return {k: round(float(v), 6) for k, v in rows[:MAX_LISTED_CATEGORIES]}


def unseen_share(pair: CategoricalPair) -> StatisticResult:
    """Share of the current window's non-null rows whose category is absent from the reference.

    Returns:
        value in [0, 1] (direction ``distance``); ``extra["unseen"]`` = ``{category: share of the
        window}`` and ``extra["vanished"]`` = ``{category: share of the reference}`` of the
        reference's categories absent from the window (each up to
        :data:`MAX_LISTED_CATEGORIES`, largest share first), ``extra["n_unseen"]`` /
        ``extra["n_vanished"]`` = how many categories in all.
    """
    if (status := pair.degenerate) is not None:
        return degenerate_result("unseen_share", status)
    unseen = [k for k in pair.current if k not in pair.reference]
    vanished = [k for k in pair.reference if k not in pair.current]
    total = sum(pair.current.values())
    value = sum(pair.current[k] for k in unseen) / total
    return StatisticResult("unseen_share", float(value), "ok", {
        "unseen": _top_shares(pair.current, unseen, total),
        "vanished": _top_shares(pair.reference, vanished, sum(pair.reference.values())),
        "n_unseen": len(unseen), "n_vanished": len(vanished)})
