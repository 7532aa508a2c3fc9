"""Shadow-evaluation measurements: agreement, output shift, task metrics and the paired bootstrap.

Pure functions on numpy arrays, used by :func:`model_registry.shadow.evaluate` (which decides) and
by the canary checks. The output shift uses the drift statistics registry
(:mod:`drift_checks.statistics`, the one implementation of KS and PSI). The paired percentile
bootstrap follows Efron & Tibshirani, *An Introduction to the Bootstrap* (1993), ch. 13; see
:mod:`model_registry.shadow` for the method and the decision rule.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ground.exceptions import DataError

# ------------------------------------------------------------------------------- defaults
#: Two-sided confidence level of the bootstrap intervals.
DEFAULT_CONFIDENCE = 0.95
#: Bootstrap resamples.
DEFAULT_N_BOOT = 1000
#: Score threshold turning a positive-class probability into a label.
DEFAULT_THRESHOLD = 0.5
#: Quantile bins of the PSI.
DEFAULT_PSI_BINS = 10
#: Floor of a bin proportion in the PSI (avoids log(0)).
PSI_EPS = 1e-4
#: Resamples evaluated per vectorised block (bounds memory to about block * n * 8 bytes).
_BOOT_BLOCK = 200


class Task(str, enum.Enum):
    """Kind of model output."""

    CLASSIFICATION = "classification"
    REGRESSION = "regression"
    MULTICLASS = "multiclass"


#: Metrics per task, and whether higher is better.
METRICS: dict[Task, dict[str, bool]] = {
    Task.CLASSIFICATION: {"auc": True, "accuracy": True, "f1": True},
    Task.REGRESSION: {"rmse": False, "mae": False},
    # one-vs-rest AUC, log-loss, accuracy on [n, C] probabilities (drift_checks.multiclass)
    Task.MULTICLASS: {"auc_ovr": True, "log_loss": False, "accuracy": True},
}


@dataclasses.dataclass(frozen=True)
class MetricComparison:
    """One metric for both versions on the labelled rows, with the paired-bootstrap interval.

    Attributes:
        name: Metric name.
        higher_is_better: Direction of the metric.
        champion: Champion's value on all labelled rows.
        challenger: Challenger's value on all labelled rows.
        improvement: Challenger's improvement (sign-adjusted, positive favours the challenger).
        ci_low: Lower bound of the improvement's interval.
        ci_high: Upper bound of the improvement's interval.
        n_boot_used: Resamples where the metric was defined.
    """

    name: str
    higher_is_better: bool
    champion: float
    challenger: float
    improvement: float
    ci_low: float
    ci_high: float
    n_boot_used: int


def as_score_vector(values: Any, field: str, *, allow_nan: bool = False) -> np.ndarray:
    """One score per row from a model's outputs.

    Args:
        values: Shape (n,) scores, (n, 1), or (n, 2) binary class probabilities (the positive
            class, column 1, is kept).
        field: Name used in error messages ("champion outputs").
        allow_nan: Accept non-finite values (labels that have not arrived yet).

    Returns:
        Shape (n,) float64 array.

    Raises:
        DataError: Another shape, or a non-finite value where ``allow_nan`` is false; the message
            names the field and the first bad row.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 2 and arr.shape[1] == 2:
        arr = arr[:, 1]  # (n, 2) class probabilities: keep the positive class
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise DataError(
            f"{field} has shape {arr.shape}; expected (n,) scores or (n, 2) binary probabilities"
        )
    if not allow_nan and not np.isfinite(arr).all():
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise DataError(f"{field}[{bad}]={float(arr[bad])!r} is not finite (expected a number)")
    return arr


def prediction_agreement(champion: Any, challenger: Any, *, task: Task | str = Task.CLASSIFICATION,
                         threshold: float = DEFAULT_THRESHOLD) -> float:
    """Agreement of two versions' outputs on the same rows.

    Args:
        champion: Champion outputs, shape (n,) (scores or predictions) or (n, 2).
        challenger: Challenger outputs, same shape.
        task: Classification: share of rows with equal labels (``score >= threshold``), in [0, 1].
            Regression: mean absolute difference (output units, 0 = identical).
        threshold: Classification threshold.

    Raises:
        DataError: Shapes differ, are empty, or hold non-finite values.
    """
    a, b = paired_outputs(champion, challenger)
    if Task(task) is Task.CLASSIFICATION:
        return float(np.mean((a >= threshold) == (b >= threshold)))
    return float(np.mean(np.abs(a - b)))


