"""Hourly drift monitoring stages, called by ``dags/drift_monitor.py`` (plain Python, no Airflow).

One DAG run checks one hour (the run's data interval) for every monitored model::

    monitored_models ─┬─> check_model_hour ──┬─> record_in_mlflow ─> alert ─> data-quality gate
                      │   (critical path:    ├─> drift asset event (only when drift)
                      │    contract +        │
                      │    statistics +      │
                      │    thresholds)       │
                      ├─> evidently_for_hour (sample report, beside the check)
                      └─> profile_for_hour   (whylogs profile, beside the check)

The DAG runs each stage for a batch of models per task instance
(:mod:`tritonflow.pipelines.drift_batches`, ``TRITONFLOW_DRIFT_MODELS_PER_TASK``).

Every stage returns a small JSON-serialisable dict (under ``Settings.max_xcom_bytes``); bulky
artefacts (the full summary JSON, the Evidently HTML, the whylogs profile) are written under
:func:`artefact_dir` and referenced by path.

Idempotent per hour: the history store replaces an hour's rows on a rerun, artefacts are
overwritten at the same paths, MLflow metrics are logged with the hour as step and the window
start as timestamp (a rerun writes the same points), and the model version's verdict tags only
move forward in time (a backfill of an old hour never overwrites a newer verdict).

Where things live (all derived from :class:`ground.settings.Settings`):

* inference log and drift references: :func:`log_root` (``TRITONFLOW_INFERENCE_LOG_ROOT`` or
  ``<home>/inference_logs``); references are recorded at publish time by
  :func:`drift_checks.reference.save_reference` under the same root;
* statistics history: ``TRITONFLOW_DRIFT_HISTORY_DB_URL`` or ``<home>/drift/history.db``;
* artefacts: ``<home>/drift/artefacts/<model>/<YYYY-MM-DDTHH>/``;
* prepared training references (sorted columns, PSI bins; keyed by the sample's SHA-256):
  :func:`reference_cache_dir`, ``<home>/drift/reference_cache/``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ground.exceptions import ContractViolation, RegistryError, SettingsError, WindowError
from ground.settings import Settings, get_settings

log = logging.getLogger(__name__)

#: MLflow experiment of the drift runs (one run per model version).
DRIFT_EXPERIMENT = "tritonflow-drift"
#: Alias naming the served version that is monitored.
CHAMPION_ALIAS = "champion"
#: Model-version tag prefix of the latest verdict.
VERDICT_TAG_PREFIX = "tritonflow.drift."
#: Largest number of drifting features / scores carried in an alert or asset event.
MAX_EVENT_FEATURES = 50


# ------------------------------------------------------------------------------ helpers
def _settings(settings: Settings | None) -> Settings:
    return settings if settings is not None else get_settings()


def _endpoint(settings: Settings) -> str | None:
    return settings.s3_endpoint_url or None


def log_root(settings: Settings | None = None) -> str:
    """Inference-log (and drift reference) root: ``inference_log_root`` or ``<home>/inference_logs``."""
    s = _settings(settings)
    return s.inference_log_root or str(Path(s.home) / "inference_logs")


def _hour(value: Any, field: str):
    import pandas as pd

    try:
        t = pd.Timestamp(value)
    except (ValueError, TypeError):
        raise WindowError(f"{field}={value!r} is not a time; expected an ISO 8601 UTC datetime") from None
    if t.tzinfo is None:
        t = t.tz_localize("UTC")
    return t.tz_convert("UTC")


def artefact_dir(model: str, start: Any, settings: Settings | None = None) -> Path:
    """``<home>/drift/artefacts/<model>/<YYYY-MM-DDTHH>`` of the window starting at ``start``."""
    s = _settings(settings)
    return Path(s.home) / "drift" / "artefacts" / model / f"{_hour(start, 'start'):%Y-%m-%dT%H}"


def _history(settings: Settings):
    from drift_checks.history import HistoryStore, default_history_url

    return HistoryStore(default_history_url(settings))


def _mlflow_client(settings: Settings):
    from mlflow import MlflowClient

    uri = settings.resolved_mlflow_tracking_uri
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _json_size(value: Any) -> int:
    return len(json.dumps(value, default=str).encode())


# ------------------------------------------------------------------------------ stages
def monitored_models(settings: Settings | None = None, only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Registered models with a ``champion`` alias, and the version it names.

    Args:
        settings: Settings (MLflow tracking URI, ``monitored_models`` filter).
        only: Names to keep (e.g. the DAG's ``models`` parameter); overrides the setting
            ``TRITONFLOW_MONITORED_MODELS`` (comma-separated). Empty/``None``: no filter.

    Returns:
        ``[{"model": name, "version": int}]`` sorted by name. Models without a champion are left
        out (nothing is served yet).

    Raises:
        RegistryError: A requested model does not exist or has no ``champion`` alias (names it).
        ServiceUnavailableError / MLflow errors: the registry did not answer (retried).
    """
    s = _settings(settings)
    wanted = [m.strip() for m in (only or s.monitored_models.split(",")) if m and m.strip()]
    client = _mlflow_client(s)
    out = []
    if wanted:
        for name in sorted(set(wanted)):
            try:
                rm = client.get_registered_model(name)
            except Exception as exc:  # noqa: BLE001 - MLflow raises its own RestException
                if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
                    raise RegistryError(f"monitored model {name!r} is not registered in MLflow "
                                        f"({s.resolved_mlflow_tracking_uri}); expected a registered "
                                        "model name") from None
                raise
            aliases = dict(rm.aliases or {})
            if CHAMPION_ALIAS not in aliases:
                raise RegistryError(f"monitored model {name!r} has no {CHAMPION_ALIAS!r} alias "
                                    f"(aliases: {sorted(aliases) or 'none'}); expected the served version "
                                    f"to carry it")
            out.append({"model": name, "version": int(aliases[CHAMPION_ALIAS])})
        return out
    for rm in client.search_registered_models(max_results=1000):
        aliases = dict(rm.aliases or {})
        if CHAMPION_ALIAS in aliases:
            out.append({"model": rm.name, "version": int(aliases[CHAMPION_ALIAS])})
    return sorted(out, key=lambda d: d["model"])


