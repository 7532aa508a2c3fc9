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
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, cast

import numpy as np

from drift_checks.binning import PSI_EPSILON, PsiBins, bin_counts, psi_cap, psi_edges, psi_from_counts

if TYPE_CHECKING:  # sketches imports this module; the sketched window is a NumericSample subclass
    from drift_checks.sketches import SketchSample

Kind = Literal["numeric", "categorical"]
Direction = Literal["p_value", "distance"]
Role = Literal["significance", "effect", "guard"]

#: Floor of the reference standard deviation in the normalised Wasserstein distance, from
#: Evidently's ``wasserstein_distance_norm`` (``norm = max(np.std(reference), 0.001)``).
WASSERSTEIN_STD_FLOOR = 1e-3
#: scipy's ``ks_2samp`` is exact up to this many rows per side; beyond it the asymptotic
#: Smirnov distribution is used (same rule as scipy's ``method="auto"``).
KS_EXACT_MAX_N = 10_000
#: Largest effective sample size ``n*m/(n+m)`` for which the KS p-value uses scipy's
#: ``kstwo.sf`` (the finite-n one-sample Kolmogorov distribution, what ``ks_2samp`` uses).
#: ``kstwo.sf`` costs about 2 s per call at an effective size of 500,000 (measured on this
#: machine class: 20 features of a 1M-row window would spend 40 s there), so beyond this size the
#: limiting Kolmogorov distribution with Stephens' finite-sample correction is used instead:
#: ``p = kstwobign.sf((sqrt(en) + 0.12 + 0.11 / sqrt(en)) * D)`` (Stephens 1970, J. R. Stat.
#: Soc. B 32(1); Press et al., Numerical Recipes 3rd ed., 14.3.3). Measured against ``kstwo.sf``
#: for effective sizes 20,000-500,000: absolute error below 1e-3 everywhere, relative error below
#: 0.3 % for p >= 1e-4.
KS_KSTWO_MAX_EN = 20_000
#: Most categories listed by name in a result (unseen / vanished), largest share first.
MAX_LISTED_CATEGORIES = 20

Status = Literal["ok", "empty", "all_null", "constant"]


@dataclasses.dataclass(frozen=True)
class StatisticResult:
    """One statistic for one feature and one window.

    Attributes:
        name: Registry name of the statistic (e.g. ``"psi"``).
        value: The score compared with the threshold; ``None`` when undefined (see ``status``).
            Never NaN or infinite.
        status: ``"ok"``, ``"empty"`` (a side has no rows), ``"all_null"`` (a side has rows but
            every value is null) or ``"constant"`` (the reference is constant; value still given).
        extra: Secondary numbers (e.g. the KS statistic next to its p-value), JSON-serialisable.
    """

    name: str
    value: float | None
    status: str = "ok"
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"name": self.name, "value": self.value, "status": self.status, **dict(self.extra)}


@dataclasses.dataclass(frozen=True)
class Statistic:
    """Registry entry: a pure statistic and its metadata.

    Attributes:
        name: Unique name, used as the key in the history store.
        kind: ``"numeric"`` or ``"categorical"``.
        direction: ``"p_value"`` (drift when value < threshold) or ``"distance"`` (drift when
            value > threshold); comparisons are strict.
        default_threshold: Static threshold used until a calibrated one exists.
        threshold_source: Where the default comes from.
        fn: ``fn(pair) -> StatisticResult`` with a :class:`NumericPair` or
            :class:`CategoricalPair`.
        description: One line for reports.
        role: ``"significance"``, ``"effect"`` or ``"guard"`` (see the module docstring).
        minimum_effect: Distances: the lowest threshold ever used (floor). p-values: the highest
            threshold ever used (equals the static α).
        strong_effect: Distances: the size from which an effect is large (``None``: p-values).
    """

    name: str
    kind: Kind
    direction: Direction
    default_threshold: float
    threshold_source: str
    fn: Callable[[Any], StatisticResult]
    description: str
    role: Role = "effect"
    minimum_effect: float = 0.0
    strong_effect: float | None = None

    def is_drift(self, value: float | None, threshold: float) -> bool | None:
        """Whether ``value`` is STRICTLY on the drift side of ``threshold``.

        Returns:
            ``True``/``False``; ``None`` when the value is undefined (``None``, NaN, inf).
        """
        if value is None or not math.isfinite(value):
            return None
        return value < threshold if self.direction == "p_value" else value > threshold

    def bounded(self, threshold: float) -> float:
        """``threshold`` moved inside the statistic's allowed range.

        Never below the minimum effect (distances), never above the static α (p-values).
        """
        if self.direction == "p_value":
            return min(float(threshold), self.minimum_effect)
        return max(float(threshold), self.minimum_effect)


