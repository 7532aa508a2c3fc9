"""The whole hourly drift check as one function: :func:`check_window`.

window -> contract (exact vectorised checks + GX on a bounded sample) -> statistics per feature
-> thresholds (P95 of history / static fallback) -> per-feature and dataset verdicts -> history
(every hour, also when nothing drifted) -> small JSON summary (XCom-safe). That is the hourly
critical path. The Evidently report on a sample (:func:`evidently_report_for_window`) and the
whylogs profile of the hour are separate steps that run beside it (their cost is fixed, 15-27 s
for Evidently, and they decide nothing).

Severities, per feature:

* ``no_data``: the window has no rows (case H15): nothing scored, nothing stored in the
  statistics history (the P95 baseline is untouched), a data-availability alert is raised;
* ``invalid``: the contract failed on the column (e.g. 100 % nulls, case H15), or a statistic is
  undefined (all-null, empty): no drift is computed from nonsense and no NaN can read as "ok";
* ``drift``: the feature is flagged in this window AND in the ``consecutive_windows - 1``
  previous hourly windows (hysteresis: one unusual hour, expected 5 % of the time at P95, is
  not an alarm; case H18);
* ``warning``: flagged in this window only;
* ``ok``.

A feature is *flagged* when at least ``min_flagged`` of its statistics are on the drift side of
their thresholds (default: a majority). The dataset severity is ``drift`` when the weighted share
of drifting features reaches ``dataset_drift_share`` (Evidently's default share 0.5), else the
worst of warning/invalid/ok.
"""

from __future__ import annotations

import dataclasses
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from drift_checks import statistics as st
from drift_checks.contracts import (
    DEFAULT_GX_SAMPLE_ROWS,
    Contract,
    ContractResult,
    derive_contract,
    run_contract,
)
from drift_checks.history import HistoryStore, StatisticRow
from drift_checks.inference_log import LogSchema, categorical_columns, numeric_columns
from drift_checks.thresholds import ThresholdPolicy, resolve_thresholds, weighted_score

SEVERITY_ORDER = ["ok", "warning", "invalid", "drift"]
#: Largest summary returned (bytes); larger ones drop per-statistic details (case H24).
DEFAULT_MAX_SUMMARY_BYTES = 48 * 1024


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """Knobs of the hourly check.

    Attributes:
        policy: Threshold policy (look-back, quantile, min history, static overrides).
        statistics: Statistic names to compute (``None``: every registered one of the kind).
        weights: Per-feature weights of the dataset score (missing: 1).
        consecutive_windows: Flagged windows in a row needed for ``drift``.
        min_flagged: Statistics beyond threshold needed to flag a feature (``None``: majority).
        dataset_drift_share: Weighted share of drifting features for dataset drift.
        evidently_sample_rows: Rows per side for the Evidently report
            (:func:`evidently_report_for_window`, a separate step); 0 disables it.
        max_summary_bytes: Cap of the returned summary.
        workers: Threads scoring numeric features (numpy releases the GIL).
        contract_sample_rows: Rows of the seeded sample on which GX evaluates the expectations
            that have no exact vectorised check (see :func:`drift_checks.contracts.run_contract`).
    """

    policy: ThresholdPolicy = dataclasses.field(default_factory=ThresholdPolicy)
    statistics: tuple[str, ...] | None = None
    weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    consecutive_windows: int = 2
    min_flagged: int | None = None
    dataset_drift_share: float = 0.5
    evidently_sample_rows: int = 5000
    max_summary_bytes: int = DEFAULT_MAX_SUMMARY_BYTES
    workers: int = 2
    contract_sample_rows: int = DEFAULT_GX_SAMPLE_ROWS

    @classmethod
    def from_settings(cls, settings=None, **overrides) -> "CheckConfig":
        from tritonflow.settings import get_settings

        s = settings or get_settings()
        kw: dict[str, Any] = dict(policy=ThresholdPolicy.from_settings(s),
                                  evidently_sample_rows=getattr(s, "drift_evidently_sample_rows", 5000),
                                  max_summary_bytes=getattr(s, "max_xcom_bytes", DEFAULT_MAX_SUMMARY_BYTES),
                                  dataset_drift_share=getattr(s, "drift_dataset_share", 0.5))
        kw.update(overrides)
        return cls(**kw)


@dataclasses.dataclass
class PreparedReference:
    """Reference columns prepared once per model version (sorted numerics, category counts)."""

    schema: LogSchema
    frame: pd.DataFrame
    numeric: dict[str, st.NumericSample]
    categorical: dict[str, dict[str, int]]


