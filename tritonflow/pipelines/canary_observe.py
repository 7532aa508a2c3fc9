"""What a canary reads while it runs, and the MLflow record of every analysis.

* :class:`LogTail` / :func:`observer`: the inference-log records (and the labels that arrived) of a
  step's window, read incrementally: every analysis (default every 5 s) lists the window's hour
  partitions and reads only the files it has not read yet.
* :func:`load_expected` / :func:`expected_for`: the challenger's expected behaviour, the
  expected-predictions file a shadow evaluation wrote (replay or live mirror, see
  :func:`tritonflow.pipelines.shadow_replay.write_expected`), from the canary conf's
  ``expected_predictions`` or, when the conf has none, from the challenger version's tag
  ``tritonflow.shadow.expected_uri``.
* :func:`coverage_reference_for`: the challenger's drift reference sample and its most important
  features for the feature-space coverage.
* :class:`CanaryRecord`: one MLflow run per canary (experiment ``tritonflow-canary``) holding every
  analysis as metrics (step = analysis number, timestamp = the analysis' end), the thresholds as
  params, and at the end all analyses as ``canary/analyses.json`` plus the plot over time
  (:func:`tritonflow.canary_plot.plot_canary`).
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from ground.exceptions import DataError, WindowError
from tritonflow.pipelines.shadow_compare import EXPECTED_TAG
from tritonflow.pipelines.shadow_replay import OUTPUT_PREFIXES

log = logging.getLogger(__name__)

#: MLflow experiment of the canary runs.
CANARY_EXPERIMENT = "tritonflow-canary"
#: Metrics logged per analysis: MLflow metric name -> StepAnalysis field.
ANALYSIS_METRICS = {
    "percent": "percent",
    "requests": "canary_requests",
    "error_rate": "canary_error_rate",
    "failures": "canary_failures",
    "triton_failures": "triton_failures",
    "gateway_failures": "gateway_failures",
    "gateway_requests": "gateway_requests",
    "error_rate_lower": "canary_error_rate_lower",
    "recent_error_rate": "recent_error_rate",
    "mean_latency_ms": "canary_mean_latency_ms",
    "champion_mean_latency_ms": "champion_mean_latency_ms",
    "latency_ratio": "latency_ratio",
    "predictions": "predictions_canary_n",
    "nonfinite_predictions": "predictions_nonfinite",
    "prediction_ks": "prediction_ks",
    "prediction_ks_margin": "prediction_ks_margin",
    "prediction_psi": "prediction_psi",
    "coverage_ratio": "coverage_ratio",
}
#: Verdicts as numbers for the MLflow metric ``verdict``.
VERDICT_CODES = {"continue": 0, "pass": 1, "inconclusive": 2, "fail": 3}


# ----------------------------------------------------------------------------------- the log
class LogTail:
    """Incremental reader of one model's inference-log (or label) partitions.

    Args:
        root: Inference-log root (folder or ``s3://bucket/prefix``).
        model: The model's log folder (the Triton model name the traffic is logged under).
        labels: Read the label partitions instead of the records.
        endpoint_url: S3-compatible endpoint.
    """

    def __init__(self, root: str, model: str, *, labels: bool = False, endpoint_url: str | None = None):
        from drift_checks.storage import Store

        self.store = Store(root, endpoint_url)
        self.model, self.labels = model, labels
        self._frames: dict[str, pd.DataFrame] = {}

    def read(self, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame:
        """Rows with ``start <= timestamp < end`` (UTC); files already read are not read again.

        Raises:
            WindowError: A file is not Parquet or lacks ``timestamp``.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        from drift_checks.inference_log import partition_prefix

        hour = start.floor("h")
        while hour < end:
            for key in self.store.list(partition_prefix(self.model, hour, self.labels)):
                if key in self._frames or not key.endswith(".parquet"):
                    continue
                try:
                    frame = pq.read_table(io.BytesIO(self.store.get_bytes(key))).to_pandas()
                except (pa.ArrowInvalid, OSError) as exc:
                    raise WindowError(f"{self.store.uri(key)}: not a readable Parquet file ({exc})") from None
                if "timestamp" not in frame.columns:
                    raise WindowError(f"{self.store.uri(key)}: column 'timestamp' is missing")
                self._frames[key] = frame
            hour += pd.Timedelta(hours=1)
        if not self._frames:
            return pd.DataFrame()
        frame = pd.concat(self._frames.values(), ignore_index=True)
        ts = pd.to_datetime(frame["timestamp"], utc=True)
        return frame[(ts >= start) & (ts < end)].reset_index(drop=True)


def _utc(seconds: float) -> pd.Timestamp:
    return pd.Timestamp(seconds, unit="s", tz="UTC")


def observer(root: str, log_model: str, *, prediction_columns: Sequence[str] | None = None,
             prefixes: Sequence[str] = OUTPUT_PREFIXES,
             label_column: str | None = None, endpoint_url: str | None = None
             ) -> Callable[[float, float], Any]:
    """``observe(start, end)`` for :func:`repository_sync.canary.runner.run_canary`.

    Reads the records of ``[start, end)`` (unix seconds) and the labels that arrived in the same
    window, joined by ``request_id``.

    Args:
        root: Inference-log root (folder or URI).
        log_model: The model's folder under ``root``.
        endpoint_url: S3 endpoint of ``root`` (``None``: the default).
        prediction_columns: The output columns (default: names starting with ``prefixes``).
        prefixes: Name prefixes of the default output columns.
        label_column: The label column (default: the labels' only non-key column).

    Raises:
        WindowError: (from the returned callable) the prediction columns are missing, or labels
            have several columns and none is named.
    """
    from drift_checks.inference_log import BASE_COLUMNS, join_labels
    from repository_sync.canary.checks import Observations

    records = LogTail(root, log_model, endpoint_url=endpoint_url)
    labels = LogTail(root, log_model, labels=True, endpoint_url=endpoint_url)

    def observe(start: float, end: float) -> Observations:
        frame = records.read(_utc(start), _utc(end))
        cols = list(prediction_columns) if prediction_columns else [
            c for c in frame.columns
            if c not in BASE_COLUMNS and str(c).lower().startswith(tuple(prefixes))]
        if frame.empty:
            return Observations(pd.DataFrame({"model_version": pd.Series([], dtype="int64")}), tuple(cols))
        missing = [c for c in cols if c not in frame.columns]
        if not cols or missing:
            raise WindowError(
                f"inference log of {log_model!r}: prediction columns {missing or cols!r} not found "
                f"(columns: {sorted(map(str, frame.columns))}); expected prediction_columns naming "
                f"them, or names starting with {tuple(prefixes)}")
        label = None
        lab = labels.read(_utc(start), _utc(end))
        if not lab.empty and "request_id" in lab.columns:
            keys = [c for c in lab.columns if c not in ("request_id", "timestamp")]
            label = label_column or (keys[0] if len(keys) == 1 else None)
            if label_column is None and len(keys) > 1:
                raise WindowError(f"labels of {log_model!r} have several columns {keys}; pass "
                                  "label_column naming the one the quality check uses")
            if label in keys:
                frame = join_labels(frame, lab[["request_id", "timestamp", label]])
            else:
                label = None
        features = tuple(c for c in frame.columns
                         if c not in BASE_COLUMNS and c not in cols and c != label
                         and c != "label_timestamp" and pd.api.types.is_numeric_dtype(frame[c]))
        return Observations(frame, tuple(cols), features, label)

    return observe


# ----------------------------------------------------------------------------------- expected behaviour
def load_expected(uri: str, *, tracking_uri: str | None = None):
    """Read an expected-predictions file (local path or any MLflow artifact URI).

    Raises:
        DataError: The file cannot be found or read, or lacks the expected score column.
    """
    from repository_sync.canary.checks import ExpectedBehaviour

    path = Path(uri)
    if not path.is_file():
        try:
            import mlflow

            path = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, tracking_uri=tracking_uri))
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"expected_predictions={uri!r} cannot be read ({exc}); expected the "
                            "expected-predictions file a shadow evaluation recorded") from None
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"expected_predictions={uri!r} is not a Parquet file ({exc})") from None
    source = str(frame["source"].iloc[0]) if "source" in frame.columns and len(frame) else "expected"
    return ExpectedBehaviour.from_frame(frame, source=source, uri=uri)


