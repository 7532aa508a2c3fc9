"""The whole hourly drift check as one function: :func:`check_window`.

window -> contract (exact vectorised checks + GX) -> statistics per feature (the registry) ->
thresholds (per reference: taught history, reference chunks or static; floors and ceilings) ->
per-feature vote -> importance-weighted dataset verdict -> alert policy -> history (every hour,
also when nothing drifted) -> small JSON summary (XCom-safe). That is the hourly critical path
(:mod:`drift_checks.thresholds` and :mod:`drift_checks.policy` document the rules). The Evidently
report on a sample (:func:`evidently_report_for_window`) and the whylogs profile of the hour are
separate steps that run beside it (their cost is fixed, 15-27 s for Evidently, and they decide
nothing).

Feature severities:

* ``no_data``: the window has no rows: nothing scored, nothing stored in the
  statistics history (the baseline is untouched), a data-availability alert is raised;
* ``invalid``: a CRITICAL expectation failed on the column (missing, wrong dtype, e.g. 100 %
  nulls) or a statistic is undefined on the window's side: no drift is computed from
  nonsense, no NaN can read as "ok", and the feature counts as flagged in the dataset score (it
  never leaves the denominator);
* ``unscored``: the reference itself has no value for the column (reported as a data-quality
  warning; not part of the score);
* ``drift``: a strong effect, or flagged in this window and the ``k - 1`` windows before (one
  unusual hour is not an alarm), or sustained (flagged now, with evidence in most of the last
  few windows: the run rule of :mod:`drift_checks.policy`; or with evidence against the window's
  own season in each of the last few: its season-matched run rule, where a season is given);
* ``warning``: flagged in this window only;
* ``ok``.

A window whose learned ranges or category sets are exceeded is NOT invalid: those expectations
only warn, and the shifted feature is scored as drift. A window whose contract failed raises a
data-quality alert and never a drift alert.
"""

from __future__ import annotations

import dataclasses
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pandas as pd

from drift_checks import statistics as st
from drift_checks.budget import BudgetCalibration, calibrate_to_budget, uncalibrated
from drift_checks.contract_types import Contract, ContractResult
from drift_checks.contracts import DEFAULT_GX_SAMPLE_ROWS, derive_contract, run_contract, with_derived
from drift_checks.declared_schema import apply_schema, typed_reference
from drift_checks.history import HistoryStore, StatisticRow
from drift_checks.inference_log import LogSchema, categorical_columns, numeric_columns
from drift_checks.policy import (
    AlertDecision,
    AlertPolicy,
    FeatureVerdict,
    decide_alert,
    feature_verdict,
    importance_weights,
    season_sustained_features,
    sustained_features,
)
from drift_checks.thresholds import (
    Calibration,
    Threshold,
    ThresholdPolicy,
    calibrate_from_reference,
    chunk_rows_for,
    resolve_thresholds,
    settings_fields,
    weighted_score,
)

if TYPE_CHECKING:
    from drift_checks.summaries import WindowSummary
    from ground.settings import Settings

SEVERITY_ORDER = ["ok", "warning", "invalid", "drift"]
#: Largest summary returned (bytes); larger ones drop per-statistic details.
DEFAULT_MAX_SUMMARY_BYTES = 48 * 1024


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """Knobs of the hourly check.

    Attributes:
        policy: Threshold policy (look-back, quantile, min history, static overrides, ceiling).
        alerts: Alert policy (k consecutive windows, cooldown, dataset share, weighting).
        statistics: Statistic names to compute (``None``: every registered one of the kind).
        weights: Explicit per-feature weights (override the reference's importance).
        evidently_sample_rows: Rows per side for the Evidently report
            (:func:`evidently_report_for_window`, a separate step); 0 disables it.
        max_summary_bytes: Cap of the returned summary.
        workers: Threads scoring numeric features (numpy releases the GIL).
        contract_sample_rows: Rows of the seeded sample on which GX evaluates the row-wise
            expectations that have no exact vectorised check.
    """

    policy: ThresholdPolicy = dataclasses.field(default_factory=ThresholdPolicy)
    alerts: AlertPolicy = dataclasses.field(default_factory=AlertPolicy)
    statistics: tuple[str, ...] | None = None
    weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    evidently_sample_rows: int = 5000
    max_summary_bytes: int = DEFAULT_MAX_SUMMARY_BYTES
    workers: int = 2
    contract_sample_rows: int = DEFAULT_GX_SAMPLE_ROWS

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> "CheckConfig":
        """Config from the ``drift_*`` settings (thresholds, alert policy, Evidently sample size).

        Args:
            settings: The :class:`ground.settings.Settings` in effect, read by the caller.
            **overrides: Field values that replace the settings' ones.

        Returns:
            The config.

        Raises:
            SettingsError: A threshold or alert setting fails its check.
        """
        s = settings
        return cls(**settings_fields(s, {"policy": ThresholdPolicy.from_settings(s),
                                         "alerts": AlertPolicy.from_settings(s), **overrides},
                                     evidently_sample_rows=("drift_evidently_sample_rows", 5000),
                                     max_summary_bytes=("max_xcom_bytes", DEFAULT_MAX_SUMMARY_BYTES)))


