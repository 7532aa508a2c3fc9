"""Shadow evaluation: champion vs challenger on replayed traffic, decided and recorded.

Plain Python (no Airflow); the ``shadow_evaluation`` DAG calls the stages in this order and
passes their small, JSON-serialisable returns through XCom (bulky data goes by reference):

1. :func:`resolve_versions` -- the champion (alias ``champion``) and the challenger (alias
   ``challenger`` or a version given), with the Triton name/version each is served under and the
   input columns of its MLflow signature.
2. :func:`ensure_challenger_published` -- a challenger missing from the Triton repository is
   published in-process through :mod:`tritonflow.pipelines.publish`.
3. :func:`tritonflow.pipelines.shadow_replay.replay` -- the logged inputs of a window of the
   inference log are sent to BOTH versions on Triton; both versions' scores are stored as Parquet
   under ``<settings.home>/shadow/<model>/<run>/``. The live mode
   (:func:`tritonflow.pipelines.shadow_live.live`: the gateway mirrors a share of the champion's
   live requests to the challenger) returns the same dict.
4. :func:`tritonflow.pipelines.shadow_compare.compare` -- the labels that arrived and both score
   vectors go to :func:`model_registry.shadow.evaluate`; the decision is recorded on BOTH model
   versions in MLflow. The outcome (``promote_challenger``, ``retrain``, ``nothing``,
   ``inconclusive``) drives the DAG's branch.

This module holds the stages before the replay (the window to replay: :func:`latest_drift_event`,
:func:`evaluation_window`; the versions; the challenger's publication) and the helpers the other
shadow modules share (settings, registry client, inference-log root, timestamps, version info).
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Mapping, NotRequired, TypedDict, cast

from ground.exceptions import DataError, RegistryError, RejectedVersionError, WindowError
from ground.settings import Settings, get_settings
from model_registry.registry.entities import CHALLENGER_ALIAS, CHAMPION_ALIAS
from tritonflow.pipelines.loop_context import CHANGE_POINT_TAG, TRAINING_WINDOW_TAG, lift_hint, rejection
from tritonflow.pipelines.publish_common import s3_endpoint

#: Prefix of the model-version tags a shadow evaluation writes.
SHADOW_TAG_PREFIX = "tritonflow.shadow."
#: Prefix of the reference-metric version tags written at training (``tritonflow.reference_auc``).
REFERENCE_TAG_PREFIX = "tritonflow.reference_"
#: Module of the publish pipeline used for a challenger missing from the repository.
PUBLISH_MODULE = "tritonflow.pipelines.publish"


class VersionInfo(TypedDict):
    """One model version as the shadow stages hand it on (:func:`version_info`; JSON, XCom-safe).

    Attributes:
        version: MLflow model version.
        triton_model_name: The Triton model it is served as (publish record tag, else the name).
        triton_model_version: Its Triton version (publish record tag, else the MLflow version).
        input_columns: The signature's input columns in order (empty for a tensor signature).
        aliases: Its MLflow aliases.
        run_id: The MLflow run that logged it.
        reference_metrics: ``{metric: value}`` recorded at training (``tritonflow.reference_*``).
        change_point: The change point its retraining found after a confirmed shift (ISO 8601,
            tag ``tritonflow.change_point``; empty when none): the shadow decision judges the rows
            since it (:func:`tritonflow.pipelines.shadow_compare.since_change_point`).
    """

    version: int
    triton_model_name: str
    triton_model_version: int
    input_columns: list[str]
    aliases: NotRequired[list[str]]
    run_id: NotRequired[str]
    reference_metrics: NotRequired[dict[str, float]]
    change_point: NotRequired[str]


# ----------------------------------------------------------------------------- helpers
def settings_or_default(settings: Settings | None) -> Settings:
    """``settings``, or the environment's (:func:`~ground.settings.get_settings`) when ``None``."""
    return settings if settings is not None else get_settings()


def open_registry(settings: Settings):
    """A :class:`model_registry.registry.RegistryClient` on ``settings.resolved_mlflow_tracking_uri``."""
    from model_registry.registry import RegistryClient

    return RegistryClient(settings.resolved_mlflow_tracking_uri)


