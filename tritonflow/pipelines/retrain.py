"""Retraining stages: the training window (inference log joined with labels) and the training run.

Plain Python (no Airflow); the ``retrain`` DAG calls :func:`training_window` then
:func:`run_training` and triggers the publish pipeline for the version it returns.

* :func:`training_window` reads the model's inference log for ``[end - days, end)``, joins the
  labels that arrived (by ``request_id``, labels read until ``end + shadow_label_lag_hours``),
  keeps the labelled rows and, optionally, mixes in a share of the version's reference data
  (older rows first, so a time-ordered hold-out stays on recent rows). The window is written as
  Parquet under ``<settings.home>/retrain/<model>/windows/`` and returned by reference with its
  lineage: requested and observed bounds, row counts, the SHA-256 data hash
  (:func:`model_registry.training.data_sha256`) and the drift event that caused it.
* :func:`run_training` runs the model's training entry point under
  :class:`model_registry.training.RetrainGuard` (one retraining in flight per model, a cooldown
  after a success) through :func:`model_registry.training.retrain`: a new registered version with
  the alias ``challenger``, the reason and the lineage as ``tritonflow.*`` tags. A failing
  entry point leaves the registry unchanged.

After a confirmed shift (``reason`` ``champion_degraded``, or a ``retrain_followup``) the window
follows the evidence (:mod:`model_registry.evidence_window`, ``TRITONFLOW_RETRAIN_WINDOW_RULE``):
the labelled rows of ``retrain_evidence_lookback_factor`` spans are searched for the point where the
served model's loss rose, and the window is the rows since then, at least
``retrain_min_post_shift_rows`` of them. The choice and its reason become version tags
(``tritonflow.window_rule``, ``window_reason``, ``change_point``, ``post_shift_rows``,
``retrain_followup_at``). A version trained on too few post-shift rows asks for a follow-up:
:func:`followup_due` (called hourly by ``drift_monitor``) returns the retrain conf once the
champion's ``retrain_followup_at`` has passed, at most once per version.

Reference data of a version, for the mix: the training window a retraining recorded on it
(version tag ``tritonflow.training_window_uri``), else the drift reference sample
(:func:`drift_checks.reference.load_reference`) when it holds the label column.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Mapping

from ground.checksums import sha256_file
from ground.exceptions import DataError, RegistryError, SettingsError, WindowError
from ground.settings import Settings, get_settings
from tritonflow.pipelines import shared_work
from tritonflow.pipelines.retrain_followup import (
    FOLLOWUP_AT_TAG,
    FOLLOWUP_REASON,
    FOLLOWUP_STARTED_TAG,
    followup_conf,
    trigger_of,
)
from tritonflow.pipelines.shadow import drift_event_json, log_root, utc

#: Folder under ``settings.home`` holding training windows (``<model>/windows/<hash>.parquet``).
RETRAIN_DIR = "retrain"
#: Version tag naming the training window a retrained version was trained on.
TRAINING_WINDOW_TAG = "tritonflow.training_window_uri"
#: Columns of an inference-log label file that are not labels.
_LABEL_KEYS = ("request_id", "timestamp")
#: Seed of the reference sample drawn for the mix.
MIX_SEED = 0
#: Reasons whose window follows the evidence (a shift the labels confirmed).
EVIDENCE_REASONS = ("champion_degraded", "retrain_followup")
#: Lineage keys of the window choice, recorded as ``tritonflow.<key>`` version tags.
CHOICE_KEYS = ("window_rule", "window_reason", "change_point", "change_point_p_value", "post_shift_rows",
               "retrain_followup_at")


def _settings(settings: Settings | None) -> Settings:
    return settings if settings is not None else get_settings()


def entry_point_for(model: str, settings: Settings | None = None) -> str:
    """The configured training entry point of ``model``.

    ``settings.retrain_entry_points`` (a JSON object ``{"model": "module:function"}``) wins over
    ``settings.retrain_entry_point`` (default ``model_registry.training:train_noaa``).

    Raises:
        SettingsError: ``retrain_entry_points`` is not a JSON object.
    """
    s = _settings(settings)
    raw = (s.retrain_entry_points or "").strip()
    if raw:
        try:
            mapping = json.loads(raw)
        except ValueError:
            raise SettingsError(f"TRITONFLOW_RETRAIN_ENTRY_POINTS={raw[:200]!r} is not JSON; expected "
                            '{"model": "module:function"}') from None
        if not isinstance(mapping, dict):
            raise SettingsError(f"TRITONFLOW_RETRAIN_ENTRY_POINTS is a {type(mapping).__name__}; "
                            'expected a JSON object {"model": "module:function"}')
        if model in mapping:
            return mapping[model]
    return s.retrain_entry_point


def _label_column(labels: Any, label_column: str | None) -> str:
    candidates = [c for c in labels.columns if c not in _LABEL_KEYS]
    if label_column:
        if label_column not in candidates:
            raise WindowError(f"label_column={label_column!r} is not in the labels' columns "
                              f"{candidates}")
        return label_column
    if len(candidates) != 1:
        raise WindowError(f"labels have columns {candidates}; expected exactly one label column "
                          "or label_column= naming it")
    return candidates[0]


def reference_rows(model: str, version: int, *, label_column: str,
                   settings: Settings | None = None) -> tuple[Any, str]:
    """The labelled reference data of a model version, and where it came from.

    Returns:
        ``(frame, source_uri)``.

    Raises:
        WindowError: Neither a recorded training window nor a reference sample with
            ``label_column`` exists for the version (the message names both places).
    """
    import pandas as pd

    from model_registry.registry import RegistryClient

    s = _settings(settings)
    ref = RegistryClient(s.resolved_mlflow_tracking_uri).get_version(model, version)
    uri = ref.tags.get(TRAINING_WINDOW_TAG, "")
    if uri and Path(uri).is_file():
        frame = pd.read_parquet(uri)
        if label_column in frame.columns:
            return frame, uri
    from drift_checks.reference import load_reference

    try:
        reference = load_reference(log_root(s), model, version, endpoint_url=s.s3_endpoint_url or None,
                                   with_profile=False)
    except WindowError as exc:
        raise WindowError(f"model {model!r} v{version} has no reference data to mix: no readable "
                          f"{TRAINING_WINDOW_TAG} tag ({uri or 'unset'}) and {exc}") from None
    if label_column not in reference.frame.columns:
        raise WindowError(f"model {model!r} v{version}: reference sample at {reference.uri} has no "
                          f"label column {label_column!r}; cannot mix it into a training window")
    if reference.times is not None and "timestamp" not in reference.frame.columns:  # mixed rows keep their times
        return reference.frame.assign(timestamp=pd.to_datetime(reference.times).tz_localize("UTC")), reference.uri
    return reference.frame, reference.uri


def _window_end(end: Any, drift_event: Any) -> Any:
    if end not in (None, ""):
        return utc(end, "end")
    event = json.loads(drift_event_json(drift_event) or "{}")
    if isinstance(event, dict) and event.get("window_end"):
        return utc(event["window_end"], "drift_event.window_end")
    return utc(dt.datetime.now(dt.timezone.utc), "end")


def _labelled_log(model: str, s: Settings, start: Any, stop: Any, label_column: str | None
                  ) -> tuple[Any, Any, str]:
    """``(records, labelled, label column)``: the window's logged rows, and those with a label.

    Labels that arrived up to ``shadow_label_lag_hours`` after ``stop`` count; integer-like labels
    are downcast to integers.

    Raises:
        WindowError: No logged row, no label, or no labelled row in ``[start, stop)``; ambiguous labels.
    """
    import pandas as pd

    from drift_checks.inference_log import join_labels, read_labels, read_window

    root, endpoint = log_root(s), s.s3_endpoint_url or None
    records = read_window(root, model, start.to_pydatetime(), stop.to_pydatetime(),
                          endpoint_url=endpoint).frame
    if records.empty:
        raise WindowError(f"inference log of model {model!r} under {root} has no record in "
                          f"[{start.isoformat()}, {stop.isoformat()}); nothing to train on")
    until = stop + pd.Timedelta(hours=float(s.shadow_label_lag_hours))
    labels = read_labels(root, model, start.to_pydatetime(), until.to_pydatetime(),
                         endpoint_url=endpoint)
    if labels.empty:
        raise WindowError(f"no label of model {model!r} arrived in [{start.isoformat()}, "
                          f"{until.isoformat()}); a training window needs labelled rows")
    column = _label_column(labels, label_column)
    joined = join_labels(records, labels[["request_id", "timestamp", column]])
    joined = joined.drop(columns=["label_timestamp"])
    labelled = joined[joined[column].notna()].reset_index(drop=True)
    if labelled.empty:
        raise WindowError(f"none of the {len(records)} logged rows of {model!r} in "
                          f"[{start.isoformat()}, {stop.isoformat()}) has a label yet")
    try:
        labelled[column] = pd.to_numeric(labelled[column], downcast="integer")
    except (TypeError, ValueError):
        pass
    return records, labelled, column


def _mix_reference(model: str, labelled: Any, column: str, frac: float, reference_version: int | None,
                   s: Settings) -> tuple[Any, str, int]:
    """``(window, reference source, reference rows)``: ``labelled`` with reference rows mixed in.

    ``m = round(frac / (1 - frac) * n)`` reference rows (at most all) of ``reference_version``
    (default: the champion), sampled without replacement (seed :data:`MIX_SEED`), go before the
    ``n`` labelled log rows.

    Raises:
        RegistryError: No reference version given and the model has no champion.
        WindowError: The reference data is unavailable or lacks columns of the window.
    """
    import pandas as pd

    if reference_version is None:
        from model_registry.registry import RegistryClient

        champion = RegistryClient(s.resolved_mlflow_tracking_uri).champion(model)
        if champion is None:
            raise RegistryError(f"model {model!r} has no champion whose reference data could "
                                "be mixed in; pass reference_version=")
        reference_version = champion.version
    ref, reference_source = reference_rows(model, int(reference_version), label_column=column,
                                           settings=s)
    ref = ref[ref[column].notna()]
    wanted = int(round(frac / (1 - frac) * len(labelled)))
    n_ref = min(wanted, len(ref))
    sample = ref.sample(n=n_ref, random_state=MIX_SEED) if n_ref < len(ref) else ref
    if "timestamp" in sample.columns:
        sample = sample.sort_values("timestamp", kind="stable")
    common = [c for c in labelled.columns if c in sample.columns]
    missing = [c for c in labelled.columns if c not in sample.columns
               and c not in ("request_id", "timestamp", "model_version")]
    if missing:
        raise WindowError(f"reference data {reference_source} lacks columns {missing} of the "
                          "training window; cannot mix it")
    window = pd.concat([sample[common], labelled], ignore_index=True)
    return window, reference_source, n_ref


def _choose_rows(model: str, s: Settings, stop: Any, days: float, reason: str | None, change_point: Any,
                 label_column: str | None) -> tuple[Any, Any, str, dict[str, str]]:
    """``(records, labelled, label column, choice tags)`` of the window ending at ``stop``.

    Without a confirmed shift (``reason`` not in :data:`EVIDENCE_REASONS`) the rows of the policy's
    span; with one, the rows :func:`model_registry.evidence_window.choose_window` picks from
    ``lookback_factor`` spans.
    """
    import pandas as pd

    from model_registry.evidence_window import EvidenceWindowPolicy, choose_window

    policy = EvidenceWindowPolicy.from_settings(s)
    span_start = stop - pd.Timedelta(days=days)
    if reason not in EVIDENCE_REASONS or policy.rule == "span":
        records, labelled, column = _labelled_log(model, s, span_start, stop, label_column)
        why = (f"reason {reason or 'unset'!r} is not a confirmed shift ({', '.join(EVIDENCE_REASONS)})"
               if reason not in EVIDENCE_REASONS else "TRITONFLOW_RETRAIN_WINDOW_RULE=span")
        return records, labelled, column, {"window_rule": "span", "window_reason": f"{why}: the policy's span"}
    lookback = stop - pd.Timedelta(days=days * policy.lookback_factor)
    records, labelled, column = _labelled_log(model, s, lookback, stop, label_column)
    choice = choose_window(labelled, label_column=column, policy=policy, span_start=span_start, end=stop,
                           recorded_change_point=change_point)
    since = pd.to_datetime(labelled["timestamp"], utc=True) >= choice.start
    records = records[pd.to_datetime(records["timestamp"], utc=True) >= choice.start]
    return records, labelled[since].reset_index(drop=True), column, choice.tags()


def training_window(model: str, *, days: float | None = None,
                    mix_reference_fraction: float | None = None, end: Any = None,
                    drift_event: Any = None, label_column: str | None = None,
                    reference_version: int | None = None, reason: str | None = None,
                    change_point: Any = None, settings: Settings | None = None) -> dict[str, Any]:
    """Build the training window of ``model`` and store it as Parquet.

    Args:
        model: Registered model name (also the inference log's model folder).
        days: Span of the window before ``end`` in days (default ``retrain_window_days``).
        mix_reference_fraction: Share in [0, 1) of the final window taken from the reference data
            (default ``retrain_mix_reference_fraction``): ``m = round(f / (1 - f) * n)`` reference
            rows for ``n`` labelled log rows, sampled without replacement (seed 0), at most all.
        end: End of the window, exclusive (ISO 8601/datetime; default: the drift event's
            ``window_end``, else now, UTC).
        drift_event: The drift asset event's extra (mapping or JSON) that caused the retraining.
        label_column: Label column (default: the labels' only non-key column).
        reference_version: Version whose reference data is mixed in (default: the champion).
        reason: Why the retraining runs; ``champion_degraded`` and ``retrain_followup`` (a shift the
            labels confirmed) make the window follow the evidence (see the module's docstring).
        change_point: A change point recorded by the retraining a follow-up follows (ISO 8601).
        settings: Settings (inference-log root, home, MLflow URI, label lag, ``retrain_*`` window rule).

    Returns:
        ``{"model", "uri", "sha256", "bytes", "rows", "label_column", "lineage"}``; ``lineage``
        holds ``requested_start``/``requested_end`` (ISO), the observed ``window_start``/
        ``window_end``, ``window_rows``, ``window_labelled_rows``, ``window_positive_rows``,
        ``data_sha256``, ``log_rows``, ``labelled_log_rows``, ``reference_rows``,
        ``reference_source``, ``drift_event`` (compact JSON, ``""`` if none) and the window
        choice (:data:`CHOICE_KEYS`: ``window_rule``, ``window_reason``, ...).

    Raises:
        WindowError: No logged row or no labelled row in the window, ambiguous labels, or
            reference data requested but unavailable.
        DataError: ``days`` <= 0 or the fraction outside [0, 1).
    """
    import pandas as pd

    from model_registry.training import window_lineage

    s = _settings(settings)
    days = float(s.retrain_window_days if days is None else days)
    frac = float(s.retrain_mix_reference_fraction if mix_reference_fraction is None
                 else mix_reference_fraction)
    if not days > 0:
        raise DataError(f"days={days!r}; expected a positive number of days")
    if not 0 <= frac < 1:
        raise DataError(f"mix_reference_fraction={frac!r}; expected a share in [0, 1)")
    event = drift_event_json(drift_event)
    stop = _window_end(end, event)
    start = stop - pd.Timedelta(days=days)
    records, labelled, column, choice = _choose_rows(model, s, stop, days, reason, change_point, label_column)
    window, reference_source, n_ref = labelled, "", 0
    if frac > 0:
        window, reference_source, n_ref = _mix_reference(model, labelled, column, frac, reference_version, s)

    info = window_lineage(window, label_column=column)
    folder = Path(s.home) / RETRAIN_DIR / model / "windows"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{info['data_sha256'][:24]}.parquet"
    window.to_parquet(path, index=False)
    shared_work.share(s, path)  # run_training may run on another worker
    lineage = {
        "requested_start": start.isoformat(),
        "requested_end": stop.isoformat(),
        **info,
        "log_rows": int(len(records)),
        "labelled_log_rows": int(len(labelled)),
        "reference_rows": int(n_ref),
        "reference_source": reference_source,
        "drift_event": event,
        **choice,
    }
    return {"model": model, "uri": str(path), "sha256": sha256_file(path),
            "bytes": path.stat().st_size, "rows": int(len(window)), "label_column": column,
            "lineage": lineage}


def run_training(model: str, window_ref: Mapping[str, Any], *, entry_point: Any = None,
                 reason: str, drift_event: Any = None, params: Mapping[str, Any] | None = None,
                 ignore_cooldown: bool = False, holder: str | None = None,
                 settings: Settings | None = None, guard: Any = None) -> dict[str, Any]:
    """Train ``model`` on a stored window under the retrain guard and register a challenger.

    Args:
        model: Registered model name.
        window_ref: The return value of :func:`training_window` (``uri``, ``sha256``, ``lineage``).
        entry_point: ``module:function``, ``project:<uri>[#entry]`` or a mapping (see
            :class:`model_registry.training.EntryPoint`); default :func:`entry_point_for`.
        reason: Why it runs (``drift``, ``champion_degraded``, ``schedule``, ``manual``...).
        drift_event: The drift event that caused it (default: the window's lineage).
        params: Training parameters passed to the entry point.
        ignore_cooldown: Start within the cooldown (never bypasses a retraining in flight).
        holder: Lock holder id (e.g. the DAG run id).
        settings: Settings (MLflow URI, ``retrain_cooldown_s``, ``retrain_stale_after_s``, home).
        guard: A :class:`model_registry.training.RetrainGuard` (default: from the settings).

    Returns:
        The registered version (:meth:`RegisteredVersion.as_dict`: ``name``, ``version``,
        ``run_id``, ``model_uri``, ``alias``, ``tags``) plus ``entry_point`` and
        ``publish_conf`` = ``{"model", "version_or_alias", "then": ["shadow_evaluation"],
        "dataset_uri"}`` (the training window, as the publish's validation dataset).

    Raises:
        ConcurrencyError: Another retraining of the model is in flight.
        RetrainCooldownError: Within the cooldown (and not ``ignore_cooldown``).
        TrainingError: The entry point failed; the registry is unchanged.
        DataError: The window file is missing or changed, or the entry point cannot be resolved.
    """
    import pandas as pd

    from model_registry.training import EntryPoint, Lineage, RetrainGuard, retrain

    s = _settings(settings)
    for key in ("uri", "lineage"):
        if key not in window_ref:
            raise DataError(f"window_ref lacks key {key!r}; expected the dict training_window() returns")
    path = Path(window_ref["uri"])
    shared_work.fetch(s, path)  # training_window may have run on another worker
    if not path.is_file():
        raise DataError(f"training window {str(path)!r} does not exist (is settings.home shared by "
                        "the workers, or TRITONFLOW_STAGING_URI set?)")
    if window_ref.get("sha256") and sha256_file(path) != window_ref["sha256"]:
        raise DataError(f"training window {path} changed since it was built (sha256 differs)")
    spec = entry_point if entry_point not in (None, "") else entry_point_for(model, s)
    entry = EntryPoint.parse(spec)
    lineage_in = dict(window_ref["lineage"])
    event = drift_event_json(drift_event) or lineage_in.get("drift_event", "")
    extra = {
        "training_window_uri": str(path),
        "training_window_sha256": window_ref.get("sha256") or sha256_file(path),
        "entry_point": entry.target if entry.kind == "callable" else f"project:{entry.target}#{entry.entry_point}",
    }
    for key in ("requested_start", "requested_end", "log_rows", "labelled_log_rows",
                "reference_rows", "reference_source", *CHOICE_KEYS):
        if key in lineage_in:
            extra[key] = str(lineage_in[key])
    lineage = Lineage(reason=reason, drift_event=event or None, extra=extra)
    window = pd.read_parquet(path)
    guard = guard if guard is not None else RetrainGuard.from_settings(s)
    result = retrain(entry, window, name=model, tracking_uri=s.resolved_mlflow_tracking_uri,
                     lineage=lineage, guard=guard, params=params, holder=holder,
                     ignore_cooldown=ignore_cooldown)
    out = result.as_dict()
    out["entry_point"] = extra["entry_point"]
    # The training window doubles as the publish's validation dataset, so the parity gate and the
    # drift reference recorded at publish time reflect real recent data, not the input example.
    out["publish_conf"] = {"model": model, "version_or_alias": str(result.version),
                           "then": ["shadow_evaluation"]}
    if window_ref.get("uri"):
        out["publish_conf"]["dataset_uri"] = str(window_ref["uri"])
    return out


def followup_due(model: str, hour_end: Any, *, settings: Settings | None = None,
                 mark: bool = True) -> dict[str, Any] | None:
    """The retrain conf of the champion's follow-up retraining when it is due, else None.

    A retraining after a shift records ``tritonflow.retrain_followup_at`` on its version when its
    window held fewer than ``retrain_followup_factor * retrain_min_post_shift_rows`` post-shift rows.
    Once that version serves (it is the champion) and ``hour_end`` (logical time, the hour the drift
    monitor checked) has reached it, the follow-up is due: the conf names the recorded change point so
    the new window is the rows since it (:func:`~tritonflow.pipelines.retrain_followup.followup_conf`).
    With ``mark`` the champion is tagged ``tritonflow.retrain_followup_started`` first, so each
    version asks for one follow-up only. (``drift_monitor`` decides it from the tags its ``record``
    stage reads anyway; this looks the champion up.)

    Args:
        model: Registered model name.
        hour_end: End of the checked hour (ISO 8601/datetime, UTC).
        settings: Settings (MLflow URI).
        mark: Tag the champion as followed up.

    Returns:
        ``{"model", "reason": "retrain_followup", "change_point", "window_end", "version"}`` or None.
    """
    from model_registry.registry import RegistryClient

    s = _settings(settings)
    registry = RegistryClient(s.resolved_mlflow_tracking_uri)
    champion = registry.champion(model)
    if champion is None:
        return None
    conf = followup_conf(model, champion.version, registry.get_version(model, champion.version).tags, hour_end)
    if conf is not None and mark:
        registry.set_version_tags(champion, {FOLLOWUP_STARTED_TAG: conf["window_end"]})
    return conf


def followup_triggers(checked_summaries: Any, *, settings: Settings | None = None) -> list[dict[str, Any]]:
    """The ``retrain`` triggers of the follow-ups due at the end of the checked hour.

    Args:
        checked_summaries: Check summaries of an hour (``model``, ``window_end``), failures left out.
        settings: Settings (MLflow URI).

    Returns:
        ``[{"trigger_dag_id": "retrain", "conf": {"model", "reason", "change_point", "window_end",
        "ignore_cooldown": True}}]``,
        one per model whose champion's follow-up is due; a model whose registry lookup fails is
        left out (logged): its follow-up is asked again the next hour.
    """
    import logging

    from ground.exceptions import TritonflowError

    out = []
    for summary in checked_summaries or []:
        model, end = summary.get("model"), summary.get("window_end")
        if not model or not end:
            continue
        try:
            conf = followup_due(str(model), end, settings=settings)
        except TritonflowError as exc:
            logging.getLogger(__name__).warning("follow-up retraining of %s not checked: %s", model, exc)
            continue
        if conf is not None:
            out.append(trigger_of(conf))
    return out


__all__ = ["CHOICE_KEYS", "EVIDENCE_REASONS", "FOLLOWUP_AT_TAG", "FOLLOWUP_REASON", "FOLLOWUP_STARTED_TAG",
           "RETRAIN_DIR", "TRAINING_WINDOW_TAG", "entry_point_for", "followup_due", "followup_triggers",
           "reference_rows", "run_training", "training_window"]