@dataclasses.dataclass
class PreparedReference:
    """Reference columns prepared once per model version (sorted numerics, category counts).

    Attributes:
        schema / frame: Feature kinds and the sample in row (time) order.
        numeric / categorical: Prepared columns.
        reference_id: The id thresholds are keyed by (``""``: unkeyed).
        importance: ``{feature: importance}`` of the model version (``None``: none stored).
        time_ordered: Whether the rows follow time (see :func:`looks_time_ordered`); chunks of
            consecutive rows then calibrate seasonality too, else chunks of a seeded shuffle
            calibrate sampling noise only.
        calibrations: Reference-chunk calibrations by chunk size (filled lazily).
        budgets: Quantiles calibrated to the false-alarm budget, by calibration and policies
            (filled lazily, :meth:`budget`).
        calibration_store: Where the calibrations outlive the process (``load(key)`` /
            ``save(key, calibration)``, :class:`drift_checks.reference_cache.CalibrationStore`);
            ``None``: this object only. Each hourly check runs in a fresh task process, and
            scoring the reference's chunks is most of a small window's check.
    """

    schema: LogSchema
    frame: pd.DataFrame
    numeric: dict[str, st.NumericSample]
    categorical: dict[str, dict[str, int]]
    reference_id: str = ""
    importance: dict[str, float] | None = None
    time_ordered: bool = True
    calibrations: dict[tuple, Calibration] = dataclasses.field(default_factory=dict)
    budgets: dict[tuple, BudgetCalibration | None] = dataclasses.field(default_factory=dict)
    calibration_store: Any = None

    def calibration(self, window_rows: int, quantile: float, names=None) -> Calibration | None:
        """The reference-chunk calibration for a window of ``window_rows`` rows.

        Cached here and, with a :attr:`calibration_store`, there (computed once per reference,
        chunk size, quantile and statistics, whichever process asks first).
        """
        size = chunk_rows_for(window_rows, len(self.frame))
        if size == 0:
            return None
        key = (size, quantile, tuple(names) if names is not None else None)
        if key not in self.calibrations:
            stored = self.calibration_store.load(key) if self.calibration_store is not None else None
            if stored is None:
                frame = self.frame if self.time_ordered else self.frame.sample(frac=1.0, random_state=0)
                stored = calibrate_from_reference(frame, self.numeric, self.categorical, size, quantile=quantile,
                                                  names=names)
                if self.calibration_store is not None:
                    self.calibration_store.save(key, stored)
            self.calibrations[key] = stored
        return self.calibrations[key]

    def contract_rows(self) -> pd.DataFrame:
        """The rows a window's derived contract is learned from (here: this reference's rows)."""
        return self.frame

    def budget(self, calibration: Calibration | None, policy: ThresholdPolicy, alerts: AlertPolicy,
               weights: Mapping[str, float]) -> BudgetCalibration | None:
        """The quantile calibrated to ``alerts``' false-alarm budget on ``calibration`` (cached).

        See :func:`drift_checks.budget.calibrate_to_budget`; ``None`` without a calibration.
        """
        if calibration is None:
            return None
        key = (calibration.chunk_rows, calibration.n_chunks, policy.quantile, policy.ceiling_factor,
               tuple(sorted(policy.static.items())), alerts, tuple(sorted(weights.items())))
        if key not in self.budgets:
            self.budgets[key] = calibrate_to_budget(calibration, policy, alerts, weights)
        return self.budgets[key]


def looks_time_ordered(frame: pd.DataFrame, columns) -> bool:
    """Whether the reference's row order can stand for time.

    ``False`` when a non-constant feature is sorted (numeric, either direction) or grouped (each
    category in one block), as in a file sorted by a column; ``True`` otherwise. References are written
    in their source's order (:func:`drift_checks.reference.save_reference`), normally the order of time.
    """
    for c in columns:
        if c not in frame.columns:
            continue
        s = frame[c].dropna()
        if isinstance(s.dtype, np.dtype) and s.dtype.kind in "iuf":  # no hash table: min/max and one diff
            v = s.to_numpy()
            if v.size < 2 or v.min() == v.max():  # fewer than 2 distinct values (nunique() < 2)
                continue
            if bool(np.all(v[1:] >= v[:-1])) or bool(np.all(v[1:] <= v[:-1])):  # pandas' is_monotonic_*
                return False
            continue
        if s.nunique() < 2:
            continue
        if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
            if s.is_monotonic_increasing or s.is_monotonic_decreasing:
                return False
        else:
            codes = s.astype(str)
            runs = int((codes != codes.shift()).sum())
            if runs == codes.nunique():
                return False
    return True