def log_root(settings: Settings) -> str:
    """Inference-log root: ``settings.inference_log_root`` or ``<home>/inference_logs``."""
    return settings.inference_log_root or str(Path(settings.home) / "inference_logs")


def utc(value: Any, field: str):
    """Parse an ISO 8601 string or datetime to a UTC ``pandas.Timestamp`` (naive = UTC).

    Raises:
        WindowError: The value is not a timestamp (names the field and the value).
    """
    import pandas as pd

    try:
        ts = pd.Timestamp(value)
    except (TypeError, ValueError):
        raise WindowError(f"{field}={value!r} is not a timestamp (expected ISO 8601)") from None
    if ts is pd.NaT:
        raise WindowError(f"{field}={value!r} is not a timestamp (expected ISO 8601)")
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def trusted_keys_dir(settings: Settings) -> Path:
    """Folder of trusted public keys, by the publish pipeline's rule.

    ``settings.signing_trusted_keys_dir`` when configured (not the default), else
    ``<settings.home>/keys/trusted``, where a publish generates the pair on first use.
    """
    from ground.settings import DEFAULTS

    configured = Path(settings.signing_trusted_keys_dir)
    return configured if configured != DEFAULTS.signing_trusted_keys_dir else (
        Path(settings.home) / "keys" / "trusted")


def _triton_name(registered: str) -> str:
    try:
        from tritonflow.pipelines.publish import triton_model_name
    except ImportError:
        return registered
    return triton_model_name(registered)