# ----------------------------------------------------------------------------- numeric inputs
@dataclasses.dataclass(frozen=True)
class NumericSample:
    """A numeric column prepared for scoring.

    Attributes:
        values: Finite values, sorted ascending (float64, 1-D).
        n_rows: Rows in the column including nulls and infinities.
        n_null: Null / NaN values dropped.
        n_pos_inf / n_neg_inf: ``+inf`` / ``-inf`` values dropped (reported as infinite, never as
            null).
    """

    values: np.ndarray
    n_rows: int
    n_null: int
    n_pos_inf: int = 0
    n_neg_inf: int = 0

    @property
    def n_infinite(self) -> int:
        """Infinite values dropped (``+inf`` and ``-inf``)."""
        return self.n_pos_inf + self.n_neg_inf

    @functools.cached_property
    def psi_bins(self) -> PsiBins:
        """PSI bins of this sample as a reference (computed once, reused every hour)."""
        return psi_edges(self.values)

    @functools.cached_property
    def prefix(self) -> np.ndarray:
        """``prefix[i]`` = sum of the ``i`` smallest values (for ECDF integrals)."""
        return np.concatenate([[0.0], np.cumsum(self.values)])

    @functools.cached_property
    def std(self) -> float:
        """Population standard deviation of the finite values (``np.std``, ddof 0)."""
        return float(np.std(self.values))

    @property
    def status(self) -> Status:
        """``empty`` (no row), ``all_null`` (no finite value) or ``ok``."""
        if self.n_rows == 0:
            return "empty"
        if self.values.size == 0:
            return "all_null"
        return "ok"


def _as_float_array(values: Any) -> np.ndarray:
    """1-D float64 array; pandas nullable dtypes (``Int64``, ``Float64``) give NaN for NA."""
    to_numpy = getattr(values, "to_numpy", None)
    if to_numpy is not None and not isinstance(values, np.ndarray):
        try:
            return np.asarray(to_numpy(dtype="float64", na_value=np.nan)).ravel()
        except TypeError:  # objects without na_value (e.g. pyarrow arrays)
            pass
    arr = np.asarray(values, dtype=object if not isinstance(values, np.ndarray) else None)
    if arr.dtype == object:
        arr = np.array([np.nan if v is None else v for v in arr.ravel()], dtype="float64")
    return np.asarray(arr, dtype="float64").ravel()


def prepare_numeric(values: Iterable[float] | np.ndarray) -> NumericSample:
    """Drop nulls/NaN/inf and sort, once per column (reuse the reference's every hour).

    Args:
        values: 1-D array-like of numbers (pandas Series of any numeric dtype including the
            nullable ``Int64``/``Float64``, numpy array, list; ``None`` allowed).

    Returns:
        A :class:`NumericSample` (nulls and ``+/-inf`` counted separately).
    """
    arr = _as_float_array(values)
    n = int(arr.size)
    mask = np.isfinite(arr)
    if mask.all():
        return NumericSample(values=np.sort(arr, kind="quicksort"), n_rows=n, n_null=0)
    finite = np.sort(arr[mask], kind="quicksort")
    pos, neg = int(np.count_nonzero(arr == np.inf)), int(np.count_nonzero(arr == -np.inf))
    return NumericSample(values=finite, n_rows=n, n_null=n - int(finite.size) - pos - neg,
                         n_pos_inf=pos, n_neg_inf=neg)


