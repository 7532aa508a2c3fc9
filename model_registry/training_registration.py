"""Logging a trained model to MLflow with its lineage, and registering it as a new version.

The model is logged inside an MLflow run first; the version is registered only after training and
logging succeeded, and if setting the alias or tags fails the new version (and a registered model
created for it) is deleted again (:func:`log_and_register`). Lineage (:class:`Lineage`,
:func:`window_lineage`, :func:`data_sha256`) records why a retraining ran and on which rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ground.exceptions import DataError, RegistryError
from model_registry.datasets import DAY_COLUMN, LABEL_COLUMN, TIMESTAMP_COLUMN
from model_registry.noaa_model import TrainedModel
from model_registry.registry_client import pinned_mlflow_uris
from model_registry.registry_entities import CHALLENGER_ALIAS, TAG_PREFIX

#: MLflow experiment that retraining runs are logged to.
DEFAULT_EXPERIMENT = "tritonflow-retrain"
#: Name of the logged model inside its run.
MODEL_ARTIFACT_NAME = "model"
#: Rows of the window kept as the logged model's input example.
INPUT_EXAMPLE_ROWS = 5


# ----------------------------------------------------------------------------- lineage
def data_sha256(frame: pd.DataFrame) -> str:
    """SHA-256 of a window's content, independent of its index and of file formats.

    Hashed, in order: each column's name, dtype and values (numeric and boolean columns as
    little-endian bytes, datetimes as int64 nanoseconds since the epoch in UTC, other columns as
    their ``str`` values joined by the unit separator U+001F).

    Returns:
        64 lowercase hex digits.
    """
    digest = hashlib.sha256()
    digest.update(f"rows={len(frame)}\x1e".encode())
    for col in frame.columns:
        series = frame[col]
        digest.update(f"{col}\x1f{series.dtype}\x1e".encode())
        if pd.api.types.is_datetime64_any_dtype(series):
            ts = series.dt.tz_convert("UTC") if series.dt.tz is not None else series
            data = ts.astype("int64").to_numpy().astype("<i8").tobytes()
        elif pd.api.types.is_bool_dtype(series) or pd.api.types.is_numeric_dtype(series):
            arr = series.to_numpy()
            data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        else:
            data = "\x1f".join(map(str, series.tolist())).encode("utf-8")
        digest.update(data)
        digest.update(b"\x1e")
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class Lineage:
    """Why and on what a retraining ran (recorded on the run and on the new model version).

    Attributes:
        reason: Why it ran: ``drift``, ``champion_degraded``, ``challenger_lost``, ``schedule``
            or ``manual`` (free text is allowed, it is recorded as given).
        drift_event: Identifier or JSON of the drift event (asset event) that caused it, if any.
        extra: More string tags to record (e.g. the triggering DAG run id).
    """

    reason: str
    drift_event: str | None = None
    extra: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise DataError(f"lineage reason={self.reason!r}; expected a non-empty string")


def window_lineage(window: pd.DataFrame, *, label_column: str = LABEL_COLUMN) -> dict[str, Any]:
    """Bounds, row counts and data hash of a training window.

    Bounds come from the ``timestamp`` column (ISO 8601) when present, else from ``day``, else
    from the index. Returns keys ``window_start``, ``window_end`` (inclusive), ``window_rows``,
    ``window_labelled_rows``, ``window_positive_rows`` and ``data_sha256``.
    """
    if TIMESTAMP_COLUMN in window.columns and len(window):
        ts = pd.to_datetime(window[TIMESTAMP_COLUMN], utc=True)
        start, end = ts.min().isoformat(), ts.max().isoformat()
    elif DAY_COLUMN in window.columns and len(window):
        start, end = f"day {int(window[DAY_COLUMN].min())}", f"day {int(window[DAY_COLUMN].max())}"
    else:
        start, end = (str(window.index.min()), str(window.index.max())) if len(window) else ("", "")
    labels = window[label_column] if label_column in window.columns else pd.Series(dtype=float)
    return {
        "window_start": start,
        "window_end": end,
        "window_rows": int(len(window)),
        "window_labelled_rows": int(labels.notna().sum()),
        "window_positive_rows": int((labels == 1).sum()),
        "data_sha256": data_sha256(window),
    }


# ----------------------------------------------------------------------------- MLflow
@dataclasses.dataclass(frozen=True)
class RegisteredVersion:
    """A model version registered by retraining.

    Attributes:
        name: Registered model name.
        version: Model version (string, as MLflow returns it).
        run_id: MLflow run that trained/logged it.
        model_uri: URI of the logged model (``models:/m-...`` or ``runs:/<run>/model``).
        alias: Alias set on the version (``challenger``).
        tags: Tags set on the version.
    """

    name: str
    version: str
    run_id: str
    model_uri: str
    alias: str
    tags: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable copy (small enough for XCom)."""
        return dataclasses.asdict(self)