def prepare_reference(frame: pd.DataFrame, schema: LogSchema, workers: int = 2, *,
                      reference_id: str = "", importance: Mapping[str, float] | None = None,
                      time_ordered: bool | None = None) -> PreparedReference:
    """Sort numeric columns and count categories of the reference (reuse every hour).

    The sample is first read as its declared schema
    (:func:`drift_checks.declared_schema.typed_reference`): categorical columns as category
    names whatever their dtype.

    Args:
        frame: The reference sample (feature columns).
        schema: Its feature kinds.
        workers: Threads sorting numeric columns.
        reference_id: The id thresholds are keyed by.
        importance: ``{feature: importance}`` of the model version.
        time_ordered: Whether the rows follow time (``None``: :func:`looks_time_ordered`).

    Raises:
        WindowError: A reference value cannot be read as its column's declared kind.
    """
    frame = typed_reference(frame, schema.features)  # the declared schema first
    cols = [c for c in numeric_columns(schema) if c in frame.columns]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # numpy sorts release the GIL
        num = dict(zip(cols, pool.map(lambda c: st.prepare_numeric(frame[c]), cols), strict=True))
    cat = {c: st.category_counts(frame[c]) for c in categorical_columns(schema) if c in frame.columns}
    ordered = looks_time_ordered(frame, schema.features) if time_ordered is None else bool(time_ordered)
    return PreparedReference(schema, frame, num, cat, reference_id, dict(importance) if importance else None,
                             ordered)


def _iso(t) -> str:
    return pd.Timestamp(t).tz_convert("UTC").isoformat()


def _missing_share(frame, col: str) -> float | None:
    if isinstance(frame, pd.DataFrame):
        return round(float(frame[col].isna().mean()), 6) if col in frame.columns and len(frame) else None
    return frame.missing_share(col)


def _columns(frame) -> list[str]:
    return list(frame.columns) if isinstance(frame, pd.DataFrame) else frame.columns


def _quality_alerts(cres: ContractResult, frame) -> list[dict[str, Any]]:
    alerts = []
    for r, kind, sev in ([(r, "data_quality", "invalid") for r in cres.failures]
                         + [(r, "data_quality_warning", "warning") for r in cres.warnings]):
        a = {"kind": kind, "severity": sev, "column": r.column, "expectation": r.expectation,
             "source": r.source, "observed": r.observed, "message": r.message[:300]}
        if r.expectation == "expect_column_values_to_not_be_null" and r.column in _columns(frame):
            a["window_missing_share"] = _missing_share(frame, r.column)
            a["reference_missing_share"] = r.meta.get("reference_null_fraction")
        alerts.append(a)
    for r in cres.check_errors:
        alerts.append({"kind": "contract_check_error", "severity": "error", "column": r.column,
                       "expectation": r.expectation, "source": r.source, "message": r.message[:300]})
    return alerts


def _reference_degenerate(reference: PreparedReference, col: str) -> bool:
    if col in reference.numeric:
        return reference.numeric[col].status != "ok"
    return not reference.categorical.get(col)


@dataclasses.dataclass
class _ContractOutcome:
    """What the window's contract decided, before any statistic.

    Attributes:
        frame: The window read as its declared schema (a streamed summary unchanged).
        result: The contract's result.
        status: ``ok``, ``contract_failed`` or ``check_error``.
        invalid: ``{feature: reason}`` of the columns a CRITICAL expectation failed.
        unscored: ``{feature: reason}`` of the columns the reference has no value for.
        alerts: Data-quality alerts and warnings so far (the drift alert is added later).
    """

    frame: Any
    result: ContractResult
    status: str
    invalid: dict[str, str]
    unscored: dict[str, str]
    alerts: list[dict[str, Any]]


@dataclasses.dataclass
class _Votes:
    """The per-feature votes of one window and the history they were judged with.

    Attributes:
        thresholds: ``{(feature, statistic): Threshold}`` applied this hour.
        verdicts: ``{feature: FeatureVerdict}`` of every scored feature.
        previous: ``{feature: flags of the k - 1 windows before}``, oldest first.
        sustained: Features the run rule calls sustained.
        budget: The false-alarm budget and the quantile calibrated to it (summary entry).
        season_sustained: Features the season-matched run rule calls sustained.
        season_rows: The window's statistics against its season (stored for the run rule).
    """

    thresholds: dict[tuple[str, str], Threshold]
    verdicts: dict[str, FeatureVerdict]
    previous: dict[str, list[bool]]
    sustained: set[str]
    budget: dict[str, Any]
    season_sustained: set[str] = dataclasses.field(default_factory=set)
    season_rows: list[StatisticRow] = dataclasses.field(default_factory=list)


