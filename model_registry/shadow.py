"""Shadow evaluation: compare a champion and a challenger on the same replayed rows, then decide.

Pure functions on numpy arrays (no MLflow, no Triton, no Airflow). The DAG replays the recent
logged inputs through both model versions, passes their outputs (and the labels that have
arrived, ``NaN`` where not) to :func:`evaluate`, records :meth:`ShadowDecision.evidence` and
:meth:`ShadowDecision.report_markdown` on both model versions, and branches on
:attr:`ShadowDecision.outcome`.

Method
------
* **Agreement**: classifiers, the share of rows where both versions predict the same label
  (score >= threshold); regressors, the mean absolute difference of the two predictions.
* **Output shift**: two-sample Kolmogorov-Smirnov statistic and p-value on the two score
  distributions and the Population Stability Index with the champion as reference, both from the
  drift statistics registry (:mod:`drift_checks.statistics`, the one implementation):
  ``PSI = sum((c_i - r_i) * ln(c_i / r_i))`` over ``bins`` quantile bins of the champion's
  outputs, proportions floored at ``eps`` (Siddiqi, *Credit Risk Scorecards*, 2006; rule of thumb:
  < 0.1 stable, 0.1-0.25 moderate, > 0.25 large shift).
* **Task metrics** on labelled rows: AUC (``sklearn.metrics.roc_auc_score``), accuracy and F1 for
  binary classifiers; RMSE and MAE for regressors; one-vs-rest AUC, log-loss and accuracy for
  multi-class classifiers (``Task.MULTICLASS``: outputs ``[n, C]`` probabilities, labels class
  indices; :mod:`model_registry.multiclass`), where agreement is the share of equal arg-max
  classes and the output shift is the largest per-class KS/PSI.
* **Paired percentile bootstrap** (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993,
  ch. 13): ``n_boot`` times, draw ``n`` labelled rows with replacement (seeded
  ``numpy.random.default_rng(seed)``), compute each metric for *both* versions on the *same*
  draw and take the difference; the confidence interval of the difference is the
  ``(1-confidence)/2`` and ``(1+confidence)/2`` percentiles of those differences (two-sided).
  Draws where a metric is undefined (AUC on a single-class draw) are dropped and counted.
  Differences are expressed as an **improvement** of the challenger: ``challenger - champion`` for
  metrics where higher is better (AUC, accuracy, F1) and ``champion - challenger`` where lower is
  better (RMSE, MAE), so a positive improvement always favours the challenger.

Decision rule (:class:`DecisionRule`)
-------------------------------------
1. Fewer than ``min_labels`` labelled rows, or the primary metric undefined on them
   -> verdict ``inconclusive`` (never a win), outcome ``inconclusive``.
2. A guardrail metric whose observed improvement is below ``-guardrail_tolerance`` (the challenger
   is worse on it by more than the tolerance) -> ``challenger_loses``.
3. Lower CI bound of the primary improvement >= ``margin`` -> ``challenger_wins``.
4. Upper CI bound of the primary improvement < 0 (the champion is better with the stated
   confidence) -> ``challenger_loses``; otherwise ``no_difference``.

``champion_degraded`` is set when the champion's primary metric on the labelled rows is worse than
``champion_floor`` or worse than its ``reference`` metric by more than ``degradation_tolerance``.
Outcome: wins -> ``promote_challenger``; otherwise a degraded champion -> ``retrain``; otherwise
``nothing``. Without a challenger only the champion is assessed.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any, Sequence

import numpy as np

from tritonflow.exceptions import DataError

# ------------------------------------------------------------------------------- defaults
#: Fewest labelled rows a comparison needs before it may conclude anything.
DEFAULT_MIN_LABELS = 200
#: Two-sided confidence level of the bootstrap intervals.
DEFAULT_CONFIDENCE = 0.95
#: Smallest improvement of the primary metric (metric units, e.g. AUC points) the challenger
#: must show at the lower confidence bound to win.
DEFAULT_MARGIN = 0.01
#: Largest worsening (metric units) tolerated on any guardrail metric.
DEFAULT_GUARDRAIL_TOLERANCE = 0.02
#: Bootstrap resamples.
DEFAULT_N_BOOT = 1000
#: Score threshold turning a positive-class probability into a label.
DEFAULT_THRESHOLD = 0.5
#: Largest drop (metric units) of the champion below its reference metric before it counts as
#: degraded.
DEFAULT_DEGRADATION_TOLERANCE = 0.05
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


class Verdict(str, enum.Enum):
    """Result of the champion/challenger comparison."""

    CHALLENGER_WINS = "challenger_wins"
    CHALLENGER_LOSES = "challenger_loses"
    NO_DIFFERENCE = "no_difference"
    INCONCLUSIVE = "inconclusive"
    NO_CHALLENGER = "no_challenger"


class Outcome(str, enum.Enum):
    """What the shadow DAG does next."""

    PROMOTE_CHALLENGER = "promote_challenger"
    RETRAIN = "retrain"
    NOTHING = "nothing"
    INCONCLUSIVE = "inconclusive"


#: Metrics per task, and whether higher is better.
METRICS: dict[Task, dict[str, bool]] = {
    Task.CLASSIFICATION: {"auc": True, "accuracy": True, "f1": True},
    Task.REGRESSION: {"rmse": False, "mae": False},
    # one-vs-rest AUC, log-loss, accuracy on [n, C] probabilities (model_registry.multiclass)
    Task.MULTICLASS: {"auc_ovr": True, "log_loss": False, "accuracy": True},
}


@dataclasses.dataclass(frozen=True)
class DecisionRule:
    """The configurable decision rule (see the module docstring for its steps).

    Attributes:
        task: Classification (binary scores in [0, 1]) or regression.
        primary_metric: Metric the challenger must improve (``auc``/``accuracy``/``f1`` or
            ``rmse``/``mae``).
        guardrail_metrics: Metrics that must not get worse than ``guardrail_tolerance``.
        margin: Required improvement at the lower confidence bound (metric units, >= 0).
        confidence: Two-sided confidence level in (0, 1).
        min_labels: Fewest labelled rows to conclude (>= 2).
        guardrail_tolerance: Largest tolerated worsening of a guardrail metric (>= 0).
        n_boot: Bootstrap resamples (>= 100).
        seed: Seed of the bootstrap's random generator.
        threshold: Classification threshold on the positive-class score.
        champion_floor: The champion is degraded below this primary metric value (None: off).
        degradation_tolerance: The champion is degraded when worse than its reference by more.
    """

    task: Task = Task.CLASSIFICATION
    primary_metric: str = "auc"
    guardrail_metrics: tuple[str, ...] = ("accuracy",)
    margin: float = DEFAULT_MARGIN
    confidence: float = DEFAULT_CONFIDENCE
    min_labels: int = DEFAULT_MIN_LABELS
    guardrail_tolerance: float = DEFAULT_GUARDRAIL_TOLERANCE
    n_boot: int = DEFAULT_N_BOOT
    seed: int = 0
    threshold: float = DEFAULT_THRESHOLD
    champion_floor: float | None = None
    degradation_tolerance: float = DEFAULT_DEGRADATION_TOLERANCE

    def __post_init__(self) -> None:
        task = Task(self.task)
        object.__setattr__(self, "task", task)
        if task is Task.MULTICLASS and self.primary_metric == "auc":  # the binary default
            object.__setattr__(self, "primary_metric", "auc_ovr")
        object.__setattr__(self, "guardrail_metrics", tuple(self.guardrail_metrics))
        known = METRICS[task]
        for field, name in [("primary_metric", self.primary_metric)] + [
            ("guardrail_metrics", g) for g in self.guardrail_metrics
        ]:
            if name not in known:
                raise DataError(
                    f"{field}={name!r} is not a {task.value} metric (expected one of {sorted(known)})"
                )
        checks = [
            ("margin", self.margin, self.margin >= 0, ">= 0"),
            ("confidence", self.confidence, 0 < self.confidence < 1, "in (0, 1)"),
            ("min_labels", self.min_labels, self.min_labels >= 2, ">= 2"),
            ("guardrail_tolerance", self.guardrail_tolerance, self.guardrail_tolerance >= 0, ">= 0"),
            ("n_boot", self.n_boot, self.n_boot >= 100, ">= 100"),
            ("threshold", self.threshold, 0 < self.threshold < 1, "in (0, 1)"),
            ("degradation_tolerance", self.degradation_tolerance,
             self.degradation_tolerance >= 0, ">= 0"),
        ]
        for field, value, ok, expected in checks:
            if not ok:
                raise DataError(f"{field}={value!r} is invalid (expected {expected})")

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> "DecisionRule":
        """Build the rule from :class:`tritonflow.settings.Settings` ``shadow_*`` fields.

        Args:
            settings: A settings object; missing ``shadow_*`` attributes keep this class' defaults.
            **overrides: Fields that win over the settings (e.g. ``task``, ``primary_metric``).
        """
        values: dict[str, Any] = {}
        for name in ("min_labels", "confidence", "margin", "guardrail_tolerance", "n_boot",
                     "degradation_tolerance"):
            attr = f"shadow_{name}"
            if hasattr(settings, attr):
                values[name] = getattr(settings, attr)
        floor = getattr(settings, "shadow_champion_floor", None)
        if floor is not None and not (isinstance(floor, float) and math.isnan(floor)):
            values["champion_floor"] = floor
        values.update(overrides)
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable copy of the rule."""
        out = dataclasses.asdict(self)
        out["task"] = self.task.value
        out["guardrail_metrics"] = list(self.guardrail_metrics)
        return out


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