def _load_reference(model: str, version: int, settings: Settings, with_times: bool = False):
    """The version's stored reference (its row times only when asked: ``training_seasonal``)."""
    from drift_checks.reference import load_reference

    return load_reference(log_root(settings), model, int(version), endpoint_url=_endpoint(settings),
                          with_profile=False, with_times=with_times)


def _wants_times(settings: Settings, strategy_name: str | None) -> bool:
    """Whether the check reads the reference's row times (an unknown name is refused later).

    ``training_seasonal`` does, and ``training`` with the season-matched run rule on.
    """
    from drift_checks.strategies import ReferenceStrategy

    try:
        name = ReferenceStrategy.from_settings(settings, strategy_name).name
    except SettingsError:
        return False
    return name == "training_seasonal" or _season_run_on(name, settings)


def _season_run_on(strategy_name: str, settings: Settings) -> bool:
    """Whether the season-matched run rule (:mod:`drift_checks.policy`) applies to the strategy."""
    return strategy_name == "training" and settings.drift_seasonal_run_windows >= 2


def _season_run(ref, prepared, t0, t1, strategy_name: str | None, settings: Settings):
    """The window's season for the season-matched run rule (:mod:`drift_checks.policy`), else ``None``.

    Only under the ``training`` strategy with ``TRITONFLOW_DRIFT_SEASONAL_RUN_WINDOWS`` on and a
    reference that stores its rows' times. A season of fewer than 2 cycles of
    ``TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS`` (0: the period its times give,
    :func:`drift_checks.season_match.choose_period`) is the whole reference
    (:mod:`drift_checks.season_match`), which :func:`~drift_checks.verdict.check_window` ignores.
    """
    from drift_checks.strategies import ReferenceStrategy

    strategy = ReferenceStrategy.from_settings(settings, strategy_name)
    if not _season_run_on(strategy.name, settings) or ref.times is None:
        return None
    return _seasonal_reference(ref, t0, t1, strategy, settings, training=prepared)[0]


def _read(model: str, start, end, schema, settings: Settings):
    from drift_checks.inference_log import read_window

    return read_window(log_root(settings), model, start, end, schema=schema, endpoint_url=_endpoint(settings))


def _scan(model: str, start, end, schema, settings: Settings):
    from drift_checks.streaming import open_window

    return open_window(log_root(settings), model, start, end, schema=schema, endpoint_url=_endpoint(settings))


