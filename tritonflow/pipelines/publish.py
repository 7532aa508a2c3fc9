"""The publish pipeline: an MLflow model version becomes a signed, verified, READY Triton version.

Plain Python (no Airflow import). The ``model_publish`` DAG calls one function per task, in order:

====================  =========================================================================
stage                 what it does
====================  =========================================================================
:func:`resolve`       resolves ``<name>@<alias>`` / ``<name>/<version>`` to ONE model version
                      (later stages use the immutable ``models:/<name>/<version>``)
:func:`convert_and_   converts (ZipMap off), checks IR/opset against the target Triton release,
validate`             builds ``config.pbtxt`` with protobuf, runs the pre-push checks (tensor
                      outputs, config vs model, batch 1 and >= 2, finite outputs) and the
                      blocking parity gate against the MLflow pyfunc on the validation sample
:func:`profile`       Model Analyzer with a bounded sweep on the local Triton tools; picks the
                      best config among stable measurements (or keeps the generated config and
                      says why)
:func:`sign_and_push` signs (OpenSSF model-signing) and pushes atomically to the repository
:func:`load_and_      verifies the signature, loads in explicit mode, waits READY, sends the
smoke`                validation sample and compares with the source model's outputs again
:func:`record`        writes the publish record (tags + artifacts) on the MLflow model version
                      and stores the drift reference sample
====================  =========================================================================

Every function takes and returns a small JSON-serialisable dict (the running *state*, well under
the XCom limit); bulky artefacts travel by path under ``<settings.home>/staging/<model>/<version>/``
(``model.onnx``, ``config.pbtxt``, ``parity_report.json``, ``validation_sample.npz``,
``source_outputs.npz``, ``reference_frame.parquet``). Each stage adds its wall time in seconds to
``state["timings_s"][<stage>]``.

Failures: a :class:`~tritonflow.exceptions.DataError` in conversion/validation/parity, profiling or
load/smoke tags the model version ``tritonflow.status = rejected`` with the stage and the reason
(:meth:`model_registry.registry.RegistryClient.record_rejection`) and is re-raised; nothing is
pushed when conversion, validation or parity fails, and nothing stays loaded when the load or the
smoke test fails. Transient failures (a service not answering, a timeout) and failures of our tools
(:class:`~tritonflow.exceptions.ToolingError`: the profiling environment, Model Analyzer, a local
Triton) are re-raised untagged: they are infrastructure errors, never a verdict on the model, and
may be retried. A successful publish removes an earlier rejection's ``rejected_*`` tags.

Re-running a publish is idempotent: the same content is already in the repository (the push is a
no-op), the load is repeated with the same signed config, and the tags are rewritten. A version is
immutable once pushed: when a re-run produces the same model file but a different config (e.g. a
new profiling result), the version already in the repository is kept, verified and loaded, and the
state says ``config_differs: true``.

Example::

    state = resolve("churn@challenger")
    state = convert_and_validate(state, atol=1e-5, rtol=1e-4, max_batch_size=32)
    state = profile(state, enabled=False)
    state = sign_and_push(state)
    state = load_and_smoke(state)
    summary = record(state)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from tritonflow.exceptions import (
    DataError,
    MeasurementUnstableError,
    ParityError,
    ProfilingError,
    RepositoryConflictError,
    ServiceUnavailableError,
    SettingsError,
    SignatureVerificationError,
)
from tritonflow.settings import Settings, get_settings
from tritonflow.settings_defaults import DEFAULT_SIGNING_KEY_PATH, DEFAULT_SIGNING_TRUSTED_KEYS_DIR

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
#: Largest ``max_batch_size`` the pipeline accepts (the DAG param's maximum as well).
MAX_BATCH_SIZE_LIMIT = 4096
#: Default ``max_batch_size`` of a published config.
DEFAULT_MAX_BATCH_SIZE = 32
#: Rows of a user dataset used as the validation sample (the first rows, in file order).
DATASET_SAMPLE_ROWS = 1000
#: Artifact folder (in the version's MLflow publish run) of the profiling results.
PROFILE_ARTIFACT_PATH = "profile"
#: Artifact folder of the publish reports (parity, validation, served config).
PUBLISH_ARTIFACT_PATH = "publish"
#: Stage names (keys of ``state["timings_s"]`` and ``tritonflow.rejected_stage`` values).
STAGES = ("resolve", "convert_and_validate", "profile", "perf_gate", "sign_and_push", "load_and_smoke", "record")
#: Staged JSON of the p99 regression gate (figures and verdict, also an MLflow artifact).
PERF_GATE_FILENAME = "perf_gate.json"
#: Name of the public key written beside a generated signing key (``<prefix>-<unix s>.pub``).
GENERATED_PUBLIC_KEY_PREFIX = "tritonflow-generated"
#: Keys of ``bounds`` accepted by :func:`profile` (SearchSpace fields + constraint + timeout).
PROFILE_BOUND_KEYS = ("max_batch_sizes", "instance_counts", "queue_delays_us", "concurrency",
                      "measurement_ms", "max_auto_adjusts", "p99_latency_ms", "stability_cv",
                      "timeout_s")

_SEL_VERSION = re.compile(r"^[1-9][0-9]*$")
_SEL_ALIAS = re.compile(r"^[A-Za-z_][\w\-]*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


# ---------------------------------------------------------------------------- small helpers
def default_selector(model: str, *, settings: Settings | None = None) -> str:
    """The version or alias published when a run names none: alias ``champion``, else the latest version.

    A freshly registered model has no alias yet, so a fixed default of ``champion`` would fail
    for it; the choice made is logged (it appears in the run's log).

    Args:
        model: Registered model name.
        settings: Settings (default: from the environment); the MLflow tracking URI comes from them.

    Returns:
        ``"champion"`` when the alias is set, else the highest version number as a string.

    Raises:
        RegistryError: The model does not exist or has no version.
        ServiceUnavailableError: MLflow did not answer.
    """
    from model_registry.registry import CHAMPION_ALIAS
    from tritonflow.exceptions import RegistryError

    reg = _registry(settings or get_settings())
    aliases = reg.aliases(model)
    if CHAMPION_ALIAS in aliases:
        log.info("version_or_alias empty: model %r has alias %r (version %s); publishing it", model,
                 CHAMPION_ALIAS, aliases[CHAMPION_ALIAS])
        return CHAMPION_ALIAS
    versions = reg.versions(model)
    if not versions:
        raise RegistryError(f"model {model!r} has no version; register one before publishing")
    latest = max(v.version for v in versions)
    log.info("version_or_alias empty: model %r has no alias %r (aliases: %s); publishing its latest "
             "version %s", model, CHAMPION_ALIAS, sorted(aliases) or "none", latest)
    return str(latest)


def model_reference(model: str, version_or_alias: str | int) -> str:
    """Build the reference :func:`resolve` takes from a model name and a version or alias.

    Args:
        model: Registered model name.
        version_or_alias: ``3`` / ``"3"`` (a version), ``"champion"`` (an alias) or a legacy stage
            (``"Production"``, ``"Staging"``).

    Returns:
        ``"<model>/<version>"``, ``"<model>/<Stage>"`` or ``"<model>@<alias>"``.

    Raises:
        SettingsError: Empty model, or a selector that is neither a positive integer nor an
            alias/stage name (``[A-Za-z_][A-Za-z0-9_-]*``); the message names the value.
    """
    from model_registry.registry import LEGACY_STAGES

    if not isinstance(model, str) or not model.strip():
        raise SettingsError(f"model={model!r} is empty; expected a registered model name")
    sel = str(version_or_alias).strip()
    if _SEL_VERSION.match(sel):
        return f"{model.strip()}/{sel}"
    if sel.capitalize() in LEGACY_STAGES[1:]:
        return f"{model.strip()}/{sel.capitalize()}"
    if _SEL_ALIAS.match(sel):
        return f"{model.strip()}@{sel}"
    raise SettingsError(
        f"version_or_alias={version_or_alias!r} is invalid; expected a version number (e.g. 3), an "
        "alias (e.g. champion, challenger) or a legacy stage (Production, Staging)"
    )


def triton_model_name(registered_name: str) -> str:
    """Triton model name for a registered model: the same name when it is safe, else sanitised.

    Safe names match ``[A-Za-z0-9][A-Za-z0-9_.-]*`` (folder names and S3 key
    segments without escaping); any other character becomes ``_`` and leading ``._-`` are dropped.

    Raises:
        DataError: Nothing usable is left of the name.
    """
    from repository_sync.layout import validate_model_name

    cleaned = _UNSAFE.sub("_", registered_name.strip()).lstrip("._-")
    if not cleaned:
        raise DataError(f"model name {registered_name!r} has no character usable in a Triton model name "
                        "(expected letters, digits, '_', '.', '-')")
    return validate_model_name(cleaned[:128])


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


def _check_tolerance(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise SettingsError(f"{name}={value!r} is invalid; expected a finite number >= 0")
    return v


def _check_max_batch_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, str) and value.isdigit()):
        raise SettingsError(f"max_batch_size={value!r} is invalid; expected an integer 0..{MAX_BATCH_SIZE_LIMIT}")
    v = int(value)
    if not 0 <= v <= MAX_BATCH_SIZE_LIMIT:
        raise SettingsError(f"max_batch_size={value!r} is invalid; expected an integer 0..{MAX_BATCH_SIZE_LIMIT}")
    return v


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


# ---------------------------------------------------------------------------- stage 1: resolve
def resolve(model_ref: str, *, settings: Settings | None = None) -> dict[str, Any]:
    """Resolve a model reference to one READY model version.

    Args:
        model_ref: ``<name>@<alias>``, ``<name>/<version>``, ``<name>/<Stage>`` or the same with
            ``models:/`` (see :func:`model_registry.registry.parse_model_reference`); build it with
            :func:`model_reference`.
        settings: Settings (default: from the environment); the MLflow tracking URI comes from
            ``settings.resolved_mlflow_tracking_uri``.

    Returns:
        ``{"model_ref", "model", "version", "model_uri" ("models:/<name>/<version>"), "run_id",
        "aliases", "triton_model_name", "tracking_uri", "staging_dir", "timings_s"}``.

    Raises:
        RegistryError: Bad reference, unknown model/version/alias, dangling alias, a stage
            held by 0 or several versions, or a version that is not READY.
        ServiceUnavailableError: MLflow did not answer.
    """
    from tritonflow.exceptions import RegistryError

    t0 = time.perf_counter()
    s = settings or get_settings()
    reg = _registry(s)
    ref = reg.resolve(model_ref)
    if ref.status != "READY":
        raise RegistryError(f"{ref.uri} (from {model_ref!r}) has status {ref.status!r}; expected 'READY'")
    name = triton_model_name(ref.name)
    log.info("resolved %r to %s (aliases %s); Triton model %r", model_ref, ref.uri, list(ref.aliases), name)
    return _timed({}, "resolve", t0, model_ref=model_ref, model=ref.name, version=int(ref.version),
                  model_uri=ref.uri, run_id=ref.run_id, aliases=list(ref.aliases),
                  triton_model_name=name, tracking_uri=reg.tracking_uri,
                  staging_dir=str(staging_dir(s, name, ref.version)))


# ---------------------------------------------------------------------------- stage 2: convert + validate
def load_dataset(dataset_uri: str, download_dir: str | os.PathLike[str] | None = None,
                 tracking_uri: str | None = None):
    """Read a validation dataset (CSV or Parquet) from a path, ``file://`` or an MLflow artifact URI.

    Args:
        dataset_uri: Local path, ``file:///...``, or any URI ``mlflow.artifacts.download_artifacts``
            accepts (``runs:/<run>/data.parquet``, ``models:/...``, ``s3://...``).
        download_dir: Where remote files are downloaded (default: a temporary folder).
        tracking_uri: MLflow tracking URI for ``runs:/`` URIs.

    Returns:
        ``pandas.DataFrame``.

    Raises:
        DataError: The file does not exist, cannot be downloaded, has another suffix than
            ``.csv``/``.parquet``/``.pq``, or does not parse; the message names ``dataset_uri``.
    """
    import pandas as pd

    if not isinstance(dataset_uri, str) or not dataset_uri.strip():
        raise DataError(f"dataset_uri={dataset_uri!r} is empty; expected a CSV or Parquet file URI")
    uri = dataset_uri.strip()
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        path = Path(unquote(urlparse(uri).path))
    elif "://" in uri or uri.startswith(("runs:", "models:")):
        import mlflow

        target = str(download_dir) if download_dir else tempfile.mkdtemp(prefix="tritonflow-dataset-")
        try:
            path = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=target,
                                                            tracking_uri=tracking_uri))
        except Exception as exc:  # noqa: BLE001 - MLflow/boto raise many types
            raise DataError(f"dataset_uri={dataset_uri!r} cannot be downloaded: {exc}") from exc
    else:
        path = Path(uri)
    if not path.is_file():
        raise DataError(f"dataset_uri={dataset_uri!r} is not a file; expected a CSV or Parquet file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(path)
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pandas/pyarrow parse errors
        raise DataError(f"dataset_uri={dataset_uri!r} does not parse as {suffix[1:]}: {exc}") from exc
    raise DataError(f"dataset_uri={dataset_uri!r} has suffix {suffix!r}; expected .csv, .parquet or .pq")


def _feature_columns(
    inputs: Sequence[Any], model_io: Any, sample: Mapping[str, Any]
) -> list[tuple[str, str, int | None]]:
    """``(column, input tensor, position or None)`` (:func:`model_registry.gate.feature_columns`)."""
    from model_registry.gate import feature_columns

    return feature_columns(inputs, sample)


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


def _parity_summary(result: Any) -> dict[str, dict[str, float]]:
    from model_registry.gate import parity_summary

    return parity_summary(result)


def convert_and_validate(
    resolved: Mapping[str, Any],
    *,
    atol: float | None = None,
    rtol: float | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    dataset_uri: str | None = None,
    schema: Any = None,
    export_format: str = "onnx",
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Convert the model version, build its config, run every pre-push check and the parity gate.

    The work is :func:`model_registry.gate.validate_model` (also behind ``tritonflow validate``).
    Steps: read the MLflow signature and input example; convert with the flavour's registered
    converter (scikit-learn with ZipMap off and string columns as ``tensor(string)`` inputs,
    XGBoost/LightGBM through onnxmltools, PyTorch to ONNX with a dynamic batch axis or to
    TorchScript, ONNX passthrough); bring IR/opset within the target release
    (``max_onnx_ir_version``, ``max_onnx_opset``, ``max_onnx_ml_opset``; re-exported with
    ``onnx.version_converter`` when needed); build the validation sample (the dataset's
    first :data:`DATASET_SAMPLE_ROWS` rows, else the input example plus seeded perturbations);
    build ``config.pbtxt`` with protobuf (dtypes and dims from the model, instance group from the
    hardware plan, dynamic batching when ``max_batch_size > 0``); run
    :func:`model_registry.validation.validate_for_push` (onnx.checker, IR/opset, tensor outputs,
    config vs model, batch 1 and >= 2, finite outputs); then the blocking parity gate: ONNX Runtime
    against the MLflow pyfunc on the validation sample, per output
    ``|onnx - source| <= atol + rtol * |source|`` and exact label agreement for classifiers
    (``parity_min_label_agreement``), per class for class probabilities; for tree ensembles also
    on probe rows next to float32 split thresholds (:mod:`model_registry.probing`). The
    provenance (library, converter, onnx, onnxruntime versions, IR version, opsets) is written as
    ``tritonflow.provenance.*`` tags and the parity report is logged to MLflow whether the gate
    passes or not.

    Args:
        resolved: State from :func:`resolve`.
        atol: Absolute tolerance (default ``settings.parity_atol``), >= 0.
        rtol: Relative tolerance (default ``settings.parity_rtol``), >= 0.
        max_batch_size: 0..4096; 0 disables batching. A model with a fixed batch axis is served
            with 0 (logged).
        dataset_uri: Optional validation dataset (CSV/Parquet, see :func:`load_dataset`); it is also
            the drift reference recorded by :func:`record`.
        schema: Explicit input schema for a model logged without a signature (see
            :func:`model_registry.conversion.schema_from_signature`).
        export_format: ``"onnx"`` or ``"torchscript"`` (PyTorch models; ``platform:
            "pytorch_libtorch"``, file ``model.pt``).
        settings: Settings (default: from the environment).

    Returns:
        ``resolved`` plus ``model_filename``, ``export_format``, ``provenance``, ``model_path``,
        ``config_path``, ``parity_report_path``,
        ``validation_report_path``, ``sample_path``, ``expected_path``, ``reference_frame_path``,
        ``reference_source``, ``parity`` (per output ``max_abs``/``max_rel``/``label_agreement``),
        ``checks``, ``config_summary``, ``instance_plan``, ``max_batch_size`` (served), ``atol``,
        ``rtol``, ``notes``.

    Raises:
        SettingsError: A tolerance or ``max_batch_size`` out of range (no tag: nothing was tried).
        RegistryError: The model has no signature and no ``schema`` was given (tagged rejected).
        ModelConversionError, ModelValidationError, ModelConfigError, ParityError: Tagged
            ``rejected`` on the version with the reason, then re-raised; nothing is pushed.
    """
    t0 = time.perf_counter()
    s = settings or get_settings()
    a = _check_tolerance("atol", s.parity_atol if atol is None else atol)
    r = _check_tolerance("rtol", s.parity_rtol if rtol is None else rtol)
    mbs = _check_max_batch_size(max_batch_size)
    if export_format not in ("onnx", "torchscript"):
        raise SettingsError(f"export_format={export_format!r} is invalid; expected 'onnx' or 'torchscript'")
    reg = _registry(s, resolved.get("tracking_uri"))
    ref = _version_ref(reg, resolved)
    stage = Path(resolved["staging_dir"])
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    try:
        with _mlflow_uris(reg.tracking_uri):
            updates = _convert_and_validate(resolved, ref, reg, stage, a, r, mbs, dataset_uri, schema, s,
                                            export_format)
    except DataError as exc:
        _reject(reg, ref, exc, "convert_and_validate")
        raise
    return _timed(resolved, "convert_and_validate", t0, **updates)


def _convert_and_validate(resolved, ref, reg, stage: Path, atol: float, rtol: float, mbs: int,
                          dataset_uri, schema, s: Settings, export_format: str = "onnx") -> dict[str, Any]:
    from model_registry.gate import sample_frame, validate_model
    from model_registry.provenance import provenance_tags
    from model_registry.triton_config import config_summary, to_pbtxt

    name = resolved["triton_model_name"]
    model_io = reg.model_io(ref, require_signature=schema is None)
    dataset = None
    if dataset_uri:
        dataset = load_dataset(dataset_uri, stage / "dataset", reg.tracking_uri)
    gate = validate_model(ref.uri, model_io, model_name=name, dataset=dataset, dataset_rows=DATASET_SAMPLE_ROWS,
                          atol=atol, rtol=rtol, max_batch_size=mbs, export_format=export_format,
                          schema=schema, settings=s)
    parity_path = stage / PARITY_REPORT_FILENAME
    parity_doc = gate.parity_doc(ref.uri, atol, rtol, s.parity_min_label_agreement)
    parity_path.write_text(json.dumps(_json_safe(parity_doc), indent=2, sort_keys=True))
    _record_provenance(reg, ref, gate.provenance, parity_path)
    if not gate.passed:
        raise ParityError(gate.failure)

    model_path = stage / gate.model_filename
    model_path.write_bytes(gate.model_bytes)
    text = to_pbtxt(gate.config)
    (stage / CONFIG_FILENAME).write_text(text)
    (stage / GENERATED_CONFIG_FILENAME).write_text(text)
    _write_npz(stage / SAMPLE_FILENAME, gate.sample)
    _write_npz(stage / EXPECTED_FILENAME, gate.expected)
    converted = gate.converted
    if converted.name_mapping:
        (stage / NAME_MAPPING_FILENAME).write_text(converted.name_mapping_json())
    if dataset is not None:
        cols = [c for c, _, _ in _feature_columns(converted.inputs, model_io, gate.sample)]
        reference = dataset[[c for c in cols if c in dataset.columns]]
        reference_source = f"{REAL_REFERENCE_PREFIX}{dataset_uri}"
    else:
        reference = sample_frame(converted.inputs, model_io, gate.sample)
        reference_source = "input example + seeded perturbations (validation sample)"
    reference.to_parquet(stage / REFERENCE_FRAME_FILENAME, index=False)
    (stage / VALIDATION_REPORT_FILENAME).write_text(
        json.dumps(_json_safe(gate.validation_doc(s.target_triton_release)), indent=2, sort_keys=True))
    summary = config_summary(gate.config)
    parity = _parity_summary(gate.parity)
    log.info("model %s v%s converted (%s, %s) and validated (%s); parity %s; threshold probes %s", name,
             ref.version, converted.source_flavor, converted.format, ", ".join(gate.report.checks), parity,
             {k: gate.probes.get(k) for k in ("probed", "rows", "passed", "note") if k in gate.probes})
    plan = gate.plan
    return {
        "model_path": str(model_path), "model_filename": gate.model_filename, "export_format": converted.format,
        "config_path": str(stage / CONFIG_FILENAME),
        "parity_report_path": str(parity_path),
        "validation_report_path": str(stage / VALIDATION_REPORT_FILENAME),
        "sample_path": str(stage / SAMPLE_FILENAME), "expected_path": str(stage / EXPECTED_FILENAME),
        "reference_frame_path": str(stage / REFERENCE_FRAME_FILENAME), "reference_source": reference_source,
        "parity": parity, "validation_rows": len(next(iter(gate.sample.values()))),
        "checks": list(gate.report.checks),
        "batch_sizes_checked": list(gate.report.batch_sizes), "config_summary": _json_safe(summary),
        "instance_plan": {"kind": plan.kind, "count": plan.count, "reason": plan.reason},
        "max_batch_size": int(gate.config.max_batch_size), "atol": atol, "rtol": rtol,
        "source_flavor": converted.source_flavor, "notes": gate.notes[:10],
        "provenance": provenance_tags(gate.provenance),
    }


def _record_provenance(reg: Any, ref: Any, record: Mapping[str, Any], parity_path: Path) -> None:
    """Provenance tags and the parity report on the MLflow version, whether the gate passed or not."""
    from model_registry.provenance import provenance_tags

    reg.set_version_tags(ref, provenance_tags(record))
    reg.log_version_artifact(ref, parity_path, PUBLISH_ARTIFACT_PATH)


# ---------------------------------------------------------------------------- stage 3: profile
def profiling_unavailable_reason(settings: Settings | None = None) -> str:
    """Why Model Analyzer cannot run on this host ('' when it can).

    Needs ``model-analyzer``, ``perf_analyzer`` and ``tritonserver`` in the Triton tools
    environment (``settings.triton_venv``).
    """
    from model_registry.analyzer import analyzer_binary
    from tritonflow.runtime.services import triton_server_binary

    s = settings or get_settings()
    missing = []
    for label, path in (("model-analyzer", analyzer_binary(s)),
                        ("perf_analyzer", s.triton_venv / "bin" / "perf_analyzer")):
        if not Path(path).is_file():
            missing.append(f"{label} not found at {path}")
    try:
        server = triton_server_binary(s)
        if not Path(server).is_file():
            missing.append(f"tritonserver not found at {server}")
    except Exception as exc:  # noqa: BLE001 - the runtime raises when the wheel is missing
        missing.append(f"tritonserver unavailable ({exc})")
    return "; ".join(missing)


def _search_space(bounds: Mapping[str, Any] | None, s: Settings, max_batch_size: int):
    from model_registry.analyzer import SearchSpace, parse_int_list

    b = dict(bounds or {})
    unknown = sorted(set(b) - set(PROFILE_BOUND_KEYS))
    if unknown:
        raise SettingsError(f"profile bounds {unknown} are unknown; expected keys among {list(PROFILE_BOUND_KEYS)}")
    base = SearchSpace.from_settings(s)
    kw: dict[str, Any] = {}
    for key in ("max_batch_sizes", "instance_counts", "queue_delays_us", "concurrency"):
        kw[key] = parse_int_list(b[key], f"bounds.{key}") if key in b else getattr(base, key)
    if max_batch_size > 0:  # the requested max_batch_size is the ceiling of the sweep
        capped = tuple(sorted({v for v in kw["max_batch_sizes"] if 0 < v <= max_batch_size}))
        kw["max_batch_sizes"] = capped or (max_batch_size,)
    kw["measurement_ms"] = int(b.get("measurement_ms", base.measurement_ms))
    kw["max_auto_adjusts"] = int(b.get("max_auto_adjusts", base.max_auto_adjusts))
    return SearchSpace(**kw)


def profile(
    staged: Mapping[str, Any],
    *,
    enabled: bool = True,
    bounds: Mapping[str, Any] | None = None,
    settings: Settings | None = None,
    pass_runner: Any = None,
) -> dict[str, Any]:
    """Profile the staged model with Triton Model Analyzer and adopt the best stable config.

    The sweep is bounded (:class:`model_registry.analyzer.SearchSpace`: max batch sizes capped at
    the requested ``max_batch_size``, instance counts, dynamic-batching delays, concurrencies,
    measurement window); objective throughput under ``p99 <= p99_latency_ms``; CPU-only hosts
    search KIND_CPU only; configs whose throughput CV exceeds the stability threshold or
    that perf_analyzer could not stabilise are dropped: Model Analyzer's ranking (one
    measurement per config) is confirmed by :func:`model_registry.analyzer.confirm_selection`,
    which re-measures the ``analyzer_confirm_top`` best configs in ``analyzer_confirm_passes``
    interleaved perf_analyzer passes on one Triton. The winning config replaces the
    staged ``config.pbtxt`` after the same pre-push checks; the results table, the chosen config
    and the selection report are logged to the version's MLflow publish run.

    When ``enabled`` is false, or Model Analyzer cannot run on this host
    (:func:`profiling_unavailable_reason`), the generated config is kept and
    ``state["profile"]["status"]`` says ``skipped``/``unavailable`` with the reason. When Model
    Analyzer ran but no configuration could be measured stably (a busy host:
    :class:`~tritonflow.exceptions.MeasurementUnstableError`), the generated config is kept too,
    status ``inconclusive``: noise is no verdict on the model and no config is chosen from it.

    Args:
        staged: State from :func:`convert_and_validate`.
        enabled: Run the profiling.
        bounds: Overrides among :data:`PROFILE_BOUND_KEYS` (lists as ``"8,32"`` or sequences;
            ``p99_latency_ms``, ``stability_cv``, ``timeout_s`` as numbers).
        settings: Settings (default: from the environment).
        pass_runner: Confirmation-pass runner ``(configs, concurrency) -> {config: [PerfPass]}``
            (default: real perf_analyzer passes; for library callers and tests).

    Returns:
        ``staged`` plus ``profile`` (``status``, ``reason`` or ``best``/``throughput``/
        ``p99_latency_ms``/``dropped``/``configs_measured``) and the updated ``config_summary``.

    Raises:
        SettingsError: Unknown or invalid bounds.
        ProfilingError: Configs were measured stably and none met the p99 constraint (names the
            model and each reason; tagged rejected).
        ToolingError: Model Analyzer or its Triton failed, or its Python environment is broken
            (an infrastructure error: not tagged, retried).
        TransientError: Model Analyzer ran past its timeout.
    """
    t0 = time.perf_counter()
    s = settings or get_settings()
    name = staged["triton_model_name"]
    if not enabled:
        info = {"status": "skipped", "reason": "profiling disabled (profile=false); the generated config.pbtxt is kept"}
        log.info("model %s: %s", name, info["reason"])
        return _timed(staged, "profile", t0, profile=info)
    missing = profiling_unavailable_reason(s)
    if missing:
        info = {"status": "unavailable",
                "reason": f"Model Analyzer cannot run on this host ({missing}); the generated config.pbtxt is kept"}
        log.warning("model %s: %s", name, info["reason"])
        return _timed(staged, "profile", t0, profile=info)
    search = _search_space(bounds, s, int(staged["max_batch_size"]))
    b = dict(bounds or {})
    s_run = dataclasses.replace(
        s,
        analyzer_p99_latency_ms=float(b.get("p99_latency_ms", s.analyzer_p99_latency_ms)),
        analyzer_stability_cv=float(b.get("stability_cv", s.analyzer_stability_cv)),
    )
    reg = _registry(s, staged.get("tracking_uri"))
    ref = _version_ref(reg, staged)
    try:
        updates = _profile(staged, search, s_run, reg, ref, b.get("timeout_s"), pass_runner)
    except MeasurementUnstableError as exc:  # the host's noise: keep the generated config, no verdict
        reason = f"{exc}; the generated config.pbtxt is kept"[:1000]
        log.warning("model %s: profile inconclusive: %s", name, reason)
        return _timed(staged, "profile", t0, profile=_json_safe(
            {"status": "inconclusive", "reason": reason, "search": dataclasses.asdict(search)}))
    except (ProfilingError, DataError) as exc:  # ToolingError (the environment) is never a verdict
        _reject(reg, ref, exc, "profile")
        raise
    return _timed(staged, "profile", t0, **updates)


def _profile(staged, search, s: Settings, reg, ref, timeout_s, pass_runner=None) -> dict[str, Any]:
    import csv

    from model_registry.analyzer import confirm_selection, profile_model
    from model_registry.triton_config import config_summary, read_config, to_pbtxt
    from model_registry.validation import validate_for_push

    name = staged["triton_model_name"]
    stage = Path(staged["staging_dir"])
    work = stage / "profile"
    if work.exists():
        shutil.rmtree(work)
    repo = work / "repository"
    (repo / name / "1").mkdir(parents=True)
    filename = staged.get("model_filename") or MODEL_FILENAME
    shutil.copyfile(staged["model_path"], repo / name / "1" / filename)
    generated = read_config(stage / GENERATED_CONFIG_FILENAME)
    (repo / name / CONFIG_FILENAME).write_text(to_pbtxt(generated))
    log.info("model %s: Model Analyzer sweep %s (p99 <= %s ms, CV <= %s)", name, search,
             s.analyzer_p99_latency_ms, s.analyzer_stability_cv)
    outcome = profile_model(name, generated, model_repository=repo, work_dir=work / "run", search=search,
                            settings=s, timeout_s=float(timeout_s) if timeout_s is not None else None)
    # Model Analyzer measured each config once: its best ones are confirmed with repeated passes,
    # and unstable ones (CV or perf_analyzer's own verdict) are dropped before adoption.
    outcome = confirm_selection(outcome, work / "run" / "output_model_repository", settings=s,
                                pass_runner=pass_runner)
    chosen = outcome.config
    chosen.name = name
    chosen.default_model_filename = filename
    if not chosen.backend and not chosen.platform:
        chosen.backend = generated.backend
        chosen.platform = generated.platform
    if filename == MODEL_FILENAME:
        validate_for_push(staged["model_path"], chosen, _read_npz(staged["sample_path"]), model_name=name, settings=s)

    results = work / "results.csv"
    fields = [f.name for f in dataclasses.fields(outcome.rows[0])] if outcome.rows else ["config"]
    with open(results, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in outcome.rows:
            writer.writerow(dataclasses.asdict(row))
    chosen_path = work / "chosen_config.pbtxt"
    chosen_path.write_text(to_pbtxt(chosen))
    selection_path = work / "selection.json"
    selection_path.write_text(json.dumps(_json_safe({**outcome.selection.to_dict(),
                                                     "report": outcome.selection.report()}), indent=2))
    (stage / CONFIG_FILENAME).write_text(to_pbtxt(chosen))
    for path in (results, chosen_path, selection_path, outcome.profile_config_path):
        reg.log_version_artifact(ref, path, PROFILE_ARTIFACT_PATH)
    sel = outcome.selection
    log.info("model %s: %s", name, sel.report())
    info = {"status": "profiled", "best": sel.best, "throughput": float(sel.best_row.throughput),
            "p99_latency_ms": float(sel.best_row.p99_latency_ms), "concurrency": int(sel.best_row.concurrency),
            "configs_measured": len({r.config for r in outcome.rows}),
            "dropped": {k: v[:200] for k, v in list(sel.dropped.items())[:10]},
            "p99_constraint_ms": float(sel.p99_latency_ms), "search": dataclasses.asdict(search)}
    return {"profile": _json_safe(info), "config_summary": _json_safe(config_summary(chosen)),
            "max_batch_size": int(chosen.max_batch_size)}


# ---------------------------------------------------------------------------- stage 3b: perf gate
def perf_gate(
    staged: Mapping[str, Any],
    *,
    enabled: bool = True,
    repository_uri: str | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """The p99 latency regression gate: challenger against the serving champion, before the push.

    The champion is the version holding the ``champion`` alias (skipped when there is none, when it
    is this version, or when it is not in the repository). Both are measured on one local Triton
    (:func:`model_registry.perf.perf_regression_gate`) at the champion's chosen concurrency (its
    ``tritonflow.profile`` tag, else the first ``analyzer_concurrency``), in interleaved
    perf_analyzer passes (``perf_gate_passes``, >= 3 each) with the validation sample as input
    data. The challenger is rejected when its median p99 is worse than the champion's by more
    than ``max_p99_regression`` beyond the measured noise band. Figures and verdict go to the
    version as tag ``tritonflow.perf_gate`` and artifact ``publish/perf_gate.json``.

    Args:
        staged: State from :func:`profile` (or :func:`convert_and_validate`).
        enabled: Run the gate (``False``: skipped, recorded as such).
        repository_uri: Repository holding the champion (default ``settings.resolved_repository_uri``).
        settings: Settings (default: from the environment).

    Returns:
        ``staged`` plus ``perf_gate`` (``status``: ``passed``/``skipped``/``unavailable``, figures).

    Raises:
        PerformanceRegressionError: The challenger regresses (tagged rejected, nothing pushed).
        TransientError: perf_analyzer or the local Triton failed (not tagged: not a verdict).
    """
    t0 = time.perf_counter()
    s = settings or get_settings()
    info = _perf_gate(staged, enabled, repository_uri, s)
    return _timed(staged, "perf_gate", t0, perf_gate=_json_safe(info))


def _perf_gate(staged: Mapping[str, Any], enabled: bool, repository_uri: str | None, s: Settings) -> dict[str, Any]:
    from model_registry.perf import perf_regression_gate
    from tritonflow.exceptions import PerformanceRegressionError, RegistryError

    name = staged["triton_model_name"]
    if not enabled:
        return {"status": "skipped", "reason": "perf gate disabled (perf_gate=false)"}
    reg = _registry(s, staged.get("tracking_uri"))
    try:
        champion = reg.resolve(f"{staged['model']}@champion")
    except RegistryError as exc:
        return {"status": "skipped", "reason": f"no champion to compare with ({exc})"[:300]}
    if int(champion.version) == int(staged["version"]):
        return {"status": "skipped", "reason": "this version is the champion"}
    missing = profiling_unavailable_reason(s)
    if missing:
        return {"status": "unavailable", "reason": f"perf_analyzer/Triton cannot run here ({missing})"}
    work = Path(staged["staging_dir"]) / "perf_gate"
    if work.exists():
        shutil.rmtree(work)
    champ_dir = _champion_folder(repository_uri or s.resolved_repository_uri, name, int(champion.version),
                                 work / "champion", s)
    if champ_dir is None:
        return {"status": "skipped", "reason": f"champion version {champion.version} is not in the repository"}
    chal_dir = work / "challenger"
    (chal_dir / "1").mkdir(parents=True)
    filename = staged.get("model_filename") or MODEL_FILENAME
    shutil.copyfile(staged["model_path"], chal_dir / "1" / filename)
    shutil.copyfile(staged["config_path"], chal_dir / CONFIG_FILENAME)
    concurrency = _champion_concurrency(champion, s)
    sample = _read_npz(staged["sample_path"])
    result = perf_regression_gate(champ_dir, chal_dir, concurrency=concurrency, passes=max(3, s.perf_gate_passes),
                                  measurement_ms=s.perf_gate_measurement_ms,
                                  samples={"champion": sample, "challenger": sample}, settings=s)
    info = {"status": "rejected" if result.verdict.rejected else "passed", "champion_version": int(champion.version),
            **result.to_dict()}
    path = Path(staged["staging_dir"]) / PERF_GATE_FILENAME
    path.write_text(json.dumps(_json_safe(info), indent=2, sort_keys=True))
    ref = _version_ref(reg, staged)
    reg.set_version_tags(ref, {"tritonflow.perf_gate": {k: info[k] for k in (
        "status", "champion_version", "champion_p99_ms", "challenger_p99_ms", "regression", "noise_band",
        "max_regression", "limit", "concurrency")}})
    reg.log_version_artifact(ref, path, PUBLISH_ARTIFACT_PATH)
    log.info("model %s v%s perf gate against champion v%s: %s", name, staged["version"], champion.version,
             result.verdict.reason)
    if result.verdict.rejected:
        error = PerformanceRegressionError(f"model {staged['model']!r} version {staged['version']}: p99 latency "
                                           f"regression against champion version {champion.version}: "
                                           f"{result.verdict.reason}")
        _reject(reg, ref, error, "perf_gate")
        raise error
    return {k: v for k, v in info.items() if k != "passes"}


def _champion_folder(repository: str, name: str, version: int, dest: Path, s: Settings) -> Path | None:
    """``dest`` with the champion's ``config.pbtxt`` (its signed intended config) and ``1/<model>``."""
    from repository_sync.layout import INTENDED_CONFIG_FILENAME, plan_version
    from repository_sync.storage import open_repository

    storage = open_repository(repository, endpoint_url=_endpoint(s))
    for filename in ("model.onnx", "model.pt"):
        layout = plan_version(name, version, filename)
        try:
            with storage.local_version(layout) as local:
                if not (local / filename).is_file():
                    continue
                (dest / "1").mkdir(parents=True)
                shutil.copyfile(local / filename, dest / "1" / filename)
                shutil.copyfile(local / INTENDED_CONFIG_FILENAME, dest / CONFIG_FILENAME)
                return dest
        except DataError:
            return None
    return None


def _champion_concurrency(champion: Any, s: Settings) -> int:
    """The champion's profiled concurrency (``tritonflow.profile`` tag), else the first searched one."""
    from model_registry.analyzer import parse_int_list

    try:
        value = int(json.loads(champion.tags.get("tritonflow.profile", "{}")).get("concurrency") or 0)
    except (TypeError, ValueError):
        value = 0
    return value if value > 0 else parse_int_list(s.analyzer_concurrency, "analyzer_concurrency")[0]


# ---------------------------------------------------------------------------- stage 4: sign + push
@dataclasses.dataclass(frozen=True)
class SigningKeys:
    """Where the signing key and the trusted public keys are (never their content).

    Attributes:
        private_key: PEM private key file.
        trusted_dir: Folder of trusted PEM public keys.
        generated: True when this call generated the pair (first use, nothing configured).
    """

    private_key: Path
    trusted_dir: Path
    generated: bool = False


def ensure_signing_keys(settings: Settings | None = None, *, create: bool = True) -> SigningKeys:
    """The signing key pair from settings, generated under ``settings.home`` on first use.

    ``settings.signing_key_path`` / ``signing_trusted_keys_dir`` are used when configured (they
    differ from the defaults). Otherwise the pair lives under ``<settings.home>/keys/``
    (``model_signing.pem`` and ``trusted/``); when no key is there yet and ``create`` is true, an
    ECDSA P-256 pair is generated (under a file lock, so two publishes do not race) and a warning
    names the files and the key id. The key itself is never logged.

    Raises:
        SigningKeyError: A configured key file does not exist (names the setting), or no key exists
            and ``create`` is false.
    """
    from repository_sync.signing import SigningKeyError, generate_key_pair

    s = settings or get_settings()
    configured = Path(s.signing_key_path) != DEFAULT_SIGNING_KEY_PATH
    key = Path(s.signing_key_path) if configured else Path(s.home) / "keys" / "model_signing.pem"
    trusted = (Path(s.signing_trusted_keys_dir) if Path(s.signing_trusted_keys_dir) != DEFAULT_SIGNING_TRUSTED_KEYS_DIR
               else Path(s.home) / "keys" / "trusted")
    if key.is_file():
        return SigningKeys(key, trusted)
    if configured:
        raise SigningKeyError(
            f"TRITONFLOW_SIGNING_KEY_PATH={str(key)!r} does not exist; expected a PEM ECDSA private key "
            "(create one with repository_sync.signing.generate_key_pair)"
        )
    if not create:
        raise SigningKeyError(f"no signing key at {str(key)!r}; expected one generated by a publish")
    key.parent.mkdir(parents=True, exist_ok=True)
    with open(key.parent / ".keygen.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            if key.is_file():
                return SigningKeys(key, trusted)
            public = trusted / f"{GENERATED_PUBLIC_KEY_PREFIX}-{int(time.time())}.pub"
            key_id = generate_key_pair(key, public)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    log.warning("no signing key configured (TRITONFLOW_SIGNING_KEY_PATH): generated an ECDSA P-256 key "
                "pair, private key file %s, trusted public key %s, key id %s", key, public, key_id)
    return SigningKeys(key, trusted, generated=True)


def _endpoint(settings: Settings) -> str | None:
    return settings.s3_endpoint_url or None


def _existing_identical(repository_uri: str, state: Mapping[str, Any], keys: SigningKeys, settings: Settings,
                        conflict: RepositoryConflictError) -> dict[str, Any]:
    """The already-published version when its model file equals the staged one, else raise."""
    from repository_sync.layout import INTENDED_CONFIG_FILENAME, plan_version
    from repository_sync.signing import verify_version
    from repository_sync.storage import open_repository, sha256_file

    storage = open_repository(repository_uri, endpoint_url=_endpoint(settings))
    filename = state.get("model_filename") or MODEL_FILENAME
    layout = plan_version(state["triton_model_name"], int(state["version"]), filename)
    with storage.local_version(layout) as local:
        if sha256_file(local / filename) != sha256_file(Path(state["model_path"])):
            raise conflict
        info = verify_version(local, str(keys.trusted_dir), signature_file=layout.signature_filename)
        intended = (local / INTENDED_CONFIG_FILENAME).read_text()
    from model_registry.triton_config import config_summary, parse_config

    log.warning("model %s version %s is already in %s with the same model file but another config; "
                "versions are immutable, so the published config is kept", layout.model_name,
                layout.version, repository_uri)
    return {"repository_uri": storage.uri, "version_uri": storage.version_uri(layout),
            "signature_digest": info.signature_digest, "key_id": info.key_id,
            "signed_files": list(info.files), "already_published": True, "config_differs": True,
            "serving_config_written": False,
            "published_config_summary": _json_safe(config_summary(parse_config(intended)))}


def sign_and_push(
    staged: Mapping[str, Any],
    *,
    repository_uri: str | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Sign the staged version and push it atomically to the Triton repository.

    Uses :func:`repository_sync.publish.publish_version`: the version folder (``model.onnx`` +
    ``config.pbtxt.intended``) is signed with OpenSSF model-signing, copied to a staging location
    at the destination, verified there with the trusted keys and only then made visible; a
    version is never overwritten and ``<model>/config.pbtxt`` is written only for a model's first
    version (the champion's serving config never changes on publish).

    Args:
        staged: State from :func:`profile` (or :func:`convert_and_validate`).
        repository_uri: Folder or ``s3://http://host:port/bucket/prefix`` (default
            ``settings.resolved_repository_uri``); ``settings.s3_endpoint_url`` overrides the
            boto3 endpoint.
        settings: Settings (default: from the environment); keys from
            :func:`ensure_signing_keys`.

    Returns:
        ``staged`` plus ``repository_uri`` (as Triton is given it), ``version_uri``,
        ``signature_digest``, ``key_id``, ``signed_files``, ``already_published``,
        ``config_differs``, ``serving_config_written``, ``keys_generated``.

    Raises:
        SignatureVerificationError: The copy at the destination does not verify (tagged rejected).
        RepositoryConflictError: The version exists with a different model file.
        SigningKeyError: Configured key missing/unusable.
        ServiceUnavailableError: S3 unreachable.
    """
    from repository_sync.publish import publish_version

    t0 = time.perf_counter()
    s = settings or get_settings()
    repo = repository_uri or s.resolved_repository_uri
    if not repo:
        raise SettingsError("repository_uri='' ; expected a folder or s3:// URL (TRITONFLOW_REPOSITORY_URI)")
    keys = ensure_signing_keys(s)
    try:
        result = publish_version(
            repository=repo, model_name=staged["triton_model_name"], version=int(staged["version"]),
            model_file=staged["model_path"], config=Path(staged["config_path"]).read_text(),
            private_key=keys.private_key, trusted_keys=str(keys.trusted_dir), endpoint_url=_endpoint(s),
        )
        push = {k: v for k, v in result.to_dict().items() if k not in ("model_name", "version", "timings_s", "bytes")}
        push["config_differs"] = False
        push["push_timings_s"] = result.timings_s
    except RepositoryConflictError as exc:
        push = _existing_identical(repo, staged, keys, s, exc)
    except SignatureVerificationError as exc:
        reg = _registry(s, staged.get("tracking_uri"))
        _reject(reg, _version_ref(reg, staged), exc, "sign_and_push")
        raise
    log.info("model %s version %s %s at %s (signature %s, key id %s)", staged["triton_model_name"],
             staged["version"], "already published" if push["already_published"] else "published",
             push["version_uri"], push["signature_digest"][:16], push["key_id"][:16])
    return _timed(staged, "sign_and_push", t0, **push, keys_generated=keys.generated,
                  trusted_keys_dir=str(keys.trusted_dir))


# ---------------------------------------------------------------------------- stage 5: load + smoke
def _is_local(url: str) -> bool:
    host = url.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def load_and_smoke(
    pushed: Mapping[str, Any],
    *,
    triton_url: str | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Verify, load (explicit mode), wait READY, send the validation sample, compare with the source.

    Uses :meth:`repository_sync.triton_client.TritonModelControl.load_and_smoke_test`: the version
    is verified against its signature (a local copy for S3), loaded with its signed
    ``config.pbtxt.intended`` through the repository API keeping other READY versions loaded,
    awaited READY within ``settings.load_timeout_s``, then the first ``validation_sample_rows``
    rows of the validation sample are sent and the outputs compared with the source model's
    outputs (same ``atol``/``rtol`` as the parity gate). For a Triton on this host the free memory
    is checked first (:func:`model_registry.hardware.preflight_memory_check`).

    On any failure other than Triton being unreachable the model is put back as it was (a version
    that was READY from an earlier run but no longer verifies is unloaded too), the version is
    tagged rejected with the reason, and the error is re-raised.

    Args:
        pushed: State from :func:`sign_and_push`.
        triton_url: ``host:port`` of Triton's HTTP endpoint (default ``settings.triton_http_url``).
        settings: Settings (default: from the environment).

    Returns:
        ``pushed`` plus ``load`` (``versions``, ``load_s``, ``signature_digest``, ``key_id``),
        ``smoke`` (rows sent, invalid requests, max abs error per output), ``triton_url`` and
        ``fallback`` (the INT8 replica, :func:`model_registry.fallback.publish_fallback`).

    Raises:
        SignatureVerificationError: Tampered, unsigned or untrusted version (names the file).
        ModelLoadRefusedError: Triton refused the load. ParityError: Served outputs differ from
            the source model's. (These are tagged rejected.)
        ModelLoadError: not READY in time. InsufficientMemoryError: not enough free memory now.
        ServiceUnavailableError: Triton unreachable. (Infrastructure: not tagged, retried.)
    """
    from repository_sync.triton_client import TritonModelControl

    t0 = time.perf_counter()
    s = settings or get_settings()
    url = triton_url or s.triton_http_url
    name, version = pushed["triton_model_name"], int(pushed["version"])
    keys = ensure_signing_keys(s, create=False)
    rows = max(1, int(s.validation_sample_rows))
    feeds = {k: v[:rows] for k, v in _read_npz(pushed["sample_path"]).items()}
    expected = {k: v[:rows] for k, v in _read_npz(pushed["expected_path"]).items()}
    reg = _registry(s, pushed.get("tracking_uri"))
    ctl = None
    try:
        preflight = _preflight(pushed, s) if _is_local(url) else {"skipped": "Triton is not on this host"}
        from repository_sync.coordination import coordination_store

        ctl = TritonModelControl(url, repository=pushed["repository_uri"], trusted_keys=str(keys.trusted_dir),
                                 endpoint_url=_endpoint(s), load_timeout_s=s.load_timeout_s,
                                 coordination=coordination_store(s), holder=f"model_publish/{name}")
        info, smoke = ctl.load_and_smoke_test(name, version, feeds, expected,
                                              atol=float(pushed["atol"]), rtol=float(pushed["rtol"]))
    except ServiceUnavailableError:
        raise
    except Exception as exc:
        if ctl is not None:
            _unload_version_if_ready(ctl, name, version)
        if isinstance(exc, DataError):  # a verdict on the model; tool/service failures are not
            _reject(reg, _version_ref(reg, pushed), exc, "load_and_smoke")
        raise
    finally:
        if ctl is not None:
            ctl.close()
    log.info("model %s version %s READY on %s (versions %s) and served the validation sample (%s)",
             name, version, url, info["versions"], smoke.summary())
    from model_registry.fallback import publish_fallback  # the INT8 <model>__fallback (skipped with a reason)

    return _timed(pushed, "load_and_smoke", t0, triton_url=url, preflight=_json_safe(preflight),
                  load=_json_safe(info), smoke=_json_safe(smoke.summary()),
                  fallback=publish_fallback(pushed, settings=s, triton_url=url))


def _preflight(state: Mapping[str, Any], s: Settings) -> dict[str, int]:
    from model_registry.hardware import preflight_memory_check

    groups = state.get("config_summary", {}).get("instance_groups") or [{"kind": "KIND_CPU", "count": 1}]
    size = Path(state["model_path"]).stat().st_size
    kind = groups[0].get("kind", "KIND_CPU")
    count = sum(int(g.get("count", 1)) for g in groups)
    need = int(size * s.instance_memory_factor * max(count, 1))
    return preflight_memory_check(need, kind=kind, gpus=groups[0].get("gpus") or ())


def _unload_version_if_ready(ctl: Any, name: str, version: int) -> None:
    """Unload ``version`` if it is READY (e.g. loaded by an earlier run), keeping other versions."""
    try:
        if version not in ctl.ready_versions(name):
            return
        ctl.unload_versions(name, [version])  # the desired set minus it, under the model's lease
        log.warning("model %s version %s was READY and failed the checks: unloaded", name, version)
    except Exception as exc:  # noqa: BLE001 - best effort; the original error is raised
        log.error("could not unload model %s version %s: %s", name, version, exc)


# ---------------------------------------------------------------------------- stage 6: record
def reference_root(settings: Settings) -> str:
    """Root of the drift references: ``settings.inference_log_root`` or ``<home>/inference_logs``."""
    return settings.inference_log_root or str(Path(settings.home) / "inference_logs")


def _reference_importance(model_uri: str, flavor: str, frame) -> tuple[dict[str, float], str]:
    """Each input's permutation importance for the version, on its drift reference.

    The source model predicts (scikit-learn classifiers: ``predict_proba``; else the pyfunc);
    see :func:`drift_checks.importance.permutation_importances`. A failure only costs the
    weighting (the drift check falls back to uniform weights), so it is logged, never raised.

    Returns:
        ``({column: importance}, method)``; ``({}, "not computed: <why>")`` on failure.
    """
    from drift_checks.importance import METHOD, permutation_importances

    try:
        import mlflow.pyfunc

        model = mlflow.pyfunc.load_model(model_uri)
        predict = model.predict
        if flavor == "sklearn":
            import mlflow.sklearn

            raw = mlflow.sklearn.load_model(model_uri)
            predict = getattr(raw, "predict_proba", raw.predict)
        return permutation_importances(predict, frame), METHOD
    except Exception as exc:  # noqa: BLE001 - the weighting is a refinement, never a publish failure
        log.warning("model %s: input importance not computed (uniform drift weights): %s", model_uri, exc)
        return {}, f"not computed: {type(exc).__name__}: {exc}"[:300]


def record(loaded: Mapping[str, Any], *, settings: Settings | None = None) -> dict[str, Any]:
    """Record the publish on the MLflow model version and store the drift reference sample.

    Tags (``tritonflow.*``, :meth:`~model_registry.registry.RegistryClient.record_publish`):
    repository URI, Triton model name and version, signature digest and key id, parity errors per
    output, chosen config summary, timings per stage (seconds), ``status = published``; plus
    ``tritonflow.version_uri``, ``tritonflow.smoke``, ``tritonflow.profile``,
    ``tritonflow.reference_uri`` / ``reference_source``, ``tritonflow.drift_importance``. Artifacts
    (the version's publish run, folder ``publish/``): ``config.pbtxt``, ``parity_report.json``,
    ``validation_report.json``. The drift reference (only from real data: the dataset, e.g. the
    training window; a version published from its input example gets none, tagged with the reason
    :data:`NO_REAL_REFERENCE`, and the drift check refuses it) goes to
    :func:`drift_checks.reference.save_reference` under
    :func:`reference_root`, with each input's permutation importance for the version
    (:func:`_reference_importance`: the weights of the drift check's dataset verdict).

    Args:
        loaded: State from :func:`load_and_smoke`.
        settings: Settings (default: from the environment).

    Returns:
        A small summary: ``model``, ``version``, ``triton_model_name``, ``triton_model_version``,
        ``repository_uri``, ``version_uri``, ``signature_digest``, ``key_id``, ``status``,
        ``already_published``, ``profile``, ``reference_uri``, ``timings_s``, and the MLflow
        run holding the publish artifacts: ``publish_run_id``, ``publish_experiment_id``.

    Raises:
        RegistryError: A field of the record is empty, or MLflow refused a tag.
        ServiceUnavailableError: MLflow did not answer.
    """
    import pandas as pd

    from drift_checks.reference import save_reference
    from model_registry.registry import PublishRecord

    t0 = time.perf_counter()
    s = settings or get_settings()
    reg = _registry(s, loaded.get("tracking_uri"))
    ref = _version_ref(reg, loaded)
    reference: dict[str, Any]
    try:
        if not str(loaded.get("reference_source", "")).startswith(REAL_REFERENCE_PREFIX):
            raise DataError(NO_REAL_REFERENCE)
        frame = pd.read_parquet(loaded["reference_frame_path"])
        with _mlflow_uris(reg.tracking_uri):
            importance, how = _reference_importance(ref.uri, loaded.get("source_flavor", ""), frame)
        saved = save_reference(reference_root(s), loaded["model"], int(loaded["version"]), frame,
                               endpoint_url=_endpoint(s), importance=importance or None,
                               importance_method=how)
        reference = {"uri": saved.uri, "rows": len(saved.frame), "source": loaded.get("reference_source", ""),
                     "importance": importance}
    except DataError as exc:  # the version serves; a missing reference only weakens drift checks
        log.warning("model %s version %s: drift reference not stored: %s", ref.name, ref.version, exc)
        reference = {"uri": "", "rows": 0, "source": f"not stored: {exc}", "importance": {}}
    for key in ("config_path", "parity_report_path", "validation_report_path"):
        if loaded.get(key) and Path(loaded[key]).is_file():
            reg.log_version_artifact(ref, loaded[key], PUBLISH_ARTIFACT_PATH)
    timings = dict(loaded.get("timings_s") or {})
    timings["record"] = round(time.perf_counter() - t0, 4)
    timings["total"] = round(sum(v for k, v in timings.items() if k in STAGES), 4)
    record_ = PublishRecord(
        repository_uri=loaded["repository_uri"], triton_model_name=loaded["triton_model_name"],
        triton_model_version=int(loaded["version"]), signature_digest=loaded["signature_digest"],
        signature_key_id=loaded["key_id"], parity_errors=loaded.get("parity") or {},
        config_summary=loaded.get("published_config_summary") or loaded.get("config_summary") or {},
        timings_s=timings,
    )
    written = reg.record_publish(ref, record_)
    cleared = _clear_stale_outcome_tags(reg, ref)
    extra = {
        "tritonflow.version_uri": loaded["version_uri"],
        "tritonflow.smoke": loaded.get("smoke") or {},
        "tritonflow.profile": {k: v for k, v in (loaded.get("profile") or {}).items() if k != "search"},
        "tritonflow.reference_uri": reference["uri"],
        "tritonflow.reference_source": reference["source"][:500],
        "tritonflow.drift_importance": json.dumps(reference["importance"], sort_keys=True)[:4000],
        "tritonflow.already_published": str(bool(loaded.get("already_published"))).lower(),
    }
    if loaded.get("expected_path") and Path(loaded["expected_path"]).is_file():
        from tritonflow.pipelines.sentinel import OUTPUT_RANGE_TAG, output_ranges

        # the health sentinel judges served answers against the range seen at validation
        extra[OUTPUT_RANGE_TAG] = json.dumps(output_ranges(_read_npz(loaded["expected_path"])), sort_keys=True)
    written.update(reg.set_version_tags(ref, extra))
    run_id = reg.publish_run_id(ref)  # holds the artifacts above; the Airflow UI links to it
    summary = {
        "model": loaded["model"], "version": int(loaded["version"]),
        "triton_model_name": loaded["triton_model_name"], "triton_model_version": int(loaded["version"]),
        "repository_uri": loaded["repository_uri"], "version_uri": loaded["version_uri"],
        "signature_digest": loaded["signature_digest"], "key_id": loaded["key_id"], "status": "published",
        "already_published": bool(loaded.get("already_published")),
        "config_differs": bool(loaded.get("config_differs")),
        "profile": (loaded.get("profile") or {}).get("status", "skipped"),
        "reference_uri": reference["uri"], "timings_s": timings, "tags_written": len(written),
        "fallback": (loaded.get("fallback") or {}).get("status", "disabled"),
        "stale_tags_cleared": cleared,
        "publish_run_id": run_id,
        "publish_experiment_id": reg.client.get_run(run_id).info.experiment_id,
    }
    log.info("model %s version %s published and recorded: %s", ref.name, ref.version,
             json.dumps(summary, sort_keys=True))
    return summary


#: ``reference_source`` prefix of a reference built from real data (a dataset: the training window).
REAL_REFERENCE_PREFIX = "dataset "
#: Why a version published without real data gets no drift reference (drift checks then refuse it).
NO_REAL_REFERENCE = ("no drift reference stored: the version was published without real data (no "
                     "dataset_uri), and an input example plus perturbations is not a reference; publish it "
                     "with dataset_uri (its training window) to monitor it")

#: Outcome tags of an earlier rejection; a new publish of the version replaces them.
REJECTION_TAGS = ("tritonflow.rejected_stage", "tritonflow.rejection_reason", "tritonflow.rejected_at")


def _clear_stale_outcome_tags(reg: Any, ref: Any) -> list[str]:
    """Delete the version's earlier ``rejected_*`` tags (this publish's outcome replaces them)."""
    try:
        present = dict(reg.client.get_model_version(ref.name, str(ref.version)).tags or {})
    except Exception as exc:  # noqa: BLE001 - tags are written; report what could not be read
        log.warning("model %s version %s: could not read tags to clear stale rejection tags: %s",
                    ref.name, ref.version, exc)
        return []
    cleared = [k for k in REJECTION_TAGS if k in present]
    for key in cleared:
        reg.client.delete_model_version_tag(ref.name, str(ref.version), key)
    if cleared:
        log.info("model %s version %s: earlier rejection tags %s replaced by this publish", ref.name,
                 ref.version, cleared)
    return cleared


# ---------------------------------------------------------------------------- all stages
def publish(
    model_ref: str,
    *,
    repository_uri: str | None = None,
    triton_url: str | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    profile_enabled: bool = False,
    bounds: Mapping[str, Any] | None = None,
    dataset_uri: str | None = None,
    schema: Any = None,
    export_format: str = "onnx",
    perf_gate_enabled: bool = True,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Run every stage in order (what the DAG does, in one process); returns :func:`record`'s summary.

    Raises:
        Whatever the failing stage raises (see each stage).
    """
    s = settings or get_settings()
    state = resolve(model_ref, settings=s)
    state = convert_and_validate(state, atol=atol, rtol=rtol, max_batch_size=max_batch_size,
                                 dataset_uri=dataset_uri, schema=schema, export_format=export_format, settings=s)
    state = profile(state, enabled=profile_enabled, bounds=bounds, settings=s)
    state = perf_gate(state, enabled=perf_gate_enabled, repository_uri=repository_uri, settings=s)
    state = sign_and_push(state, repository_uri=repository_uri, settings=s)
    state = load_and_smoke(state, triton_url=triton_url, settings=s)
    return record(state, settings=s)
