"""Shared pieces of the publish pipeline: the staging layout, the running state and MLflow access.

What every stage module of the publish pipeline (:mod:`tritonflow.pipelines.publish` and its
``publish_*`` siblings) uses: the names of the files staged under
``<settings.home>/staging/<model>/<version>/<attempt>/`` (:func:`staging_dir`: one folder per
publish attempt, so two publishes of one version never share one; :func:`remove_staging` and
:func:`sweep_staging` clean them up), the stage names
(:data:`STAGES`), the MLflow artifact folders, and small helpers that time a stage into the running
state, open the model registry, point MLflow's fluent API at a tracking URI, tag a version
rejected, unload a version that failed its checks (:func:`unload_version_if_ready`), make values JSON-safe
and write/read the validation arrays (``.npz`` without pickles).

Plain Python (no Airflow import).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, TypedDict, cast

from ground.settings import Settings

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- constants
#: Folder under ``settings.home`` holding one staging folder per publish attempt of a model version.
STAGING_DIRNAME = "staging"
#: Marker file in an attempt's staging folder, touched when a stage starts (its age is the attempt's).
STAGING_MARKER = ".attempt"
#: Seconds after which an attempt folder nobody touched is removed by :func:`sweep_staging`: far
#: longer than any publish stage (the longest, profiling, is bounded by its task timeout), so a
#: running attempt is never taken for an abandoned one.
STAGING_MAX_AGE_S = 24 * 3600.0
#: Staged file names.
MODEL_FILENAME = "model.onnx"
CONFIG_FILENAME = "config.pbtxt"
GENERATED_CONFIG_FILENAME = "config.generated.pbtxt"
PARITY_REPORT_FILENAME = "parity_report.json"
VALIDATION_REPORT_FILENAME = "validation_report.json"
SAMPLE_FILENAME = "validation_sample.npz"
EXPECTED_FILENAME = "source_outputs.npz"
REFERENCE_FRAME_FILENAME = "reference_frame.parquet"
NAME_MAPPING_FILENAME = "name_mapping.json"
#: Default ``max_batch_size`` of a published config.
DEFAULT_MAX_BATCH_SIZE = 32
#: Artifact folder (in the version's MLflow publish run) of the profiling results.
PROFILE_ARTIFACT_PATH = "profile"
#: Artifact folder of the publish reports (parity, validation, served config).
PUBLISH_ARTIFACT_PATH = "publish"
#: Stage names (keys of ``state["timings_s"]`` and ``tritonflow.rejected_stage`` values).
STAGES = ("resolve", "convert_and_validate", "profile", "perf_gate", "sign_and_push", "load_and_smoke", "record")
#: Staged JSON of the p99 regression gate (figures and verdict, also an MLflow artifact).
PERF_GATE_FILENAME = "perf_gate.json"
#: ``reference_source`` prefix of a reference built from real data (a dataset: the training window).
REAL_REFERENCE_PREFIX = "dataset "


def new_attempt() -> str:
    """A token unique per publish attempt: ``<UTC yyyymmddThhmmssZ>-<12 hex>`` (sortable by start)."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:12]}"


def staging_dir(settings: Settings, model: str, version: int, attempt: str) -> Path:
    """``<settings.home>/staging/<model>/<version>/<attempt>``: where one publish attempt keeps its artefacts.

    Args:
        settings: Settings (``home``).
        model: Triton model name.
        version: Model version.
        attempt: The attempt's token (:func:`new_attempt`); a publish's tasks find it in their state.

    Raises:
        ValueError: ``attempt`` is empty or not a single path segment.
    """
    if not attempt or attempt in (".", "..") or "/" in attempt or os.sep in attempt:
        raise ValueError(f"attempt={attempt!r} is invalid; expected one folder name (see new_attempt)")
    return Path(settings.home) / STAGING_DIRNAME / model / str(int(version)) / attempt