def streamed_summary(scan, prepared, settings: Settings | None = None, writes: list | None = None):
    """Summarise a window too large for the exact statistics.

    The summary of a window above ``drift_exact_max_rows`` (bin counts, sketches, contract
    facts; constant memory), computed once and stored so reruns decide from the same sketches.

    ``TRITONFLOW_DRIFT_ENGINE=local`` streams the files in this process's workers
    (:func:`drift_checks.streaming.summarize_window`); ``spark`` has Spark summarise the files'
    partitions and merges them here, on the driver (:mod:`drift_checks.spark`).

    ``writes``: as :func:`drift_checks.streaming.stored_summary` (a list: the summary is stored
    on a thread while the caller scores it; wait for the futures appended).

    Returns:
        ``(WindowSummary, computed)``; ``computed`` is ``False`` when the stored one was reused.

    Raises:
        SettingsError: An unknown engine.
    """
    from drift_checks.streaming import stored_summary, summarize_window
    from ground.exceptions import SettingsError

    s = _settings(settings)
    if s.drift_engine not in ("local", "spark"):
        raise SettingsError(f"TRITONFLOW_DRIFT_ENGINE={s.drift_engine!r}; expected local or spark")

    def compute():
        if s.drift_engine == "spark":
            from drift_checks.spark import get_spark, summarize_window_spark

            return summarize_window_spark(get_spark(s.spark_master), scan, prepared, sketch_k=s.drift_sketch_k,
                                          batch_rows=s.drift_stream_batch_rows)
        return summarize_window(scan, prepared, sketch_k=s.drift_sketch_k, batch_rows=s.drift_stream_batch_rows,
                                workers=s.drift_stream_workers)

    return stored_summary(scan, prepared, compute, sketch_k=s.drift_sketch_k, writes=writes)


def _no_reference_summary(model: str, version: int, start, end, error: str) -> dict[str, Any]:
    return {
        "model": model, "model_version": int(version), "window_start": start.isoformat(),
        "window_end": end.isoformat(), "n_rows": None, "status": "no_reference", "severity": "no_reference",
        "drift": False, "dataset_score": None, "features": {}, "contract": None, "evidently": None,
        "alerts": [{"kind": "no_reference", "severity": "error",
                    "message": f"{model!r} v{version}: {error}"}],
        "artefacts": {},
    }


def _strategy_reference(model: str, version: int, ref, t0, t1, strategy_name: str | None,
                        settings: Settings):
    """(prepared reference, note) for the strategy (:mod:`drift_checks.strategies`)."""
    from drift_checks.reference_cache import prepared_training_reference
    from drift_checks.strategies import ReferenceStrategy, served_reference
    from drift_checks.verdict import prepare_reference

    strategy = ReferenceStrategy.from_settings(settings, strategy_name)
    span = strategy.served_range(t0, t1)
    if span is not None:
        served = served_reference(_read(model, span[0], span[1], ref.schema, settings).frame,
                                  list(ref.schema.features), kinds=ref.schema.features)
        if served is not None:
            return prepare_reference(served, ref.schema, reference_id=strategy.reference_id(
                ref.reference_id, version), importance=ref.importance, time_ordered=True), strategy.describe()
        note = (f"{strategy.describe()}: fewer than the rows needed in [{span[0]}, {span[1]}); "
                "the training reference applies")
    elif strategy.name == "training_seasonal":
        return _seasonal_reference(ref, t0, t1, strategy, settings)
    else:
        note = strategy.describe()
    return prepared_training_reference(ref, reference_cache_dir(settings)), note


def _seasonal_reference(ref, t0, t1, strategy, settings: Settings, training=None):
    """(prepared reference, note) of ``training_seasonal``: the reference rows of the window's season.

    ``training``: the prepared training reference when the caller holds it already.
    """
    import dataclasses
    import hashlib

    import pandas as pd

    from drift_checks.reference_cache import prepared_training_reference
    from drift_checks.season_match import SeasonalReference

    if training is None:
        training = prepared_training_reference(ref, reference_cache_dir(settings))
    if ref.times is None:
        return training, ("training_seasonal: the reference stores no row times (its source had no 'timestamp' "
                          "column); the whole training reference applies")
    whole = training.calibration_store
    times_key = hashlib.sha256(ref.times.tobytes()).hexdigest()[:16]

    def store(period: pd.Timedelta, duration: pd.Timedelta):  # keyed apart from the whole reference's
        return dataclasses.replace(whole, reference_key=f"{whole.reference_key}-season-{period.value}-"
                                                        f"{duration.value}-{times_key}")

    return SeasonalReference(training, ref.times, strategy.period, store=store if whole is not None else None
                             ).for_window(t0, t1)


