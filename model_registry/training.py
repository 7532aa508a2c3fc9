"""Retraining: the NOAA training function, MLflow logging/registration, entry points and the guard.

Plain Python (no Airflow). The ``retrain`` DAG calls :func:`retrain` with the model's configured
:class:`EntryPoint`, the training window (inference log joined with labels) and a
:class:`Lineage` naming why it runs; the result is a new registered model version carrying the
alias ``challenger``.

Guarantees:

* **A failed training run leaves the registry unchanged.** The model is logged inside an MLflow
  run first; the model version is registered only after training and logging succeeded, and if
  setting the alias or tags fails, the new version (and a registered model created for it) is
  deleted again. A failing training run is marked ``FAILED`` in MLflow for the record.
* **At most one retraining in flight per model, with a cooldown** (:class:`RetrainGuard`): a
  row per model in the shared coordination database (``repository_sync.coordination``)
  updated with the row locked, so two processes (Airflow workers on one or several hosts) cannot
  both start. A lock older than ``stale_after_s`` counts as abandoned (a
  crashed worker). The cooldown runs from the last *successful* retraining; failures do not start it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pandas as pd

from model_registry.datasets import DAY_COLUMN, FEATURE_COLUMNS, LABEL_COLUMN, TIMESTAMP_COLUMN
from tritonflow.exceptions import (
    ConcurrencyError,
    DataError,
    RegistryError,
    RetrainCooldownError,
    TrainingError,
    WindowError,
)

#: MLflow experiment that retraining runs are logged to.
DEFAULT_EXPERIMENT = "tritonflow-retrain"
#: Name of the logged model inside its run.
MODEL_ARTIFACT_NAME = "model"
#: Prefix of every tag tritonflow writes on runs and model versions.
TAG_PREFIX = "tritonflow."
#: Alias a freshly trained version receives.
CHALLENGER_ALIAS = "challenger"
#: Fewest rows :func:`train_noaa` accepts (enough for a time-ordered validation split).
MIN_TRAINING_ROWS = 100
#: Rows of the window kept as the logged model's input example.
INPUT_EXAMPLE_ROWS = 5


# ----------------------------------------------------------------------------- the NOAA model
@dataclasses.dataclass(frozen=True)
class NoaaTrainingParams:
    """Hyper-parameters of :func:`train_noaa`.

    Attributes:
        C: Inverse L2 regularisation strength of the logistic regression (> 0).
        max_iter: Solver iterations (>= 10).
        validation_fraction: Trailing share of the window (time order) held out to measure the
            reference metrics, in (0, 0.5].
        seed: Random state of the solver.
    """

    C: float = 1.0
    max_iter: int = 1000
    validation_fraction: float = 0.2
    seed: int = 0

    @classmethod
    def from_mapping(cls, params: Mapping[str, Any] | "NoaaTrainingParams" | None) -> "NoaaTrainingParams":
        """Build from a mapping (e.g. DAG params); unknown keys are refused.

        Raises:
            DataError: An unknown key or an out-of-range value (named with the expected range).
        """
        if params is None:
            return cls()
        if isinstance(params, NoaaTrainingParams):
            return params
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise DataError(f"training params {unknown!r} are unknown (expected {sorted(known)})")
        values = {}
        for key, raw in params.items():
            kind: Callable[[Any], Any] = type(known[key].default)  # every field has a default
            try:
                values[key] = kind(raw)
            except (TypeError, ValueError):
                raise DataError(f"training param {key}={raw!r} is not a {kind.__name__}") from None
        out = cls(**values)
        checks = [("C", out.C > 0, "> 0"), ("max_iter", out.max_iter >= 10, ">= 10"),
                  ("validation_fraction", 0 < out.validation_fraction <= 0.5, "in (0, 0.5]")]
        for key, ok, expected in checks:
            if not ok:
                raise DataError(f"training param {key}={getattr(out, key)!r} must be {expected}")
        return out


@dataclasses.dataclass
class TrainedModel:
    """A trained, not yet logged model and what is known about it.

    Attributes:
        model: The fitted estimator (a scikit-learn ``Pipeline`` for NOAA).
        feature_columns: Input columns, in order.
        label_column: Label column it was trained on.
        params: Hyper-parameters (logged as run params).
        metrics: Time-ordered hold-out metrics (``validation_auc`` etc.; logged as run metrics and
            recorded on the version as its reference for the shadow evaluation's degradation check).
        flavor: MLflow flavor to log it with (only ``"sklearn"`` is supported).
    """

    model: Any
    feature_columns: tuple[str, ...]
    label_column: str
    params: dict[str, Any]
    metrics: dict[str, float]
    flavor: str = "sklearn"

    def predict_scores(self, frame: pd.DataFrame) -> np.ndarray:
        """Positive-class probabilities, shape (n,), for the rows of ``frame``."""
        return self.model.predict_proba(frame.loc[:, list(self.feature_columns)])[:, 1]


def _plain(value: Any) -> Any:
    """A numpy / pandas scalar as the Python value (for messages); other values unchanged."""
    item = getattr(value, "item", None)
    return item() if item is not None else value


def _check_training_window(window: pd.DataFrame, features: tuple[str, ...], label: str) -> None:
    if not isinstance(window, pd.DataFrame):
        raise WindowError(f"window is a {type(window).__name__}; expected a pandas DataFrame")
    missing = [c for c in (*features, label) if c not in window.columns]
    if missing:
        raise WindowError(f"training window lacks columns {missing!r}; has {list(window.columns)!r}")
    if len(window) < MIN_TRAINING_ROWS:
        raise WindowError(f"training window has {len(window)} rows; expected >= {MIN_TRAINING_ROWS}")
    for col in (*features, label):
        values = pd.to_numeric(window[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            raise WindowError(
                f"training window column {col!r} row {_plain(window.index[pos])!r} "
                f"= {_plain(window[col].iloc[pos])!r}; expected a finite number"
            )
    labels = set(np.unique(window[label].to_numpy()).tolist())
    if not labels <= {0, 1}:
        raise WindowError(f"label column {label!r} holds {sorted(labels)!r}; expected 0/1")
    if len(labels) < 2:
        raise WindowError(f"label column {label!r} holds only {sorted(labels)!r}; need both classes")


def train_noaa(window: pd.DataFrame, *, params: Mapping[str, Any] | NoaaTrainingParams | None = None
               ) -> TrainedModel:
    """Train the NOAA rain classifier on a window: ``StandardScaler`` + ``LogisticRegression``.

    The trailing ``validation_fraction`` of the window (in row order, i.e. time order) is held
    out to measure the reference metrics (AUC, accuracy, F1 at 0.5); the returned model is then
    refitted on the whole window. Measured on the real series (see the module's tests and the
    report): trained on days 0-8,000 it scores AUC about 0.85 on days 8,000-12,000 and about 0.2
    after the concept drift at day 12,000; retrained on days 12,000-16,000 it scores about 0.83 on
    days 16,000-18,159.

    Args:
        window: Rows with the eight :data:`~model_registry.datasets.FEATURE_COLUMNS` and ``rain``
            (other columns, e.g. ``day``/``timestamp``, are ignored), in time order.
        params: :class:`NoaaTrainingParams` or a mapping of its fields.

    Returns:
        A :class:`TrainedModel` with the fitted pipeline and ``validation_*`` metrics.

    Raises:
        WindowError: Missing columns, fewer than :data:`MIN_TRAINING_ROWS` rows, non-finite values
            or labels that are not both of 0/1 (the message names column, row and value).
        DataError: Invalid params.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from model_registry.shadow import task_metrics

    hp = NoaaTrainingParams.from_mapping(params)
    features = tuple(FEATURE_COLUMNS)
    _check_training_window(window, features, LABEL_COLUMN)
    X = window.loc[:, list(features)].astype(np.float64)
    y = window[LABEL_COLUMN].to_numpy().astype(np.int64)

    def make() -> Pipeline:
        return Pipeline([
            ("scale", StandardScaler()),
            ("classify", LogisticRegression(C=hp.C, max_iter=hp.max_iter, random_state=hp.seed)),
        ])

    cut = int(round(len(X) * (1 - hp.validation_fraction)))
    metrics: dict[str, float] = {}
    if len(np.unique(y[:cut])) == 2 and len(np.unique(y[cut:])) == 2:
        holdout = make().fit(X.iloc[:cut], y[:cut])
        scores = holdout.predict_proba(X.iloc[cut:])[:, 1]
        metrics = {f"validation_{k}": v for k, v in task_metrics(y[cut:], scores).items()}
    model = make().fit(X, y)
    metrics.update({
        "train_rows": float(len(X)),
        "train_positive_rate": float(y.mean()),
        "validation_rows": float(len(X) - cut),
    })
    return TrainedModel(model=model, feature_columns=features, label_column=LABEL_COLUMN,
                        params=dataclasses.asdict(hp), metrics=metrics)


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


@contextlib.contextmanager
def _tracking(tracking_uri: str) -> Iterator[None]:
    """Point the fluent MLflow API at ``tracking_uri`` for the block, then restore it."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)


def _experiment_id(client: Any, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name)
    except MlflowException:  # created concurrently
        return client.get_experiment_by_name(name).experiment_id


def _lineage_records(model_metrics: Mapping[str, float], window_info: Mapping[str, Any],
                     lineage: Lineage) -> tuple[dict[str, str], dict[str, str]]:
    """(run params, tags shared by the run and the version)."""
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


def _register(client: Any, *, name: str, model_uri: str, run_id: str, tags: Mapping[str, str],
              alias: str, description: str) -> RegisteredVersion:
    """Register ``model_uri``; on any failure after creation, delete what was created."""
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
        with _tracking(client.tracking_uri):
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
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    info = window_lineage(window, label_column=model.label_column)
    params, tags = _lineage_records(model.metrics, info, lineage)
    X = window.loc[:, list(model.feature_columns)].astype(np.float64)
    with _tracking(tracking_uri):
        exp_id = _experiment_id(client, experiment)
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
        return _register(client, name=name, model_uri=logged.model_uri, run_id=run_id,
                         tags=version_tags, alias=alias,
                         description=f"Retrained ({lineage.reason}) on {info['window_start']} .. "
                                     f"{info['window_end']}, {info['window_rows']} rows.")


# ----------------------------------------------------------------------------- entry points
@dataclasses.dataclass(frozen=True)
class EntryPoint:
    """A model's training entry point.

    Either a Python callable ``module:function`` (``kind="callable"``) or an MLflow Project
    (``kind="project"``: ``target`` is the project URI, a folder or a Git URL, ``entry_point``
    one of its entry points).

    Callable contract: ``fn(window: pandas.DataFrame, *, params: dict) -> TrainedModel | str |
    mlflow.models.model.ModelInfo``. A :class:`TrainedModel` is logged and registered by
    :func:`log_and_register`; a model URI (or ``ModelInfo``) means the callable logged the model
    itself (the fluent API points at the tracking server during the call) and it is registered.

    Project contract: the entry point accepts a ``window`` parameter (path of a Parquet file
    holding the training window) plus ``parameters``, and logs a model named ``model_name`` in its
    run (``mlflow.projects.run`` with ``env_manager`` as given, ``local`` by default).
    """

    kind: str
    target: str
    entry_point: str = "main"
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    env_manager: str = "local"
    model_name: str = MODEL_ARTIFACT_NAME

    def __post_init__(self) -> None:
        if self.kind not in ("callable", "project"):
            raise DataError(f"entry point kind={self.kind!r}; expected 'callable' or 'project'")
        if self.kind == "callable":
            module, _, func = self.target.partition(":")
            if not module or not func:
                raise DataError(f"entry point target={self.target!r}; expected 'module:function'")
        elif not self.target:
            raise DataError("entry point target='' ; expected an MLflow Project URI")

    @classmethod
    def parse(cls, spec: str | Mapping[str, Any] | "EntryPoint") -> "EntryPoint":
        """Parse a configured entry point.

        Accepted: ``"package.module:function"``; ``"project:<uri>"`` or ``"project:<uri>#<entry>"``;
        a mapping with ``callable`` or ``project_uri`` (+ ``entry_point``, ``parameters``,
        ``env_manager``, ``model_name``); an :class:`EntryPoint`.

        Raises:
            DataError: The spec matches none of these forms.
        """
        if isinstance(spec, EntryPoint):
            return spec
        if isinstance(spec, str):
            if spec.startswith("project:"):
                uri, _, entry = spec[len("project:"):].partition("#")
                return cls(kind="project", target=uri, entry_point=entry or "main")
            return cls(kind="callable", target=spec)
        if isinstance(spec, Mapping):
            extra = {k: spec[k] for k in ("parameters", "env_manager", "model_name") if k in spec}
            if "callable" in spec:
                return cls(kind="callable", target=str(spec["callable"]), **extra)
            if "project_uri" in spec:
                return cls(kind="project", target=str(spec["project_uri"]),
                           entry_point=str(spec.get("entry_point", "main")), **extra)
        raise DataError(
            f"training entry point={spec!r}; expected 'module:function', 'project:<uri>[#entry]' "
            "or a mapping with 'callable' or 'project_uri'"
        )


def resolve_callable(target: str) -> Callable[..., Any]:
    """Import ``module:function`` (dotted attribute paths allowed after the colon).

    Raises:
        DataError: The module cannot be imported, the attribute is missing or not callable.
    """
    module_name, _, attr_path = target.partition(":")
    if not module_name or not attr_path:
        raise DataError(f"entry point={target!r}; expected 'module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise DataError(f"entry point={target!r}: module {module_name!r} cannot be imported "
                        f"({exc})") from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise DataError(f"entry point={target!r}: {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise DataError(f"entry point={target!r} is a {type(obj).__name__}, not callable")
    return obj


def _register_logged(client: Any, *, model_uri: str, run_id: str, window: pd.DataFrame,
                     name: str, lineage: Lineage, alias: str) -> RegisteredVersion:
    """Record lineage on an already-logged model's run, then register it."""
    info = window_lineage(window)
    metrics = {}
    if run_id:
        with contextlib.suppress(Exception):
            metrics = dict(client.get_run(run_id).data.metrics)
    params, tags = _lineage_records(metrics, info, lineage)
    if run_id:
        existing = client.get_run(run_id).data.params
        for key, value in params.items():
            if key not in existing:
                client.log_param(run_id, key, value)
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
    return _register(client, name=name, model_uri=model_uri, run_id=run_id,
                     tags={**tags, TAG_PREFIX + "training_run_id": run_id}, alias=alias,
                     description=f"Retrained ({lineage.reason}) on {info['window_start']} .. "
                                 f"{info['window_end']}, {info['window_rows']} rows.")


def run_entry_point(entry: EntryPoint | str | Mapping[str, Any], window: pd.DataFrame, *,
                    tracking_uri: str, name: str, lineage: Lineage,
                    params: Mapping[str, Any] | None = None, alias: str = CHALLENGER_ALIAS,
                    experiment: str = DEFAULT_EXPERIMENT) -> RegisteredVersion:
    """Run a training entry point on ``window`` and register its model as ``alias``.

    Args:
        entry: The entry point (see :class:`EntryPoint` for both contracts).
        window: Training window (inference log joined with labels).
        tracking_uri: MLflow tracking server URI.
        name: Registered model name.
        lineage: Why it runs.
        params: Training parameters (merged over the entry point's own ``parameters``).
        alias: Alias for the new version.
        experiment: Experiment of the training run.

    Returns:
        The :class:`RegisteredVersion`.

    Raises:
        TrainingError: The entry point raised, failed, or returned no usable model; nothing was
            registered.
        DataError: The entry point cannot be resolved.
        RegistryError: Registration failed; nothing was left registered.
    """
    import mlflow
    from mlflow.models.model import ModelInfo

    ep = EntryPoint.parse(entry)
    merged = {**dict(ep.parameters), **dict(params or {})}
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    if ep.kind == "callable":
        fn = resolve_callable(ep.target)
        ok = False
        with _tracking(tracking_uri):
            try:
                result = fn(window, params=merged)
                ok = True
            except DataError:
                raise
            except Exception as exc:
                raise TrainingError(f"training entry point {ep.target!r} failed: "
                                    f"{type(exc).__name__}: {exc}; nothing was registered") from exc
            finally:
                while mlflow.active_run() is not None:  # a callable that left its run open
                    mlflow.end_run(status="FINISHED" if ok else "FAILED")
        if isinstance(result, TrainedModel):
            return log_and_register(result, window, tracking_uri=tracking_uri, name=name,
                                    lineage=lineage, alias=alias, experiment=experiment)
        if isinstance(result, ModelInfo):
            return _register_logged(client, model_uri=result.model_uri, run_id=result.run_id or "",
                                    window=window, name=name, lineage=lineage, alias=alias)
        if isinstance(result, str) and result:
            run_id = result.split("/")[1] if result.startswith("runs:/") else ""
            return _register_logged(client, model_uri=result, run_id=run_id, window=window,
                                    name=name, lineage=lineage, alias=alias)
        raise TrainingError(f"training entry point {ep.target!r} returned "
                            f"{type(result).__name__}; expected TrainedModel, ModelInfo or a model "
                            "URI; nothing was registered")

    # MLflow Project
    import mlflow.projects

    with tempfile.TemporaryDirectory(prefix="tritonflow-window-") as tmp, _tracking(tracking_uri):
        path = Path(tmp) / "window.parquet"
        window.to_parquet(path, index=False)
        exp_id = _experiment_id(client, experiment)
        try:
            submitted = mlflow.projects.run(
                ep.target, entry_point=ep.entry_point,
                parameters={**{k: str(v) for k, v in merged.items()}, "window": str(path)},
                experiment_id=exp_id, env_manager=ep.env_manager, synchronous=True,
                backend="local",
            )
        except Exception as exc:
            raise TrainingError(f"MLflow Project {ep.target!r} entry point {ep.entry_point!r} "
                                f"failed: {exc}; nothing was registered") from exc
    run_id = submitted.run_id
    models = [m for m in _logged_models(client, run_id, exp_id) if m.name == ep.model_name]
    model_uri = models[0].model_uri if models else f"runs:/{run_id}/{ep.model_name}"
    if not models:
        artifacts = {a.path for a in client.list_artifacts(run_id)}
        if ep.model_name not in artifacts:
            raise TrainingError(f"MLflow Project {ep.target!r} run {run_id} logged no model named "
                                f"{ep.model_name!r}; nothing was registered")
    return _register_logged(client, model_uri=model_uri, run_id=run_id, window=window, name=name,
                            lineage=lineage, alias=alias)


def _logged_models(client: Any, run_id: str, experiment_id: str) -> list[Any]:
    """MLflow 3 logged models whose source run is ``run_id`` (empty on older servers)."""
    with contextlib.suppress(Exception):
        page = client.search_logged_models(experiment_ids=[experiment_id],
                                           filter_string=f"source_run_id = '{run_id}'")
        return list(page)
    return []


# ----------------------------------------------------------------------------- the guard
@dataclasses.dataclass(frozen=True)
class Lease:
    """A held retraining lock: ``model`` by ``holder`` since ``started_at`` (epoch seconds)."""

    model: str
    holder: str
    started_at: float


class RetrainGuard:
    """At most one retraining in flight per model, and a cooldown after a successful one.

    State lives in the shared coordination database (:mod:`repository_sync.coordination`, scope
    ``retrain-guard``, one JSON row per model: ``holder, status, started_at, finished_at,
    last_success_at``), so retrainings are serialised across processes and hosts when that
    database is PostgreSQL. Every check-and-set is one transaction holding the row locked
    (``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR UPDATE`` on PostgreSQL). Times are epoch seconds
    from ``clock`` (``time.time`` by default; injectable for tests).

    Args:
        path: SQLAlchemy URL of the coordination database, or a SQLite file path.
        cooldown_s: Seconds after a successful retraining before the next may start (>= 0).
        stale_after_s: Age in seconds after which a held lock counts as abandoned (> 0).
        clock: Source of the current time.
    """

    SCOPE = "retrain-guard"

    def __init__(self, path: str | Path, *, cooldown_s: float, stale_after_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        from repository_sync.coordination import CoordinationStore

        if cooldown_s < 0:
            raise DataError(f"cooldown_s={cooldown_s!r} must be >= 0 seconds")
        if stale_after_s <= 0:
            raise DataError(f"stale_after_s={stale_after_s!r} must be > 0 seconds")
        text = str(path)
        self.url = text if "://" in text else f"sqlite:///{Path(text).resolve()}"
        self.path = None if "://" in text else Path(text)
        self.cooldown_s = float(cooldown_s)
        self.stale_after_s = float(stale_after_s)
        self._clock = clock
        self.store = CoordinationStore(self.url)

    @classmethod
    def from_settings(cls, settings: Any) -> "RetrainGuard":
        """Guard in the shared coordination database of ``settings`` with the ``retrain_*`` settings."""
        from repository_sync.coordination import database_url

        return cls(database_url(settings), cooldown_s=settings.retrain_cooldown_s,
                   stale_after_s=settings.retrain_stale_after_s)

    def status(self, model: str) -> dict[str, Any] | None:
        """The model's row (``holder``, ``status``, times) or None if it never retrained."""
        return self.store.get_state(self.SCOPE, model)

    def acquire(self, model: str, *, holder: str | None = None,
                ignore_cooldown: bool = False) -> Lease:
        """Take the model's retraining lock.

        Args:
            model: Registered model name.
            holder: Who holds it (e.g. the DAG run id); a random id by default.
            ignore_cooldown: Start even within the cooldown (a manual retraining); never bypasses
                a retraining in flight.

        Raises:
            ConcurrencyError: Another retraining of ``model`` is in flight (not stale).
            RetrainCooldownError: The last successful retraining ended less than ``cooldown_s`` ago.
        """
        holder = holder or uuid.uuid4().hex
        now = self._clock()
        with self.store.locked_state(self.SCOPE, model) as (conn, row):
            row = dict(row or {})
            if row:
                other, status = row.get("holder"), row.get("status")
                started: Any = row.get("started_at")  # unix time; set whenever status is "running"
                last_ok = row.get("last_success_at")
                if status == "running" and now - started < self.stale_after_s:
                    raise ConcurrencyError(
                        f"retraining of model {model!r} is already in flight (holder "
                        f"{other!r}, started {now - started:.0f} s ago); at most one per model"
                    )
                if (not ignore_cooldown and last_ok is not None
                        and now - last_ok < self.cooldown_s):
                    raise RetrainCooldownError(
                        f"model {model!r} was retrained {now - last_ok:.0f} s ago; cooldown is "
                        f"{self.cooldown_s:.0f} s (retrain_cooldown_s)"
                    )
            row.update(holder=holder, status="running", started_at=now)
            row.setdefault("finished_at", None)
            row.setdefault("last_success_at", None)
            self.store.set_state(self.SCOPE, model, row, conn=conn)
        return Lease(model=model, holder=holder, started_at=now)

    def release(self, lease: Lease, *, succeeded: bool) -> None:
        """Release a lease; a success starts the cooldown. A lease taken over (stale) is ignored."""
        now = self._clock()
        with self.store.locked_state(self.SCOPE, lease.model) as (conn, row):
            if not row or row.get("holder") != lease.holder:
                return
            row = dict(row, status="succeeded" if succeeded else "failed", finished_at=now)
            if succeeded:
                row["last_success_at"] = now
            self.store.set_state(self.SCOPE, lease.model, row, conn=conn)

    @contextlib.contextmanager
    def hold(self, model: str, *, holder: str | None = None,
             ignore_cooldown: bool = False) -> Iterator[Lease]:
        """Context manager: :meth:`acquire`, run the block, :meth:`release` (success = no error)."""
        lease = self.acquire(model, holder=holder, ignore_cooldown=ignore_cooldown)
        try:
            yield lease
        except BaseException:
            self.release(lease, succeeded=False)
            raise
        self.release(lease, succeeded=True)


def retrain(entry: EntryPoint | str | Mapping[str, Any], window: pd.DataFrame, *,
            name: str, tracking_uri: str, lineage: Lineage, guard: RetrainGuard,
            params: Mapping[str, Any] | None = None, alias: str = CHALLENGER_ALIAS,
            holder: str | None = None, ignore_cooldown: bool = False,
            experiment: str = DEFAULT_EXPERIMENT) -> RegisteredVersion:
    """Retrain ``name`` under the guard: one in flight per model, cooldown after success.

    Returns:
        The registered challenger version (publish it next).

    Raises:
        ConcurrencyError: Another retraining of the model is in flight.
        RetrainCooldownError: Within the cooldown (and not ``ignore_cooldown``).
        TrainingError: The entry point failed; the registry is unchanged.
        RegistryError: Registration failed; nothing was left registered.
    """
    with guard.hold(name, holder=holder, ignore_cooldown=ignore_cooldown):
        return run_entry_point(entry, window, tracking_uri=tracking_uri, name=name,
                               lineage=lineage, params=params, alias=alias, experiment=experiment)


def lineage_json(result: RegisteredVersion) -> str:
    """Compact JSON of a registered version (for XCom and logs)."""
    return json.dumps(result.as_dict(), sort_keys=True)