def _no_data_summary(base: dict[str, Any], model: str, start: Any, history: HistoryStore,
                     model_version: int | None) -> dict[str, Any]:
    """Record an empty hour (the statistics history untouched) and summarise it as ``no_data``."""
    summary = {**base, "status": "no_data", "severity": "no_data", "drift": False, "dataset_drift": False,
               "dataset_score": None, "features": {}, "contract": None, "evidently": None,
               "alerts": [{"kind": "data_availability", "severity": "no_data",
                           "message": f"no inference records for {model!r} in "
                                      f"[{base['window_start']}, {base['window_end']})"}],
               "alert_features": [], "alert_reason": "", "artefacts": {}}
    history.record_hour(model, start, status="no_data", n_rows=0, model_version=model_version,
                        reference_id=base["reference_id"], summary={"status": "no_data"})
    return summary


def _check_contract(frame: Any, reference: PreparedReference, contract: Contract | None,
                    cfg: CheckConfig, streamed: bool) -> _ContractOutcome:
    """Read the window as its declared schema and run the derived contract (plus a user's suite)."""
    schema = reference.schema
    unreadable = None
    if not streamed:  # the declared schema first (a streamed window was read with it)
        applied = apply_schema(frame, schema.features)
        frame, unreadable = applied.frame, applied.unreadable
    contract = with_derived(contract, derive_contract(reference.contract_rows(), schema))  # a user's suite adds
    cres: ContractResult = run_contract(contract, frame, gx_sample_rows=cfg.contract_sample_rows,
                                        schema=schema.features, unreadable=unreadable)
    status = {"passed": "ok", "failed": "contract_failed", "error": "check_error"}[cres.status]
    invalid = {c: "contract failed: " + ", ".join(
        f"{r.expectation} observed {json.dumps(r.observed)[:80]}" for r in cres.failures if r.column == c)
        for c in cres.invalid_columns if c in schema.features}
    alerts = _quality_alerts(cres, frame)
    unscored = {c: "the reference has no value for this column" for c in schema.features
                if c not in invalid and c in _columns(frame) and _reference_degenerate(reference, c)}
    for c in unscored:
        alerts.append({"kind": "data_quality_warning", "severity": "warning", "column": c,
                       "message": f"column {c!r} cannot be scored: {unscored[c]}"})
    return _ContractOutcome(frame, cres, status, invalid, unscored, alerts)


def _score_features(frame: Any, reference: PreparedReference, checked: _ContractOutcome, cfg: CheckConfig,
                    n_rows: int) -> tuple[dict[str, dict[str, st.StatisticResult]], dict[str, st.NumericSample]]:
    """Every statistic of every valid, scorable feature; and the window's numeric samples."""
    schema = reference.schema
    skip = checked.invalid.keys() | checked.unscored.keys()
    num_cols = [c for c in numeric_columns(schema) if c not in skip]
    cat_cols = [c for c in categorical_columns(schema) if c not in skip]
    streamed = not isinstance(frame, pd.DataFrame)
    names = cfg.statistics
    samples: dict[str, st.NumericSample] = {}

    def score_num(c):
        samples[c] = cur = frame.numeric_sample(c) if streamed else st.prepare_numeric(frame[c])
        return c, st.score_numeric(reference.numeric[c], cur, names)

    with ThreadPoolExecutor(max_workers=max(1, cfg.workers)) as pool:
        scored: dict[str, dict[str, st.StatisticResult]] = dict(pool.map(score_num, num_cols))
    for c in cat_cols:
        counts = frame.category_counts(c) if streamed else st.category_counts(frame[c])
        scored[c] = st.score_categorical(reference.categorical[c], counts, reference_rows=len(reference.frame),
                                         current_rows=n_rows, names=names)
    # (infinite values never get here: the derived contract's finiteness check made the column invalid)
    return scored, samples


def _budgeted(reference: PreparedReference, cfg: CheckConfig, n_rows: int, weights: Mapping[str, float]
              ) -> tuple[Calibration | None, ThresholdPolicy, dict[str, Any]]:
    """The reference calibration and threshold policy at the quantile calibrated to the budget.

    The policy's own quantile when the reference gives no calibration (then the summary entry
    says why) or when it already fits the budget (:mod:`drift_checks.budget`).
    """
    policy, budget = cfg.policy, cfg.alerts.false_alarm_budget_per_week
    calibration = reference.calibration(n_rows, policy.quantile, cfg.statistics)
    fitted = reference.budget(calibration, policy, cfg.alerts, weights)
    if fitted is None:
        return calibration, policy, uncalibrated(budget, "fewer than 10 reference chunks of the window's size")
    if fitted.quantile != policy.quantile:
        policy = dataclasses.replace(policy, quantile=fitted.quantile)
        calibration = calibration.at_quantile(fitted.quantile) if calibration is not None else None
    return calibration, policy, fitted.to_dict()