def reference_cache_dir(settings: Settings) -> Path:
    """``<home>/drift/reference_cache``: prepared training references (:mod:`drift_checks.reference_cache`)."""
    return Path(settings.home) / "drift" / "reference_cache"


def check_model_hour(model: str, version: int, start: Any, end: Any,
                     settings: Settings | None = None, reference_strategy: str | None = None) -> dict[str, Any]:
    """Run the hourly drift check of one model version.

    The hourly drift check of one model version (critical path: contract, statistics,
    thresholds, verdict, alert policy, history).

    Args:
        model: Registered model name (also its inference-log folder).
        version: Model version whose reference is the baseline (the champion).
        start: Start of the window (the DAG run's data interval), UTC, inclusive.
        end: End of the window, UTC, exclusive.
        settings: Settings (log root, history URL, threshold and alert policy, XCom limit).
        reference_strategy: ``training``, ``trailing`` or ``seasonal`` (``None``: the setting
            ``TRITONFLOW_DRIFT_REFERENCE_STRATEGY``).

    Returns:
        The summary of :func:`drift_checks.verdict.check_window` (status ``ok``, ``no_data``,
        ``contract_failed``, ``check_error``) plus ``reference_strategy`` (what the window was
        compared with), or status ``no_reference`` with an alert when no reference was recorded
        for the version; plus ``artefacts`` (summary JSON path and, on a contract failure,
        ``window_parquet``: a copy of the window kept for inspection). At most
        ``settings.max_xcom_bytes`` serialised.

    Raises:
        WindowError: A log file of the hour is malformed (bad data: no retry).
        SettingsError: An unknown reference strategy or policy setting.
    """
    from drift_checks.verdict import CheckConfig, check_window

    s = _settings(settings)
    t0, t1 = _hour(start, "start"), _hour(end, "end")
    try:
        ref = _load_reference(model, version, s, with_times=_wants_times(s, reference_strategy))
    except WindowError as exc:
        exc = WindowError(f"{exc}; a drift reference is built only from real data (the training window "
                          "given to the publish as dataset_uri): this version is not monitored until it "
                          "is published with one")
        summary = _no_reference_summary(model, version, t0, t1, str(exc))
        log.error("drift check %s v%s [%s, %s): %s", model, version, t0, t1, exc)
        return summary
    prepared, note = _strategy_reference(model, int(version), ref, t0, t1, reference_strategy, s)
    scan = _scan(model, t0, t1, ref.schema, s)
    window = None
    writes: list[Any] = []  # futures of the stored summary's write
    season = None
    if scan.n_rows > s.drift_exact_max_rows:  # constant memory: bin counts and sketches
        current, computed = streamed_summary(scan, prepared, s, writes)  # stored while it is scored
    else:  # (the season run rule scores exact windows only: a streamed summary is binned for one reference)
        window = _read(model, t0, t1, ref.schema, s)
        current = window.frame
        season = _season_run(ref, prepared, t0, t1, reference_strategy, s)
    out_dir = artefact_dir(model, t0, s)
    try:
        summary = check_window(model=model, frame=current, start=t0, end=t1, reference=prepared,
                               history=_history(s), config=CheckConfig.from_settings(s),
                               model_version=int(version), artefact_dir=out_dir, season=season)
    except BaseException:
        for w in writes:  # wait for the write; the check's own error is the one raised
            w.exception()
        raise
    for w in writes:  # the stored summary is written (a failed write raises here)
        w.result()
    summary["window_files"] = len(scan.files)
    summary["reference_strategy"] = note
    if window is None:
        summary["engine"] = f"streamed ({s.drift_engine}; summary {'computed' if computed else 'stored, reused'})"
    if summary["status"] in ("contract_failed", "check_error") and window is None:
        keep = out_dir / "window_files.json"  # a streamed window is too large to copy
        keep.write_text(json.dumps(scan.files, indent=1))
        summary["artefacts"]["window_files"] = str(keep)
    elif summary["status"] in ("contract_failed", "check_error") and window is not None:
        keep = out_dir / "window.parquet"
        _keep_window(window.frame, keep)  # the window as checked, for inspection
        summary["artefacts"]["window_parquet"] = str(keep)
        log.warning("drift check %s v%s [%s, %s): data contract %s; window kept at %s", model, version,
                    t0, t1, summary["status"], keep)
    return summary