def paired_outputs(champion: Any, challenger: Any) -> tuple[np.ndarray, np.ndarray]:
    """The champion's and the challenger's scores on the same replayed rows.

    Args:
        champion: Champion outputs (see :func:`as_score_vector` for the shapes).
        challenger: Challenger outputs on the same rows.

    Returns:
        Two shape (n,) float64 arrays, n >= 1.

    Raises:
        DataError: Non-finite values, different row counts, or no rows.
    """
    a = as_score_vector(champion, "champion outputs")
    b = as_score_vector(challenger, "challenger outputs")
    if a.shape != b.shape:
        raise DataError(
            f"challenger outputs have {b.shape[0]} rows, champion outputs {a.shape[0]}; "
            "expected the same replayed rows"
        )
    if a.size == 0:
        raise DataError("champion outputs are empty (expected at least one replayed row)")
    return a, b


def psi(reference: Any, current: Any, *, bins: int = DEFAULT_PSI_BINS, eps: float = PSI_EPS) -> float:
    """Population Stability Index of ``current`` against ``reference``.

    The drift registry's PSI (:func:`drift_checks.statistics.psi_edges`, ``bin_counts``,
    ``psi_from_counts``): bins are the ``bins``-quantiles of ``reference`` (bin ``i`` holds
    ``(edge[i-1], edge[i]]``, open-ended outer bins, duplicate edges merged; one bin per value
    when the reference has at most ``bins`` distinct values); proportions are floored at ``eps``.
    Formula: ``sum((c - r) * ln(c / r))`` (Siddiqi 2006). 0 means identical binned distributions.

    Raises:
        DataError: Empty or non-finite inputs, or ``bins < 2``.
    """
    from drift_checks import statistics as st

    if bins < 2:
        raise DataError(f"bins={bins!r} must be >= 2")
    ref = as_score_vector(reference, "reference")
    cur = as_score_vector(current, "current")
    if ref.size == 0 or cur.size == 0:
        raise DataError("psi needs non-empty reference and current samples")
    ref = np.sort(ref)
    edges = st.psi_edges(ref, bins)
    return st.psi_from_counts(st.bin_counts(ref, edges, is_sorted=True), st.bin_counts(cur, edges), eps)


def output_shift(champion: Any, challenger: Any, *, bins: int = DEFAULT_PSI_BINS) -> dict[str, float]:
    """Distribution shift between the two versions' outputs on the same rows.

    Returns:
        ``{"ks_statistic", "ks_pvalue"}`` from the drift registry's two-sample KS
        (:func:`drift_checks.statistics.ks_test`, scipy's ``ks_2samp`` values) and ``"psi"`` with
        the champion as reference (see :func:`psi`).
    """
    from drift_checks import statistics as st

    a, b = paired_outputs(champion, challenger)
    d, p = st.ks_test(a, b)
    return {"ks_statistic": d, "ks_pvalue": p, "psi": psi(a, b, bins=bins)}


def task_metrics(labels: Any, outputs: Any, *, task: Task | str = Task.CLASSIFICATION,
                 threshold: float = DEFAULT_THRESHOLD) -> dict[str, float]:
    """Task metrics of one version on labelled rows.

    Args:
        labels: True labels (0/1) or targets, shape (n,), no NaN.
        outputs: Positive-class scores in [0, 1] (classification) or predictions, shape (n,).
        task: Classification -> ``auc`` (``sklearn.metrics.roc_auc_score``; NaN when one class
            only), ``accuracy``, ``f1`` (positive class 1). Regression -> ``rmse``, ``mae``.
        threshold: Classification threshold.

    Raises:
        DataError: Shapes differ, values are not finite, or classification labels are not 0/1.
    """
    from sklearn.metrics import accuracy_score, f1_score, mean_absolute_error, roc_auc_score

    y = as_score_vector(labels, "labels")
    s = as_score_vector(outputs, "outputs")
    if y.shape != s.shape:
        raise DataError(f"labels have {y.size} rows, outputs {s.size}; expected equal")
    if Task(task) is Task.REGRESSION:
        return {"rmse": float(np.sqrt(np.mean((y - s) ** 2))),
                "mae": float(mean_absolute_error(y, s))}
    _check_binary(y)
    pred = (s >= threshold).astype(np.int64)
    yi = y.astype(np.int64)
    auc = float(roc_auc_score(yi, s)) if np.unique(yi).size == 2 else float("nan")
    return {"auc": auc, "accuracy": float(accuracy_score(yi, pred)),
            "f1": float(f1_score(yi, pred, zero_division=0.0))}


