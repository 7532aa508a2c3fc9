"""Canary checks on what the challenger answered.

Output health, its own expected behaviour, quality against the champion where labels arrived, and
feature-space coverage.

Pure functions on numpy arrays and pandas frames (no services); :func:`repository_sync.canary.analysis.analyse_step`
calls them on every analysis of a step, with the inference-log rows of the step's window
(:class:`Observations`) and the challenger's expected behaviour (:class:`ExpectedBehaviour`).

* **Output health** (a *hard* check, judged at every analysis): non-finite outputs count as
  errors; a float output column that is constant over at least ``hard_min_requests`` challenger
  predictions while the comparison side (expected or champion outputs) varies is a broken model.
* **Expected behaviour** (statistical, judged at the end of the bake): the challenger's live
  predictions are compared with what the *same challenger* predicted on comparable inputs -- its
  shadow-evaluation predictions on the replayed window, or its own outputs on mirrored live
  requests -- never with the champion's (after a concept drift a good challenger predicts
  differently from the stale champion by design). Comparable inputs: when the expected predictions
  carry their inputs, requests with identical inputs count once (a deterministic model answers a
  repeated input identically: repeats add no evidence) and each distinct live input is matched to
  the :data:`MATCH_NEIGHBOURS` expected rows nearest in standardised feature space (Euclidean,
  reference mean and standard deviation); the live predictions are compared with the predictions
  of those neighbours, i.e. the expected predictions re-weighted to the live input mix (a k-nearest
  neighbour density-ratio estimate). This removes the part of the difference that comes from a
  different input mix (seasons, hours). The matched values repeat the predictions of a limited
  set of expected rows, so the margins below use their effective sample size
  ``(sum c)^2 / sum c^2`` (``c``: how often each expected row was matched; Kish 1965) instead of
  their count. Measured on NOAA (40 canaries after the concept drift, 150/300/1000 requests drawn
  from the 192 days after a 480-day shadow window, a challenger retrained on that window): KS
  minus margin at most 0.04 and PSI minus margin at most 0.09 with 10 neighbours, no false
  failure, against PSI minus margin 0.41 and three false failures with one neighbour, repeats
  counted and the matched count as sample size. Statistics: two-sample KS and PSI from
  :mod:`drift_checks.statistics` (the one implementation of both). A statistic fails only when it
  exceeds its threshold by more than its sampling noise at ``confidence``: KS by the two-sample
  Dvoretzky-Kiefer-Wolfowitz/Smirnov margin ``c(a) * sqrt((n + m) / (n m))`` with
  ``c(a) = sqrt(-ln(a / 2) / 2)`` (Massart 1990; the asymptotic Smirnov critical value), PSI by the
  ``confidence`` quantile of its null distribution ``PSI * n m / (n + m) ~ chi2(B - 1)``
  (Yurdakul 2018, *Statistical properties of the population stability index*), B the number of bins;
  the PSI judges only with at least :data:`PSI_MIN_ROWS_PER_BIN` rows per bin on each side.
* **Quality** (statistical): where labels arrived for requests of the window, the challenger's
  metric (AUC, or accuracy) on its labelled requests is compared with the champion's on theirs;
  the difference gets an unpaired percentile bootstrap interval (each side resampled on its own,
  Efron & Tibshirani 1993, ch. 13). The challenger fails when the interval's upper bound is below
  ``-max_quality_drop``: it is worse by more than the tolerance with the stated confidence.
* **Feature-space coverage** (statistical): for each important feature, the reference's decile
  bins (:data:`COVERAGE_BINS` quantile bins of the drift reference sample). A bin that the
  window's live traffic reaches well enough for the challenger's share to have put at least
  ``2 m`` requests there must hold at least ``m`` challenger requests; bins live traffic does not
  reach (seasons, hours not in the window) cannot be covered by waiting and are reported, not
  required. ``2 m`` keeps a bin the challenger's share should fill from being declared uncovered by
  chance (binomial with mean ``2 m``: ``P(X < m)`` is about 3 % at ``m = 5``). Not covered ->
  the step is inconclusive and extended.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ground.exceptions import DataError

#: Column of the expected-predictions file holding the challenger's expected score.
EXPECTED_SCORE_COLUMN = "expected_score"
#: Columns of an expected-predictions file that are neither scores nor features.
EXPECTED_KEY_COLUMNS = ("request_id", "timestamp", "model_version", "served_version", "source")
#: Quantile bins per feature of the coverage check (deciles).
COVERAGE_BINS = 10
#: A reached bin is required when the challenger's share of its traffic is at least this many
#: times ``m`` (see the module docstring).
COVERAGE_REQUIRED_FACTOR = 2.0
#: Bootstrap resamples of the quality interval.
QUALITY_N_BOOT = 1000
#: Expected rows matched to each distinct live input (see the module docstring).
MATCH_NEIGHBOURS = 10
#: Floor of a feature's standard deviation when standardising for the input matching.
MATCH_STD_FLOOR = 1e-12
#: Fewest rows per side and PSI bin before the PSI can fail a step: with fewer, empty bins are
#: likely and the floored PSI swings by whole units on identical distributions (Cochran's rule
#: of thumb for chi-square approximations asks 5-10 expected per cell); KS alone judges then.
PSI_MIN_ROWS_PER_BIN = 10
#: Metrics the quality comparison knows, all "higher is better".
QUALITY_METRICS = ("auc", "accuracy")


# ----------------------------------------------------------------------------------- inputs
@dataclasses.dataclass
class Observations:
    """The inference-log rows of a step's window.

    Attributes:
        frame: One row per logged request: ``model_version``, the feature columns, the prediction
            columns and, where labels arrived, ``label_column`` (NaN where not).
        prediction_columns: The model outputs logged (e.g. ``probability_rain``).
        feature_columns: The model inputs logged.
        label_column: The joined label column (``None``: no label arrived).
    """

    frame: pd.DataFrame
    prediction_columns: tuple[str, ...] = ()
    feature_columns: tuple[str, ...] = ()
    label_column: str | None = None

    def rows_of(self, version: int) -> pd.DataFrame:
        """Rows served by ``version``."""
        if self.frame.empty or "model_version" not in self.frame.columns:
            return self.frame.iloc[0:0]
        return self.frame[self.frame["model_version"].astype("int64") == int(version)]

    @classmethod
    def from_arrays(cls, challenger: Any, challenger_version: int = 2,
                    champion: Any = None, champion_version: int = 1) -> "Observations":
        """Observations holding only predictions (``prediction`` column).

        For callers and tests that have arrays rather than an inference log.
        """
        parts = []
        for values, version in ((challenger, challenger_version), (champion, champion_version)):
            if values is None:
                continue
            arr = np.asarray(values, dtype=float)
            arr = arr.reshape(len(arr), -1)
            cols = ["prediction"] if arr.shape[1] == 1 else [f"prediction_{j}" for j in range(arr.shape[1])]
            part = pd.DataFrame(arr, columns=cols)
            part.insert(0, "model_version", int(version))
            parts.append(part)
        frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"model_version": []})
        return cls(frame, tuple(c for c in frame.columns if c != "model_version"))


@dataclasses.dataclass
class ExpectedBehaviour:
    """What the challenger is expected to predict: its own outputs on comparable inputs.

    Attributes:
        source: Where they come from (``"shadow_replay"``, ``"live_mirror"``, ...).
        scores: Expected scores, shape ``(n,)`` (positive-class probability or regression output).
        features: The inputs of those rows, shape ``(n, f)`` (``None``: not matched on inputs).
        columns: Expected outputs per output column (``{column: (n,)}``), compared column by column
            with the same-named live prediction columns (the per-output-column hook, e.g. one
            column per class of a multi-class model); empty: the score alone.
        uri: Where they were read from (recorded with the analysis).
    """

    source: str
    scores: np.ndarray
    features: pd.DataFrame | None = None
    columns: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    uri: str = ""

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, *, source: str, uri: str = "",
                   feature_columns: Sequence[str] | None = None) -> "ExpectedBehaviour":
        """Read an expected-predictions table.

        It holds :data:`EXPECTED_SCORE_COLUMN`, optional feature columns and optional
        ``expected.<output column>`` columns.

        Raises:
            DataError: The table lacks :data:`EXPECTED_SCORE_COLUMN` or has no row.
        """
        if EXPECTED_SCORE_COLUMN not in frame.columns:
            raise DataError(f"expected predictions {uri or '(frame)'} lack column "
                            f"{EXPECTED_SCORE_COLUMN!r} (columns: {sorted(map(str, frame.columns))})")
        if frame.empty:
            raise DataError(f"expected predictions {uri or '(frame)'} have no row")
        per_column = {c[len("expected."):]: frame[c].to_numpy(dtype=float)
                      for c in frame.columns if str(c).startswith("expected.")}
        if feature_columns is None:
            feature_columns = [c for c in frame.columns
                               if c not in EXPECTED_KEY_COLUMNS and c != EXPECTED_SCORE_COLUMN
                               and not str(c).startswith("expected.")
                               and pd.api.types.is_numeric_dtype(frame[c])]
        features = frame[list(feature_columns)].reset_index(drop=True) if feature_columns else None
        return cls(source, frame[EXPECTED_SCORE_COLUMN].to_numpy(dtype=float), features,
                   per_column, uri)


def scores_of(frame: pd.DataFrame, columns: Sequence[str]) -> np.ndarray | None:
    """One score per row from the logged prediction columns, by the shadow evaluation's rule.

    One column: that column; two columns (binary class probabilities): the second (positive
    class), as :func:`tritonflow.pipelines.shadow_replay.replay` scores. More columns: ``None`` (no single
    score; compare per output column instead).
    """
    cols = [c for c in columns if c in frame.columns]
    if len(cols) == 1:
        return pd.to_numeric(frame[cols[0]], errors="coerce").to_numpy(dtype=float)
    if len(cols) == 2:
        return pd.to_numeric(frame[cols[1]], errors="coerce").to_numpy(dtype=float)
    return None


# ----------------------------------------------------------------------------------- output health
@dataclasses.dataclass
class OutputHealth:
    """Hard-check figures of the challenger's logged outputs.

    Attributes:
        n: Challenger predictions (rows) seen.
        nonfinite: Rows with a NaN or infinite value in any prediction column.
        constant_columns: Float columns constant over the rows while the comparison side varies.
    """

    n: int
    nonfinite: int
    constant_columns: list[str]


def output_health(rows: pd.DataFrame, columns: Sequence[str], comparison: pd.DataFrame | None,
                  min_rows: int) -> OutputHealth:
    """Count non-finite outputs and find constant float outputs.

    A column is *constant* when it has at least ``min_rows`` finite values, all equal, it is a
    float column, and the same column of ``comparison`` (the expected or champion outputs) has
    more than two distinct values (so a label column or a legitimately quiet period is not flagged).
    """
    cols = [c for c in columns if c in rows.columns]
    if not cols or rows.empty:
        return OutputHealth(int(len(rows)), 0, [])
    values = rows[cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    nonfinite = int((~np.isfinite(values)).any(axis=1).sum())
    constant: list[str] = []
    for j, col in enumerate(cols):
        if not pd.api.types.is_float_dtype(rows[col]):
            continue
        v = values[:, j]
        v = v[np.isfinite(v)]
        if v.size < min_rows or v.min() != v.max():
            continue
        if comparison is None or col not in comparison.columns:
            continue
        other = pd.to_numeric(comparison[col], errors="coerce").to_numpy(dtype=float)
        other = other[np.isfinite(other)]
        if np.unique(other).size > 2:
            constant.append(col)
    return OutputHealth(int(len(rows)), nonfinite, constant)


def binomial_lower_bound(k: float, n: float, confidence: float) -> float:
    """One-sided Clopper-Pearson lower bound of a rate with ``k`` events in ``n`` trials.

    ``Beta(1 - confidence; k, n - k + 1)`` (Clopper & Pearson 1934); 0 when ``k == 0``.
    """
    from scipy.stats import beta

    k, n = int(round(k)), int(round(n))
    if n <= 0 or k <= 0:
        return 0.0
    return float(beta.ppf(1.0 - confidence, k, n - k + 1))


# ----------------------------------------------------------------------------------- expected behaviour
@dataclasses.dataclass
class PredictionCheck:
    """The challenger's live predictions against its expected ones (one output column).

    Attributes:
        column: Output compared (``"score"`` or an output column name).
        source: Source of the expected predictions.
        n_live, n_expected: Sample sizes compared (the expected side's effective size when matched).
        matched_on_inputs: Expected predictions were matched to the live inputs.
        ks, ks_pvalue, ks_margin: KS statistic D, its p-value and its sampling margin.
        psi, psi_margin, psi_bins: PSI, its sampling margin (``None``: too few rows for the PSI
            to judge) and the bins used.
        failed: Reasons this column fails (empty: within thresholds).
    """

    column: str
    source: str
    n_live: int
    n_expected: int
    matched_on_inputs: bool
    ks: float | None
    ks_pvalue: float | None
    ks_margin: float | None
    psi: float | None
    psi_margin: float | None
    psi_bins: int | None
    failed: list[str] = dataclasses.field(default_factory=list)


def ks_margin(n: int, m: int, confidence: float) -> float:
    """Two-sample KS sampling margin ``sqrt(-ln(a/2)/2) * sqrt((n+m)/(n*m))``, ``a = 1 - confidence``."""
    alpha = 1.0 - confidence
    return math.sqrt(-math.log(alpha / 2.0) / 2.0) * math.sqrt((n + m) / (n * m))


def psi_margin(n: int, m: int, bins: int, confidence: float) -> float:
    """PSI sampling margin: the ``confidence`` quantile of ``chi2(bins - 1)`` over ``n m / (n + m)``."""
    from scipy.stats import chi2

    return float(chi2.ppf(confidence, max(bins - 1, 1)) * (n + m) / (n * m))


def match_on_inputs(live_features: pd.DataFrame, expected: ExpectedBehaviour,
                    values: np.ndarray, neighbours: int = MATCH_NEIGHBOURS
                    ) -> tuple[np.ndarray, float] | None:
    """``values`` at the ``neighbours`` expected rows nearest to each live input.

    ``values`` holds one value (or one row, ``[n, C]``) per expected row; the result is flattened
    (``neighbours`` values per live row) and comes with its effective sample size.

    Features are the numeric columns both sides have, standardised with the expected rows' mean
    and standard deviation; rows with a non-finite feature are dropped on both sides.

    Returns:
        ``(matched values, effective sample size (sum c)^2 / sum c^2 over how often each expected
        row was matched)``, or ``None`` when there is no common feature.
    """
    from sklearn.neighbors import NearestNeighbors

    if expected.features is None or live_features is None or live_features.empty:
        return None
    common = [c for c in expected.features.columns if c in live_features.columns]
    if not common:
        return None
    ref = expected.features[common].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    cur = live_features[common].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    ok_ref = np.isfinite(ref).all(axis=1) & np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    ok_cur = np.isfinite(cur).all(axis=1)
    if not ok_ref.any() or not ok_cur.any():
        return None
    ref, vals, cur = ref[ok_ref], values[ok_ref], cur[ok_cur]
    mu = ref.mean(axis=0)
    sd = np.maximum(ref.std(axis=0), MATCH_STD_FLOOR)
    k = max(1, min(int(neighbours), len(ref)))
    nn = NearestNeighbors(n_neighbors=k).fit((ref - mu) / sd)
    _, idx = nn.kneighbors((cur - mu) / sd)
    counts = np.bincount(idx.ravel()).astype(float)
    return vals[idx].reshape(-1, *vals.shape[1:]), float(counts.sum() ** 2 / np.sum(counts ** 2))


def compare_with_expected(live: np.ndarray, expected: np.ndarray, *, column: str, source: str,
                          matched: bool, confidence: float, max_ks: float,
                          max_psi: float, expected_size: float | None = None) -> PredictionCheck:
    """KS and PSI (drift_checks' implementations) of live vs expected predictions, with margins.

    Fails a statistic only when it exceeds its threshold by more than its sampling margin (see
    the module docstring). ``expected_size``: the expected side's effective sample size for the
    margins (default: its number of finite values).

    Raises:
        DataError: A side has no finite value.
    """
    from drift_checks.numeric_statistics import NumericPair, ks_p_value, prepare_numeric, psi

    a, b = prepare_numeric(expected), prepare_numeric(live)
    if a.values.size == 0 or b.values.size == 0:
        raise DataError(f"prediction check of {column!r}: no finite value on the "
                        f"{'expected' if a.values.size == 0 else 'live'} side")
    pair = NumericPair(a, b)
    ks = ks_p_value(pair)
    ps = psi(pair)
    n = int(b.values.size)
    m = int(round(expected_size)) if expected_size else int(a.values.size)
    m = max(1, min(m, int(a.values.size)))
    d = float(ks.extra["statistic"])
    bins = int(ps.extra.get("bins", 10))
    d_margin, p_margin = ks_margin(n, m, confidence), psi_margin(n, m, bins, confidence)
    out = PredictionCheck(column, source, n, m, matched, d, ks.value, d_margin, ps.value, p_margin, bins)
    if d - d_margin > max_ks:
        out.failed.append(
            f"{column}: KS {d:.3f} vs the challenger's expected predictions ({source}) exceeds "
            f"max_prediction_ks {max_ks:g} by more than its sampling margin {out.ks_margin:.3f} "
            f"(n={n}, m={m})")
    if min(n, m) < PSI_MIN_ROWS_PER_BIN * bins:
        out.psi_margin = None  # not judged: too few rows per bin (see PSI_MIN_ROWS_PER_BIN)
    elif ps.value is not None and ps.value - p_margin > max_psi:
        out.failed.append(
            f"{column}: PSI {ps.value:.3f} vs the challenger's expected predictions ({source}) "
            f"exceeds max_prediction_psi {max_psi:g} by more than its sampling margin "
            f"{out.psi_margin:.3f} (n={n}, m={m})")
    return out


#: Comparison of one output column: ``(live values, expected values, column, expected, live
#: features) -> PredictionCheck``. The default matches on inputs then calls
#: :func:`compare_with_expected`; a per-class comparison for multi-class models plugs in here.
ColumnComparison = Callable[..., PredictionCheck]


def expected_behaviour_checks(live_rows: pd.DataFrame, prediction_columns: Sequence[str],
                              feature_columns: Sequence[str], expected: ExpectedBehaviour, *,
                              confidence: float, max_ks: float, max_psi: float,
                              compare_column: ColumnComparison | None = None) -> list[PredictionCheck]:
    """Compare the challenger's live rows with its expected behaviour, per output.

    The live score (:func:`scores_of`) is compared with ``expected.scores``; every output column
    the expected side also has (``expected.columns``) is compared with its live column.

    Raises:
        DataError: No live output can be compared (no single score and no common column).
    """
    compare_column = compare_column or _default_column_comparison
    live_features = live_rows[[c for c in feature_columns if c in live_rows.columns]]
    checks: list[PredictionCheck] = []
    score = scores_of(live_rows, prediction_columns)
    if score is not None:
        checks.append(compare_column(score, expected.scores, "score", expected, live_features,
                                     confidence=confidence, max_ks=max_ks, max_psi=max_psi))
    for col, values in expected.columns.items():
        if col in live_rows.columns:
            live = pd.to_numeric(live_rows[col], errors="coerce").to_numpy(dtype=float)
            checks.append(compare_column(live, np.asarray(values, dtype=float), col, expected,
                                         live_features, confidence=confidence, max_ks=max_ks,
                                         max_psi=max_psi))
    if not checks:
        raise DataError(
            f"no challenger output to compare with its expected predictions: prediction columns "
            f"{list(prediction_columns)} give no single score (expected 1 column, or 2 class "
            f"probabilities) and none of them is among the expected columns {sorted(expected.columns)}")
    return checks


def _default_column_comparison(live: np.ndarray, expected_values: np.ndarray, column: str,
                               expected: ExpectedBehaviour, live_features: pd.DataFrame, *,
                               confidence: float, max_ks: float, max_psi: float) -> PredictionCheck:
    finite = np.isfinite(live)
    matched = None
    if expected.features is not None and len(live_features) == len(live):
        common = [c for c in expected.features.columns if c in live_features.columns]
        if common:  # a repeated input counts once (see the module docstring)
            finite &= ~live_features[common].duplicated().to_numpy()
        matched = match_on_inputs(live_features[finite], expected, expected_values)
    if matched is not None and matched[0].size:
        reference, size = matched
    else:
        reference, size, matched = expected_values, None, None
    return compare_with_expected(live[finite], reference, column=column, source=expected.source,
                                 matched=matched is not None, confidence=confidence,
                                 max_ks=max_ks, max_psi=max_psi, expected_size=size)


# ----------------------------------------------------------------------------------- quality
@dataclasses.dataclass
class QualityCheck:
    """Challenger vs champion quality on the labelled requests each served in the window.

    Attributes:
        metric: ``auc`` or ``accuracy`` (accuracy when AUC is undefined on a side).
        n_challenger, n_champion: Labelled requests per version.
        challenger, champion: The metric per version (``None``: not evaluated).
        difference, ci_low, ci_high: ``challenger - champion`` and its interval.
        evaluated: Whether the comparison was made.
        note: Why not, or how it was decided.
        failed: The challenger is worse by more than the tolerance with confidence.
    """

    metric: str
    n_challenger: int
    n_champion: int
    challenger: float | None = None
    champion: float | None = None
    difference: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    evaluated: bool = False
    note: str = ""
    failed: bool = False


def quality_check(challenger_y: Any, challenger_s: Any, champion_y: Any, champion_s: Any, *,
                  metric: str, min_labels: int, confidence: float, max_drop: float,
                  n_boot: int = QUALITY_N_BOOT, seed: int = 0, threshold: float = 0.5) -> QualityCheck:
    """Compare quality with an unpaired bootstrap interval (see the module docstring).

    Args:
        challenger_y: Labels (0/1) of the challenger's labelled requests.
        challenger_s: Scores of the same requests.
        champion_y: Labels (0/1) of the champion's labelled requests.
        champion_s: Scores of the same requests.
        metric: ``"auc"`` or ``"accuracy"``.
        min_labels: Fewest labelled requests per side to compare.
        confidence: Two-sided confidence of the interval.
        max_drop: Tolerated drop (metric units).
        n_boot: Bootstrap resamples per side.
        seed: Random seed of the resamples.
        threshold: Score at or above which a request counts as predicted positive (accuracy).

    Raises:
        DataError: Unknown metric, or labels that are not 0/1.
    """
    from drift_checks.shadow_metrics import bootstrap_metric

    if metric not in QUALITY_METRICS:
        raise DataError(f"canary quality metric {metric!r} is unknown; expected one of {QUALITY_METRICS}")
    sides = []
    for y, s in ((challenger_y, challenger_s), (champion_y, champion_s)):
        y = np.asarray(y, dtype=float).ravel()
        s = np.asarray(s, dtype=float).ravel()
        ok = np.isfinite(y) & np.isfinite(s)
        y, s = y[ok], s[ok]
        if (~np.isin(y, (0.0, 1.0))).any():
            raise DataError(f"canary quality: labels {sorted(set(y.tolist()))[:5]} are not binary 0/1")
        sides.append((y, s))
    (yc, sc), (yh, sh) = sides
    q = QualityCheck(metric, int(yc.size), int(yh.size))
    if min(yc.size, yh.size) < min_labels:
        q.note = (f"quality not compared: {yc.size} challenger and {yh.size} champion labelled "
                  f"requests, fewer than min_labels={min_labels} on a side")
        return q
    used = metric
    if metric == "auc" and (len(np.unique(yc)) < 2 or len(np.unique(yh)) < 2):
        used = "accuracy"
    q.metric = used
    rng = np.random.default_rng(seed)
    all_c = np.arange(yc.size)[None, :]
    all_h = np.arange(yh.size)[None, :]
    q.challenger = float(bootstrap_metric(used, yc, sc, all_c, threshold)[0])
    q.champion = float(bootstrap_metric(used, yh, sh, all_h, threshold)[0])
    q.difference = q.challenger - q.champion
    diffs = []
    for start in range(0, n_boot, 200):
        size = min(200, n_boot - start)
        bc = bootstrap_metric(used, yc, sc, rng.integers(0, yc.size, (size, yc.size)), threshold)
        bh = bootstrap_metric(used, yh, sh, rng.integers(0, yh.size, (size, yh.size)), threshold)
        diffs.append(bc - bh)
    d = np.concatenate(diffs)
    d = d[np.isfinite(d)]
    alpha = 1.0 - confidence
    if d.size == 0:
        q.note = f"quality not compared: {used} undefined on every resample"
        return q
    q.ci_low, q.ci_high = float(np.quantile(d, alpha / 2)), float(np.quantile(d, 1 - alpha / 2))
    q.evaluated = True
    q.failed = q.ci_high < -max_drop
    q.note = (f"challenger {used} {q.challenger:.3f} vs champion {q.champion:.3f}: difference "
              f"{q.difference:+.3f}, {confidence:.0%} interval [{q.ci_low:+.3f}, {q.ci_high:+.3f}]"
              + (f" entirely below -max_quality_drop {max_drop:g}" if q.failed else ""))
    return q


# ----------------------------------------------------------------------------------- coverage
@dataclasses.dataclass
class FeatureCoverage:
    """Coverage of one feature's reference decile bins.

    Attributes:
        feature: The feature.
        bins: Reference bins (duplicate quantiles merged).
        reached: Bins with any live request in the window.
        required: Bins the challenger's share should have filled (see the module docstring).
        covered: Required bins holding at least ``m`` challenger requests.
        challenger_counts, traffic_counts: Requests per bin (challenger; all versions).
        min_requests: ``m``; challenger_share: the challenger's share of the window's requests.
    """

    feature: str
    bins: int
    reached: int
    required: int
    covered: int
    challenger_counts: list[int]
    traffic_counts: list[int]
    min_requests: int = 0
    challenger_share: float = 0.0

    def is_required(self, i: int) -> bool:
        """Bin ``i`` is one the challenger's share of its traffic should have filled."""
        return self.traffic_counts[i] * self.challenger_share >= COVERAGE_REQUIRED_FACTOR * self.min_requests

    @property
    def uncovered(self) -> list[int]:
        """Indexes of the required bins that lack challenger requests."""
        return [i for i, c in enumerate(self.challenger_counts)
                if self.is_required(i) and c < self.min_requests]


@dataclasses.dataclass
class CoverageCheck:
    """Feature-space coverage of a step's challenger requests.

    Attributes:
        features: Per-feature figures, most important first.
        min_requests: ``m``.
        covered: Every required bin of every feature holds ``m`` challenger requests.
        ratio: Covered required bins / required bins (1.0 when none is required).
        reached_ratio: Reference bins live traffic reached / all reference bins.
        note: What was not covered, or why coverage was not evaluated.
    """

    features: list[FeatureCoverage]
    min_requests: int
    covered: bool
    ratio: float
    reached_ratio: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable figures."""
        return {
            "min_requests": self.min_requests, "covered": self.covered, "ratio": self.ratio,
            "reached_ratio": self.reached_ratio, "note": self.note,
            "features": [{"feature": f.feature, "bins": f.bins, "reached": f.reached,
                          "required": f.required, "covered": f.covered,
                          "challenger_counts": f.challenger_counts,
                          "traffic_counts": f.traffic_counts} for f in self.features],
        }


def important_features(features: Sequence[str], importances: Mapping[str, float] | None,
                       top: int) -> list[str]:
    """The ``top`` most important of ``features``, most important first.

    All of them when ``top`` is 0 or there are no importances; ties keep the features' order.
    """
    feats = list(features)
    if not importances or top <= 0:
        return feats
    ranked = sorted(feats, key=lambda f: -float(importances.get(f, 0.0)))
    return ranked[:top]


def coverage_check(reference: pd.DataFrame, features: Sequence[str], traffic: pd.DataFrame,
                   challenger_mask: np.ndarray, *, min_requests: int,
                   bins: int = COVERAGE_BINS) -> CoverageCheck:
    """Coverage of the reference's decile bins by the challenger's requests (module docstring).

    Args:
        reference: The drift reference sample (feature columns).
        features: Features to check (numeric; others are skipped and noted).
        traffic: The window's requests of every version (feature columns).
        challenger_mask: Boolean per ``traffic`` row: served by the challenger.
        min_requests: ``m``.
        bins: Quantile bins per feature on the reference (default: deciles).
    """
    mask = np.asarray(challenger_mask, dtype=bool)
    total, chal = int(len(traffic)), int(mask.sum())
    share = chal / total if total else 0.0
    out: list[FeatureCoverage] = []
    skipped: list[str] = []
    for f in features:
        if f not in reference.columns or f not in traffic.columns \
                or not pd.api.types.is_numeric_dtype(reference[f]):
            skipped.append(f)
            continue
        ref = pd.to_numeric(reference[f], errors="coerce").to_numpy(dtype=float)
        ref = ref[np.isfinite(ref)]
        if ref.size == 0:
            skipped.append(f)
            continue
        edges = np.unique(np.quantile(ref, np.linspace(0, 1, bins + 1)[1:-1]))
        vals = pd.to_numeric(traffic[f], errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(vals)
        idx = np.searchsorted(edges, vals[ok], side="right")
        t = np.bincount(idx, minlength=edges.size + 1)
        c = np.bincount(idx[mask[ok]], minlength=edges.size + 1)
        fc = FeatureCoverage(f, int(edges.size + 1), int((t > 0).sum()), 0, 0,
                             [int(x) for x in c], [int(x) for x in t], int(min_requests), share)
        req = [i for i in range(fc.bins) if fc.is_required(i)]
        fc.required = len(req)
        fc.covered = sum(1 for i in req if c[i] >= min_requests)
        out.append(fc)
    required = sum(f.required for f in out)
    covered = sum(f.covered for f in out)
    all_bins = sum(f.bins for f in out)
    reached = sum(f.reached for f in out)
    ok = covered == required
    notes = []
    if not ok:
        gaps = [f"{f.feature} bins {f.uncovered}" for f in out if f.uncovered]
        notes.append(f"feature space not covered: fewer than {min_requests} challenger requests in "
                     f"{required - covered} of {required} reached reference decile bins ("
                     + "; ".join(gaps[:4]) + ")")
    if skipped:
        notes.append(f"coverage not checked for {skipped} (missing or not numeric)")
    return CoverageCheck(out, int(min_requests), ok, covered / required if required else 1.0,
                         reached / all_bins if all_bins else 0.0, "; ".join(notes))


__all__ = [
    "COVERAGE_BINS", "EXPECTED_SCORE_COLUMN", "CoverageCheck", "ExpectedBehaviour",
    "FeatureCoverage", "Observations", "OutputHealth", "PredictionCheck", "QualityCheck",
    "binomial_lower_bound", "compare_with_expected", "coverage_check", "expected_behaviour_checks",
    "important_features", "ks_margin", "match_on_inputs", "output_health", "psi_margin",
    "quality_check", "scores_of",
]