def _vote(model: str, start: Any, scored: dict[str, dict[str, st.StatisticResult]],
          reference: PreparedReference, history: HistoryStore, cfg: CheckConfig, n_rows: int,
          weights: Mapping[str, float]) -> _Votes:
    """Thresholds for every (feature, statistic), each feature's vote, its past flags and the run rule."""
    ref_id = reference.reference_id
    thresholds, verdicts, budget = _judge(model, start, scored, reference, history, cfg, n_rows, weights)
    k = cfg.alerts.consecutive_windows
    prev = history.previous_flags(model, list(scored), start, k - 1, reference_id=ref_id)
    n_run = cfg.alerts.sustained_windows
    sustained = set(sustained_features(
        cfg.alerts, _flagged(verdicts),
        history.previous_evidence(model, list(scored), start, n_run - 1, reference_id=ref_id)
        if n_run >= 2 else {}))
    return _Votes(thresholds, verdicts, prev, sustained, budget)


def _judge(model: str, start: Any, scored: dict[str, dict[str, st.StatisticResult]],
           reference: PreparedReference, history: HistoryStore, cfg: CheckConfig, n_rows: int,
           weights: Mapping[str, float]
           ) -> tuple[dict[tuple[str, str], Threshold], dict[str, FeatureVerdict], dict[str, Any]]:
    """(thresholds, per-feature verdicts, budget entry) of ``scored`` against ``reference``.

    Thresholds from the reference's calibration at the budget's quantile and its own taught history.
    """
    series = [(f, s) for f, res in scored.items() for s in res]
    calibration, policy = None, cfg.policy
    budget = uncalibrated(cfg.alerts.false_alarm_budget_per_week, "no feature scored")
    if series:
        calibration, policy, budget = _budgeted(reference, cfg, n_rows, weights)
    thresholds = resolve_thresholds(history, model, start, series, policy,
                                    reference_id=reference.reference_id, calibration=calibration)
    verdicts = {f: feature_verdict(res, {n: thresholds[(f, n)] for n in res}) for f, res in scored.items()}
    return thresholds, verdicts, budget


def _flagged(verdicts: Mapping[str, FeatureVerdict]) -> dict[str, bool]:
    """``{feature: flagged by its vote}`` (a feature with an undefined statistic is not)."""
    return {f: v.flagged and not v.undefined for f, v in verdicts.items()}


def _season_votes(model: str, start: Any, checked: _ContractOutcome, season: PreparedReference,
                  history: HistoryStore, cfg: CheckConfig, n_rows: int, weights: Mapping[str, float],
                  votes: _Votes) -> None:
    """The season-matched run rule (:func:`drift_checks.policy.season_sustained_features`) into ``votes``.

    The window is scored against ``season`` too, with that reference's own calibrated and taught
    thresholds; those statistics are kept (``votes.season_rows``) as evidence for the windows after,
    and decide nothing in this one. They teach the season's dynamic thresholds as the hour's own
    rows teach the reference's: not when the feature's effect against its season is strong.
    """
    scored, _ = _score_features(checked.frame, season, checked, cfg, n_rows)
    if not any(scored.values()):
        return
    _, verdicts, _ = _judge(model, start, scored, season, history, cfg, n_rows, weights)
    sid = season.reference_id
    votes.season_rows = [StatisticRow(f, vote.name, float(vote.value), taught=not v.strong,  # as the hour's own
                                      threshold=vote.threshold.value, source=vote.threshold.source, reference_id=sid)
                         for f, v in verdicts.items() for vote in v.votes if vote.value is not None]
    before = history.previous_evidence(model, list(scored), start, cfg.alerts.seasonal_run_windows - 1,
                                       reference_id=sid)
    votes.season_sustained = set(season_sustained_features(cfg.alerts, _flagged(votes.verdicts), before))


def _scored_feature(f: str, v: FeatureVerdict, results: Mapping[str, st.StatisticResult], votes: _Votes,
                    cfg: CheckConfig) -> dict[str, Any]:
    """Severity, flag, reason and per-statistic detail of one scored feature (weight and counts added later)."""
    k, n_run = cfg.alerts.consecutive_windows, cfg.alerts.sustained_windows
    persistent = all(votes.previous.get(f, []))
    if v.undefined:
        sev = "invalid"
    elif v.strong or (v.flagged and persistent) or f in votes.sustained | votes.season_sustained:
        sev = "drift"
    else:
        sev = "warning" if v.flagged else "ok"
    reason = v.reason
    if sev == "drift" and not v.strong and persistent:
        reason += f" in {k} consecutive windows"
    if f in votes.sustained:
        reason += f"; sustained: evidence in {cfg.alerts.sustained_evidence} of the last {n_run} windows"
    if f in votes.season_sustained:
        reason += (f"; sustained against its season: evidence in each of the "
                   f"{cfg.alerts.seasonal_run_windows - 1} windows before")
    stats_out = {}
    for vote in v.votes:
        stats_out[vote.name] = {**results[vote.name].to_dict(), "threshold": vote.threshold.value,
                                "threshold_source": vote.threshold.source,
                                "ceiling": vote.threshold.ceiling,
                                "n_history": vote.threshold.n_history, "flagged": vote.flagged,
                                "strong": vote.strong, **({"abstains": vote.reason} if vote.reason else {})}
    return {"severity": sev, "flagged": bool(v.flagged or v.undefined), "strong": v.strong,
            "reason": reason, "statistics": stats_out}