def _keep_window(frame: Any, path: Path) -> None:
    """Write the window (pandas) that broke its contract to ``path`` (Parquet), for inspection.

    A column mixing numbers and text (files from producers that disagree on its type) cannot be
    stored as one Arrow type; its values are kept as text then (nulls stay null).
    """
    import pyarrow as pa

    try:
        frame.to_parquet(path, index=False)
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        mixed = {c: frame[c].map(str, na_action="ignore") for c in frame.columns if frame[c].dtype == object}
        frame.assign(**mixed).to_parquet(path, index=False)


def evidently_for_hour(model: str, version: int, start: Any, end: Any,
                       settings: Settings | None = None, sample_rows: int | None = None) -> dict[str, Any]:
    """Build the Evidently data-drift report of one hour.

    Evidently ``DataDriftPreset`` report of the hour on seeded samples (its own step, beside
    the check; it never changes the verdict).

    Args:
        model: As :func:`check_model_hour`.
        version: As :func:`check_model_hour`.
        start: As :func:`check_model_hour`.
        end: As :func:`check_model_hour`.
        settings: Settings (default: from the environment).
        sample_rows: Rows per side (default ``settings.drift_evidently_sample_rows``; 0: off).

    Returns:
        ``{"model", "version", "window_start", "status", "html_path", "scores", "excluded"}``;
        status ``ok``, ``no_data``, ``no_columns``, ``disabled`` or ``no_reference``.
    """
    from drift_checks.reference_cache import prepared_training_reference
    from drift_checks.verdict import evidently_report_for_window

    s = _settings(settings)
    t0, t1 = _hour(start, "start"), _hour(end, "end")
    base = {"model": model, "version": int(version), "window_start": t0.isoformat()}
    rows = s.drift_evidently_sample_rows if sample_rows is None else int(sample_rows)
    if rows <= 0:
        return {**base, "status": "disabled", "html_path": None, "scores": {}, "excluded": {}}
    try:
        ref = _load_reference(model, version, s)
    except WindowError:
        return {**base, "status": "no_reference", "html_path": None, "scores": {}, "excluded": {}}
    scan = _scan(model, t0, t1, ref.schema, s)
    if scan.n_rows > s.drift_exact_max_rows:  # a seeded sample, streamed: never the whole window
        from drift_checks.streaming import sample_window

        current = sample_window(scan, ref.schema, rows, s.drift_stream_batch_rows)
    else:
        current = _read(model, t0, t1, ref.schema, s).frame
    ev = evidently_report_for_window(prepared_training_reference(ref, reference_cache_dir(s), workers=1), current,
                                     artefact_dir(model, t0, s), sample_rows=rows)
    out = {**base, "status": ev["status"], "html_path": ev["html_path"], "scores": ev["scores"],
           "excluded": ev["excluded"]}
    if _json_size(out) > s.max_xcom_bytes:  # many columns: the scores stay in the HTML
        out["scores"] = {}
        out["truncated"] = True
    return out


def profile_for_hour(model: str, version: int, start: Any, end: Any,
                     settings: Settings | None = None) -> dict[str, Any]:
    """Profile the hour with whylogs once and store it, for inspection (it decides nothing).

    Off the critical path (about 12 s per 1M x 20 window). A rerun returns the stored profile.

    Returns:
        ``{"model", "window_start", "profile_uri", "created", "n_rows"}``; ``profile_uri`` is
        ``None`` for an empty hour.
    """
    from drift_checks.profiles import profile_hour

    s = _settings(settings)
    t0, t1 = _hour(start, "start"), _hour(end, "end")
    try:
        schema = _load_reference(model, version, s).schema
    except WindowError:
        schema = None
    scan = _scan(model, t0, t1, schema, s)
    from drift_checks.profiles import profile_key
    from drift_checks.storage import Store

    store = Store(log_root(s), _endpoint(s))
    if scan.n_rows > s.drift_exact_max_rows and store.exists(profile_key(model, t0)):
        return {"model": model, "window_start": t0.isoformat(), "n_rows": scan.n_rows,
                "profile_uri": store.uri(profile_key(model, t0)), "created": False}
    if scan.n_rows > s.drift_exact_max_rows:  # profile batch by batch, merge the views
        from drift_checks.profiles import merge_profiles, profile_frame
        from drift_checks.streaming import iter_window_frames

        cols = list(schema.features) if schema is not None else []
        views, n = [], 0
        for part in iter_window_frames(scan, cols, s.drift_stream_batch_rows):
            views.append(profile_frame(part.drop(columns="timestamp")))
            n += len(part)
        frame = merge_profiles(views) if views else None
    else:
        frame = _read(model, t0, t1, schema, s).frame
        n = len(frame)
    base = {"model": model, "window_start": t0.isoformat(), "n_rows": n}
    if n == 0:
        return {**base, "profile_uri": None, "created": False}
    uri, created = profile_hour(log_root(s), model, t0, frame, endpoint_url=_endpoint(s))
    return {**base, "profile_uri": uri, "created": created}