def sklearn_requirements() -> list[str]:
    """Pinned pip requirements of a logged scikit-learn model (the installed versions).

    Given explicitly so that ``log_model`` does not infer them, which imports the model in a
    subprocess (about a minute on a loaded two-core machine).
    """
    from importlib.metadata import version

    return [f"{pkg}=={version(pkg)}" for pkg in ("mlflow", "scikit-learn", "numpy", "pandas",
                                                 "scipy", "cloudpickle")]


def experiment_id_for(client: Any, name: str) -> str:
    """The id of MLflow experiment ``name``, created when missing (a concurrent creation is fine).

    Args:
        client: An ``mlflow.MlflowClient``.
        name: Experiment name.

    Returns:
        The experiment id.
    """
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name)
    except MlflowException:  # created concurrently
        return client.get_experiment_by_name(name).experiment_id


def lineage_records(model_metrics: Mapping[str, float], window_info: Mapping[str, Any],
                    lineage: Lineage) -> tuple[dict[str, str], dict[str, str]]:
    """The run params and the tags shared by the training run and the model version.

    Args:
        model_metrics: The model's metrics; ``validation_*`` ones become ``reference_*`` tags.
        window_info: The training window's description (dates, rows).
        lineage: Why it was trained (reason, drift event, extra tags).

    Returns:
        ``(params, tags)``, both ``{str: str}``; tags carry the ``tritonflow.`` prefix.
    """
    params = {k: str(v) for k, v in window_info.items()}
    params["retrain_reason"] = lineage.reason
    params["drift_event"] = lineage.drift_event or ""
    tags = {TAG_PREFIX + k: str(v) for k, v in window_info.items()}
    tags[TAG_PREFIX + "reason"] = lineage.reason
    tags[TAG_PREFIX + "drift_event"] = lineage.drift_event or ""
    for key, value in model_metrics.items():
        if key.startswith("validation_"):
            tags[TAG_PREFIX + "reference_" + key[len("validation_"):]] = f"{value:.6g}"
    for key, extra in lineage.extra.items():
        tags[TAG_PREFIX + str(key)] = str(extra)
    return params, tags