def _feature_report(checked: _ContractOutcome, scored: dict[str, dict[str, st.StatisticResult]],
                    samples: Mapping[str, st.NumericSample], votes: _Votes, weights: Mapping[str, float],
                    cfg: CheckConfig) -> dict[str, dict[str, Any]]:
    """``{feature: severity, flagged, strong, reason, weight, statistics[, n_null, n_infinite]}``."""
    features: dict[str, dict[str, Any]] = {}
    for c, reason in checked.invalid.items():
        features[c] = {"severity": "invalid", "flagged": True, "strong": False, "reason": reason,
                       "weight": weights.get(c, 1.0), "statistics": {}}
    for c, reason in checked.unscored.items():
        features[c] = {"severity": "unscored", "flagged": False, "strong": False, "reason": reason,
                       "weight": weights.get(c, 1.0), "statistics": {}}
    for f, v in votes.verdicts.items():
        entry = _scored_feature(f, v, scored[f], votes, cfg)
        extra = {}
        if f in samples:
            extra = {"n_null": samples[f].n_null, "n_infinite": samples[f].n_infinite}
        features[f] = {"severity": entry["severity"], "flagged": entry["flagged"], "strong": entry["strong"],
                       "reason": entry["reason"], "weight": weights.get(f, 1.0),
                       "statistics": entry["statistics"], **extra}
    return features


def _decide(model: str, start: Any, features: Mapping[str, dict[str, Any]], votes: _Votes,
            checked: _ContractOutcome, weights: Mapping[str, float], history: HistoryStore,
            cfg: CheckConfig, ref_id: str) -> tuple[float, bool, AlertDecision]:
    """The weighted dataset score, the dataset verdict and the alert decision of the window."""
    in_score = {f: info["flagged"] for f, info in features.items() if info["severity"] != "unscored"}
    score = weighted_score(in_score, weights)
    dataset_drift = bool(in_score) and score >= cfg.alerts.dataset_share
    k = cfg.alerts.consecutive_windows
    decision = decide_alert(
        cfg.alerts, window_start=pd.Timestamp(start).tz_convert("UTC").to_pydatetime(),
        dataset_drift=dataset_drift,
        previous_drift=history.previous_windows(model, start, k - 1, reference_id=ref_id),
        strong_features=[f for f, v in votes.verdicts.items() if v.strong],
        persistent_features=[f for f, info in features.items() if info["severity"] == "drift"
                             or (info["severity"] == "invalid" and f in checked.invalid)],
        last_alert=history.last_alert(model, start, reference_id=ref_id),
        contract_failed=checked.status != "ok", sustained=sorted(votes.sustained),
        season_sustained=sorted(votes.season_sustained))
    return score, dataset_drift, decision


def _window_severity(decision: AlertDecision, status: str, dataset_drift: bool,
                     features: Mapping[str, dict[str, Any]]) -> str:
    """The window's severity: ``drift`` (an alert candidate on a passed contract), ``warning``, ``invalid``, ``ok``."""
    sevs = {v["severity"] for v in features.values()}
    if decision.candidate and status == "ok":
        return "drift"
    if dataset_drift or "drift" in sevs or "warning" in sevs:
        return "warning"
    if "invalid" in sevs:
        return "invalid"
    return "ok"


def _record_window(model: str, start: Any, summary: Mapping[str, Any], features: Mapping[str, dict[str, Any]],
                   votes: _Votes, history: HistoryStore, *, status: str, dataset_drift: bool, fired: bool,
                   n_rows: int, model_version: int | None, ref_id: str) -> None:
    """Store the hour: its statistics (taught when the window may teach), verdicts and small summary."""
    teach_window = status == "ok" and not dataset_drift and not fired
    rows = [StatisticRow(f, vote.name, float(vote.value), taught=teach_window and not v.strong,
                         threshold=vote.threshold.value, source=vote.threshold.source)
            for f, v in votes.verdicts.items() if not v.undefined for vote in v.votes if vote.value is not None]
    rows += [dataclasses.replace(r, taught=teach_window and r.taught) for r in votes.season_rows]
    history.record_hour(model, start, status=status, n_rows=n_rows, statistics=rows,
                        verdicts={f: (info["severity"], info["flagged"], info["strong"])
                                  for f, info in features.items()},
                        model_version=model_version, reference_id=ref_id, dataset_drift=dataset_drift,
                        alert=fired,
                        summary={k_: summary[k_] for k_ in ("status", "severity", "drift", "dataset_drift",
                                                             "dataset_score", "alert_features")})