def _check_binary(y: np.ndarray) -> None:
    bad = ~np.isin(y, (0.0, 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"labels[{i}]={float(y[i])!r} is not a binary label (expected 0 or 1)")


# ------------------------------------------------------------------------- bootstrap
def bootstrap_metric(name: str, y: np.ndarray, s: np.ndarray, idx: np.ndarray,
                     threshold: float) -> np.ndarray:
    """Metric ``name`` on each bootstrap resample, vectorised.

    Args:
        name: ``auc``, ``accuracy``, ``f1``, ``rmse`` or ``mae``.
        y: Labels, shape (n,).
        s: Scores, shape (n,).
        idx: Resample row indices, shape (b, n): one resample per row.
        threshold: Classification threshold for the label-based metrics.

    Returns:
        Shape (b,) metric per resample; NaN where it is undefined (AUC of a one-class resample).
    """
    yb, sb = y[idx], s[idx]
    if name == "rmse":
        return np.sqrt(np.mean((yb - sb) ** 2, axis=1))
    if name == "mae":
        return np.mean(np.abs(yb - sb), axis=1)
    if name == "accuracy":
        return np.mean((sb >= threshold) == (yb == 1), axis=1)
    if name == "f1":
        pred, pos = sb >= threshold, yb == 1
        tp = np.sum(pred & pos, axis=1)
        denom = 2 * tp + np.sum(pred & ~pos, axis=1) + np.sum(~pred & pos, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)
    if name == "auc":
        # Mann-Whitney form of the ROC AUC with average ranks for ties, equal to
        # sklearn.metrics.roc_auc_score (ties count one half).
        from scipy.stats import rankdata

        ranks = rankdata(sb, axis=1)
        pos = yb == 1
        n_pos = pos.sum(axis=1)
        n_neg = pos.shape[1] - n_pos
        with np.errstate(invalid="ignore", divide="ignore"):
            auc = (np.sum(ranks * pos, axis=1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
        return np.where((n_pos > 0) & (n_neg > 0), auc, np.nan)
    raise DataError(f"metric={name!r} is unknown")


def paired_bootstrap(labels: Any, champion: Any, challenger: Any, *,
                     metrics: Sequence[str], task: Task | str = Task.CLASSIFICATION,
                     n_boot: int = DEFAULT_N_BOOT, confidence: float = DEFAULT_CONFIDENCE,
                     seed: int = 0, threshold: float = DEFAULT_THRESHOLD) -> dict[str, MetricComparison]:
    """Paired percentile bootstrap of the challenger's improvement on each metric.

    Method: ``n_boot`` resamples of the ``n`` labelled rows with replacement
    (``numpy.random.default_rng(seed)``); on each, both versions are scored on the same rows and
    the sign-adjusted difference kept; the interval is the two-sided ``confidence`` percentile
    interval of those differences (Efron & Tibshirani 1993, ch. 13).

    Args:
        labels: True labels/targets of the labelled rows, shape (n,), no NaN.
        champion: Champion outputs on those rows, shape (n,).
        challenger: Challenger outputs on those rows, shape (n,).
        metrics: Metric names of ``task`` (see :data:`METRICS`).
        task: Classification or regression.
        n_boot: Number of resamples.
        confidence: Two-sided confidence level.
        seed: Random seed (same seed, same intervals).
        threshold: Classification threshold.

    Returns:
        ``{metric: MetricComparison}``; bounds are NaN if the metric was undefined on every draw.

    Raises:
        DataError: Shapes differ, values are not finite, or a metric is unknown for the task.
    """
    task = Task(task)
    y = as_score_vector(labels, "labels")
    a, b = paired_outputs(champion, challenger)
    if y.shape != a.shape:
        raise DataError(f"labels have {y.size} rows, outputs {a.size}; expected equal")
    if task is Task.CLASSIFICATION:
        _check_binary(y)
    direction = METRICS[task]
    for m in metrics:
        if m not in direction:
            raise DataError(f"metric={m!r} is not a {task.value} metric "
                            f"(expected one of {sorted(direction)})")
    def resampled(m: str, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return bootstrap_metric(m, y, a, idx, threshold), bootstrap_metric(m, y, b, idx, threshold)

    return bootstrap_comparisons(
        metrics, direction, resampled,
        task_metrics(y, a, task=task, threshold=threshold), task_metrics(y, b, task=task, threshold=threshold),
        n_rows=y.size, n_boot=n_boot, confidence=confidence, seed=seed)


def bootstrap_comparisons(metrics: Sequence[str], higher_is_better: Mapping[str, bool],
                          resampled: Callable[[str, np.ndarray], tuple[np.ndarray, np.ndarray]],
                          champion: Mapping[str, float], challenger: Mapping[str, float], *, n_rows: int,
                          n_boot: int, confidence: float, seed: int = 0,
                          block: int = _BOOT_BLOCK) -> dict[str, MetricComparison]:
    """The paired percentile bootstrap loop, for any metrics that can be scored on resampled rows.

    Draws ``n_boot`` resamples of ``n_rows`` row indices with replacement
    (``numpy.random.default_rng(seed)``), ``block`` resamples at a time (memory about
    ``block * n_rows * 8`` bytes), scores both versions on the same rows, keeps the sign-adjusted
    difference (positive favours the challenger) and takes the two-sided ``confidence`` percentile
    interval of the finite ones (Efron & Tibshirani 1993, ch. 13). Shared by
    :func:`paired_bootstrap` (binary and regression) and
    :func:`drift_checks.multiclass.paired_bootstrap_multiclass`.

    Args:
        metrics: Metric names, in the order of the result.
        higher_is_better: ``{metric: True if higher is better}`` for each of ``metrics``.
        resampled: ``(metric, idx) -> (champion values, challenger values)``, ``idx`` of shape
            ``(size, n_rows)`` (one resample a row), each result of shape ``(size,)``, NaN where the
            metric is undefined on a resample.
        champion: Champion's point estimate of each metric on all rows.
        challenger: Challenger's point estimate of each metric on all rows.
        n_rows: Labelled rows ``n``.
        n_boot: Number of resamples.
        confidence: Two-sided confidence level.
        seed: Random seed (same seed, same intervals).
        block: Resamples scored per vectorised block.

    Returns:
        ``{metric: MetricComparison}``; bounds are NaN if the metric was undefined on every draw.
    """
    rng = np.random.default_rng(seed)
    diffs: dict[str, list[np.ndarray]] = {m: [] for m in metrics}
    done = 0
    while done < n_boot:
        size = min(block, n_boot - done)
        idx = rng.integers(0, n_rows, size=(size, n_rows))
        for m in metrics:
            ma, mb = resampled(m, idx)
            diffs[m].append(mb - ma if higher_is_better[m] else ma - mb)
        done += size
    alpha = 1.0 - confidence
    out: dict[str, MetricComparison] = {}
    for m in metrics:
        d = np.concatenate(diffs[m])
        d = d[np.isfinite(d)]
        lo, hi = ((float(np.quantile(d, alpha / 2)), float(np.quantile(d, 1 - alpha / 2)))
                  if d.size else (float("nan"), float("nan")))
        improvement = (challenger[m] - champion[m]) if higher_is_better[m] else (champion[m] - challenger[m])
        out[m] = MetricComparison(name=m, higher_is_better=higher_is_better[m], champion=champion[m],
                                  challenger=challenger[m], improvement=float(improvement),
                                  ci_low=lo, ci_high=hi, n_boot_used=int(d.size))
    return out