class NumericPair:
    """Reference and current samples of one numeric feature, with shared cached work.

    The gap between the two empirical CDFs is computed once and shared by KS and Wasserstein.
    """

    def __init__(self, reference: NumericSample, current: NumericSample):
        self.reference = reference
        self.current = current

    @property
    def degenerate(self) -> Status | None:
        """``"empty"``/``"all_null"`` when a side cannot be scored, else ``None``."""
        for side in (self.current, self.reference):
            if side.status != "ok":
                return side.status
        return None

    @property
    def reference_constant(self) -> bool:
        """True when every finite reference value is the same (the statistic may then be degenerate)."""
        r = self.reference.values
        return bool(r.size and r[0] == r[-1])

    @functools.cached_property
    def ecdf_gap(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct values of both sides ascending, ``F_ref - F_cur`` at each of them).

        ECDFs with ``side="right"`` semantics (ties complete at the last copy of a value, the one
        kept). The two sorted sides are merged in linear time: binary searches place the smaller
        side into the larger one (``np.insert``), so a small window against a large reference
        costs O(n log m + m) memory-speed work, not a sort of both.
        """
        a, b = self.reference.values, self.current.values
        n = a.size + b.size
        if b.size <= a.size:  # current values go after equal reference values (stable order)
            pos = np.searchsorted(a, b, side="right") + np.arange(b.size)
            allv = np.insert(a, np.searchsorted(a, b, side="right"), b)
            from_cur = np.zeros(n, dtype=bool)
            from_cur[pos] = True
        else:  # reference values go before equal current values
            pos = np.searchsorted(b, a, side="left") + np.arange(a.size)
            allv = np.insert(b, np.searchsorted(b, a, side="left"), a)
            from_cur = np.ones(n, dtype=bool)
            from_cur[pos] = False
        count_b = np.cumsum(from_cur)
        count_a = np.arange(1, n + 1) - count_b
        gap = count_a / a.size - count_b / b.size
        last = np.empty(n, dtype=bool)
        np.not_equal(allv[1:], allv[:-1], out=last[:-1])
        last[-1] = True
        if not last.all():
            allv, gap = allv[last], gap[last]
        return allv, gap

    @functools.cached_property
    def d_and_w1(self) -> tuple[float, float]:
        """(KS statistic D, Wasserstein-1 distance) of the two ECDFs.

        When the current side is much smaller than the reference (a window against a large
        reference, every chunk of a reference calibration), both come from binary searches of the
        current side's distinct values into the reference and prefix sums of the reference
        (:meth:`NumericSample.prefix`): O(n log m). Otherwise from the merged ECDFs
        (:attr:`ecdf_gap`). Both give scipy's ``ks_2samp`` statistic and
        ``wasserstein_distance`` (to float rounding).
        """
        if getattr(self.current, "weights", None) is not None:  # a sketched window
            return cast("SketchSample", self.current).d_and_w1(self.reference.values)
        a, b = self.reference.values, self.current.values
        if b.size * 8 > a.size:
            allv, gap = self.ecdf_gap
            return float(np.max(np.abs(gap))), float(np.sum(np.abs(gap[:-1]) * np.diff(allv)))
        m, n = a.size, b.size
        keep = np.concatenate([b[1:] != b[:-1], [True]])
        u = b[keep]  # distinct current values
        cb = np.nonzero(keep)[0] + 1  # current rows <= u_k
        ga_right = np.searchsorted(a, u, side="right")  # reference rows <= u_k
        ga_left = np.searchsorted(a, u, side="left")  # reference rows < u_k
        cb_prev = np.concatenate([[0], cb[:-1]])
        d = float(max(np.max(np.abs(ga_right / m - cb / n)), np.max(np.abs(ga_left / m - cb_prev / n))))
        pre = self.reference.prefix  # pre[i] = sum of the i smallest reference values

        def integral(lo, hi):  # integral of G(x) = #{a <= x} over [lo, hi), vectorised
            p_ = np.searchsorted(a, lo, side="right")
            q_ = np.maximum(np.searchsorted(a, hi, side="left"), p_)
            return p_ * (hi - lo) + (q_ - p_) * hi - (pre[q_] - pre[p_])

        # (-inf, u_0): F_cur = 0; [u_last, inf): F_cur = 1
        below = ga_left[0] * u[0] - pre[ga_left[0]]
        above = (pre[m] - pre[ga_left[-1]]) - (m - ga_left[-1]) * u[-1]
        total = float(below + above)
        if u.size > 1:
            lo, hi = u[:-1], u[1:]
            t_num = cb[:-1]  # G compared with t = m * cb / n; G >= t <=> G >= ceil(m * cb / n)
            need = (m * t_num + n - 1) // n
            idx = np.clip(need - 1, 0, m - 1)
            cross = np.where(need <= 0, -np.inf, np.where(need > m, np.inf, a[idx]))
            y = np.clip(cross, lo, hi)
            t = m * t_num / n
            pieces = t * (y - lo) - integral(lo, y) + integral(y, hi) - t * (hi - y)
            total += float(np.sum(pieces))
        return d, total / m

    @property
    def psi_bins(self) -> PsiBins:
        """The reference's PSI bins (computed once per reference)."""
        return self.reference.psi_bins

    @property
    def current_n(self) -> int:
        """Finite values of the current side (a sketch retains fewer than it summarises)."""
        return int(getattr(self.current, "n_finite", self.current.values.size))

    def current_bin_counts(self) -> np.ndarray:
        """The current side's counts in the reference's PSI bins.

        A sketched window gives its streamed counts, checked to be of the same bins.
        """
        streamed = getattr(self.current, "psi_counts", None)
        if streamed is None:
            return bin_counts(self.current.values, self.psi_bins, is_sorted=True)
        edges = cast("SketchSample", self.current).psi_edges
        if edges is None or not np.array_equal(edges, self.psi_bins.edges):
            raise ValueError("the window was binned on other PSI bins than this reference's")
        return streamed