def expected_for(registry: Any, model: str, challenger: int, uri: str | None, *,
                 tracking_uri: str | None = None, fetch: Callable[[str], Any] | None = None):
    """The challenger's expected behaviour from ``uri``, else from its version tag.

    Args:
        registry: The registry client (the version's tags).
        model: Registered model name.
        challenger: Challenger version.
        uri: Where the expected predictions are (None: the version's tag).
        tracking_uri: MLflow tracking URI for ``runs:/`` and artifact URIs.
        fetch: Called with a local path before it is read (the shadow replay that wrote it may
            have run on another worker: :func:`tritonflow.pipelines.shared_work.fetch`).

    Returns:
        ``(ExpectedBehaviour or None, note)``.

    Raises:
        DataError: ``uri`` was given and cannot be read (a given reference never silently drops).
    """
    if uri:
        if fetch is not None:
            fetch(uri)
        return load_expected(uri, tracking_uri=tracking_uri), f"expected predictions from {uri}"
    try:
        tags = registry.get_version(model, challenger).tags or {}
    except Exception as exc:  # noqa: BLE001
        return None, f"no expected predictions (version tags unreadable: {exc})"
    tagged = tags.get(EXPECTED_TAG)
    if not tagged:
        return None, (f"no expected predictions: version {challenger} has no {EXPECTED_TAG!r} tag "
                      "(no shadow evaluation recorded one) and the conf named none")
    try:
        if fetch is not None:
            fetch(tagged)
        return load_expected(tagged, tracking_uri=tracking_uri), f"expected predictions from tag {tagged}"
    except DataError as exc:
        return None, f"expected predictions of tag {EXPECTED_TAG!r} unreadable: {exc}"


