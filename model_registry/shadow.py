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
  indices; :mod:`drift_checks.multiclass`), where agreement is the share of equal arg-max
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

The measurements (agreement, output shift, task metrics, paired bootstrap) live in
:mod:`drift_checks.shadow_metrics` and are re-exported here; this module holds the decision.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any

import numpy as np

from drift_checks.shadow_metrics import (
    DEFAULT_CONFIDENCE,
    DEFAULT_N_BOOT,
    DEFAULT_PSI_BINS,
    DEFAULT_THRESHOLD,
    METRICS,
    PSI_EPS,
    MetricComparison,
    Task,
    as_score_vector,
    output_shift,
    paired_bootstrap,
    paired_outputs,
    prediction_agreement,
    psi,
    task_metrics,
)
from ground.exceptions import DataError

# ------------------------------------------------------------------------------- defaults
#: Fewest labelled rows a comparison needs before it may conclude anything.
DEFAULT_MIN_LABELS = 200
#: Smallest improvement of the primary metric (metric units, e.g. AUC points) the challenger
#: must show at the lower confidence bound to win.
DEFAULT_MARGIN = 0.01
#: Largest worsening (metric units) tolerated on any guardrail metric.
DEFAULT_GUARDRAIL_TOLERANCE = 0.02
#: Largest drop (metric units) of the champion below its reference metric before it counts as
#: degraded.
DEFAULT_DEGRADATION_TOLERANCE = 0.05


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
        """Build the rule from :class:`ground.settings.Settings` ``shadow_*`` fields.

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
        from drift_checks.multiclass import as_probabilities, multiclass_metrics, paired_bootstrap_multiclass

        a = as_probabilities(champion, "champion outputs")
        b = None if challenger is None else as_probabilities(challenger, "challenger outputs", n_classes=a.shape[1])
        if b is not None and b.shape[0] != a.shape[0]:
            raise DataError(f"challenger outputs have {b.shape[0]} rows, champion outputs {a.shape[0]}; "
                            "expected the same replayed rows")
    else:
        a = as_score_vector(champion, "champion outputs")
        b = None
        if challenger is not None:
            a, b = paired_outputs(a, challenger)
    if a.size == 0:
        raise DataError("champion outputs are empty (expected at least one replayed row)")
    y = (np.full(a.shape[0], np.nan) if labels is None
         else as_score_vector(labels, "labels", allow_nan=True))
    if y.shape != a.shape[:1]:
        raise DataError(f"labels have {y.size} rows, outputs {a.shape[0]}; expected equal")
    mask = ~np.isnan(y)
    n_lab = int(mask.sum())
    reasons: list[str] = []
    higher = METRICS[rule.task][rule.primary_metric]

    agreement = shift = None
    if b is not None and multi:
        from drift_checks.multiclass import per_class_prediction_shift

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
    "DEFAULT_PSI_BINS", "PSI_EPS",
    "DecisionRule", "MetricComparison", "Outcome", "ShadowDecision", "Task", "Verdict",
    "evaluate", "output_shift", "paired_bootstrap", "prediction_agreement", "psi", "task_metrics",
]