def enter_staging(state: Mapping[str, Any]) -> Path:
    """The state's staging folder, its marker touched (the attempt is alive); created when missing."""
    stage = Path(state["staging_dir"])
    stage.mkdir(parents=True, exist_ok=True)
    (stage / STAGING_MARKER).touch()
    return stage


def remove_staging(state: Mapping[str, Any]) -> bool:
    """Remove this attempt's staging folder (never another attempt's); True when something was removed.

    Called when a publish ends (:func:`tritonflow.pipelines.publish.publish`, the ``model_publish``
    DAG's ``record`` task). Errors are logged, never raised: the publish's outcome is what matters.
    """
    stage = state.get("staging_dir")
    if not stage or not Path(stage).exists():
        return False
    try:
        shutil.rmtree(stage)
    except OSError as exc:
        log.warning("could not remove the staging folder %s: %s", stage, exc)
        return False
    return True


def _age_s(path: Path, now: float) -> float:
    marker = path / STAGING_MARKER
    try:
        return now - (marker.stat().st_mtime if marker.is_file() else path.stat().st_mtime)
    except OSError:  # removed meanwhile
        return 0.0


def sweep_staging(settings: Settings, *, max_age_s: float = STAGING_MAX_AGE_S, now: float | None = None) -> list[str]:
    """Remove the staging folders of abandoned attempts (failed DAG runs, killed workers).

    An entry of ``<home>/staging/<model>/<version>/`` whose marker (:data:`STAGING_MARKER`, else the
    entry itself) is older than ``max_age_s`` is removed, as are files left there by the layout
    before attempt folders; a concurrent attempt touched its marker when its current stage started,
    so it is never removed. Emptied version and model folders are removed when they are as old.

    Args:
        settings: Settings (``home``).
        max_age_s: Age limit in seconds (default :data:`STAGING_MAX_AGE_S`).
        now: Clock (``time.time()``), for tests.

    Returns:
        The removed paths. Errors are logged, never raised.
    """
    t = time.time() if now is None else now
    root = Path(settings.home) / STAGING_DIRNAME
    removed: list[str] = []
    for model_dir in _subdirs(root):
        model_old = _age_s(model_dir, t) > max_age_s  # judged before its content changes
        for version_dir in _subdirs(model_dir):
            version_old = _age_s(version_dir, t) > max_age_s
            for entry in _entries(version_dir):
                if _age_s(entry, t) <= max_age_s:
                    continue
                try:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                    removed.append(str(entry))
                except OSError as exc:
                    log.warning("could not remove the stale staging entry %s: %s", entry, exc)
            if version_old:
                with contextlib.suppress(OSError):  # not empty (a new attempt started), or gone
                    version_dir.rmdir()
        if model_old:
            with contextlib.suppress(OSError):
                model_dir.rmdir()
    if removed:
        log.info("removed %d abandoned staging entr%s older than %.0f s: %s", len(removed),
                 "y" if len(removed) == 1 else "ies", max_age_s, removed[:10])
    return removed


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _subdirs(folder: Path) -> list[Path]:
    return [p for p in _entries(folder) if p.is_dir() and not p.is_symlink()]


