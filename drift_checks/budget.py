"""A declared false-alarm budget: the alert policy's expected false alerts per model-week.

The alert policy (:class:`drift_checks.policy.AlertPolicy`) states ``false_alarm_budget_per_week``
(``TRITONFLOW_DRIFT_FALSE_ALARM_BUDGET_PER_WEEK``, default 1.0): how many drift alerts a model may
raise in a week of hourly windows (:data:`WINDOWS_PER_WEEK` = 168) when nothing drifted. This is
the "expected run time between false alarms" (ERT) of Alibi Detect's online detectors
(``CVMDriftOnline``, ``MMDDriftOnline``, ``LSDDDriftOnline``: the user gives ``ert`` and the
detector sets its thresholds on the reference so that, with no change, it raises on average one
false alarm per ``ert`` steps; Cobb et al., "Sequential multivariate change detection with
calibrated and memoryless false detection rates", AISTATS 2022). Here ``ERT = 168 / budget``
windows, so a window may alarm by chance with probability at most ``p* = budget / 168``.

**Calibration** (:func:`calibrate_to_budget`), on the reference's own windows: the time-ordered
chunks of the window's size that already calibrate the ``reference`` thresholds
(:func:`drift_checks.thresholds.calibrate_from_reference`) are the null, windows in which nothing
drifted. For a candidate quantile ``q``, each chunk is judged exactly as a window is (the
``reference`` thresholds at ``q``, :func:`~drift_checks.policy.feature_verdict`, the weighted
dataset verdict), which gives per-window rates over the chunks:

* ``s``: a strong effect on some feature;
* ``d``: the dataset verdict is drift;
* ``f_i``: feature ``i`` is flagged; ``e_i``: it shows evidence (a statistic beyond its threshold,
  :meth:`drift_checks.history.HistoryStore.previous_evidence`).

With windows taken as independent and the three alert rules bounded by their sum, a window alarms
with probability at most::

    p(q) = s + d ** k + sum_i f_i * P[Binomial(n - 1, e_i) >= m - 1]

(``k``: consecutive windows; ``m`` of ``n``: the sustained-drift run rule, flagged now and evidence
in ``m - 1`` of the ``n - 1`` windows before; the cooldown is ignored, so this is an upper bound),
and the expected false alerts per week are ``168 * p(q)``. The calibrated quantile is the lowest
of :data:`QUANTILE_LADDER` (from the policy's own quantile, P95 by default, up) whose
``168 * p(q)`` is within the budget; when none is, the highest, and the calibration says the budget
is not met. A quantile above the policy's raises every ``reference`` threshold (and the dynamic
ones, which are never tighter than the reference's), so the calibration never loosens a threshold:
where P95 is already within the budget, nothing changes.

Why the quantile and not the run rule: the run rule (4 of 5) is what catches a sustained shift
of a low-importance input within 2 windows (:mod:`drift_checks.policy`); changing its span would
change the delays the benchmark holds it to, while a higher quantile only asks for more evidence
per statistic. The estimate assumes independent windows and that a window drawn from the
reference looks like the reference's own chunks; the backtest reports the realised rate with an
exact bound (:func:`realised_rate`), which is how a deployment checks both assumptions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Mapping

from scipy import stats as sps

from drift_checks.policy import FeatureVerdict, feature_verdict
from drift_checks.statistics import REGISTRY
from drift_checks.thresholds import MIN_REFERENCE_CHUNKS, Calibration, reference_thresholds, weighted_score

if TYPE_CHECKING:
    from drift_checks.policy import AlertPolicy
    from drift_checks.thresholds import ThresholdPolicy

#: Hourly windows in a model-week: the budget's unit.
WINDOWS_PER_WEEK = 168
#: Quantiles tried, lowest first (those below the policy's quantile are skipped).
QUANTILE_LADDER = (0.95, 0.975, 0.99, 0.995, 0.999)
#: Confidence of the realised rate's upper bound.
DEFAULT_CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class BudgetCalibration:
    """The quantile calibrated to the budget on one reference's chunks.

    Attributes:
        budget_per_week: The declared budget (false alerts per 168 windows).
        quantile: The calibrated quantile of distances (p-values: ``1 - quantile``).
        expected_per_week: ``168 * p(quantile)`` (module docstring).
        met: ``expected_per_week <= budget_per_week``.
        chunks: Reference chunks judged.
        tried: ``(quantile, expected per week)`` of every quantile tried, in order.
    """

    budget_per_week: float
    quantile: float
    expected_per_week: float
    met: bool
    chunks: int
    tried: tuple[tuple[float, float], ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, as recorded in every window's summary."""
        return {"budget_per_week": self.budget_per_week, "calibrated": True, "quantile": self.quantile,
                "expected_per_week": round(self.expected_per_week, 4), "met": self.met,
                "reference_chunks": self.chunks,
                "tried": [[q, round(e, 4)] for q, e in self.tried]}


def uncalibrated(budget_per_week: float, why: str) -> dict[str, Any]:
    """The summary entry of a window whose reference gives no calibration (``why``)."""
    return {"budget_per_week": budget_per_week, "calibrated": False, "reason": why}


def _run_probability(flag: float, evidence: float, span: int, needed: int) -> float:
    """``flag * P[Binomial(span - 1, evidence) >= needed - 1]``: the run rule's chance in one window."""
    if span < 2 or flag <= 0:
        return 0.0
    return flag * float(sps.binom.sf(needed - 2, span - 1, evidence))