@dataclasses.dataclass(frozen=True)
class ShadowDecision:
    """The result of :func:`evaluate`: verdict, outcome and the evidence behind them."""

    verdict: Verdict
    outcome: Outcome
    champion_degraded: bool | None
    reasons: tuple[str, ...]
    rule: DecisionRule
    n_rows: int
    n_labelled: int
    agreement: float | None
    output_shift: dict[str, float] | None
    comparisons: dict[str, MetricComparison]
    champion_metrics: dict[str, float]
    champion_reference: float | None

    def evidence(self) -> dict[str, Any]:
        """A small JSON-serialisable dict (NaN becomes None) of everything the decision used."""
        body = {
            "verdict": self.verdict.value,
            "outcome": self.outcome.value,
            "champion_degraded": self.champion_degraded,
            "reasons": list(self.reasons),
            "rule": self.rule.as_dict(),
            "n_rows": self.n_rows,
            "n_labelled": self.n_labelled,
            "agreement": self.agreement,
            "output_shift": self.output_shift,
            "comparisons": {k: dataclasses.asdict(v) for k, v in self.comparisons.items()},
            "champion_metrics": self.champion_metrics,
            "champion_reference": self.champion_reference,
        }
        return _jsonable(body)

    def evidence_json(self) -> str:
        """:meth:`evidence` as a JSON string (strict: no NaN)."""
        return json.dumps(self.evidence(), allow_nan=False, sort_keys=True)

    def report_markdown(self, champion_label: str = "champion",
                        challenger_label: str = "challenger") -> str:
        """A readable comparison report (Markdown).

        Args:
            champion_label: How to name the champion (e.g. ``"noaa v3 (champion)"``).
            challenger_label: How to name the challenger.
        """
        r = self.rule
        pct = f"{r.confidence:.0%}"
        lines = [
            f"# Shadow evaluation: {challenger_label} vs {champion_label}",
            "",
            f"**Outcome: `{self.outcome.value}`** (verdict `{self.verdict.value}`, champion "
            f"degraded: {_fmt_bool(self.champion_degraded)})",
            "",
        ]
        lines += [f"- {reason}" for reason in self.reasons]
        lines += [
            "",
            "## Data",
            "",
            f"- replayed rows: {self.n_rows}; labelled rows: {self.n_labelled} "
            f"(minimum {r.min_labels})",
        ]
        if self.agreement is not None:
            kind = ("share of equal labels" if r.task in (Task.CLASSIFICATION, Task.MULTICLASS)
                    else "mean absolute difference")
            lines.append(f"- prediction agreement ({kind}): {_fmt(self.agreement)}")
        if self.output_shift:
            s = self.output_shift
            lines.append(
                f"- output shift: KS {_fmt(s['ks_statistic'])} (p={_fmt(s['ks_pvalue'], 3, 'g')}),"
                f" PSI {_fmt(s['psi'])}"
            )
        if self.comparisons:
            lines += [
                "",
                f"## Metrics on labelled rows ({pct} paired percentile bootstrap, "
                f"{r.n_boot} resamples, seed {r.seed})",
                "",
                f"| metric | role | {champion_label} | {challenger_label} | improvement | "
                f"{pct} CI |",
                "|---|---|---|---|---|---|",
            ]
            for name, c in self.comparisons.items():
                role = ("primary" if name == r.primary_metric
                        else "guardrail" if name in r.guardrail_metrics else "info")
                lines.append(
                    f"| {name} ({'higher' if c.higher_is_better else 'lower'} is better) | {role} "
                    f"| {_fmt(c.champion)} | {_fmt(c.challenger)} | {_fmt(c.improvement, sign=True)}"
                    f" | [{_fmt(c.ci_low, sign=True)}, {_fmt(c.ci_high, sign=True)}] |"
                )
        elif self.champion_metrics:
            lines += ["", "## Champion metrics on labelled rows", ""]
            lines += [f"- {k}: {_fmt(v)}" for k, v in self.champion_metrics.items()]
        lines += [
            "",
            "## Rule",
            "",
            f"The challenger wins only if the lower {pct} bound of its {r.primary_metric} "
            f"improvement is >= {r.margin} and no guardrail ({', '.join(r.guardrail_metrics) or 'none'})"
            f" is worse by more than {r.guardrail_tolerance}; fewer than {r.min_labels} labelled "
            "rows is inconclusive.",
        ]
        if self.champion_reference is not None or r.champion_floor is not None:
            parts = []
            if r.champion_floor is not None:
                parts.append(f"worse than the floor {r.champion_floor}")
            if self.champion_reference is not None:
                parts.append(f"worse than its reference {_fmt(self.champion_reference)} by more "
                             f"than {r.degradation_tolerance}")
            lines.append(f"The champion is degraded when its {r.primary_metric} is "
                         f"{' or '.join(parts)}.")
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- building blocks
def _fmt(value: float | None, digits: int = 4, kind: str = "f", sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, f"{'+' if sign else ''}.{digits}{kind}")


