"""Training entry points: a Python callable ``module:function`` or an MLflow Project.

:class:`EntryPoint` parses the configured form, :func:`run_entry_point` runs it on a training
window and registers the model it produced (logging it first when the callable returned a
:class:`~model_registry.noaa_model.TrainedModel`). A failing entry point registers nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from ground.exceptions import DataError, TrainingError
from model_registry.noaa_model import TrainedModel
from model_registry.registry_client import pinned_mlflow_uris
from model_registry.registry_entities import CHALLENGER_ALIAS, TAG_PREFIX
from model_registry.training_registration import (
    DEFAULT_EXPERIMENT,
    MODEL_ARTIFACT_NAME,
    Lineage,
    RegisteredVersion,
    experiment_id_for,
    lineage_records,
    log_and_register,
    register_with_rollback,
    window_lineage,
)


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
    params, tags = lineage_records(metrics, info, lineage)
    if run_id:
        existing = client.get_run(run_id).data.params
        for key, value in params.items():
            if key not in existing:
                client.log_param(run_id, key, value)
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
    return register_with_rollback(client, name=name, model_uri=model_uri, run_id=run_id,
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
    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    if ep.kind == "callable":
        fn = resolve_callable(ep.target)
        ok = False
        with pinned_mlflow_uris(tracking_uri):
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

    with tempfile.TemporaryDirectory(prefix="tritonflow-window-") as tmp, pinned_mlflow_uris(tracking_uri):
        path = Path(tmp) / "window.parquet"
        window.to_parquet(path, index=False)
        exp_id = experiment_id_for(client, experiment)
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