def expected_per_week(calibration: Calibration, policy: ThresholdPolicy, alerts: AlertPolicy,
                      weights: Mapping[str, float] | None = None) -> float:
    """``168 * p(q)`` at ``policy.quantile`` on ``calibration``'s chunks (module docstring).

    Args:
        calibration: The reference chunks (:func:`drift_checks.thresholds.calibrate_from_reference`).
        policy: Threshold policy; its ``quantile`` is the one judged.
        alerts: Alert policy (dataset share, consecutive windows, run rule).
        weights: Per-feature weights of the dataset verdict (missing: 1).

    Returns:
        The expected false alerts per week (``nan`` without chunks).
    """
    chunks = calibration.chunks
    if not chunks:
        return math.nan
    cal = calibration.at_quantile(policy.quantile)
    series = sorted({(f, name) for c in chunks for f, res in c.items() for name in res})
    thresholds = reference_thresholds(series, policy, cal)
    strong = drifted = 0
    flags: dict[str, int] = {}
    evidence: dict[str, int] = {}
    for chunk in chunks:
        verdicts = {f: feature_verdict(res, {n: thresholds[(f, n)] for n in res}) for f, res in chunk.items()}
        strong += any(v.strong for v in verdicts.values())
        drifted += weighted_score({f: v.flagged or bool(v.undefined) for f, v in verdicts.items()},
                                  weights) >= alerts.dataset_share
        for f, v in verdicts.items():
            flags[f] = flags.get(f, 0) + bool(v.flagged)
            evidence[f] = evidence.get(f, 0) + _evidence(v)
    n = len(chunks)
    p = strong / n + (drifted / n) ** alerts.consecutive_windows
    p += sum(_run_probability(flags[f] / n, evidence[f] / n, alerts.sustained_windows, alerts.sustained_evidence)
             for f in flags)
    return WINDOWS_PER_WEEK * min(p, 1.0)


def _evidence(verdict: FeatureVerdict) -> bool:
    """Evidence as the run rule reads it from the history (:meth:`HistoryStore.previous_evidence`).

    A statistic strictly beyond its threshold, an effect statistic only beyond a ``reference`` or
    ``dynamic`` one.
    """
    for vote in verdict.votes:
        stat = REGISTRY[vote.name]
        if vote.value is None or not stat.is_drift(vote.value, vote.threshold.value):
            continue
        if stat.role != "effect" or vote.threshold.source in ("reference", "dynamic"):
            return True
    return False


def calibrate_to_budget(calibration: Calibration | None, policy: ThresholdPolicy, alerts: AlertPolicy,
                        weights: Mapping[str, float] | None = None) -> BudgetCalibration | None:
    """The lowest quantile of :data:`QUANTILE_LADDER` whose expected false alerts fit the budget.

    Args:
        calibration: The reference chunks; ``None`` or fewer than
            :data:`~drift_checks.thresholds.MIN_REFERENCE_CHUNKS`: no calibration (``None``).
        policy: Threshold policy; quantiles below its ``quantile`` are not tried.
        alerts: Alert policy, with ``false_alarm_budget_per_week``.
        weights: Per-feature weights of the dataset verdict.

    Returns:
        A :class:`BudgetCalibration`, or ``None`` when there is nothing to calibrate on.
    """
    if calibration is None or calibration.n_chunks < MIN_REFERENCE_CHUNKS or not calibration.chunks:
        return None
    budget = alerts.false_alarm_budget_per_week
    ladder = [policy.quantile] + [q for q in QUANTILE_LADDER if q > policy.quantile]
    tried: list[tuple[float, float]] = []
    for q in ladder:
        e = expected_per_week(calibration, dataclasses.replace(policy, quantile=q), alerts, weights)
        tried.append((q, e))
        if e <= budget:
            return BudgetCalibration(budget, q, e, True, calibration.n_chunks, tuple(tried))
    q, e = tried[-1]
    return BudgetCalibration(budget, q, e, False, calibration.n_chunks, tuple(tried))


def realised_rate(alerts: int, windows: int, budget_per_week: float | None = None, *,
                  confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """The realised false-alert rate of ``alerts`` in ``windows`` quiet windows, with an exact bound.

    A window raises at most one alert, so the count is binomial; the upper bound is the exact
    one-sided Clopper-Pearson bound on the per-window rate (Clopper and Pearson, Biometrika 26,
    1934): the ``confidence`` quantile of ``Beta(alerts + 1, windows - alerts)`` (1 when every
    window alerted), scaled to 100 windows and to a week (168 windows).

    Args:
        alerts: Alerts raised in the quiet windows.
        windows: Quiet windows (no real shift).
        budget_per_week: The declared budget, reported beside (``None``: not reported).
        confidence: One-sided confidence of the bound.

    Returns:
        ``{windows, alerts, per_100_windows, per_100_windows_upper, per_week, per_week_upper,
        confidence[, budget_per_week, within_budget]}``; ``within_budget`` compares the upper bound
        (``None`` without windows).
    """
    if windows <= 0:
        out: dict[str, Any] = {"windows": 0, "alerts": 0, "per_100_windows": None, "per_100_windows_upper": None,
                               "per_week": None, "per_week_upper": None, "confidence": confidence}
        if budget_per_week is not None:
            out.update(budget_per_week=budget_per_week, within_budget=None)
        return out
    rate = alerts / windows
    upper = 1.0 if alerts >= windows else float(sps.beta.ppf(confidence, alerts + 1, windows - alerts))
    out = {"windows": windows, "alerts": alerts, "per_100_windows": round(100 * rate, 3),
           "per_100_windows_upper": round(100 * upper, 3), "per_week": round(WINDOWS_PER_WEEK * rate, 3),
           "per_week_upper": round(WINDOWS_PER_WEEK * upper, 3), "confidence": confidence}
    if budget_per_week is not None:
        out.update(budget_per_week=budget_per_week, within_budget=WINDOWS_PER_WEEK * upper <= budget_per_week)
    return out