def _fmt_bool(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _as_vector(values: Any, field: str, *, allow_nan: bool = False) -> np.ndarray:
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
    a, b = _pair(champion, challenger)
    if Task(task) is Task.CLASSIFICATION:
        return float(np.mean((a >= threshold) == (b >= threshold)))
    return float(np.mean(np.abs(a - b)))


def _pair(champion: Any, challenger: Any) -> tuple[np.ndarray, np.ndarray]:
    a = _as_vector(champion, "champion outputs")
    b = _as_vector(challenger, "challenger outputs")
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
    ref = _as_vector(reference, "reference")
    cur = _as_vector(current, "current")
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

    a, b = _pair(champion, challenger)
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

    y = _as_vector(labels, "labels")
    s = _as_vector(outputs, "outputs")
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
def _boot_metric(name: str, y: np.ndarray, s: np.ndarray, idx: np.ndarray,
                 threshold: float) -> np.ndarray:
    """Metric ``name`` on each resample (rows of ``idx``), vectorised; NaN where undefined."""
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
    y = _as_vector(labels, "labels")
    a, b = _pair(champion, challenger)
    if y.shape != a.shape:
        raise DataError(f"labels have {y.size} rows, outputs {a.size}; expected equal")
    if task is Task.CLASSIFICATION:
        _check_binary(y)
    direction = METRICS[task]
    for m in metrics:
        if m not in direction:
            raise DataError(f"metric={m!r} is not a {task.value} metric "
                            f"(expected one of {sorted(direction)})")
    point_a = task_metrics(y, a, task=task, threshold=threshold)
    point_b = task_metrics(y, b, task=task, threshold=threshold)
    rng = np.random.default_rng(seed)
    diffs: dict[str, list[np.ndarray]] = {m: [] for m in metrics}
    done = 0
    while done < n_boot:
        size = min(_BOOT_BLOCK, n_boot - done)
        idx = rng.integers(0, y.size, size=(size, y.size))
        for m in metrics:
            ma = _boot_metric(m, y, a, idx, threshold)
            mb = _boot_metric(m, y, b, idx, threshold)
            diffs[m].append(mb - ma if direction[m] else ma - mb)
        done += size
    alpha = 1.0 - confidence
    out: dict[str, MetricComparison] = {}
    for m in metrics:
        d = np.concatenate(diffs[m])
        d = d[np.isfinite(d)]
        lo, hi = ((float(np.quantile(d, alpha / 2)), float(np.quantile(d, 1 - alpha / 2)))
                  if d.size else (float("nan"), float("nan")))
        improvement = (point_b[m] - point_a[m]) if direction[m] else (point_a[m] - point_b[m])
        out[m] = MetricComparison(name=m, higher_is_better=direction[m], champion=point_a[m],
                                  challenger=point_b[m], improvement=float(improvement),
                                  ci_low=lo, ci_high=hi, n_boot_used=int(d.size))
    return out


# ------------------------------------------------------------------------- the decision
def _worse_by(value: float, bound: float, higher_is_better: bool) -> float:
    """How much ``value`` is worse than ``bound`` (positive = worse)."""
    return (bound - value) if higher_is_better else (value - bound)


def evaluate(labels: Any | None, champion: Any, challenger: Any | None, *,
             rule: DecisionRule | None = None,
             champion_reference: float | None = None) -> ShadowDecision:
    """Compare champion and challenger outputs on the same replayed rows and decide.

    Args:
        labels: Labels/targets per replayed row, shape (n,), ``NaN`` where the label has not
            arrived; ``None`` when no label arrived at all.
        champion: Champion outputs per row, shape (n,) scores/predictions or (n, 2) probabilities.
        challenger: Challenger outputs on the same rows, or ``None`` when there is no challenger
            (only the champion's degradation is assessed).
        rule: The decision rule (default :class:`DecisionRule`).
        champion_reference: The champion's primary metric at registration/reference time (e.g.
            its validation AUC), for the degradation check; ``None`` skips that check.

    Returns:
        A :class:`ShadowDecision` with verdict, outcome, flags, evidence and report.

    Raises:
        DataError: Shapes differ, outputs are not finite, or labels are not valid for the task.
    """
    rule = rule or DecisionRule()
    multi = rule.task is Task.MULTICLASS
    if multi:
        from model_registry.multiclass import as_probabilities, multiclass_metrics, paired_bootstrap_multiclass

        a = as_probabilities(champion, "champion outputs")
        b = None if challenger is None else as_probabilities(challenger, "challenger outputs", n_classes=a.shape[1])
        if b is not None and b.shape[0] != a.shape[0]:
            raise DataError(f"challenger outputs have {b.shape[0]} rows, champion outputs {a.shape[0]}; "
                            "expected the same replayed rows")
    else:
        a = _as_vector(champion, "champion outputs")
        b = None
        if challenger is not None:
            a, b = _pair(a, challenger)
    if a.size == 0:
        raise DataError("champion outputs are empty (expected at least one replayed row)")
    y = (np.full(a.shape[0], np.nan) if labels is None
         else _as_vector(labels, "labels", allow_nan=True))
    if y.shape != a.shape[:1]:
        raise DataError(f"labels have {y.size} rows, outputs {a.shape[0]}; expected equal")
    mask = ~np.isnan(y)
    n_lab = int(mask.sum())
    reasons: list[str] = []
    higher = METRICS[rule.task][rule.primary_metric]

    agreement = shift = None
    if b is not None and multi:
        from model_registry.multiclass import per_class_prediction_shift

        agreement = float(np.mean(np.argmax(a, axis=1) == np.argmax(b, axis=1)))
        per_class = per_class_prediction_shift(a, b)
        worst = per_class["per_class"][per_class["worst_class"]]
        from scipy.stats import ks_2samp

        shift = {"ks_statistic": per_class["max_ks"],
                 "ks_pvalue": float(ks_2samp(a[:, worst["class"]], b[:, worst["class"]]).pvalue),
                 "psi": per_class["max_psi"], "worst_class": float(per_class["worst_class"])}
    elif b is not None:
        agreement = prediction_agreement(a, b, task=rule.task, threshold=rule.threshold)
        shift = output_shift(a, b)

    enough = n_lab >= rule.min_labels
    comparisons: dict[str, MetricComparison] = {}
    champ_metrics: dict[str, float] = {}
    if enough:
        champ_metrics = (multiclass_metrics(y[mask], a[mask]) if multi else
                         task_metrics(y[mask], a[mask], task=rule.task, threshold=rule.threshold))
    primary = champ_metrics.get(rule.primary_metric, float("nan"))
    if not enough:
        reasons.append(f"only {n_lab} labelled rows; at least min_labels={rule.min_labels} needed")
    elif math.isnan(primary):
        enough = False
        reasons.append(f"{rule.primary_metric} is undefined on the {n_lab} labelled rows "
                       "(a single class)")

    # Champion degradation (point estimate on the labelled rows).
    degraded: bool | None = None
    if enough:
        degraded = False
        if rule.champion_floor is not None and _worse_by(primary, rule.champion_floor, higher) > 0:
            degraded = True
            reasons.append(f"champion {rule.primary_metric}={primary:.4f} is worse than the "
                           f"floor {rule.champion_floor}")
        if champion_reference is not None:
            drop = _worse_by(primary, float(champion_reference), higher)
            if drop > rule.degradation_tolerance:
                degraded = True
                reasons.append(f"champion {rule.primary_metric}={primary:.4f} is worse than its "
                               f"reference {champion_reference:.4f} by {drop:.4f} "
                               f"(> tolerance {rule.degradation_tolerance})")

    if b is None:
        verdict = Verdict.NO_CHALLENGER if enough else Verdict.INCONCLUSIVE
        reasons.insert(0, "no challenger to compare")
    elif not enough:
        verdict = Verdict.INCONCLUSIVE
    else:
        names = [rule.primary_metric] + [g for g in rule.guardrail_metrics
                                         if g != rule.primary_metric]
        names += [m for m in METRICS[rule.task] if m not in names]
        if multi:
            comparisons = paired_bootstrap_multiclass(y[mask], a[mask], b[mask], metrics=names,
                                                      n_boot=rule.n_boot, confidence=rule.confidence,
                                                      seed=rule.seed)
        else:
            comparisons = paired_bootstrap(y[mask], a[mask], b[mask], metrics=names, task=rule.task,
                                           n_boot=rule.n_boot, confidence=rule.confidence,
                                           seed=rule.seed, threshold=rule.threshold)
        p = comparisons[rule.primary_metric]
        broken = [g for g in rule.guardrail_metrics
                  if comparisons[g].improvement < -rule.guardrail_tolerance]
        summary = (f"{rule.primary_metric} improvement {p.improvement:+.4f}, "
                   f"{rule.confidence:.0%} CI [{p.ci_low:+.4f}, {p.ci_high:+.4f}]")
        if broken:
            verdict = Verdict.CHALLENGER_LOSES
            reasons.append(summary)
            for g in broken:
                reasons.append(f"guardrail {g}: challenger worse by {-comparisons[g].improvement:.4f}"
                               f" (> tolerance {rule.guardrail_tolerance})")
        elif p.ci_low >= rule.margin:
            verdict = Verdict.CHALLENGER_WINS
            reasons.append(f"{summary} >= margin {rule.margin}")
        elif p.ci_high < 0:
            verdict = Verdict.CHALLENGER_LOSES
            reasons.append(f"{summary} entirely below 0: the champion is better")
        else:
            verdict = Verdict.NO_DIFFERENCE
            reasons.append(f"{summary} does not clear margin {rule.margin}")

    if verdict is Verdict.CHALLENGER_WINS:
        outcome = Outcome.PROMOTE_CHALLENGER
    elif verdict is Verdict.INCONCLUSIVE:
        outcome = Outcome.INCONCLUSIVE
    else:
        outcome = Outcome.RETRAIN if degraded else Outcome.NOTHING

    return ShadowDecision(
        verdict=verdict, outcome=outcome, champion_degraded=degraded, reasons=tuple(reasons),
        rule=rule, n_rows=int(a.shape[0]), n_labelled=n_lab, agreement=agreement,
        output_shift=shift, comparisons=comparisons, champion_metrics=champ_metrics,
        champion_reference=None if champion_reference is None else float(champion_reference),
    )


__all__ = [
    "DecisionRule", "MetricComparison", "Outcome", "ShadowDecision", "Task", "Verdict",
    "evaluate", "output_shift", "paired_bootstrap", "prediction_agreement", "psi", "task_metrics",
]
