"""Shadow decision: labels joined to the replayed scores, decided and recorded on both versions.

Stage 4 of the shadow evaluation (:mod:`tritonflow.pipelines.shadow` describes the sequence).
:func:`compare` joins the labels that arrived (inference-log labels joined by ``request_id``) to
both score vectors of :func:`tritonflow.pipelines.shadow_replay.replay` (or of the live mode) and
hands them to :func:`model_registry.shadow.evaluate` (paired bootstrap, decision rule from the
``shadow_*`` settings plus overrides, the champion's reference metric from its
``tritonflow.reference_<metric>`` version tag). The evidence JSON and the Markdown report are
written beside the predictions and recorded on BOTH model versions in MLflow (tags
``tritonflow.shadow.*`` and artifacts). The outcome (``promote_challenger``, ``retrain``,
``nothing``, ``inconclusive``) drives the DAG's branch. When a version records a change point
inside the window (a retraining after a confirmed shift), the rows since it are judged
(:func:`since_change_point`).

Predictions with per-class probabilities (a multi-class model,
:mod:`tritonflow.pipelines.shadow_classes`) are decided with the ``multiclass`` task (one-vs-rest
AUC, log-loss, accuracy) unless ``rule_overrides`` names a task; their labels may be class names
or values, mapped to class indices in the champion's class order (``replayed["class_labels"]``).

The challenger's expected predictions are recorded on its model version (artifact and tag
:data:`EXPECTED_TAG`) and their URI passed in ``canary_conf``, so the canary judges the challenger
against its own behaviour here rather than against the champion.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ground.checksums import sha256_file
from ground.exceptions import DataError, WindowError
from ground.settings import Settings
from tritonflow.pipelines.promotion_policy import promotion_policy
from tritonflow.pipelines.publish_common import s3_endpoint
from tritonflow.pipelines.shadow import (
    SHADOW_TAG_PREFIX,
    drift_event_json,
    log_root,
    open_registry,
    settings_or_default,
    utc,
)
from tritonflow.pipelines.shadow_classes import CHALLENGER_PROBA, CHAMPION_PROBA, probabilities

#: Decision files written beside the predictions of a shadow run.
EVIDENCE_FILE = "shadow_evidence.json"
REPORT_FILE = "shadow_report.md"
#: Version tag (on the challenger) naming its expected-predictions artifact.
EXPECTED_TAG = SHADOW_TAG_PREFIX + "expected_uri"


def _label_column(labels: Any, label_column: str | None) -> str | None:
    candidates = [c for c in labels.columns if c not in ("request_id", "timestamp")]
    if label_column:
        if label_column not in candidates and len(labels):
            raise DataError(f"label_column={label_column!r} is not in the labels' columns "
                            f"{candidates}; expected one of them")
        return label_column
    if not candidates:
        return None
    if len(candidates) > 1:
        raise DataError(f"labels have several columns {candidates}; pass label_column= to pick "
                        "the one the metrics use")
    return candidates[0]


def _read_predictions(replayed: Mapping[str, Any], settings: Settings):
    import pandas as pd

    from tritonflow.pipelines import shared_work

    for key in ("model", "uri", "window_start", "window_end", "champion"):
        if key not in replayed:
            raise DataError(f"replayed lacks key {key!r}; expected the dict replay() returns")
    path = Path(replayed["uri"])
    # replay may have run on another worker: its whole run folder (predictions, and the expected
    # predictions compare logs to MLflow)
    shared_work.fetch(settings, path.parent)
    if not path.is_file():
        raise DataError(f"predictions file {str(path)!r} does not exist (expected replay()'s output; "
                        "is settings.home shared by the workers, or TRITONFLOW_STAGING_URI set?)")
    if replayed.get("sha256") and sha256_file(path) != replayed["sha256"]:
        raise DataError(f"predictions file {path} has changed since replay (sha256 differs); "
                        "expected the file replay() wrote")
    return pd.read_parquet(path)


def compare(replayed: Mapping[str, Any], *, settings: Settings | None = None,
            label_column: str | None = None, labels_until: Any = None,
            rule_overrides: Mapping[str, Any] | None = None,
            drift_event: Any = None, record: bool = True) -> dict[str, Any]:
    """Join the labels, decide with :func:`model_registry.shadow.evaluate`, record on both versions.

    Labels are read from the inference log's label partitions for arrivals in
    ``[window_start, labels_until)`` (default ``window_end + shadow_label_lag_hours``) and joined
    by ``request_id``; rows without a label count as unlabelled (fewer than ``min_labels`` is
    ``inconclusive``, never a win).

    Args:
        replayed: The return value of :func:`replay`.
        settings: Settings (``shadow_*`` rule fields, MLflow URI, inference-log root).
        label_column: The label column (default: the labels' only non-key column).
        labels_until: End of the label arrival window (ISO 8601/datetime).
        rule_overrides: :class:`model_registry.shadow.DecisionRule` fields that win over the
            settings (e.g. ``{"min_labels": 50, "confidence": 0.99, "margin": 0.02}``); None values
            are ignored.
        drift_event: The drift event that caused the evaluation (mapping or JSON string),
            passed on in ``retrain_conf``.
        record: Record the decision on the model versions in MLflow (tags and artifacts).

    Returns:
        ``{"model", "outcome", "verdict", "champion_degraded", "reasons", "n_rows", "n_labelled",
        "champion", "challenger", "primary", "evidence_uri", "report_uri", "recorded",
        "canary_conf", "retrain_conf"}``: ``champion``/``challenger`` are version numbers,
        ``primary`` the primary metric's comparison (None without one), ``canary_conf`` and
        ``retrain_conf`` the confs of the DAGs the outcome triggers.

    Raises:
        DataError: The predictions file is missing or changed, labels are ambiguous or invalid
            (a multi-class label that is not one of the model's classes: the value and the known
            classes are named), or a rule override is out of range.
        WindowError: A label file is malformed.
    """
    s = settings_or_default(settings)
    model = replayed["model"]
    preds = _read_predictions(replayed, s)
    window = _label_window(replayed, s, labels_until)
    multi = probabilities(preds, CHAMPION_PROBA) is not None
    joined, y, column = _join_labels(preds, replayed, s, window, label_column, multi)
    rule = _rule(s, rule_overrides, multi)
    joined, y, judged = since_change_point(joined, y, replayed, window, rule.min_labels)
    decision = _decide(joined, y, replayed, rule, multi)
    champ_v = int(replayed["champion"]["version"])
    chal = replayed.get("challenger")
    chal_v = None if chal is None else int(chal["version"])
    evidence = {
        **decision.evidence(),
        "model": model,
        "champion_version": champ_v,
        "challenger_version": chal_v,
        "window_start": window[0].isoformat(),
        "window_end": window[1].isoformat(),
        "labels_until": window[2].isoformat(),
        "judged": judged,
        "label_column": column,
        "class_labels": replayed.get("class_labels") if multi else None,
        "predictions_uri": replayed["uri"],
        "predictions_sha256": replayed.get("sha256"),
        "evaluated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    evidence_path, report_path = _write_evidence(replayed, decision, evidence, window, champ_v, chal_v)
    expected_path = _unchanged_expected(replayed) if chal_v is not None else None
    recorded: dict[str, Any] = {}
    if record:
        recorded = _record(s, model, evidence, evidence_path, report_path, champ_v, chal_v,
                           evidence_path.parent.name, expected_path)
    expected_ref = (recorded.get("challenger") or {}).get("expected_uri") or expected_path
    outcome = decision.outcome.value
    return {
        "model": model,
        "outcome": outcome,
        "verdict": decision.verdict.value,
        "champion_degraded": decision.champion_degraded,
        "reasons": list(decision.reasons),
        "n_rows": decision.n_rows,
        "n_labelled": decision.n_labelled,
        "champion": champ_v,
        "challenger": chal_v,
        "primary": _primary(decision, rule),
        "evidence_uri": str(evidence_path),
        "report_uri": str(report_path),
        "recorded": recorded,
        "canary_conf": {"model": model, "challenger": None if chal_v is None else str(chal_v),
                        **({"expected_predictions": expected_ref} if expected_ref else {})},
        "retrain_conf": {
            "model": model,
            "reason": "champion_degraded" if decision.champion_degraded else "shadow_" + outcome,
            "drift_event": drift_event_json(drift_event),
        },
    }


def _label_window(replayed: Mapping[str, Any], s: Settings, labels_until: Any) -> tuple[Any, Any, Any]:
    """``(start, end, until)`` (UTC ``pandas.Timestamp``): the replayed window and the labels' arrival end.

    Raises:
        WindowError: ``until`` is not after ``start``, or a bound is not a timestamp.
    """
    import pandas as pd

    start = utc(replayed["window_start"], "window_start")
    end = utc(replayed["window_end"], "window_end")
    until = (end + pd.Timedelta(hours=float(s.shadow_label_lag_hours)) if labels_until in (None, "")
             else utc(labels_until, "labels_until"))
    if until <= start:
        raise WindowError(f"labels_until={until.isoformat()} is not after window_start="
                          f"{start.isoformat()}")
    return start, end, until


def _join_labels(preds: Any, replayed: Mapping[str, Any], s: Settings, window: tuple[Any, Any, Any],
                 label_column: str | None, multi: bool) -> tuple[Any, np.ndarray | None, str | None]:
    """``(rows, labels, label column)``: the predictions joined with the labels that arrived by ``until``.

    Without a label column the predictions come back as they are, with no labels. Multi-class
    labels become class indices in the champion's class order.
    """
    import pandas as pd

    from drift_checks.inference_log import join_labels, read_labels
    from drift_checks.multiclass import class_indices

    start, _, until = window
    labels = read_labels(log_root(s), replayed["model"], start.to_pydatetime(), until.to_pydatetime(),
                         endpoint_url=s3_endpoint(s))
    column = _label_column(labels, label_column)
    if column is None or column not in labels.columns:
        return preds, None, column
    joined = join_labels(preds, labels[["request_id", "timestamp", column]])
    y = (class_indices(joined[column], replayed.get("class_labels"), f"label column {column!r}") if multi
         else pd.to_numeric(joined[column], errors="coerce").to_numpy(dtype=np.float64))
    return joined, y, column


def _rule(s: Settings, rule_overrides: Mapping[str, Any] | None, multi: bool) -> Any:
    """The :class:`model_registry.shadow.DecisionRule` of the settings, with the overrides."""
    from model_registry.shadow import DecisionRule

    overrides = {k: v for k, v in dict(rule_overrides or {}).items() if v is not None}
    if multi:  # [N, C] probabilities: one-vs-rest AUC, log-loss, accuracy
        overrides.setdefault("task", "multiclass")
    return DecisionRule.from_settings(s, **overrides)


def since_change_point(joined: Any, y: np.ndarray | None, replayed: Mapping[str, Any],
                       window: tuple[Any, Any, Any], min_labels: int) -> tuple[Any, np.ndarray | None, dict[str, Any]]:
    """The rows a shadow decision judges: those since a change point a version recorded, when enough.

    A retraining after a confirmed shift records where the served model's loss rose (version tag
    ``tritonflow.change_point``, :mod:`model_registry.evidence_window`). Rows before it follow
    the concept the shift replaced, so over a window straddling it a challenger fitted to the new
    concept is judged largely on the old one, against a champion fitted to both. On NOAA's
    day-12,000 shift a follow-up trained on the 272 rows since the shift scored AUC 0.567 against
    its champion's 0.783 over 208 pre-shift and 272 post-shift rows and lost, while it led on the
    post-shift rows (0.842 against 0.774) and on the 228 rows after both were trained (0.844
    against 0.805).

    So the latest change point either version records inside ``[start, end)`` starts the rows
    judged, when at least ``min_labels`` labelled rows follow it. With fewer the whole window is
    judged (said in ``judged["reason"]``): ``inconclusive`` would leave serving a champion the
    shift already degraded, and a first retraining after a shift has few rows since it.

    Args:
        joined: The replayed rows with their labels (column ``timestamp``, UTC).
        y: Their labels, ``NaN`` where none arrived (None: no label at all).
        replayed: :func:`tritonflow.pipelines.shadow_replay.replay`'s return (``champion`` and
            ``challenger`` version info, their ``change_point``).
        window: ``(start, end, labels_until)`` (:func:`_label_window`).
        min_labels: The decision rule's fewest labelled rows.

    Returns:
        ``(rows, labels, judged)``: the rows and labels judged, and ``{"since", "recorded_by",
        "rows_before", "labelled_since", "reason"}`` (``since`` empty when the whole window is).

    Raises:
        WindowError: A recorded change point is not a timestamp.
    """
    import pandas as pd

    start, end = window[0], window[1]
    points = [(utc(info["change_point"], f"{role}.change_point"), int(info["version"]))
              for role in ("champion", "challenger")
              if (info := replayed.get(role)) and info.get("change_point")]
    inside = [p for p in points if start < p[0] < end]
    whole = {"since": "", "recorded_by": None, "rows_before": 0, "labelled_since": None}
    if not inside:
        return joined, y, {**whole, "reason": "the whole window: no version records a change point inside it"}
    point, version = max(inside)
    since = (pd.to_datetime(joined["timestamp"], utc=True) >= point).to_numpy()
    n = 0 if y is None else int((since & np.isfinite(np.asarray(y, dtype=np.float64))).sum())
    if y is None or n < min_labels:
        return joined, y, {**whole, "labelled_since": n, "reason": (
            f"the whole window: only {n} labelled rows since the change point {point.isoformat()} "
            f"(version {version}), fewer than min_labels={min_labels}")}
    before = int((~since).sum())
    return (joined[since].reset_index(drop=True), y[since],
            {"since": point.isoformat(), "recorded_by": version, "rows_before": before,
             "labelled_since": n, "reason": (
                 f"the {int(since.sum())} rows since the change point {point.isoformat()} version {version} "
                 f"records ({n} labelled); the {before} before it follow the replaced concept")})


def _decide(joined: Any, y: np.ndarray | None, replayed: Mapping[str, Any], rule: Any, multi: bool) -> Any:
    """:func:`model_registry.shadow.evaluate` on the scores of both versions."""
    from model_registry.shadow import evaluate

    champ, chal = replayed["champion"], replayed.get("challenger")
    reference = (champ.get("reference_metrics") or {}).get(rule.primary_metric)
    if multi:
        champion_out = probabilities(joined, CHAMPION_PROBA)
        challenger_out = None if chal is None else probabilities(joined, CHALLENGER_PROBA)
    else:
        champion_out = joined["champion_score"].to_numpy(np.float64)
        challenger_out = None if chal is None else joined["challenger_score"].to_numpy(np.float64)
    return evaluate(y, champion_out, challenger_out, rule=rule, champion_reference=reference)


def _write_evidence(replayed: Mapping[str, Any], decision: Any, evidence: Mapping[str, Any],
                    window: tuple[Any, Any, Any], champ_v: int, chal_v: int | None) -> tuple[Path, Path]:
    """Write the evidence (JSON) and the report (Markdown) beside the predictions; their paths."""
    model = replayed["model"]
    start, end, until = window
    run_dir = Path(replayed["uri"]).parent
    evidence_path = run_dir / EVIDENCE_FILE
    report_path = run_dir / REPORT_FILE
    evidence_path.write_text(json.dumps(evidence, sort_keys=True, indent=2, allow_nan=False))
    report = decision.report_markdown(
        champion_label=f"{model} v{champ_v} (champion)",
        challenger_label=(f"{model} v{chal_v} (challenger)" if chal_v is not None else "no challenger"),
    )
    report += (f"\nWindow: {start.isoformat()} .. {end.isoformat()} (labels arrived until "
               f"{until.isoformat()}); predictions: `{replayed['uri']}`.\n"
               f"Rows judged: {evidence['judged']['reason']}.\n")
    report_path.write_text(report)
    return evidence_path, report_path


def _unchanged_expected(replayed: Mapping[str, Any]) -> str | None:
    """The challenger's expected predictions (path), checked against the digest written with them.

    Raises:
        DataError: The file changed since it was written.
    """
    expected_path = replayed.get("expected_uri")
    if expected_path and replayed.get("expected_sha256") and Path(expected_path).is_file() \
            and sha256_file(expected_path) != replayed["expected_sha256"]:
        raise DataError(f"expected predictions {expected_path} changed since they were written "
                        "(sha256 differs)")
    return expected_path


def _primary(decision: Any, rule: Any) -> dict[str, Any] | None:
    """The primary metric's comparison as a JSON-safe dict (NaN as ``None``); ``None`` without one."""
    primary = decision.comparisons.get(rule.primary_metric)
    if primary is None:
        return None
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in primary.__dict__.items()}