class PublishState(TypedDict, total=False):
    """The state one publish stage hands the next (an XCom value between ``model_publish``'s tasks).

    Each stage returns its input plus the keys it adds (:func:`timed`); every value is plain JSON, so
    the state survives XCom and a task retried on another worker. Keys by the stage that adds them:

    * ``resolve``: ``model_ref``, ``model`` (registered name), ``version``, ``model_uri``
      (``models:/<name>/<version>``), ``run_id``, ``aliases``, ``triton_model_name``,
      ``tracking_uri``, ``staging_attempt`` and ``staging_dir`` (this attempt's own folder);
    * ``convert_and_validate``: the staged files (``model_path``, ``model_filename``, ``config_path``,
      ``sample_path``, ``expected_path``, ``reference_frame_path``, the report paths;
      ``reference_time_column``: the reference frame's column of row times that is no model
      input, ``""`` when none), the gate's
      figures (``parity``, ``checks``, ``batch_sizes_checked``, ``validation_rows``, ``atol``,
      ``rtol``), ``config_summary``, ``instance_plan``, ``max_batch_size``, ``export_format``,
      ``source_flavor``, ``reference_source``, ``notes``, ``provenance``;
    * ``profile``: ``profile`` (status ``profiled``, ``reused``, ``inconclusive``, ``skipped`` with
      its figures and reason) and the chosen ``config_summary`` / ``max_batch_size``;
    * ``perf_gate``: ``perf_gate`` (the p99 gate's verdict and figures);
    * ``sign_and_push``: ``repository_uri``, ``version_uri``, ``signature_digest``, ``key_id``,
      ``signed_files``, ``already_published`` and, for a version already there, ``config_differs``,
      ``serving_config_written``, ``published_config_summary``; ``push_timings_s``,
      ``keys_generated``, ``trusted_keys_dir``;
    * ``load_and_smoke``: ``triton_url``, ``preflight``, ``load``, ``smoke``, ``fallback``;
    * every stage: ``timings_s`` (stage -> wall seconds); the DAG adds ``then`` and ``loop``, and a
      publish that joined another's claim carries ``joined_publish``
      (:data:`tritonflow.pipelines.publish_claim.JOINED_KEY`).
    """

    model_ref: str
    model: str
    version: int
    model_uri: str
    run_id: str
    aliases: list[str]
    triton_model_name: str
    tracking_uri: str
    staging_attempt: str
    staging_dir: str
    timings_s: dict[str, float]
    model_path: str
    model_filename: str
    export_format: str
    config_path: str
    parity_report_path: str
    validation_report_path: str
    sample_path: str
    expected_path: str
    reference_frame_path: str
    reference_source: str
    reference_time_column: str
    parity: dict[str, Any]
    validation_rows: int
    checks: list[str]
    batch_sizes_checked: list[int]
    config_summary: dict[str, Any]
    instance_plan: dict[str, Any]
    max_batch_size: int
    atol: float
    rtol: float
    source_flavor: str
    notes: list[str]
    provenance: dict[str, str]
    profile: dict[str, Any]
    perf_gate: dict[str, Any]
    repository_uri: str
    version_uri: str
    signature_digest: str
    key_id: str
    signed_files: list[str]
    already_published: bool
    config_differs: bool
    serving_config_written: bool
    published_config_summary: dict[str, Any]
    push_timings_s: dict[str, float]
    keys_generated: bool
    trusted_keys_dir: str
    triton_url: str
    preflight: dict[str, Any]
    load: dict[str, Any]
    smoke: dict[str, Any]
    fallback: dict[str, Any]
    then: list[str]
    loop: dict[str, Any] | None
    joined_publish: dict[str, Any]


def timed(state: Mapping[str, Any], stage: str, started: float, **updates: Any) -> PublishState:
    """The state a stage hands on: ``state`` plus ``updates`` plus the stage's wall time.

    Args:
        state: The running publish state (left unchanged).
        stage: Stage name (one of :data:`STAGES`), the key in ``timings_s``.
        started: ``time.perf_counter()`` when the stage started.
        **updates: Keys the stage adds or replaces.

    Returns:
        A new state: ``{**state, **updates, "timings_s": {..., stage: seconds rounded to 0.1 ms}}``.
    """
    timings = dict(state.get("timings_s") or {})
    timings[stage] = round(time.perf_counter() - started, 4)
    return cast(PublishState, {**state, **updates, "timings_s": timings})


def open_registry(settings: Settings, tracking_uri: str | None = None):
    """A :class:`model_registry.registry.RegistryClient` whose tracking server is also the registry.

    Args:
        settings: Settings (``resolved_mlflow_tracking_uri``).
        tracking_uri: MLflow URI that wins over the settings' (a state's ``tracking_uri``).

    Returns:
        The client.
    """
    from model_registry.registry import RegistryClient

    uri = tracking_uri or settings.resolved_mlflow_tracking_uri
    return RegistryClient(tracking_uri=uri, registry_uri=uri)