def _reference_metrics(tags: Mapping[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in tags.items():
        if key.startswith(REFERENCE_TAG_PREFIX):
            try:
                f = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(f):
                out[key[len(REFERENCE_TAG_PREFIX):]] = f
    return out


def version_info(registry: Any, ref: Any) -> VersionInfo:
    """What the shadow stages need to know about one model version (JSON-serialisable).

    Args:
        registry: A :class:`model_registry.registry.RegistryClient`.
        ref: The :class:`model_registry.registry.ModelVersionRef`.

    Returns:
        ``{"version", "aliases", "run_id", "triton_model_name", "triton_model_version",
        "input_columns", "reference_metrics", "change_point"}``. The Triton name/version come from
        the publish record tags (``tritonflow.triton_model_name``/``_version``), else the registered
        name and the MLflow version. ``input_columns`` are the signature's column names in order
        (empty for a tensor signature: the log's columns are then matched to input names).
    """
    io = registry.model_io(ref, require_signature=False)
    columns = [n for n in io.input_names if n] if io.input_kind == "columns" else []
    tags = dict(ref.tags)
    return {
        "version": int(ref.version),
        "aliases": list(ref.aliases),
        "run_id": ref.run_id,
        "triton_model_name": tags.get("tritonflow.triton_model_name") or _triton_name(ref.name),
        "triton_model_version": int(tags.get("tritonflow.triton_model_version") or ref.version),
        "input_columns": columns,
        "reference_metrics": _reference_metrics(tags),
        "change_point": tags.get(CHANGE_POINT_TAG, ""),
    }


def as_version_info(model: str, value: Any, settings: Settings, role: str) -> VersionInfo:
    """A version-info dict (:func:`version_info`): the one given, or built from a version or an alias.

    Args:
        model: Registered model name.
        value: A dict from :func:`resolve_versions` (checked for its keys), a version number or an
            alias.
        settings: Settings (the MLflow tracking URI).
        role: ``"champion"`` or ``"challenger"``, named in errors.

    Returns:
        The version-info dict.

    Raises:
        DataError: A dict lacking keys. RegistryError: Unknown version or alias.
    """
    if isinstance(value, Mapping):
        missing = [k for k in ("version", "triton_model_name", "triton_model_version",
                               "input_columns") if k not in value]
        if missing:
            raise DataError(f"{role}={dict(value)!r} lacks keys {missing}; expected the dict "
                            "resolve_versions() returns, a version number or an alias")
        return cast(VersionInfo, dict(value))
    registry = open_registry(settings)
    text = str(value).strip()
    ref = registry.get_version(model, int(text)) if text.isdigit() else registry.resolve_alias(model, text)
    return version_info(registry, ref)


# ----------------------------------------------------------------------------- 0. plan
def latest_drift_event(events: Any, model: str | None = None) -> dict[str, Any] | None:
    """The most recent drift event's ``extra`` among asset events (optionally for one model).

    Args:
        events: Iterable of asset events (objects with ``extra`` and ``timestamp``, as Airflow's
            ``triggering_asset_events`` values hold) or of plain ``extra`` mappings, in order.
        model: Keep only events whose ``extra["model"]`` is this model.

    Returns:
        The chosen ``extra`` (``model``, ``version``, ``features``, ``scores``, ``window_start``,
        ``window_end``...), or None when there is none.
    """
    chosen, chosen_key = None, None
    for i, event in enumerate(events or ()):
        extra = event if isinstance(event, Mapping) else getattr(event, "extra", None)
        if not isinstance(extra, Mapping) or not extra.get("model"):
            continue
        if model and extra.get("model") != model:
            continue
        stamp = getattr(event, "timestamp", None)
        key = (str(extra.get("window_end") or ""), str(stamp or ""), i)
        if chosen_key is None or key >= chosen_key:
            chosen, chosen_key = dict(extra), key
    return chosen


def evaluation_window(*, window_start: Any = None, window_end: Any = None,
                      window_hours: float | str | None = None, drift_event: Any = None,
                      settings: Settings | None = None, now: Any = None) -> dict[str, str]:
    """The replay window ``[start, end)`` of a shadow evaluation.

    Rules: ``end`` = ``window_end``, else the drift event's ``window_end``, else ``now`` (UTC).
    ``start`` = ``window_start``, else ``end - window_hours`` (default ``shadow_window_hours``),
    widened to the drift event's ``window_start`` when that is earlier (the replay always covers
    the drifted window, and enough traffic around it for labels to matter).

    Returns:
        ``{"window_start", "window_end"}`` as ISO 8601 UTC strings.

    Raises:
        WindowError: Unparseable bounds, ``end <= start`` or ``window_hours <= 0``.
    """
    import pandas as pd

    s = settings_or_default(settings)
    event = json.loads(drift_event_json(drift_event) or "{}")
    if not isinstance(event, dict):
        event = {}
    if window_end not in (None, ""):
        end = utc(window_end, "window_end")
    elif event.get("window_end"):
        end = utc(event["window_end"], "drift_event.window_end")
    else:
        end = utc(now if now is not None else dt.datetime.now(dt.timezone.utc), "now")
    hours = float(s.shadow_window_hours if window_hours in (None, "") else window_hours)
    if not hours > 0:
        raise WindowError(f"window_hours={window_hours!r}; expected a positive number of hours")
    if window_start not in (None, ""):
        start = utc(window_start, "window_start")
    else:
        start = end - pd.Timedelta(hours=hours)
        if event.get("window_start"):
            start = min(start, utc(event["window_start"], "drift_event.window_start"))
    if end <= start:
        raise WindowError(f"window_end={end.isoformat()} is not after window_start="
                          f"{start.isoformat()}; expected start < end")
    return {"window_start": start.isoformat(), "window_end": end.isoformat()}


def drift_event_json(event: Any) -> str:
    """A drift event (asset-event extra mapping or JSON string) as compact JSON; ``""`` if none.

    Raises:
        DataError: A string that is not JSON, or a value that cannot be serialised.
    """
    if event in (None, "", {}):
        return ""
    if isinstance(event, str):
        try:
            event = json.loads(event)
        except ValueError:
            raise DataError(f"drift_event={event[:200]!r} is not JSON; expected the drift "
                            "asset event's extra (a JSON object)") from None
    try:
        return json.dumps(event, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError) as exc:
        raise DataError(f"drift_event cannot be serialised ({exc}); expected a JSON object") from None


# ----------------------------------------------------------------------------- 1. resolve
def resolve_versions(model: str, challenger: int | str | None = None, *,
                     settings: Settings | None = None) -> dict[str, Any]:
    """Resolve the champion and the challenger of ``model`` in the MLflow registry.

    Args:
        model: Registered model name.
        challenger: A version number (``5`` or ``"5"``), an alias (``"challenger"``,
            ``"candidate"``), or None/``""`` for the alias ``challenger`` when it is set.
        settings: Settings (default: from the environment).

    Returns:
        ``{"model", "champion": info, "challenger": info | None, "notes": [...]}`` with each info
        as :func:`version_info` returns it. The challenger is None when no alias ``challenger`` is
        set, or when that alias names the champion itself (e.g. right after a promotion; noted).

    Raises:
        RegistryError: The model has no ``champion``, the given version/alias does not exist, or
            a challenger given explicitly is the champion.
        DataError: ``model`` is empty.
    """
    if not isinstance(model, str) or not model.strip():
        raise DataError(f"model={model!r}; expected a registered model name")
    s = settings_or_default(settings)
    registry = open_registry(s)
    champion = registry.champion(model)
    if champion is None:
        raise RegistryError(
            f"model {model!r} has no alias {CHAMPION_ALIAS!r}: a shadow evaluation compares a "
            "challenger with the serving champion (promote a version first)"
        )
    notes: list[str] = []
    given = None if challenger is None else str(challenger).strip()
    chal_ref = None
    if not given:
        if CHALLENGER_ALIAS in registry.aliases(model):
            chal_ref = registry.resolve_alias(model, CHALLENGER_ALIAS)
            if chal_ref.version == champion.version:
                notes.append(f"alias {CHALLENGER_ALIAS!r} names the champion v{champion.version}; "
                             "evaluating the champion alone")
                chal_ref = None
        else:
            notes.append(f"model {model!r} has no alias {CHALLENGER_ALIAS!r}; evaluating the "
                         "champion alone")
    else:
        chal_ref = (registry.get_version(model, int(given)) if given.isdigit()
                    else registry.resolve_alias(model, given))
        if chal_ref.version == champion.version:
            raise RegistryError(
                f"challenger={challenger!r} of model {model!r} is version {chal_ref.version}, "
                "which is the champion; expected a different version"
            )
    rejected = rejection(chal_ref.tags) if chal_ref is not None else ""
    if rejected and given and chal_ref is not None:  # rejected implies a challenger
        raise RejectedVersionError(f"challenger={challenger!r} of model {model!r} is version {chal_ref.version}, "
                                   f"{rejected}; a rejected version is never evaluated, published or promoted "
                                   f"({lift_hint(chal_ref.tags)})")
    if rejected and chal_ref is not None:
        notes.append(f"alias {CHALLENGER_ALIAS!r} names version {chal_ref.version}, {rejected}; "
                     "evaluating the champion alone")
        chal_ref = None
    return {
        "model": model,
        "champion": version_info(registry, champion),
        "challenger": None if chal_ref is None else version_info(registry, chal_ref),
        "notes": notes,
    }


# ----------------------------------------------------------------------------- 2. publish
def in_repository(settings: Settings, triton_name: str, triton_version: int) -> bool:
    """True when ``<name>/<version>/config.pbtxt.intended`` exists in the configured repository."""
    from repository_sync.layout import INTENDED_CONFIG_FILENAME
    from repository_sync.storage.open import open_repository

    storage = open_repository(settings.resolved_repository_uri, endpoint_url=s3_endpoint(settings))
    wanted = f"{triton_name}/{int(triton_version)}/{INTENDED_CONFIG_FILENAME}"
    return wanted in set(storage.list_paths())


def ensure_challenger_published(resolved: Mapping[str, Any], *, settings: Settings | None = None,
                                publish: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Publish the challenger through the publish pipeline unless it is in the repository already.

    The publish pipeline (:func:`tritonflow.pipelines.publish.publish`, all stages in this
    process: convert, parity gate, sign, push, verified load and smoke test, record) leaves the
    challenger READY beside the champion.

    Args:
        resolved: The return value of :func:`resolve_versions`.
        settings: Settings (default: from the environment).
        publish: The publish function (default :func:`tritonflow.pipelines.publish.publish`),
            called as ``publish("<model>/<version>", settings=settings, perf_gate_enabled=...,
            profile_enabled=...)`` (``settings.publish_perf_gate``, ``settings.publish_profile``; plus
            ``dataset_uri=`` for a retrained version).

    Returns:
        ``{"action": "no_challenger" | "already_in_repository" | "published", "model",
        "version", "triton_model_name", "triton_model_version", "publish": <its summary>}``.

    A challenger tagged ``rejected`` (by ``model_publish`` or an earlier shadow run) is refused,
    never published here. A retrained challenger is published with its training window
    (tag ``tritonflow.training_window_uri``) as dataset.

    Raises:
        RejectedVersionError: The challenger was rejected (the stage and reason are named).
        DataError: The challenger is missing from the repository and the publish pipeline cannot
            be imported (the message says to publish it with the ``model_publish`` DAG first), or
            the publish pipeline refused the version (its own error).
    """
    s = settings_or_default(settings)
    model = resolved["model"]
    chal = resolved.get("challenger")
    if not chal:
        return {"action": "no_challenger", "model": model, "version": None}
    name, version = chal["triton_model_name"], int(chal["triton_model_version"])
    base = {"model": model, "version": int(chal["version"]), "triton_model_name": name,
            "triton_model_version": version}
    registry = open_registry(s)
    tags = dict(registry.get_version(model, int(chal["version"])).tags)  # fresh: rejected since resolve?
    rejected = rejection(tags)
    if rejected:
        raise RejectedVersionError(f"challenger {model!r} v{chal['version']} was {rejected}; a version rejected "
                                   f"by one path is never published or promoted by another ({lift_hint(tags)})")
    if in_repository(s, name, version):
        return {"action": "already_in_repository", **base}
    # A retrained version is published with its training window (validation sample and drift
    # reference from real data, as model_publish does); without one it gets no drift reference.
    dataset = tags.get(TRAINING_WINDOW_TAG) or None
    if publish is None:
        try:
            module = importlib.import_module(PUBLISH_MODULE)
        except ImportError as exc:
            raise DataError(
                f"challenger {model!r} v{chal['version']} is not in the repository "
                f"{s.resolved_repository_uri!r} and the publish pipeline ({PUBLISH_MODULE}) cannot "
                f"be imported ({exc}); publish it with the model_publish DAG first"
            ) from exc
        publish = module.publish
    # The deployment's profiling and p99-gate switches (TRITONFLOW_PUBLISH_PROFILE/_PERF_GATE) hold here
    # too, as in model_publish: a model_publish of the same version at the same time is joined, not repeated
    # (tritonflow.pipelines.publish_claim), so whichever asks first publishes the profiled config.
    gate = {"perf_gate_enabled": bool(s.publish_perf_gate), "profile_enabled": bool(s.publish_profile)}
    result = (publish(f"{model}/{int(chal['version'])}", dataset_uri=dataset, settings=s, **gate) if dataset
              else publish(f"{model}/{int(chal['version'])}", settings=s, **gate))
    if not in_repository(s, name, version):
        raise DataError(
            f"the publish pipeline returned for {model!r} v{chal['version']} but "
            f"{name}/{version} is not in the repository {s.resolved_repository_uri!r}"
        )
    return {"action": "published", **base, "publish": _small(result)}


def _small(value: Any) -> Any:
    """A JSON-friendly summary of a publish result (dataclass, mapping or scalar)."""
    import dataclasses

    if hasattr(value, "to_dict"):
        value = value.to_dict()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        text = json.dumps(value, default=str, sort_keys=True)
    except (TypeError, ValueError):
        text = json.dumps(str(value))
    return json.loads(text) if len(text) <= 8000 else {"summary": text[:8000]}


__all__ = [
    "CHALLENGER_ALIAS", "CHAMPION_ALIAS", "SHADOW_TAG_PREFIX", "VersionInfo", "as_version_info", "drift_event_json",
    "ensure_challenger_published", "evaluation_window", "in_repository", "latest_drift_event",
    "log_root", "open_registry", "resolve_versions", "settings_or_default", "trusted_keys_dir", "utc",
    "version_info",
]