# ----------------------------------------------------------------------------------- coverage
def coverage_reference_for(root: str, model: str, version: int, top: int, *,
                           endpoint_url: str | None = None):
    """The drift reference of ``model`` ``version`` and its ``top`` most important numeric features.

    Importances are read from the reference when it carries them (``Reference.importance``, the
    model version's feature importances stored with its drift reference); without, every numeric
    feature is checked.

    Returns:
        ``(CoverageReference or None, note)``.
    """
    from drift_checks.reference import load_reference
    from repository_sync.canary.analysis import CoverageReference
    from repository_sync.canary.checks import important_features

    try:
        ref = load_reference(root, model, int(version), endpoint_url=endpoint_url, with_profile=False,
                             with_times=False)
    except WindowError as exc:
        return None, f"feature-space coverage not evaluated: {exc}"
    numeric = [c for c, k in ref.schema.features.items() if k in ("float", "int")]
    importances = getattr(ref, "importance", None) or getattr(ref, "importances", None)
    features = important_features(numeric, importances, top)
    return CoverageReference(ref.frame, tuple(features)), (
        f"coverage on {features} of the reference {ref.uri}"
        + (" (by importance)" if importances else " (no importances: all features)"))


# ----------------------------------------------------------------------------------- MLflow record
class CanaryRecord:
    """The MLflow run of one canary: every analysis as metrics, then analyses JSON and the plot.

    Recording an intermediate analysis never stops a canary: an MLflow error there is logged
    and counted (``errors``); the step-ending analyses stay on the model version's tags, as
    :func:`tritonflow.pipelines.canary_promotion.run_promotion` writes them.
    """

    def __init__(self, tracking_uri: str, *, model: str, triton_model: str, champion: int,
                 challenger: int, canary_id: str, thresholds: Mapping[str, Any],
                 extra_tags: Mapping[str, str] | None = None):
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.analyses: list[dict[str, Any]] = []
        self.errors = 0
        exp = self.client.get_experiment_by_name(CANARY_EXPERIMENT)
        if exp is None:
            try:
                exp_id = self.client.create_experiment(CANARY_EXPERIMENT)
            except Exception:  # noqa: BLE001 -- created by a concurrent canary
                existing = self.client.get_experiment_by_name(CANARY_EXPERIMENT)
                if existing is None:  # not created by anyone: the creation error stands
                    raise
                exp_id = existing.experiment_id
        else:
            exp_id = exp.experiment_id
        tags = {"tritonflow.model_name": model, "tritonflow.triton_model": triton_model,
                "tritonflow.champion_version": str(champion),
                "tritonflow.challenger_version": str(challenger), "tritonflow.canary_id": canary_id,
                **dict(extra_tags or {})}
        run = self.client.create_run(exp_id, run_name=f"{model}-v{challenger}-canary-{canary_id}", tags=tags)
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, json.dumps(v) if isinstance(v, (list, dict)) else str(v))
                  for k, v in sorted(thresholds.items())]
        self.client.log_batch(self.run_id, params=params)

    def add(self, analysis: Any) -> None:
        """Log one analysis as metrics (step = its number)."""
        from mlflow.entities import Metric

        d = analysis.to_dict()
        self.analyses.append(d)
        ts = int(float(d["window_end"]) * 1000)
        step = int(d.get("index") or len(self.analyses))
        metrics = [Metric(name, float(d[field]), ts, step) for name, field in ANALYSIS_METRICS.items()
                   if d.get(field) is not None]
        metrics.append(Metric("verdict", float(VERDICT_CODES.get(d["verdict"], -1)), ts, step))
        quality = d.get("quality") or {}
        if quality.get("difference") is not None:
            metrics.append(Metric("quality_difference", float(quality["difference"]), ts, step))
        try:
            self.client.log_batch(self.run_id, metrics=metrics)
        except Exception as exc:  # noqa: BLE001 -- an MLflow blip must not stop the canary
            self.errors += 1
            log.warning("canary run %s: analysis %s not logged: %s", self.run_id, step, exc)

    def finish(self, outcome: str, reason: str) -> dict[str, Any]:
        """Log the analyses JSON and the plot, end the run; returns their artifact URIs."""
        from tritonflow.canary_plot import ANALYSES_ARTIFACT, plot_canary

        out: dict[str, Any] = {"run_id": self.run_id, "analyses": len(self.analyses),
                               "record_errors": self.errors}
        with tempfile.TemporaryDirectory(prefix="tritonflow-canary-") as tmp:
            folder, name = ANALYSES_ARTIFACT.rsplit("/", 1)
            path = Path(tmp) / name
            path.write_text(json.dumps({"outcome": outcome, "reason": reason,
                                        "analyses": self.analyses}, allow_nan=False))
            self.client.log_artifact(self.run_id, str(path), folder)
            if self.analyses:
                png = plot_canary(self.analyses, Path(tmp) / "canary.png")
                self.client.log_artifact(self.run_id, str(png), folder)
                out["plot"] = f"{folder}/canary.png"
        base = self.client.get_run(self.run_id).info.artifact_uri.rstrip("/")
        out["analyses_uri"] = f"{base}/{ANALYSES_ARTIFACT}"
        self.client.set_tag(self.run_id, "tritonflow.canary_outcome", outcome)
        self.client.set_terminated(self.run_id, "FINISHED" if outcome == "promoted" else "FAILED")
        return out


__all__ = ["CANARY_EXPERIMENT", "CanaryRecord", "EXPECTED_TAG", "LogTail", "coverage_reference_for",
           "expected_for", "load_expected", "observer"]