def _metric_key(feature: str, statistic: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", f"{feature}.{statistic}")


def _drift_run(client, experiment_id: str, model: str, version: int) -> str:
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`tritonflow.model` = '{model}' and tags.`tritonflow.model_version` = '{version}'",
        max_results=1)
    if runs:
        return runs[0].info.run_id
    run = client.create_run(experiment_id, run_name=f"drift-{model}-v{version}",
                            tags={"tritonflow.model": model, "tritonflow.model_version": str(version),
                                  "tritonflow.kind": "drift"})
    return run.info.run_id


def _looked_up_run(client, model: str, version: int) -> tuple[str, str]:
    """(experiment id, run id) of the version's drift run, found in :data:`DRIFT_EXPERIMENT` or created."""
    exp = client.get_experiment_by_name(DRIFT_EXPERIMENT)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(DRIFT_EXPERIMENT)
    return exp_id, _drift_run(client, exp_id, model, version)


def _log_metrics(client, tags: Mapping[str, str], model: str, version: int, metrics: list) -> tuple[str, str]:
    """Log ``metrics`` to the version's drift run; return its (experiment id, run id).

    The run named by the version's verdict tags (``.run_id``, ``.experiment_id``: the last recorded
    hour's) is used without looking it up: two MLflow round-trips fewer each hour. When logging to
    it fails (the run was deleted), the run is looked up or created as on the first hour.
    """
    run_id, exp_id = tags.get(VERDICT_TAG_PREFIX + "run_id"), tags.get(VERDICT_TAG_PREFIX + "experiment_id")
    if run_id and exp_id:
        try:
            for i in range(0, len(metrics), 1000):
                client.log_batch(run_id, metrics=metrics[i:i + 1000])
            return exp_id, run_id
        except Exception as exc:  # noqa: BLE001 - MLflow raises its own RestException; looked up below
            log.warning("drift run %s of %s v%s named by the version's tags is not usable (%s); looking it up",
                        run_id, model, version, exc)
    exp_id, run_id = _looked_up_run(client, model, version)
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    return exp_id, run_id


def _hour_metrics(full: Mapping[str, Any], ts: int, step: int) -> list:
    """The MLflow metrics of one hour's full summary (every finite statistic, dataset score, rows)."""
    from mlflow.entities import Metric

    metrics = []
    for feature, info in (full.get("features") or {}).items():
        for name, stat in (info.get("statistics") or {}).items():
            v = stat.get("value") if isinstance(stat, Mapping) else None
            if isinstance(v, (int, float)) and math.isfinite(v):
                metrics.append(Metric(_metric_key(feature, name), float(v), ts, step))
    if isinstance(full.get("dataset_score"), (int, float)):
        metrics.append(Metric("dataset_score", float(full["dataset_score"]), ts, step))
    metrics.append(Metric("n_rows", float(full.get("n_rows") or 0), ts, step))
    return metrics