def _degenerate(name: str, status: str) -> StatisticResult:
    return StatisticResult(name=name, value=None, status=status)


def ks_p_value(pair: NumericPair) -> StatisticResult:
    """Two-sample Kolmogorov-Smirnov test (two-sided).

    Same statistic as ``scipy.stats.ks_2samp``. p-value: scipy's exact distribution when both
    sides have at most 10,000 values (delegates to scipy); else, as ``ks_2samp(method="auto")``,
    ``scipy.stats.kstwo.sf(D, round(n*m/(n+m)))`` while the effective size ``n*m/(n+m)`` is at
    most :data:`KS_KSTWO_MAX_EN`, and beyond it the limiting Kolmogorov distribution with
    Stephens' correction (see :data:`KS_KSTWO_MAX_EN` for the source and measured accuracy).

    Returns:
        value = p-value (direction ``p_value``); ``extra["statistic"]`` = D in [0, 1].
    """
    if (status := pair.degenerate) is not None:
        return _degenerate("ks_p_value", status)
    from scipy import stats

    a, b = pair.reference.values, pair.current.values
    bound = getattr(pair.current, "rank_error", None)
    if max(a.size, b.size) <= KS_EXACT_MAX_N and bound is None:
        res = stats.ks_2samp(a, b, method="auto")
        d, p = float(res.statistic), float(res.pvalue)
    else:
        d = pair.d_and_w1[0]
        m, n = sorted([float(a.size), float(pair.current_n)], reverse=True)
        en = np.round(m * n / (m + n))
        if en <= KS_KSTWO_MAX_EN:
            p = float(stats.kstwo.sf(d, en))
        else:
            root = math.sqrt(en)
            p = float(stats.kstwobign.sf((root + 0.12 + 0.11 / root) * d))
        p = float(np.clip(p, 0.0, 1.0))
    extra = {"statistic": d} if bound is None else {"statistic": d, "error_bound": bound}
    return StatisticResult("ks_p_value", p, "constant" if pair.reference_constant else "ok", extra)


def psi(pair: NumericPair) -> StatisticResult:
    """Population Stability Index on the reference's PSI bins (see :func:`psi_edges`).

    Returns:
        value >= 0 (direction ``distance``); ``extra["bins"]`` = number of bins used,
        ``extra["cap"]`` = the largest value these bins allow (a value at the cap is saturated).
    """
    if (status := pair.degenerate) is not None:
        return _degenerate("psi", status)
    bins = pair.psi_bins
    ra = bin_counts(pair.reference.values, bins, is_sorted=True)
    value = psi_from_counts(ra, pair.current_bin_counts())
    return StatisticResult("psi", value, "constant" if pair.reference_constant else "ok",
                           {"bins": bins.n_bins, "cap": psi_cap(ra)})


def wasserstein_normed(pair: NumericPair) -> StatisticResult:
    """Wasserstein-1 distance divided by the reference's standard deviation.

    As Evidently's ``wasserstein_distance_norm``; the std is floored at :data:`WASSERSTEIN_STD_FLOOR`.

    ``W1 = integral |F_ref(x) - F_cur(x)| dx``, computed exactly from the merged ECDFs (equals
    ``scipy.stats.wasserstein_distance``).

    Returns:
        value >= 0 in reference standard deviations (direction ``distance``).
    """
    if (status := pair.degenerate) is not None:
        return _degenerate("wasserstein_normed", status)
    w = pair.d_and_w1[1]
    std = pair.reference.std
    norm = max(std, WASSERSTEIN_STD_FLOOR)
    extra = {"wasserstein": w, "reference_std": std}
    if getattr(pair.current, "rank_error", None) is not None:  # see drift_checks.sketches
        extra["error_bound"] = cast("SketchSample", pair.current).wasserstein_error_bound() / norm
    return StatisticResult("wasserstein_normed", w / norm, "constant" if pair.reference_constant else "ok",
                           extra)


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
        return _degenerate("jensen_shannon", status)
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
        return _degenerate("chi_square_p_value", status)
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
        return _degenerate("unseen_share", status)
    unseen = [k for k in pair.current if k not in pair.reference]
    vanished = [k for k in pair.reference if k not in pair.current]
    total = sum(pair.current.values())
    value = sum(pair.current[k] for k in unseen) / total
    return StatisticResult("unseen_share", float(value), "ok", {
        "unseen": _top_shares(pair.current, unseen, total),
        "vanished": _top_shares(pair.reference, vanished, sum(pair.reference.values())),
        "n_unseen": len(unseen), "n_vanished": len(vanished)})


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
