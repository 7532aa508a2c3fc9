"""Shared pieces of the publish pipeline: the staging layout, the running state and MLflow access.

What every stage module of the publish pipeline (:mod:`tritonflow.pipelines.publish` and its
``publish_*`` siblings) uses: the names of the files staged under
``<settings.home>/staging/<model>/<version>/`` (:func:`staging_dir`), the stage names
(:data:`STAGES`), the MLflow artifact folders, and small helpers that time a stage into the running
state, open the model registry, point MLflow's fluent API at a tracking URI, tag a version
rejected, refuse one rejected for good (:func:`refuse_lasting_rejection`), make values JSON-safe
and write/read the validation arrays (``.npz`` without pickles).

Plain Python (no Airflow import).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from tritonflow.settings import Settings

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- constants
#: Folder under ``settings.home`` holding one staging folder per model version.
STAGING_DIRNAME = "staging"
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


def staging_dir(settings: Settings, model: str, version: int) -> Path:
    """``<settings.home>/staging/<model>/<version>``: where a publish keeps its artefacts."""
    return Path(settings.home) / STAGING_DIRNAME / model / str(int(version))


def _timed(state: Mapping[str, Any], stage: str, started: float, **updates: Any) -> dict[str, Any]:
    """New state: ``state`` + ``updates`` + the stage's seconds in ``timings_s``."""
    timings = dict(state.get("timings_s") or {})
    timings[stage] = round(time.perf_counter() - started, 4)
    return {**state, **updates, "timings_s": timings}


def _registry(settings: Settings, tracking_uri: str | None = None):
    from model_registry.registry import RegistryClient

    uri = tracking_uri or settings.resolved_mlflow_tracking_uri
    return RegistryClient(tracking_uri=uri, registry_uri=uri)


@contextlib.contextmanager
def _mlflow_uris(tracking_uri: str) -> Iterator[None]:
    """Point MLflow's fluent API (``models:/`` loading) at ``tracking_uri``, then restore.

    The previous values are restored as they were, *unset* included: calling
    ``set_registry_uri(get_registry_uri())`` would pin the resolved default instead.
    """
    import mlflow
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    prev_t, prev_r = tracking_utils._tracking_uri, registry_utils._registry_uri
    env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    try:
        yield
    finally:
        # also resets MLflow's tracer/client caches; MLflow types its private _tracking_uri as None only
        mlflow.set_tracking_uri(prev_t)  # type: ignore[arg-type]  # None unsets it (the original state)
        registry_utils._registry_uri = prev_r
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _version_ref(registry: Any, state: Mapping[str, Any]):
    return registry.get_version(state["model"], int(state["version"]))


def _reject(registry: Any, ref: Any, exc: BaseException, stage: str) -> None:
    """Tag ``ref`` rejected (stage + reason); a tagging failure is logged, never hides ``exc``."""
    reason = f"{type(exc).__name__}: {exc}"
    try:
        registry.record_rejection(ref, reason, stage)
        log.error("model %s version %s rejected at stage %s: %s", ref.name, ref.version, stage, reason)
    except Exception as tag_exc:  # noqa: BLE001 - the original error is what the caller needs
        log.error("could not tag model %s version %s as rejected (%s); original error: %s",
                  ref.name, ref.version, tag_exc, reason)


def refuse_lasting_rejection(tags: Mapping[str, Any] | None, what: str) -> None:
    """Refuse to publish a version rejected by the health sentinel or a canary.

    See :func:`tritonflow.pipelines.loop_context.lasting_rejection` for the rule (a publish-stage
    rejection is replaced by a successful publish; a sentinel or canary rejection is not).

    Raises:
        RejectedVersionError: The version carries a lasting rejection (stage, time and reason named,
            and how a person lifts it).
    """
    from tritonflow.exceptions import RejectedVersionError
    from tritonflow.pipelines.loop_context import OVERRIDE_HINT, lasting_rejection

    why = lasting_rejection(tags)
    if why:
        raise RejectedVersionError(f"{what} was {why}; a publish never lifts a rejection by the health sentinel "
                                   f"or a canary, so it is not published again: {OVERRIDE_HINT}")


def _json_safe(value: Any) -> Any:
    """Turn numpy scalars/arrays (and NaN) into JSON types."""
    import numpy as np

    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _write_npz(path: Path, arrays: Mapping[str, Any]) -> None:
    """Save arrays without pickles: string (object) arrays are stored as unicode arrays."""
    import numpy as np

    def plain(v: Any) -> Any:
        arr = np.asarray(v)
        if arr.dtype == object:
            text = [x.decode() if isinstance(x, bytes) else str(x) for x in arr.reshape(-1)]
            return np.array(text).reshape(arr.shape)
        return arr

    with open(path, "wb") as fh:
        np.savez(fh, **{k: plain(v) for k, v in arrays.items()})


def _read_npz(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Inverse of :func:`_write_npz`: unicode arrays come back as object arrays of ``str``."""
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {k: (data[k].astype(object) if data[k].dtype.kind == "U" else data[k]) for k in data.files}


def _endpoint(settings: Settings) -> str | None:
    return settings.s3_endpoint_url or None