def record_in_mlflow(summary: Mapping[str, Any], settings: Settings | None = None,
                     evidently: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record one hour's drift results against the model version in MLflow.

    In experiment :data:`DRIFT_EXPERIMENT`, one run per model version (tags ``tritonflow.model``,
    ``tritonflow.model_version``): every finite statistic as metric ``<feature>.<statistic>``
    plus ``dataset_score``, with step = hours since the epoch and timestamp = window start (a
    rerun writes the same points); the full summary JSON and the Evidently HTML as artifacts
    under ``windows/<YYYY-MM-DDTHH>/``. The model version gets tags
    ``tritonflow.drift.severity``, ``.dataset_score``, ``.window_start``, ``.status``, ``.run_id``
    and ``.experiment_id`` (each written only when its value changes), unless a later hour's
    verdict is already there. From the version's tags it also says whether the version's follow-up
    retraining is due at the hour's end (:mod:`tritonflow.pipelines.retrain_followup`).

    MLflow round-trips: the version (its tags name the drift run after the first hour), the
    metrics, the artifact(s) and the changed tags: about five a quiet hour.

    Args:
        summary: From :func:`check_model_hour`.
        settings: Settings (default: from the environment).
        evidently: From :func:`evidently_for_hour` (optional).

    Returns:
        ``{"run_id", "experiment_id", "metrics", "artifacts", "version_tagged", "followup"}``
        (``followup``: :func:`~tritonflow.pipelines.retrain_followup.followup_conf` or None), or
        ``{"skipped": reason}`` when the summary names no model version.
    """
    s = _settings(settings)
    model, version = summary.get("model"), summary.get("model_version")
    if not model or version is None:
        return {"skipped": "summary names no model version"}
    client = _mlflow_client(s)
    tags = dict(client.get_model_version(model, str(version)).tags or {})
    t0 = _hour(summary["window_start"], "window_start")
    full = dict(summary)
    p = Path(summary.get("artefacts", {}).get("summary_json") or "")
    if p.is_file():  # the uncapped summary written by check_window
        full = json.loads(p.read_text())
    metrics = _hour_metrics(full, int(t0.timestamp() * 1000), int(t0.timestamp() // 3600))
    exp_id, run_id = _log_metrics(client, tags, model, int(version), metrics)
    where = f"windows/{t0:%Y-%m-%dT%H}"
    artifacts = []
    tmp = artefact_dir(model, t0, s)
    tmp.mkdir(parents=True, exist_ok=True)
    summary_file = tmp / "drift_summary.json"
    if not summary_file.is_file():
        summary_file.write_text(json.dumps(full, indent=1, sort_keys=True, default=str))
    client.log_artifact(run_id, str(summary_file), where)
    artifacts.append(f"{where}/{summary_file.name}")
    html = (evidently or {}).get("html_path")
    if html and Path(html).is_file():
        client.log_artifact(run_id, html, where)
        artifacts.append(f"{where}/{Path(html).name}")
    tagged = _tag_version(client, model, int(version), tags, full, t0, (run_id, exp_id))
    return {"run_id": run_id, "experiment_id": exp_id, "metrics": len(metrics), "artifacts": artifacts,
            "version_tagged": tagged, "followup": _followup(model, int(version), tags, summary.get("window_end"))}


def _followup(model: str, version: int, tags: Mapping[str, str], hour_end: Any) -> dict[str, Any] | None:
    """The version's follow-up retraining due at the hour's end, from the tags just read (None: none)."""
    from tritonflow.pipelines.retrain_followup import followup_conf

    if not hour_end:
        return None
    try:
        return followup_conf(model, version, tags, hour_end)
    except WindowError as exc:  # a malformed tag must not fail the hour's record
        log.warning("follow-up retraining of %s v%s not checked: %s", model, version, exc)
        return None


def _tag_version(client, model: str, version: int, tags: Mapping[str, str], summary: Mapping[str, Any], t0,
                 run: tuple[str, str]) -> bool:
    """Set the version's verdict tags that changed; ``False`` when a later hour's verdict is there."""
    latest = tags.get(VERDICT_TAG_PREFIX + "window_start")
    if latest and _hour(latest, "tag") > t0:
        return False  # a backfill of an older hour never replaces a newer verdict
    values = {"severity": summary.get("severity"), "dataset_score": summary.get("dataset_score"),
              "window_start": t0.isoformat(), "run_id": run[0], "experiment_id": run[1],
              "status": summary.get("status")}
    for key, value in values.items():
        text = "" if value is None else str(value)
        if tags.get(VERDICT_TAG_PREFIX + key) != text:
            client.set_model_version_tag(model, str(version), VERDICT_TAG_PREFIX + key, text)
    return True


def drifting_features(summary: Mapping[str, Any]) -> list[str]:
    """Features whose severity is ``drift`` (from a full or capped summary)."""
    feats = summary.get("features") or {}
    if isinstance(feats.get("drift"), list):  # capped summary form
        return sorted(feats["drift"])
    return sorted(f for f, v in feats.items() if isinstance(v, Mapping) and v.get("severity") == "drift")


def drift_event(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """Build the drift alert's asset-event ``extra``, if an alert fired.

    The ``extra`` of the DRIFT_ALERTS asset event, or ``None`` when no drift alert fired for
    the hour (the alert policy's decision) or its data contract failed.

    Returns:
        ``{"model", "version", "features", "scores", "window_start", "window_end", "severity"}``;
        ``features`` are the ones the alert names; ``scores`` maps each to ``{statistic: value}`` (at most
        :data:`MAX_EVENT_FEATURES` features), plus ``dataset_score``.
    """
    if not summary.get("drift") or summary.get("status") not in (None, "ok"):
        return None  # a window whose contract failed raises a data-quality alert, never drift
    full = Path((summary.get("artefacts") or {}).get("summary_json") or "")
    if summary.get("truncated") and full.is_file():  # the XCom copy lost the per-statistic values
        summary = json.loads(full.read_text())
    feats = sorted(summary.get("alert_features") or drifting_features(summary))[:MAX_EVENT_FEATURES]
    scores: dict[str, Any] = {}
    for f in feats:
        info = (summary.get("features") or {}).get(f)
        stats = info.get("statistics") if isinstance(info, Mapping) else None
        scores[f] = {k: v.get("value") for k, v in (stats or {}).items() if isinstance(v, Mapping)}
    scores["dataset_score"] = summary.get("dataset_score")
    return {"model": summary.get("model"), "version": summary.get("model_version"), "features": feats,
            "scores": scores, "window_start": summary.get("window_start"),
            "window_end": summary.get("window_end"), "severity": summary.get("severity")}


def _post_json(url: str, body: Mapping[str, Any], timeout_s: float) -> int:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body, default=str).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (configured URL)
        return resp.status


def alert(summary: Mapping[str, Any], settings: Settings | None = None) -> dict[str, Any]:
    """Log the hour's alerts (always) and POST them to ``alert_webhook_url`` when configured.

    The body is JSON with a ``text`` line (Slack/Teams-compatible) and the alerts. A failing
    webhook is logged, never raised (the alert path must not hide the check's result).

    Returns:
        ``{"alerts": n, "logged": True, "webhook_status": int | None, "webhook_error": str | None}``.
    """
    s = _settings(settings)
    alerts = list(summary.get("alerts") or [])
    model, version = summary.get("model"), summary.get("model_version")
    text = (f"tritonflow drift: {model} v{version} [{summary.get('window_start')}, "
            f"{summary.get('window_end')}) severity={summary.get('severity')} "
            f"status={summary.get('status')} drifting={drifting_features(summary)}")
    level = logging.WARNING if alerts or summary.get("drift") else logging.INFO
    log.log(level, "%s alerts=%s", text, json.dumps(alerts, default=str)[:2000])
    out: dict[str, Any] = {"alerts": len(alerts), "logged": True, "webhook_status": None, "webhook_error": None}
    if s.alert_webhook_url and (alerts or summary.get("drift")):
        try:
            out["webhook_status"] = _post_json(s.alert_webhook_url, {"text": text, "alerts": alerts[:50],
                                                                      "summary_status": summary.get("status")},
                                               s.alert_timeout_s)
        except Exception as exc:  # noqa: BLE001 - logged, never raised
            out["webhook_error"] = f"{type(exc).__name__}: {exc}"
            log.error("drift alert webhook %s failed: %s", s.alert_webhook_url, exc)
    return out


def data_quality_gate(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Fail (as bad data, never retried) when the hour broke its data contract.

    Runs after the results were recorded and alerted, so the hour is fully documented; the
    window copy stays at ``artefacts.window_parquet`` for inspection.

    Raises:
        ContractViolation: Status ``contract_failed`` (names the columns and expectations, each
            with its source: ``derived`` from the reference and schema, or the ``user``'s suite) or
            ``check_error`` (an expectation could not be evaluated).
    """
    status = summary.get("status")
    if status not in ("contract_failed", "check_error"):
        return {"status": status, "passed": True}
    failed = [f"{a.get('column')}: {a.get('expectation')} observed {json.dumps(a.get('observed'), default=str)[:80]}"
              f" ({a.get('source') or 'derived'} expectation)"
              for a in summary.get("alerts") or [] if a.get("kind") in ("data_quality", "contract_check_error")]
    where = (summary.get("artefacts") or {}).get("window_parquet")
    raise ContractViolation(
        f"{summary.get('model')} v{summary.get('model_version')} window [{summary.get('window_start')}, "
        f"{summary.get('window_end')}) broke its data contract ({status}): {'; '.join(failed[:10]) or 'see summary'}; "
        f"expected the reference's columns, ranges and null fractions; window kept at {where}")


__all__ = [
    "DRIFT_EXPERIMENT", "monitored_models", "check_model_hour", "evidently_for_hour", "profile_for_hour",
    "record_in_mlflow", "alert", "drift_event", "drifting_features", "data_quality_gate", "artefact_dir",
    "log_root",
]
