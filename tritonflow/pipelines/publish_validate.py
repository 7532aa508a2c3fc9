"""Publish stage 2: conversion, pre-push checks, the parity gate and the validation sample.

:func:`convert_and_validate` turns the resolved MLflow model version into the staged
``model.onnx`` (or ``model.pt``) and ``config.pbtxt``, runs the pre-push checks and the blocking
parity gate (the work is :func:`model_registry.gate.validate_model`), and stages what later stages
compare against: the validation sample, the source model's outputs on it and the drift reference
frame (the dataset's rows when a dataset is given, see :func:`load_dataset`). Also holds the checks
of the stage's tolerances and ``max_batch_size``.

Plain Python (no Airflow import).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ground.exceptions import DataError, ParityError, SettingsError
from ground.settings import Settings, get_settings
from model_registry.registry.client import pinned_mlflow_uris
from tritonflow.pipelines.publish_claim import claimed_stage
from tritonflow.pipelines.publish_common import (
    CONFIG_FILENAME,
    DEFAULT_MAX_BATCH_SIZE,
    EXPECTED_FILENAME,
    GENERATED_CONFIG_FILENAME,
    NAME_MAPPING_FILENAME,
    PARITY_REPORT_FILENAME,
    PUBLISH_ARTIFACT_PATH,
    REAL_REFERENCE_PREFIX,
    REFERENCE_FRAME_FILENAME,
    SAMPLE_FILENAME,
    VALIDATION_REPORT_FILENAME,
    PublishState,
    enter_staging,
    json_safe,
    open_registry,
    reject_version,
    timed,
    version_ref,
    write_npz,
)

log = logging.getLogger(__name__)

#: Largest ``max_batch_size`` the pipeline accepts (the DAG param's maximum as well).
MAX_BATCH_SIZE_LIMIT = 4096
#: Rows of a user dataset used as the validation sample (the first rows, in file order).
DATASET_SAMPLE_ROWS = 1000


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


def _parity_summary(result: Any) -> dict[str, dict[str, float]]:
    from model_registry.gate import parity_summary

    return parity_summary(result)


@claimed_stage()
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
) -> PublishState:
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
        resolved: State from :func:`~tritonflow.pipelines.publish.resolve`.
        atol: Absolute tolerance (default ``settings.parity_atol``), >= 0.
        rtol: Relative tolerance (default ``settings.parity_rtol``), >= 0.
        max_batch_size: 0..4096; 0 disables batching. A model with a fixed batch axis is served
            with 0 (logged).
        dataset_uri: Optional validation dataset (CSV/Parquet, see :func:`load_dataset`); it is also
            the drift reference recorded by :func:`~tritonflow.pipelines.publish_record.record`.
        schema: Explicit input schema for a model logged without a signature (see
            :func:`model_registry.conversion.common.schema_from_signature`).
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
    reg = open_registry(s, resolved.get("tracking_uri"))
    ref = version_ref(reg, resolved)
    stage = Path(resolved["staging_dir"])  # this attempt's own folder: a retry starts it afresh
    if stage.exists():
        shutil.rmtree(stage)
    stage = enter_staging(resolved)
    try:
        with pinned_mlflow_uris(reg.tracking_uri):
            updates = _convert_and_validate(resolved, ref, reg, stage, a, r, mbs, dataset_uri, schema, s,
                                            export_format)
    except DataError as exc:
        reject_version(reg, ref, exc, "convert_and_validate")
        raise
    return timed(resolved, "convert_and_validate", t0, **updates)


def _convert_and_validate(resolved, ref, reg, stage: Path, atol: float, rtol: float, mbs: int,
                          dataset_uri, schema, s: Settings, export_format: str = "onnx") -> dict[str, Any]:
    from model_registry.gate import sample_frame, validate_model
    from model_registry.provenance import provenance_tags
    from model_registry.triton_config import config_summary, to_pbtxt

    name = resolved["triton_model_name"]
    model_io = reg.model_io(ref, require_signature=schema is None)
    dataset = None
    if dataset_uri:
        from tritonflow.pipelines import shared_work

        shared_work.fetch(s, dataset_uri)  # retrain's training window may be on another worker
        dataset = load_dataset(dataset_uri, stage / "dataset", reg.tracking_uri)
    gate = validate_model(ref.uri, model_io, model_name=name, dataset=dataset, dataset_rows=DATASET_SAMPLE_ROWS,
                          atol=atol, rtol=rtol, max_batch_size=mbs, export_format=export_format,
                          schema=schema, settings=s)
    parity_path = stage / PARITY_REPORT_FILENAME
    parity_doc = gate.parity_doc(ref.uri, atol, rtol, s.parity_min_label_agreement)
    parity_path.write_text(json.dumps(json_safe(parity_doc), indent=2, sort_keys=True))
    _record_provenance(reg, ref, gate.provenance, parity_path)
    if not gate.passed:
        raise ParityError(gate.failure)

    model_path = stage / gate.model_filename
    model_path.write_bytes(gate.model_bytes)
    text = to_pbtxt(gate.config)
    (stage / CONFIG_FILENAME).write_text(text)
    (stage / GENERATED_CONFIG_FILENAME).write_text(text)
    write_npz(stage / SAMPLE_FILENAME, gate.sample)
    write_npz(stage / EXPECTED_FILENAME, gate.expected)
    converted = gate.converted
    if converted.name_mapping:
        (stage / NAME_MAPPING_FILENAME).write_text(converted.name_mapping_json())
    time_column = ""
    if dataset is not None:
        cols = [c for c, _, _ in _feature_columns(converted.inputs, model_io, gate.sample)]
        kept = [c for c in cols if c in dataset.columns]
        if "timestamp" in dataset.columns and "timestamp" not in kept:
            kept.append("timestamp")  # the rows' times: a seasonally matched reference needs them
            time_column = "timestamp"
        reference = dataset[kept]
        reference_source = f"{REAL_REFERENCE_PREFIX}{dataset_uri}"
    else:
        reference = sample_frame(converted.inputs, model_io, gate.sample)
        reference_source = "input example + seeded perturbations (validation sample)"
    reference.to_parquet(stage / REFERENCE_FRAME_FILENAME, index=False)
    (stage / VALIDATION_REPORT_FILENAME).write_text(
        json.dumps(json_safe(gate.validation_doc(s.target_triton_release)), indent=2, sort_keys=True))
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
        "reference_time_column": time_column,
        "parity": parity, "validation_rows": len(next(iter(gate.sample.values()))),
        "checks": list(gate.report.checks),
        "batch_sizes_checked": list(gate.report.batch_sizes), "config_summary": json_safe(summary),
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
