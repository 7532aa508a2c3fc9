"""Drift decisions as pure functions: the per-feature vote, the dataset verdict, the alert policy.

**Per-feature vote** (:func:`feature_verdict`). Each statistic votes only where it is informative
(its role in :mod:`drift_checks.statistics`):

* a *guard* (unseen-category share) flags the feature on its own when it is beyond its
  threshold, and abstains otherwise (it is 0 in almost every hour, so a "no" from it means
  nothing);
* *significance* statistics (K-S, chi-square p-values) are a veto against sampling noise: when one
  is defined and not beyond its threshold, the feature is not flagged. A p-value threshold of 0
  (a calibration or history whose p-values are all 0, as on very large windows) is uninformative:
  the statistic abstains;
* *effect* statistics (PSI, Wasserstein, Jensen-Shannon) say whether the difference is large
  enough: at least one of them must be beyond its threshold. An effect statistic whose threshold
  is at or above the largest value it can take (PSI saturated by its binning) abstains.

So a numeric feature is flagged when K-S AND (PSI OR Wasserstein) say so; a categorical one when
chi-square AND Jensen-Shannon say so, or when the unseen-category share alone does. A clear 20/80
-> 30/70 category shift (chi-square p = 1.8e-4, JS 0.082) is flagged, the same mix at
another window size is not.

A feature is **strong** when it is flagged, every voting effect statistic is above its ceiling
(:mod:`drift_checks.thresholds`: the strong-effect level) and the veto agrees; or when the guard is
above its ceiling.

**Dataset verdict** (:func:`weighted_score`): the importance-weighted share of flagged features
(a feature that is invalid in the window counts as flagged: it never leaves the denominator);
``dataset_drift`` when it reaches ``dataset_share`` (default 0.5, Evidently's share). Weights come
from the model version's permutation importance (:mod:`drift_checks.importance`), or are uniform.

**Alert policy** (:func:`decide_alert`, per model and reference, in logical time: window starts):

* a drift alert fires when the dataset verdict is drift in ``consecutive_windows`` (k, default 2)
  windows in a row, or when any feature's effect is strong in one window (whatever its weight: a
  shift beyond the strong-effect size is worth a look even on a minor input), or when one feature's
  drift is **sustained** (:func:`sustained_features`, whatever its weight);
* within ``cooldown`` (default 24 hours) of the previous alert, an alert fires again only when it
  names a feature the previous one did not;
* a window whose data contract failed never raises a drift alert (it raises a data-quality alert);
* every alert names its features with the statistics, values, thresholds and threshold sources
  that caused it;
* the policy declares its **false-alarm budget**, ``false_alarm_budget_per_week`` (default 1.0
  false alert per 168 hourly windows), and the threshold quantile is calibrated to it on the
  reference's own windows (:mod:`drift_checks.budget`); every window's summary records it.

**Sustained drift** (the run rule). A feature is *sustained* when it is flagged in this window
and showed *evidence* in at least ``sustained_evidence - 1`` of the ``sustained_windows - 1``
windows before (default 4 of 5). Evidence is one statistic beyond a threshold that separates
shifts from sampling noise, even where the vote did not flag the feature: a p-value or the guard
beyond its threshold, or an effect statistic beyond a threshold calibrated on windows of this size
(``reference`` or ``dynamic``; a ``static`` effect threshold is exceeded by noise alone on small
windows: :meth:`drift_checks.history.HistoryStore.previous_evidence`). This is the run rule of
statistical process control: a small persistent shift is signalled by most of a short run of
points beyond a limit lower than the action limit, "4 out of 5 consecutive points beyond 1 sigma"
(Western Electric Company, *Statistical Quality Control Handbook*, 1956; L. S. Nelson, "The
Shewhart control chart: tests for special causes", Journal of Quality Technology 16(4), 1984,
test 6). Here each statistic's threshold plays the lesser limit (the P95 of the reference's own
windows) and the full per-feature vote the current point.

**Season-matched run rule** (:func:`season_sustained_features`). Where the window's season is
known (the reference's row times and ``TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS``: the season-matched
rows of :mod:`drift_checks.season_match`, from at least 2 cycles), each window is also scored
against the reference rows of its own season, for evidence only. A feature is sustained too when it
is flagged against the window's reference now and showed evidence against its season in each of
the ``seasonal_run_windows - 1`` windows before (default 4 of 4). A shift that a season hides from
the whole reference (NOAA's wind drop at day 3,000 falls in a windy spring) is plain against the
same weeks of earlier years before it is against the whole reference; the vote now stays the
whole reference's, so a season that merely differs from its earlier cycles raises nothing until
the window also departs from everything the model was trained on. Out of sample on NOAA
(``benchmarks/drift_quality.py``, with a year as the period) it catches the offset wind drop 2
windows after its window instead of 5 (the case it was built for). Where no season is known, the
rule never applies.

Why it is weight-blind: permutation importance says how much the model used an input on its
training data, not whether that input is still the one it was; a shift that persists on one input
for most of 5 windows is neither sampling noise nor a single unusual window (a seasonal extreme
moves several inputs for one window: that is no run). On NOAA (``benchmarks/drift_quality.py``)
single features are flagged in 2 windows in a row 8 times in 118 windows with no known shift, but
never with evidence in 4 of 5; the wind drop at day 3,000 and the pressure fall at day 16,000, on
inputs of importance 0.05, meet it within 2 windows (after 2 and 1). Neighbouring rules: 3 of 3,
3 of 4 and 4 of 6 give 1 alarm in those 118 windows, 3 of 5 gives 6, 5 of 5 misses day 16,000.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any, Callable, ClassVar, Mapping, Sequence

from drift_checks.statistic_types import StatisticResult
from drift_checks.statistics import REGISTRY
from drift_checks.thresholds import SettingsPolicy, Threshold
from ground.exceptions import SettingsError
from ground.settings import DEFAULTS

#: Default dataset share (Evidently's ``drift_share``).
DEFAULT_DATASET_SHARE = 0.5
#: Default consecutive drifted windows before an alert.
DEFAULT_CONSECUTIVE_WINDOWS = 2
#: Default cooldown between two alerts of one model naming the same features (hours).
DEFAULT_COOLDOWN_HOURS = 24.0
#: Default span of the sustained-drift run rule (windows, this one included; 0: rule off).
DEFAULT_SUSTAINED_WINDOWS = 5
#: Default windows of that span that must show evidence (this one flagged, the others any
#: statistic beyond its threshold): 4 of 5, the Western Electric / Nelson run rule.
DEFAULT_SUSTAINED_EVIDENCE = 4
#: Default span of the season-matched run rule (windows, this one included; 0: rule off): flagged
#: now, with evidence against its season in each of the 3 windows before.
DEFAULT_SEASONAL_RUN_WINDOWS = 4
#: Ways of weighting features in the dataset score.
WEIGHTINGS = ("importance", "uniform")


@dataclasses.dataclass(frozen=True)
class Vote:
    """One statistic's vote for one feature.

    Attributes:
        name: Statistic name.
        value: The value (``None``: undefined).
        threshold: The threshold it was judged by.
        flagged: Beyond its threshold (``None``: abstains).
        strong: Above its ceiling (``None``: abstains from the strong vote).
        reason: Why it abstains ("" when it votes).
    """

    name: str
    value: float | None
    threshold: Threshold
    flagged: bool | None
    strong: bool | None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class FeatureVerdict:
    """The vote of one feature in one window.

    Attributes:
        flagged: The feature differs from its reference in this window.
        strong: The difference is beyond the strong-effect level.
        votes: One :class:`Vote` per statistic.
        undefined: ``"statistic: status"`` for statistics without a value.
        reason: One line explaining the verdict.
    """

    flagged: bool
    strong: bool
    votes: tuple[Vote, ...]
    undefined: tuple[str, ...]
    reason: str

    def causes(self) -> list[dict[str, Any]]:
        """The statistics beyond their thresholds: name, value, threshold, source, strong."""
        return [{"statistic": v.name, "value": v.value, "threshold": v.threshold.value,
                 "threshold_source": v.threshold.source, "strong": bool(v.strong)}
                for v in self.votes if v.flagged]


def _cap(result: StatisticResult) -> float:
    cap = (result.extra or {}).get("cap")
    if cap is not None:
        return float(cap)
    if result.name == "jensen_shannon":
        return math.sqrt(math.log(2))
    if result.name == "unseen_share":
        return 1.0
    return math.inf


def feature_verdict(results: Mapping[str, StatisticResult],
                    thresholds: Mapping[str, Threshold]) -> FeatureVerdict:
    """Apply the per-feature vote (module docstring) to one feature's statistics.

    Args:
        results: ``{statistic: StatisticResult}`` of the feature.
        thresholds: ``{statistic: Threshold}`` for the same names.

    Returns:
        A :class:`FeatureVerdict`; never flagged when a statistic is undefined (the caller marks
        the feature invalid).
    """
    votes, undefined = [], []
    for name, r in results.items():
        stat, thr = REGISTRY[name], thresholds[name]
        flag = stat.is_drift(r.value, thr.value)
        if flag is None or r.value is None:  # is_drift gives None for every undefined value
            undefined.append(f"{name}: {r.status}")
            votes.append(Vote(name, None, thr, None, None, f"undefined ({r.status})"))
            continue
        strong = None
        if stat.direction == "distance" and thr.ceiling is not None and thr.ceiling < _cap(r):
            strong = r.value > thr.ceiling
        if stat.role == "guard" and not flag:
            votes.append(Vote(name, r.value, thr, None, None, "guard abstains below its threshold"))
        elif stat.direction == "p_value" and thr.value <= 0:
            votes.append(Vote(name, r.value, thr, None, None, "threshold 0: uninformative p-value"))
        elif stat.direction == "distance" and thr.value >= _cap(r):
            votes.append(Vote(name, r.value, thr, None, None, "threshold at the statistic's cap"))
        else:
            votes.append(Vote(name, r.value, thr, bool(flag), strong))
    if undefined:
        return FeatureVerdict(False, False, tuple(votes), tuple(undefined),
                              "undefined statistics (" + "; ".join(undefined) + ")")
    by_role = {role: [v for v in votes if REGISTRY[v.name].role == role and v.flagged is not None]
               for role in ("guard", "significance", "effect")}
    guard = any(v.flagged for v in by_role["guard"])
    guard_strong = any(v.strong for v in by_role["guard"])
    veto = [v.name for v in by_role["significance"] if not v.flagged]
    effects = by_role["effect"]
    effect = any(v.flagged for v in effects)
    flagged = guard or (not veto and effect)
    strong_effects = [v for v in effects if v.strong is not None]
    strong = guard_strong or (flagged and not veto and bool(strong_effects)
                              and all(v.strong for v in strong_effects))
    beyond = [v.name for v in votes if v.flagged]
    if flagged:
        reason = ("strong effect: " if strong else "") + ", ".join(beyond) + " beyond threshold"
    elif veto and effect:
        reason = f"{', '.join(v.name for v in effects if v.flagged)} beyond threshold but " \
                 f"{', '.join(veto)} within (sampling noise)"
    else:
        reason = ""
    return FeatureVerdict(flagged, strong, tuple(votes), (), reason)


def importance_weights(features: Sequence[str], importance: Mapping[str, float] | None,
                       weighting: str = "importance") -> tuple[dict[str, float], str]:
    """Weights of the dataset score.

    Args:
        features: The window's features.
        importance: ``{feature: importance >= 0}`` stored with the reference (``None``: none).
        weighting: ``"importance"`` or ``"uniform"``.

    Returns:
        ``({feature: weight}, how)`` where ``how`` says what was used (``"importance"``,
        ``"uniform"``, or ``"uniform (no importance stored)"``). Features missing from the
        importance get the mean importance of the others.

    Raises:
        SettingsError: Unknown ``weighting``.
    """
    if weighting not in WEIGHTINGS:
        raise SettingsError(f"drift weighting {weighting!r}; expected one of {WEIGHTINGS}")
    uniform = {f: 1.0 for f in features}
    if weighting == "uniform":
        return uniform, "uniform"
    known = {f: float(importance[f]) for f in features
             if importance and f in importance and math.isfinite(float(importance[f]))}
    if not known or sum(max(v, 0.0) for v in known.values()) <= 0:
        return uniform, "uniform (no importance stored)"
    mean = sum(max(v, 0.0) for v in known.values()) / len(known)
    return {f: max(known.get(f, mean), 0.0) for f in features}, "importance"


@dataclasses.dataclass(frozen=True)
class AlertPolicy(SettingsPolicy):
    """When a drifted window becomes an alert.

    Attributes:
        consecutive_windows: Dataset-drift windows in a row needed (k >= 1).
        cooldown: Quiet time after an alert for alerts naming no new feature (logical time).
        dataset_share: Weighted share of flagged features for a dataset-drift window (0-1].
        weighting: ``"importance"`` or ``"uniform"``.
        sustained_windows: Span of the sustained-drift run rule, this window included (0: off,
            else >= 2).
        sustained_evidence: Windows of that span that must show evidence (2..``sustained_windows``).
        seasonal_run_windows: Span of the season-matched run rule, this window included (0: off,
            else >= 2): every window before it must show evidence against its season.
        false_alarm_budget_per_week: The false drift alerts per model-week (168 hourly windows) the
            policy may raise when nothing drifted; the thresholds are calibrated to it on the
            reference's own windows (:mod:`drift_checks.budget`).
    """

    consecutive_windows: int = DEFAULT_CONSECUTIVE_WINDOWS
    cooldown: dt.timedelta = dt.timedelta(hours=DEFAULT_COOLDOWN_HOURS)
    dataset_share: float = DEFAULT_DATASET_SHARE
    weighting: str = "importance"
    sustained_windows: int = DEFAULT_SUSTAINED_WINDOWS
    sustained_evidence: int = DEFAULT_SUSTAINED_EVIDENCE
    seasonal_run_windows: int = DEFAULT_SEASONAL_RUN_WINDOWS
    false_alarm_budget_per_week: float = DEFAULTS.drift_false_alarm_budget_per_week

    SETTINGS: ClassVar[dict[str, tuple]] = {
        "consecutive_windows": ("drift_consecutive_windows", DEFAULT_CONSECUTIVE_WINDOWS),
        "cooldown": ("drift_alert_cooldown_hours", DEFAULT_COOLDOWN_HOURS, lambda h: dt.timedelta(hours=h)),
        "dataset_share": ("drift_dataset_share", DEFAULT_DATASET_SHARE),
        "weighting": ("drift_weighting", "importance"),
        "sustained_windows": ("drift_sustained_windows", DEFAULT_SUSTAINED_WINDOWS),
        "sustained_evidence": ("drift_sustained_evidence", DEFAULT_SUSTAINED_EVIDENCE),
        "seasonal_run_windows": ("drift_seasonal_run_windows", DEFAULT_SEASONAL_RUN_WINDOWS),
        "false_alarm_budget_per_week": ("drift_false_alarm_budget_per_week",
                                        DEFAULTS.drift_false_alarm_budget_per_week),
    }
    CHECKS: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {
        "consecutive_windows": (lambda k: k >= 1, ">= 1, e.g. 2"),
        "cooldown": (lambda c: c >= dt.timedelta(0), ">= 0 hours, e.g. 24"),
        "dataset_share": (lambda x: 0 < x <= 1, "a share in (0, 1], e.g. 0.5"),
        "weighting": (lambda w: w in WEIGHTINGS, f"one of {WEIGHTINGS}"),
        "sustained_windows": (lambda n: n == 0 or n >= 2, "0 (off) or >= 2 windows, e.g. 5"),
        "seasonal_run_windows": (lambda n: n == 0 or n >= 2, "0 (off) or >= 2 windows, e.g. 4"),
        "false_alarm_budget_per_week": (lambda b: 0 < b < math.inf,
                                        "a finite number > 0 of false alerts per model-week, e.g. 1"),
    }

    def __post_init__(self) -> None:
        """Check every field, then the run rule's evidence against its span.

        Raises:
            SettingsError: A field fails its check, or ``sustained_evidence`` is outside
                2..``sustained_windows`` while the rule is on.
        """
        super().__post_init__()
        n, m = self.sustained_windows, self.sustained_evidence
        if n and not 2 <= m <= n:
            raise SettingsError(f"sustained_evidence={m!r}; expected 2..sustained_windows ({n}), e.g. 4 of 5")


def sustained_features(policy: AlertPolicy, flagged: Mapping[str, bool],
                       previous_evidence: Mapping[str, Sequence[bool]]) -> list[str]:
    """Features whose drift is sustained (the run rule of the module docstring).

    Args:
        policy: The alert policy (``sustained_windows``, ``sustained_evidence``).
        flagged: ``{feature: flagged by the vote in this window}``.
        previous_evidence: ``{feature: [evidence in each of the windows before, oldest first]}``
            (:meth:`drift_checks.history.HistoryStore.previous_evidence`); only the last
            ``sustained_windows - 1`` count, a missing window counts as no evidence.

    Returns:
        Sorted names of the flagged features with evidence in at least ``sustained_evidence - 1``
        of the ``sustained_windows - 1`` windows before (empty when the rule is off).
    """
    n, m = policy.sustained_windows, policy.sustained_evidence
    if n < 2:
        return []
    out = []
    for f, now in flagged.items():
        before = list(previous_evidence.get(f, []))[-(n - 1):]
        if now and sum(bool(b) for b in before) >= m - 1:
            out.append(f)
    return sorted(out)


def season_sustained_features(policy: AlertPolicy, flagged: Mapping[str, bool],
                              season_evidence: Mapping[str, Sequence[bool]]) -> list[str]:
    """Features whose drift is sustained against their season (the season-matched run rule).

    Args:
        policy: The alert policy (``seasonal_run_windows``).
        flagged: ``{feature: flagged by the vote against the window's reference in this window}``.
        season_evidence: ``{feature: [evidence against the season-matched reference in each of the
            windows before, oldest first]}`` (:meth:`drift_checks.history.HistoryStore.previous_evidence`
            under the season's reference id); only the last ``seasonal_run_windows - 1`` count, a
            missing window counts as no evidence.

    Returns:
        Sorted names of the flagged features with evidence against their season in every one of the
        ``seasonal_run_windows - 1`` windows before (empty when the rule is off).
    """
    n = policy.seasonal_run_windows
    if n < 2:
        return []
    out = []
    for f, now in flagged.items():
        before = list(season_evidence.get(f, []))[-(n - 1):]
        if now and len(before) == n - 1 and all(before):
            out.append(f)
    return sorted(out)


@dataclasses.dataclass(frozen=True)
class AlertDecision:
    """Outcome of :func:`decide_alert`.

    Attributes:
        fire: A drift alert fires for this window.
        candidate: The window meets the alert rule (persistent dataset drift or a strong effect),
            whether or not the cooldown lets it fire.
        features: Features the alert names (strong ones, sustained ones and those flagged in k
            windows in a row).
        reason: One line.
    """

    fire: bool
    candidate: bool
    features: tuple[str, ...]
    reason: str


def decide_alert(policy: AlertPolicy, *, window_start: dt.datetime, dataset_drift: bool,
                 previous_drift: Sequence[bool], strong_features: Sequence[str],
                 persistent_features: Sequence[str],
                 last_alert: tuple[dt.datetime, Sequence[str]] | None,
                 contract_failed: bool = False,
                 sustained: Sequence[str] = (),
                 season_sustained: Sequence[str] = ()) -> AlertDecision:
    """Apply the alert policy (module docstring) to one window.

    Args:
        policy: The alert policy.
        window_start: The window's start (logical time, timezone-aware).
        dataset_drift: This window's dataset verdict.
        previous_drift: Dataset verdicts of the ``k - 1`` windows before, oldest first.
        strong_features: Features with a strong effect in this window.
        persistent_features: Features flagged in this window and the ``k - 1`` before.
        last_alert: ``(start, features)`` of the model's previous alert under this reference.
        contract_failed: The window broke its data contract.
        sustained: Features whose drift is sustained (:func:`sustained_features`).
        season_sustained: Features whose drift is sustained against their season
            (:func:`season_sustained_features`).

    Returns:
        An :class:`AlertDecision`.
    """
    k = policy.consecutive_windows
    before = list(previous_drift)[-(k - 1):] if k > 1 else []
    persistent = bool(dataset_drift) and len(before) == k - 1 and all(before)
    candidate = bool(persistent or strong_features or sustained or season_sustained)
    features = tuple(sorted(set(strong_features) | set(sustained) | set(season_sustained)
                            | (set(persistent_features) if persistent else set())))
    if not candidate:
        return AlertDecision(False, False, (), "")
    why = []
    if persistent:
        why.append(f"dataset drift in {k} consecutive windows")
    if strong_features:
        why.append("strong effect on " + ", ".join(sorted(strong_features)))
    if sustained:
        why.append(f"sustained drift on {', '.join(sorted(sustained))} (flagged, with evidence in "
                   f"{policy.sustained_evidence} of the last {policy.sustained_windows} windows)")
    if season_sustained:
        why.append(f"sustained drift against the season on {', '.join(sorted(season_sustained))} (flagged, "
                   f"with evidence against its season in each of the {policy.seasonal_run_windows - 1} "
                   "windows before)")
    reason = "; ".join(why)
    if contract_failed:
        return AlertDecision(False, True, features, reason + "; not raised: the data contract failed "
                             "(a data-quality alert instead)")
    if last_alert is not None:
        since = window_start - last_alert[0]
        new = sorted(set(features) - set(last_alert[1]))
        if since < policy.cooldown and not new:
            return AlertDecision(False, True, features, f"{reason}; within the cooldown "
                                 f"({since} after the previous alert, no new feature)")
        if new and since < policy.cooldown:
            reason += f"; new features {new} during the cooldown"
    return AlertDecision(True, True, features, reason)