def version_ref(registry: Any, state: Mapping[str, Any]):
    """The state's model version (``state["model"]``, ``state["version"]``) as a ``ModelVersionRef``.

    Args:
        registry: A :class:`model_registry.registry.RegistryClient`.
        state: A publish state.

    Returns:
        The :class:`model_registry.registry.ModelVersionRef`.

    Raises:
        RegistryError: The version does not exist.
    """
    return registry.get_version(state["model"], int(state["version"]))


def reject_version(registry: Any, ref: Any, exc: BaseException, stage: str) -> None:
    """Tag ``ref`` rejected at ``stage`` with ``exc`` as the reason; never raises.

    A tagging failure is logged, never raised, so it does not hide ``exc`` (which the caller raises).

    Args:
        registry: A :class:`model_registry.registry.RegistryClient`.
        ref: The rejected :class:`model_registry.registry.ModelVersionRef`.
        exc: The error that rejects the version (its type and message become the reason).
        stage: The stage that rejected it (one of :data:`STAGES`).
    """
    reason = f"{type(exc).__name__}: {exc}"
    try:
        registry.record_rejection(ref, reason, stage)
        log.error("model %s version %s rejected at stage %s: %s", ref.name, ref.version, stage, reason)
    except Exception as tag_exc:  # noqa: BLE001 - the original error is what the caller needs
        log.error("could not tag model %s version %s as rejected (%s); original error: %s",
                  ref.name, ref.version, tag_exc, reason)


def unload_version_if_ready(ctl: Any, name: str, version: int) -> None:
    """Unload ``version`` if it is READY (e.g. loaded by an earlier run), keeping other versions.

    Best effort, called when a loaded version failed its checks: a failure is logged, never raised,
    so the caller raises the original error.

    Args:
        ctl: A :class:`repository_sync.triton.client.TritonModelControl` (or a replica set, whose
            ``ready_versions_any`` looks at every replica).
        name: Triton model name.
        version: The version to unload.
    """
    try:
        if version not in getattr(ctl, "ready_versions_any", ctl.ready_versions)(name):  # on any replica
            return
        ctl.unload_versions(name, [version])  # the desired set minus it, under the model's lease
        log.warning("model %s version %s was READY and failed the checks: unloaded", name, version)
    except Exception as exc:  # noqa: BLE001 - best effort; the original error is raised
        log.error("could not unload model %s version %s: %s", name, version, exc)


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into JSON types, and NaN/inf into ``None``.

    Args:
        value: A mapping, list, tuple, array, scalar or plain value (nested).

    Returns:
        The same structure in JSON types (mapping keys as ``str``, tuples as lists).
    """
    import numpy as np

    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_npz(path: Path, arrays: Mapping[str, Any]) -> None:
    """Save arrays as ``.npz`` without pickles: string (object) arrays are stored as unicode arrays.

    Args:
        path: File to write.
        arrays: ``{name: array-like}``; bytes in object arrays are decoded as UTF-8.
    """
    import numpy as np

    def plain(v: Any) -> Any:
        arr = np.asarray(v)
        if arr.dtype == object:
            text = [x.decode() if isinstance(x, bytes) else str(x) for x in arr.reshape(-1)]
            return np.array(text).reshape(arr.shape)
        return arr

    with open(path, "wb") as fh:
        np.savez(fh, **{k: plain(v) for k, v in arrays.items()})


def read_npz(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Inverse of :func:`write_npz`: unicode arrays come back as object arrays of ``str``.

    Args:
        path: An ``.npz`` file written by :func:`write_npz` (pickles refused).

    Returns:
        ``{name: array}``.
    """
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {k: (data[k].astype(object) if data[k].dtype.kind == "U" else data[k]) for k in data.files}


def s3_endpoint(settings: Settings) -> str | None:
    """The S3 endpoint of the repository and the logs (``TRITONFLOW_S3_ENDPOINT_URL``), ``None`` when unset."""
    return settings.s3_endpoint_url or None