def _write_summary(summary: dict[str, Any], artefact_dir: str | Path | None) -> None:
    """Write the full summary as ``drift_summary.json`` in ``artefact_dir`` and name it in ``artefacts``."""
    if artefact_dir is None:
        return
    p = Path(artefact_dir) / "drift_summary.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(summary, indent=1, sort_keys=True))
    summary["artefacts"] = {**summary["artefacts"], "summary_json": str(p)}


def check_window(
    *,
    model: str,
    frame: "pd.DataFrame | WindowSummary",
    start,
    end,
    reference: PreparedReference,
    history: HistoryStore,
    contract: Contract | None = None,
    config: CheckConfig | None = None,
    model_version: int | None = None,
    artefact_dir: str | Path | None = None,
    season: PreparedReference | None = None,
) -> dict[str, Any]:
    """Run the hourly drift check of one model's window and record it.

    The steps, in order: contract (:func:`_check_contract`), statistics (:func:`_score_features`),
    thresholds and votes (:func:`_vote`), per-feature severities (:func:`_feature_report`),
    dataset verdict and alert (:func:`_decide`), history (:func:`_record_window`), artefact.

    Args:
        model: Model name.
        frame: The window's records (from :func:`drift_checks.inference_log.read_window`), or
            the :class:`~drift_checks.summaries.WindowSummary` of a window streamed in record
            batches (:mod:`drift_checks.streaming`, :mod:`drift_checks.spark`): the same
            contract, statistics (sketched KS/Wasserstein within their stated error bound),
            thresholds and policy.
        start: The window's UTC start (the DAG's data interval; logical time).
        end: The window's UTC end, exclusive.
        reference: From :func:`prepare_reference` (the reference of the served version, or the
            strategy's reference: see :mod:`drift_checks.strategies`).
        history: Statistics history; this hour's results REPLACE any earlier run of it.
        contract: The user's own expectations (a GX suite as a :class:`Contract`), ADDED to the
            contract derived from the reference and the schema, never in its place
            (:func:`drift_checks.contracts.with_derived`); ``None``: the derived one alone.
        config: Check knobs (default :class:`CheckConfig`).
        model_version: Version that served the window (recorded).
        artefact_dir: Folder for bulky artefacts (full summary JSON); none written when ``None``.
        season: The reference rows of the window's season (:mod:`drift_checks.season_match`, from
            at least 2 cycles; its own ``reference_id``), for the season-matched run rule
            (:mod:`drift_checks.policy`); ``None``, ``reference`` itself (a season of fewer cycles
            falls back to it), or ``seasonal_run_windows`` 0: the rule is off.

    Returns:
        JSON-serialisable summary under ``config.max_summary_bytes``: ``status`` (``ok``,
        ``no_data``, ``contract_failed``, ``check_error``), ``severity``, ``drift`` (a drift alert
        fired: the asset event), ``dataset_drift``, ``dataset_score``, ``weighting``,
        ``reference_id``, ``threshold_sources`` (how many thresholds came from each source),
        ``features`` ({name: severity, flagged, strong, weight, reason, statistics}), ``contract``,
        ``alerts`` (data quality, data-quality warnings, contract errors, the drift alert with its
        causes), ``alert_features``, ``alert_reason``, ``evidently`` (``None``) and ``artefacts``.
    """
    cfg = config or CheckConfig()
    ref_id = reference.reference_id
    streamed = not isinstance(frame, pd.DataFrame)
    n_rows = int(frame.n_rows if not isinstance(frame, pd.DataFrame) else len(frame))
    base: dict[str, Any] = {"model": model, "model_version": model_version, "reference_id": ref_id,
                            "window_start": _iso(start), "window_end": _iso(end), "n_rows": n_rows}
    if streamed:
        base["engine"] = "streamed"
    if n_rows == 0:
        return _no_data_summary(base, model, start, history, model_version)

    checked = _check_contract(frame, reference, contract, cfg, streamed)
    scored, samples = _score_features(checked.frame, reference, checked, cfg, n_rows)
    weights, weighting = ((dict(cfg.weights), "explicit") if cfg.weights else
                          importance_weights(list(reference.schema.features), reference.importance,
                                             cfg.alerts.weighting))
    votes = _vote(model, start, scored, reference, history, cfg, n_rows, weights)
    if season is not None and cfg.alerts.seasonal_run_windows >= 2 and season.reference_id != ref_id:
        _season_votes(model, start, checked, season, history, cfg, n_rows, weights, votes)
        base["season_reference_id"] = season.reference_id
    features = _feature_report(checked, scored, samples, votes, weights, cfg)
    score, dataset_drift, decision = _decide(model, start, features, votes, checked, weights, history, cfg,
                                             ref_id)
    alerts = checked.alerts
    if decision.fire:
        causes = [{"feature": f, **c} for f in decision.features if f in votes.verdicts
                  for c in votes.verdicts[f].causes()]
        alerts.append({"kind": "drift", "severity": "drift", "features": list(decision.features),
                       "causes": causes, "dataset_score": score, "reason": decision.reason})
    sources: dict[str, int] = {}
    for t in votes.thresholds.values():
        sources[t.source] = sources.get(t.source, 0) + 1

    summary = {**base, "status": checked.status,
               "severity": _window_severity(decision, checked.status, dataset_drift, features),
               "drift": decision.fire, "dataset_drift": dataset_drift, "dataset_score": score,
               "weighting": weighting, "threshold_sources": sources, "false_alarm_budget": votes.budget,
               "features": features,
               "contract": checked.result.to_dict(), "evidently": None, "alerts": alerts,
               "alert_features": list(decision.features), "alert_reason": decision.reason, "artefacts": {}}
    summary = json.loads(json.dumps(summary, default=json_default))
    _record_window(model, start, summary, features, votes, history, status=checked.status,
                   dataset_drift=dataset_drift, fired=decision.fire, n_rows=n_rows,
                   model_version=model_version, ref_id=ref_id)
    _write_summary(summary, artefact_dir)
    return _cap(summary, cfg.max_summary_bytes)