def register_with_rollback(client: Any, *, name: str, model_uri: str, run_id: str, tags: Mapping[str, str],
                           alias: str, description: str) -> RegisteredVersion:
    """Register ``model_uri``; on any failure after creation, delete what was created.

    Args:
        client: An ``mlflow.MlflowClient``.
        name: Registered model name (created when missing).
        model_uri: The logged model (``runs:/<run_id>/model``).
        run_id: The training run.
        tags: Version tags.
        alias: Alias set on the new version (``challenger``).
        description: Version description.

    Returns:
        The registered version.

    Raises:
        RegistryError: Registration failed (the version, and a model created here, are deleted).
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    created_model = False
    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(name)
            created_model = True
        except MlflowException:
            pass  # created concurrently
    mv = None
    try:
        with pinned_mlflow_uris(client.tracking_uri):
            mv = mlflow.register_model(model_uri, name, tags=dict(tags))
        client.update_model_version(name, mv.version, description=description)
        client.set_registered_model_alias(name, alias, mv.version)
    except Exception as exc:
        if mv is not None:
            with contextlib.suppress(Exception):
                client.delete_model_version(name, mv.version)
        if created_model:
            with contextlib.suppress(Exception):
                client.delete_registered_model(name)
        raise RegistryError(
            f"registering {model_uri} as {name!r} with alias {alias!r} failed ({exc}); "
            "nothing was left registered"
        ) from exc
    return RegisteredVersion(name=name, version=str(mv.version), run_id=run_id,
                             model_uri=model_uri, alias=alias, tags=dict(tags))


def log_and_register(model: TrainedModel, window: pd.DataFrame, *, tracking_uri: str, name: str,
                     lineage: Lineage, alias: str = CHALLENGER_ALIAS,
                     experiment: str = DEFAULT_EXPERIMENT) -> RegisteredVersion:
    """Log a trained model with its lineage, register a new version and set the alias.

    Steps: one MLflow run in ``experiment`` logs the params, the hold-out metrics, the lineage
    (window bounds, row counts, SHA-256 data hash, reason, drift event) as params and tags, a
    ``lineage.json`` artifact, and the model via ``mlflow.sklearn.log_model`` with a signature
    inferred from the window and an input example of its first rows. Then the model is registered
    as a new version of ``name`` carrying the lineage tags (``tritonflow.*``, including
    ``tritonflow.reference_auc``, the hold-out AUC the shadow evaluation compares the champion
    with), and ``alias`` is set on it.

    Args:
        model: A :class:`TrainedModel` (e.g. from :func:`train_noaa`).
        window: The training window it was trained on.
        tracking_uri: MLflow tracking server URI.
        name: Registered model name.
        lineage: Why it was trained.
        alias: Alias to set on the new version.
        experiment: Experiment of the training run.

    Returns:
        The :class:`RegisteredVersion`.

    Raises:
        DataError: Unsupported flavor.
        RegistryError: Registration/alias failed (the created version was deleted again).
        mlflow.exceptions.MlflowException: Logging failed; the run is marked FAILED and nothing
            is registered.
    """
    import mlflow
    import mlflow.sklearn
    from mlflow.models import infer_signature

    if model.flavor != "sklearn":
        raise DataError(f"model flavor={model.flavor!r} is not supported (expected 'sklearn')")
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"registered model name={name!r}; expected a non-empty string")
    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    info = window_lineage(window, label_column=model.label_column)
    params, tags = lineage_records(model.metrics, info, lineage)
    X = window.loc[:, list(model.feature_columns)].astype(np.float64)
    with pinned_mlflow_uris(tracking_uri):
        exp_id = experiment_id_for(client, experiment)
        with mlflow.start_run(experiment_id=exp_id, run_name=f"retrain-{name}") as run:
            mlflow.log_params({**{f"model_{k}": v for k, v in model.params.items()}, **params})
            mlflow.log_metrics(model.metrics)
            mlflow.set_tags({**tags, TAG_PREFIX + "registered_model": name})
            mlflow.log_dict({**info, "reason": lineage.reason, "drift_event": lineage.drift_event,
                             "extra": dict(lineage.extra)}, "lineage.json")
            signature = infer_signature(X.head(100), model.model.predict(X.head(100)))
            logged = mlflow.sklearn.log_model(
                model.model, name=MODEL_ARTIFACT_NAME, signature=signature,
                input_example=X.head(INPUT_EXAMPLE_ROWS), pip_requirements=sklearn_requirements(),
            )
            run_id = run.info.run_id
        version_tags = {**tags, TAG_PREFIX + "training_run_id": run_id}
        return register_with_rollback(client, name=name, model_uri=logged.model_uri, run_id=run_id,
                         tags=version_tags, alias=alias,
                         description=f"Retrained ({lineage.reason}) on {info['window_start']} .. "
                                     f"{info['window_end']}, {info['window_rows']} rows.")