def _record(settings: Settings, model: str, evidence: Mapping[str, Any], evidence_path: Path,
            report_path: Path, champion: int, challenger: int | None, run_name: str,
            expected_path: str | None = None) -> dict[str, Any]:
    """Record the shadow decision on the champion and challenger versions.

    Tags and artifacts of the decision on the champion and the challenger versions (and the
    challenger's expected predictions on the challenger, tag :data:`EXPECTED_TAG`).
    """
    registry = open_registry(settings)
    compact = json.dumps(evidence, sort_keys=True, separators=(",", ":"), allow_nan=False)
    out: dict[str, Any] = {}
    policy = promotion_policy(model, settings=settings, registry=registry)  # the policy in force, on the decision
    roles = [("champion", champion, challenger)]
    if challenger is not None:
        roles.append(("challenger", challenger, champion))
    for role, version, other in roles:
        ref = registry.get_version(model, version)
        artifact_path = f"shadow/{run_name}"
        evidence_uri = registry.log_version_artifact(ref, evidence_path, artifact_path)
        report_uri = registry.log_version_artifact(ref, report_path, artifact_path)
        tags = {
            SHADOW_TAG_PREFIX + "outcome": evidence["outcome"],
            SHADOW_TAG_PREFIX + "verdict": evidence["verdict"],
            SHADOW_TAG_PREFIX + "role": role,
            SHADOW_TAG_PREFIX + "compared_with": "" if other is None else str(other),
            SHADOW_TAG_PREFIX + "window": f"{evidence['window_start']}/{evidence['window_end']}",
            SHADOW_TAG_PREFIX + "n_labelled": str(evidence["n_labelled"]),
            SHADOW_TAG_PREFIX + "evaluated_at": evidence["evaluated_at"],
            SHADOW_TAG_PREFIX + "evidence": compact,
            SHADOW_TAG_PREFIX + "evidence_uri": evidence_uri,
            SHADOW_TAG_PREFIX + "report_uri": report_uri,
            SHADOW_TAG_PREFIX + "promotion_policy": policy,
        }
        out[role] = {"version": version, "evidence_uri": evidence_uri, "report_uri": report_uri,
                     "run_id": registry.publish_run_id(ref)}  # the run holding the files above
        if role == "challenger" and expected_path:
            expected_uri = registry.log_version_artifact(ref, expected_path, artifact_path)
            tags[EXPECTED_TAG] = expected_uri
            out[role]["expected_uri"] = expected_uri
        registry.set_version_tags(ref, tags)
    return out


__all__ = ["EXPECTED_TAG", "compare", "since_change_point"]
