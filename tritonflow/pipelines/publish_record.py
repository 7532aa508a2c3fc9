"""Publish stage 6: the publish record on the MLflow model version and the drift reference.

:func:`record` writes the outcome of a successful publish (``tritonflow.*`` tags, the publish
reports as artifacts), clears an earlier rejection's tags (:data:`REJECTION_TAGS`) and stores the
drift reference built from real data under :func:`reference_root`, with each input's permutation
importance as the drift check's weights; a version published without real data gets no reference
(:data:`NO_REAL_REFERENCE`).

Plain Python (no Airflow import).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

from ground.exceptions import DataError
from ground.settings import Settings, get_settings
from model_registry.registry.client import pinned_mlflow_uris
from tritonflow.pipelines.loop_context import refuse_lasting_rejection
from tritonflow.pipelines.publish_claim import claimed_stage
from tritonflow.pipelines.publish_common import (
    PUBLISH_ARTIFACT_PATH,
    REAL_REFERENCE_PREFIX,
    STAGES,
    open_registry,
    read_npz,
    s3_endpoint,
    version_ref,
)
from tritonflow.pipelines.publish_reuse import SOURCE_FLAVOR_TAG

log = logging.getLogger(__name__)

#: Why a version published without real data gets no drift reference (drift checks then refuse it).
NO_REAL_REFERENCE = ("no drift reference stored: the version was published without real data (no "
                     "dataset_uri), and an input example plus perturbations is not a reference; publish it "
                     "with dataset_uri (its training window) to monitor it")

#: Outcome tags of an earlier rejection; a new publish of the version replaces them. Only a
#: publish-stage rejection gets that far: a sentinel or canary rejection is refused at ``resolve``
#: and again here (:func:`tritonflow.pipelines.loop_context.lasting_rejection`); its tags are
#: cleared only after a person deleted ``tritonflow.status`` (the override).
REJECTION_TAGS = ("tritonflow.rejected_stage", "tritonflow.rejection_reason", "tritonflow.rejected_at")
#: Model-version tag: ``{output: [min, max]}`` of the outputs seen at validation, written by
#: :func:`record`; the health sentinel (:mod:`tritonflow.pipelines.sentinel`) judges served answers
#: against it.
OUTPUT_RANGE_TAG = "tritonflow.output_range"


def output_ranges(outputs: Mapping[str, Any]) -> dict[str, list[float]]:
    """The range of each numeric output over its finite values.

    Args:
        outputs: ``{output name: array}`` (any shape); non-numeric outputs are skipped.

    Returns:
        ``{output: [min, max]}`` of the finite values; an output with none is left out.
    """
    import numpy as np

    ranges: dict[str, list[float]] = {}
    for name, values in outputs.items():
        arr = np.asarray(values)
        if arr.dtype.kind not in "fiub":
            continue
        arr = arr.astype(np.float64)
        arr = arr[np.isfinite(arr)]
        if arr.size:
            ranges[str(name)] = [float(arr.min()), float(arr.max())]
    return ranges


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


@claimed_stage(last=True)
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
        loaded: State from :func:`~tritonflow.pipelines.publish.load_and_smoke`.
        settings: Settings (default: from the environment).

    Returns:
        A small summary: ``model``, ``version``, ``triton_model_name``, ``triton_model_version``,
        ``repository_uri``, ``version_uri``, ``signature_digest``, ``key_id``, ``status``,
        ``already_published``, ``profile``, ``reference_uri``, ``timings_s``, and the MLflow
        run holding the publish artifacts: ``publish_run_id``, ``publish_experiment_id``.

    Raises:
        RegistryError: A field of the record is empty, MLflow refused a tag, or the version was
            rejected by the health sentinel or a canary meanwhile (nothing recorded).
        ServiceUnavailableError: MLflow did not answer.
    """
    import pandas as pd

    from drift_checks.reference import save_reference
    from model_registry.registry import PublishRecord

    t0 = time.perf_counter()
    s = settings or get_settings()
    reg = open_registry(s, loaded.get("tracking_uri"))
    ref = version_ref(reg, loaded)
    refuse_lasting_rejection(ref.tags, ref.uri)  # rejected by the sentinel or a canary since resolve
    reference: dict[str, Any]
    try:
        if not str(loaded.get("reference_source", "")).startswith(REAL_REFERENCE_PREFIX):
            raise DataError(NO_REAL_REFERENCE)
        frame = pd.read_parquet(loaded["reference_frame_path"])
        time_column = loaded.get("reference_time_column") or ""  # the rows' times, no model input
        inputs = frame.drop(columns=[time_column]) if time_column else frame
        with pinned_mlflow_uris(reg.tracking_uri):
            importance, how = _reference_importance(ref.uri, loaded.get("source_flavor", ""), inputs)
        saved = save_reference(reference_root(s), loaded["model"], int(loaded["version"]), frame,
                               endpoint_url=s3_endpoint(s), importance=importance or None,
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
        SOURCE_FLAVOR_TAG: str(loaded.get("source_flavor") or ""),  # a later challenger's profile reuse
    }
    if loaded.get("expected_path") and Path(loaded["expected_path"]).is_file():
        # the health sentinel judges served answers against the range seen at validation
        extra[OUTPUT_RANGE_TAG] = json.dumps(output_ranges(read_npz(loaded["expected_path"])), sort_keys=True)
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