def evidently_report_for_window(reference: PreparedReference, frame: pd.DataFrame, out_dir: str | Path,
                                *, sample_rows: int = 5000, seed: int = 0) -> dict[str, Any]:
    """Evidently ``DataDriftPreset`` on seeded samples of the reference and the window.

    The user-facing report and a per-column second opinion; it never changes the verdict of
    :func:`check_window`, so it runs as its own step beside the hourly check.

    Args:
        reference: The model version's prepared reference.
        frame: The window's records.
        out_dir: Folder of ``evidently_data_drift.html``.
        sample_rows: Rows per side (0: no report, status ``"disabled"``).
        seed: Sampling seed (a rerun reports on the same rows).

    Returns:
        ``{"status", "scores", "excluded", "html_path", "sample_rows"}`` (JSON-serialisable);
        status ``ok``, ``no_data`` (empty window, Evidently not called), ``no_columns`` or
        ``disabled``.
    """
    if sample_rows <= 0:
        return {"status": "disabled", "scores": {}, "excluded": {}, "html_path": None, "sample_rows": [0, 0]}
    from drift_checks.evidently_report import run_evidently

    schema = reference.schema
    frame = apply_schema(frame, schema.features).frame  # as the reference was read (declared_schema)
    ev = run_evidently(reference.frame, frame,
                       numeric=[c for c in numeric_columns(schema) if c in frame.columns],
                       categorical=[c for c in categorical_columns(schema) if c in frame.columns],
                       out_dir=out_dir, sample_rows=sample_rows, seed=seed)
    return {"status": ev.status, "scores": ev.scores, "excluded": ev.excluded,
            "html_path": ev.html_path, "sample_rows": list(ev.sample_rows)}


def json_default(o: Any) -> Any:
    """``json.dumps``' ``default`` for drift documents (summaries, backtests).

    Args:
        o: A value ``json`` cannot encode itself.

    Returns:
        ``None`` for a non-finite float, the Python scalar of a numpy scalar (``.item()``), else
        ``str(o)`` (timestamps, paths).
    """
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _cap(summary: dict[str, Any], limit: int) -> dict[str, Any]:
    """Drop details until the summary fits ``limit`` bytes (full copy is in the artefacts)."""
    if len(json.dumps(summary)) <= limit:
        return summary
    small = dict(summary)
    small["features"] = {f: {"severity": v["severity"]} for f, v in summary["features"].items()}
    small["alerts"] = [{k: v for k, v in a.items() if k != "causes"} | (
        {"causes": a["causes"][:10]} if a.get("causes") else {}) for a in summary["alerts"]]
    if small.get("contract"):
        small["contract"] = {"status": summary["contract"]["status"],
                             "invalid_columns": summary["contract"]["invalid_columns"],
                             "sources": summary["contract"].get("sources")}
    small["alerts"] = small["alerts"][:20]
    if small.get("evidently"):
        small["evidently"] = {"status": summary["evidently"]["status"]}
    small["truncated"] = True
    if len(json.dumps(small)) > limit:
        small["features"] = {"drift": [f for f, v in summary["features"].items() if v["severity"] == "drift"]}
        small["alerts"] = small["alerts"][:3]
    return small