def prepare_reference(frame: pd.DataFrame, schema: LogSchema, workers: int = 2) -> PreparedReference:
    """Sort numeric columns and count categories of the reference (reuse every hour)."""
    cols = [c for c in numeric_columns(schema) if c in frame.columns]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # numpy sorts release the GIL
        num = dict(zip(cols, pool.map(lambda c: st.prepare_numeric(frame[c]), cols)))
    cat = {c: st.category_counts(frame[c]) for c in categorical_columns(schema) if c in frame.columns}
    return PreparedReference(schema, frame, num, cat)


def _iso(t) -> str:
    return pd.Timestamp(t).tz_convert("UTC").isoformat()


def check_window(
    *,
    model: str,
    frame: pd.DataFrame,
    start,
    end,
    reference: PreparedReference,
    history: HistoryStore,
    contract: Contract | None = None,
    config: CheckConfig | None = None,
    model_version: int | None = None,
    artefact_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run the hourly drift check of one model's window and record it.

    Args:
        model: Model name.
        frame: The window's records (from :func:`drift_checks.inference_log.read_window`).
        start / end: The window's UTC bounds (the DAG's data interval).
        reference: From :func:`prepare_reference` (model version's reference sample).
        history: Statistics history; this hour's results REPLACE any earlier run of it.
        contract: Data contract; derived from the reference when ``None``.
        config: Check knobs (default :class:`CheckConfig`).
        model_version: Version that served the window (recorded).
        artefact_dir: Folder for bulky artefacts (full summary JSON, Evidently HTML); none
            written when ``None``.

    Returns:
        JSON-serialisable summary under ``config.max_summary_bytes``: ``status`` (``ok``,
        ``no_data``, ``contract_failed``, ``check_error``), ``severity``, ``drift`` (bool),
        ``dataset_score``, ``features`` ({name: severity, reason, statistics}), ``contract``,
        ``evidently`` (``None``: the report is :func:`evidently_report_for_window`, a separate
        step), ``alerts`` and ``artefacts`` (URIs/paths).
    """
    cfg = config or CheckConfig()
    schema = reference.schema
    base = {"model": model, "model_version": model_version, "window_start": _iso(start),
            "window_end": _iso(end), "n_rows": int(len(frame))}
    artefacts: dict[str, str] = {}
    if len(frame) == 0:
        summary = {**base, "status": "no_data", "severity": "no_data", "drift": False,
                   "dataset_score": None, "features": {}, "contract": None, "evidently": None,
                   "alerts": [{"kind": "data_availability", "severity": "no_data",
                               "message": f"no inference records for {model!r} in "
                                          f"[{base['window_start']}, {base['window_end']})"}],
                   "artefacts": artefacts}
        history.record_hour(model, start, status="no_data", n_rows=0, model_version=model_version,
                            summary={"status": "no_data"})
        return summary

    # ---------------------------------------------------------------- contract
    contract = contract or derive_contract(reference.frame, schema)
    cres: ContractResult = run_contract(contract, frame, gx_sample_rows=cfg.contract_sample_rows)
    invalid = {c: "contract failed: " + ", ".join(
        f"{r.expectation} observed {json.dumps(r.observed)[:80]}" for r in cres.failures if r.column == c)
        for c in cres.invalid_columns if c in schema.features}

    # ---------------------------------------------------------------- statistics
    num_cols = [c for c in numeric_columns(schema) if c not in invalid]
    cat_cols = [c for c in categorical_columns(schema) if c not in invalid]
    names = cfg.statistics

    def score_num(c):
        return c, st.score_numeric(reference.numeric[c], st.prepare_numeric(frame[c]), names)

    with ThreadPoolExecutor(max_workers=max(1, cfg.workers)) as pool:
        scored: dict[str, dict[str, st.StatisticResult]] = dict(pool.map(score_num, num_cols))
    for c in cat_cols:
        scored[c] = st.score_categorical(reference.categorical[c], st.category_counts(frame[c]),
                                         reference_rows=len(reference.frame),
                                         current_rows=len(frame), names=names)

    series = [(f, s) for f, res in scored.items() for s in res]
    thresholds = resolve_thresholds(history, model, start, series, cfg.policy)
    prev = history.previous_flags(model, list(scored), start, cfg.consecutive_windows - 1)

    features: dict[str, dict[str, Any]] = {}
    rows: list[StatisticRow] = []
    verdicts: dict[str, tuple[str, bool]] = {}
    for c, reason in invalid.items():
        features[c] = {"severity": "invalid", "reason": reason, "statistics": {}}
        verdicts[c] = ("invalid", False)
    for f, results in scored.items():
        stats_out, n_flag, undefined = {}, 0, []
        for name, r in results.items():
            thr = thresholds[(f, name)]
            flag = st.REGISTRY[name].is_drift(r.value, thr.value)
            if flag is None:
                undefined.append(f"{name}: {r.status}")
            else:
                rows.append(StatisticRow(f, name, float(r.value)))
            n_flag += bool(flag)
            stats_out[name] = {**r.to_dict(), "threshold": thr.value, "threshold_source": thr.source,
                               "n_history": thr.n_history, "flagged": flag}
        need = cfg.min_flagged or (len(results) // 2 + 1)
        flagged = n_flag >= need
        if undefined:
            sev, reason = "invalid", "undefined statistics (" + "; ".join(undefined) + ")"
            flagged = False
        elif flagged and all(prev.get(f, [])):
            sev, reason = "drift", f"{n_flag}/{len(results)} statistics beyond threshold for " \
                                   f"{cfg.consecutive_windows} consecutive windows"
        elif flagged:
            sev, reason = "warning", f"{n_flag}/{len(results)} statistics beyond threshold in this window"
        else:
            sev, reason = "ok", ""
        features[f] = {"severity": sev, "reason": reason, "statistics": stats_out}
        verdicts[f] = (sev, flagged)

    scorable = {f: v["severity"] == "drift" for f, v in features.items() if v["severity"] != "invalid"}
    score = weighted_score(scorable, cfg.weights)
    sevs = {v["severity"] for v in features.values()}
    if scorable and score >= cfg.dataset_drift_share:
        severity = "drift"
    elif "drift" in sevs or "warning" in sevs:
        severity = "warning"
    elif "invalid" in sevs:
        severity = "invalid"
    else:
        severity = "ok"
    status = {"passed": "ok", "failed": "contract_failed", "error": "check_error"}[cres.status]

    alerts = []
    for r in cres.failures:
        alerts.append({"kind": "data_quality", "severity": "invalid", "column": r.column,
                       "expectation": r.expectation, "observed": r.observed})
    for r in cres.check_errors:
        alerts.append({"kind": "contract_check_error", "severity": "error", "column": r.column,
                       "expectation": r.expectation, "message": r.message[:300]})
    drifting = sorted(f for f, v in features.items() if v["severity"] == "drift")
    if drifting:
        alerts.append({"kind": "drift", "severity": severity, "features": drifting,
                       "dataset_score": score})

    # Evidently runs OFF the critical path (its own task): see :func:`evidently_report_for_window`.
    evid = None

    summary = {**base, "status": status, "severity": severity, "drift": severity == "drift",
               "dataset_score": score, "features": features, "contract": cres.to_dict(),
               "evidently": evid, "alerts": alerts, "artefacts": artefacts}
    summary = json.loads(json.dumps(summary, default=_default))
    history.record_hour(model, start, status=status, n_rows=len(frame), statistics=rows,
                        verdicts=verdicts, model_version=model_version,
                        summary={k: summary[k] for k in ("status", "severity", "drift", "dataset_score")})
    if artefact_dir is not None:
        p = Path(artefact_dir) / "drift_summary.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(summary, indent=1, sort_keys=True))
        artefacts["summary_json"] = str(p)
        summary["artefacts"] = dict(artefacts)
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
    ev = run_evidently(reference.frame, frame,
                       numeric=[c for c in numeric_columns(schema) if c in frame.columns],
                       categorical=[c for c in categorical_columns(schema) if c in frame.columns],
                       out_dir=out_dir, sample_rows=sample_rows, seed=seed)
    return {"status": ev.status, "scores": ev.scores, "excluded": ev.excluded,
            "html_path": ev.html_path, "sample_rows": list(ev.sample_rows)}


def _default(o):
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
    if small.get("contract"):
        small["contract"] = {"status": summary["contract"]["status"],
                             "invalid_columns": summary["contract"]["invalid_columns"]}
    small["alerts"] = summary["alerts"][:20]
    if small.get("evidently"):
        small["evidently"] = {"status": summary["evidently"]["status"]}
    small["truncated"] = True
    if len(json.dumps(small)) > limit:
        small["features"] = {"drift": [f for f, v in summary["features"].items() if v["severity"] == "drift"]}
        small["alerts"] = small["alerts"][:3]
    return small
