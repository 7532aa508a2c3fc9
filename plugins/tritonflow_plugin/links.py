"""Operator extra links: MLflow model, run, Evidently report, Triton model, Grafana panel, deliveries.

How it works in Airflow 3: the links of a task are computed on the worker and stored in XCom (key
``_link_<class name>``, one per link); the api-server only reads those XComs back
(``GET /api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}/links``) and the UI shows one button
per non-empty URL. A link with nothing recorded stores ``""``, which the API returns as ``null``
and the UI leaves out, so a task never shows a broken button.

Two pieces, both used by the DAG files:

* :func:`task_with_links`: the ``@task`` decorator of tritonflow's tasks that publish, analyse or
  promote. Its operator class declares :data:`TRITONFLOW_LINKS`, so the serialized DAG carries the
  link names and the worker computes them when the task instance finishes (success or failure);
* :func:`record_link_info`: called inside such a task with what the links need::

      record_link_info(model_name="churn", model_version="7", triton_model="churn", triton_version="7",
                       mlflow_run_id=run_id, mlflow_experiment_id=exp_id,
                       evidently_report_path="drift/2025-01-01T10/report.html")

  It merges the values (kept in the task's process, and one small XCom, key
  :data:`LINK_INFO_XCOM_KEY`, for people and tools); the buttons appear when the task instance
  finishes, whether it succeeded or failed.

The base URLs are settings read on the worker: ``TRITONFLOW_MLFLOW_UI_URL`` (else the tracking
URI), ``TRITONFLOW_TRITON_PUBLIC_URL`` (else the Triton URL the task used) and
``TRITONFLOW_GRAFANA_DASHBOARD_URL`` (empty: no Grafana button). The URL builders are pure
functions so they can be tested and reused in notifications.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping
from urllib.parse import quote, urlencode

from airflow.providers.standard.decorators.python import _PythonDecoratedOperator
from airflow.sdk import BaseOperatorLink
from airflow.sdk.bases.decorator import task_decorator_factory

from tritonflow.registry_events import URL_PREFIX

#: XCom key holding ``{model_name, model_version, mlflow_run_id, mlflow_experiment_id,
#: evidently_report_url, evidently_report_path, triton_model, triton_version, triton_http_url}``
#: for the links of one task.
LINK_INFO_XCOM_KEY = "tritonflow_links"
#: Panel of the Grafana dashboard the "Grafana panel" button opens: "Request rate per model
#: version" of the compose stack's dashboard (deploy/grafana/dashboards/triton.json, uid
#: ``tritonflow-triton``), filtered to the model with the dashboard's ``model`` variable.
GRAFANA_MODEL_PANEL_ID = 1


# ---------------------------------------------------------------------------- URL builders
def mlflow_base_url(settings: Any | None = None) -> str:
    """MLflow UI base URL: ``Settings.mlflow_ui_url`` or else the resolved tracking URI."""
    if settings is None:
        from ground.settings import get_settings

        settings = get_settings()
    return (settings.mlflow_ui_url or settings.resolved_mlflow_tracking_uri).rstrip("/")


def mlflow_model_version_url(base_url: str, model_name: str, version: str | int) -> str:
    """URL of a model version page in the MLflow UI (``<base>/#/models/<name>/versions/<v>``)."""
    return f"{base_url.rstrip('/')}/#/models/{quote(str(model_name), safe='')}/versions/{version}"


def mlflow_run_url(base_url: str, run_id: str, experiment_id: str | None = None) -> str:
    """URL of a run page in the MLflow UI.

    Args:
        base_url: MLflow UI base URL.
        run_id: The run's id.
        experiment_id: Its experiment; ``None`` or ``""``: MLflow's direct run route
            (``#/runs/<id>``), which finds the experiment itself.

    Returns:
        ``<base>/#/experiments/<experiment>/runs/<run>`` or ``<base>/#/runs/<run>``.
    """
    base = base_url.rstrip("/")
    if experiment_id in (None, ""):
        return f"{base}/#/runs/{quote(str(run_id))}"
    return f"{base}/#/experiments/{quote(str(experiment_id))}/runs/{quote(str(run_id))}"


def mlflow_run_artifact_url(base_url: str, experiment_id: str, run_id: str, path: str) -> str:
    """URL of a run artefact in the MLflow UI (used for Evidently reports logged to a run)."""
    return (
        f"{base_url.rstrip('/')}/#/experiments/{quote(str(experiment_id))}/runs/"
        f"{quote(str(run_id))}/artifacts/{quote(path)}"
    )


def triton_model_url(http_url: str, model_name: str, version: str | int | None = None) -> str:
    """URL of a model's metadata on Triton (``/v2/models/<name>[/versions/<v>]``).

    Args:
        http_url: ``host:port`` or ``http(s)://host:port`` of Triton's HTTP endpoint.
        model_name: Triton model name (URL-quoted).
        version: Model version; ``None`` or ``""``: the model's URL without a version.

    Returns:
        The URL.
    """
    base = http_url if "://" in http_url else f"http://{http_url}"
    url = f"{base.rstrip('/')}/v2/models/{quote(str(model_name), safe='')}"
    return f"{url}/versions/{version}" if version not in (None, "") else url


def grafana_panel_url(dashboard_url: str, model_name: str, panel_id: int = GRAFANA_MODEL_PANEL_ID) -> str:
    """URL of a dashboard panel in Grafana, filtered to one model.

    Args:
        dashboard_url: The dashboard's URL (``http://grafana:3000/d/<uid>``), from
            ``TRITONFLOW_GRAFANA_DASHBOARD_URL``; may already hold query parameters.
        model_name: Triton model name, set as the dashboard variable ``model`` (``var-model``).
        panel_id: Panel shown alone (``viewPanel``).

    Returns:
        ``<dashboard_url>?var-model=<name>&viewPanel=<id>``.
    """
    sep = "&" if "?" in dashboard_url else "?"
    return f"{dashboard_url.rstrip('/')}{sep}{urlencode({'var-model': model_name, 'viewPanel': panel_id})}"


# ---------------------------------------------------------------------------- info -> URL
def mlflow_link_from_info(info: Mapping[str, Any], base_url: str) -> str:
    """Model version URL from link info, ``""`` when name or version is missing."""
    if info.get("model_name") and info.get("model_version") not in (None, ""):
        return mlflow_model_version_url(base_url, info["model_name"], info["model_version"])
    return ""


def mlflow_run_link_from_info(info: Mapping[str, Any], base_url: str) -> str:
    """MLflow run URL from link info, ``""`` when no run id was recorded."""
    if not info.get("mlflow_run_id"):
        return ""
    return mlflow_run_url(base_url, str(info["mlflow_run_id"]), info.get("mlflow_experiment_id"))


def evidently_link_from_info(info: Mapping[str, Any], base_url: str) -> str:
    """Evidently report URL from link info: a direct URL, or an MLflow run artefact."""
    if info.get("evidently_report_url"):
        return str(info["evidently_report_url"])
    if info.get("mlflow_run_id") and info.get("evidently_report_path"):
        return mlflow_run_artifact_url(
            base_url,
            str(info.get("mlflow_experiment_id", "0")),
            info["mlflow_run_id"],
            info["evidently_report_path"],
        )
    return ""


def triton_link_from_info(info: Mapping[str, Any], http_url: str, public_url: str = "") -> str:
    """Triton model URL from link info, ``""`` when no model name was recorded.

    Args:
        info: Recorded link info (``triton_model``, ``triton_version``, ``triton_http_url``).
        http_url: Triton URL of the settings, used when the task recorded none.
        public_url: Triton URL a browser reaches (``TRITONFLOW_TRITON_PUBLIC_URL``); it replaces
            both when set (in docker-compose the tasks use ``triton:8000``, a browser cannot).

    Returns:
        The URL, or ``""``.
    """
    if not info.get("triton_model"):
        return ""
    base = public_url or info.get("triton_http_url") or http_url
    return triton_model_url(base, info["triton_model"], info.get("triton_version"))


def grafana_link_from_info(info: Mapping[str, Any], dashboard_url: str) -> str:
    """Grafana panel URL of the recorded Triton model, ``""`` without a model or a dashboard URL."""
    if not (dashboard_url and info.get("triton_model")):
        return ""
    return grafana_panel_url(dashboard_url, str(info["triton_model"]))


# ---------------------------------------------------------------------------- recording
def _ti_key(ti: Any) -> tuple:
    return (ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1), getattr(ti, "try_number", None))


#: Link info recorded by the task instance(s) running in this process.
_RECORDED: dict[tuple, dict[str, Any]] = {}


def record_link_info(**info: Any) -> dict[str, Any]:
    """Merge ``info`` into the running task's link info (the links read it when the task finishes).

    Call from inside a task. Values must be small strings/ints; ``None`` values are ignored.
    Known keys: ``model_name``, ``model_version`` (MLflow model version), ``mlflow_run_id``,
    ``mlflow_experiment_id`` (MLflow run), ``evidently_report_url`` or ``evidently_report_path``
    (an artefact of that run), ``triton_model``, ``triton_version``, ``triton_http_url`` (Triton
    model; the Grafana panel also uses ``triton_model``).

    Returns:
        The merged link info.
    """
    from airflow.sdk import get_current_context

    ti = get_current_context()["ti"]
    # Merged in this process (a task instance runs in one process): pulling our own XCom before
    # the first push made the Task SDK log an ERROR "XCom not found" on every successful run.
    key = _ti_key(ti)
    merged = {**_RECORDED.get(key, {}), **{k: v for k, v in info.items() if v is not None}}
    _RECORDED[key] = merged
    ti.xcom_push(key=LINK_INFO_XCOM_KEY, value=merged)
    return merged


def record_version_links(model: str, version: str | int | None, *, served: bool = True,
                         **more: Any) -> dict[str, Any]:
    """Record the links of one registered model version (call inside a task).

    Args:
        model: Registered model name.
        version: Its version (``None``: no version links; ``more`` is still recorded).
        served: Also link the version's Triton model (name from
            :func:`tritonflow.pipelines.publish.triton_model_name`) and its Grafana panel.
        **more: Further link info for :func:`record_link_info` (e.g. ``mlflow_run_id``).

    Returns:
        The merged link info.
    """
    info: dict[str, Any] = dict(more)
    if model and version not in (None, ""):
        info.update(model_name=model, model_version=str(version))
        if served:
            from tritonflow.pipelines.publish import triton_model_name

            info.update(triton_model=triton_model_name(model), triton_version=str(version))
    return record_link_info(**info)


def _settings() -> Any:
    from ground.settings import get_settings

    return get_settings()


# ---------------------------------------------------------------------------- links
class _RecordedInfoLink(BaseOperatorLink):
    """A link whose URL comes from the info the task instance recorded in this process."""

    name = ""

    def url(self, info: Mapping[str, Any]) -> str:
        """The URL for ``info``, ``""`` when it lacks what this link needs."""
        raise NotImplementedError

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """Return the URL for what the task instance recorded, ``""`` when it recorded nothing.

        Airflow calls this on the worker when the task instance finishes, with the running task
        instance as ``ti_key``, and stores the result in XCom under :attr:`xcom_key`.
        """
        info = _RECORDED.get(_ti_key(ti_key))
        return self.url(info) if info else ""


class MlflowModelVersionLink(_RecordedInfoLink):
    """Button "MLflow model version": the registry page of the version the task handled."""

    name = "MLflow model version"

    def url(self, info: Mapping[str, Any]) -> str:
        """Model version page (``model_name``, ``model_version``)."""
        return mlflow_link_from_info(info, mlflow_base_url(_settings()))


class MlflowRunLink(_RecordedInfoLink):
    """Button "MLflow run": the run holding what the task logged (publish, drift, canary, training)."""

    name = "MLflow run"

    def url(self, info: Mapping[str, Any]) -> str:
        """Run page (``mlflow_run_id``, ``mlflow_experiment_id``)."""
        return mlflow_run_link_from_info(info, mlflow_base_url(_settings()))


class EvidentlyReportLink(_RecordedInfoLink):
    """Button "Evidently report": the HTML drift report the task produced."""

    name = "Evidently report"

    def url(self, info: Mapping[str, Any]) -> str:
        """Report URL (``evidently_report_url``, or the run artefact ``evidently_report_path``)."""
        return evidently_link_from_info(info, mlflow_base_url(_settings()))


class TritonModelLink(_RecordedInfoLink):
    """Button "Triton model": the model (version) metadata on the Triton server."""

    name = "Triton model"

    def url(self, info: Mapping[str, Any]) -> str:
        """Triton model (version) URL (``triton_model``, ``triton_version``)."""
        s = _settings()
        return triton_link_from_info(info, s.triton_http_url, s.triton_public_url)


class GrafanaPanelLink(_RecordedInfoLink):
    """Button "Grafana panel": the model's request-rate panel of the serving dashboard."""

    name = "Grafana panel"

    def url(self, info: Mapping[str, Any]) -> str:
        """Panel URL (``triton_model``; needs ``TRITONFLOW_GRAFANA_DASHBOARD_URL``)."""
        return grafana_link_from_info(info, _settings().grafana_dashboard_url)


class RegistryDeliveriesLink(_RecordedInfoLink):
    """Button "Registry deliveries": the webhook receiver's delivery status (``registry_events`` runs).

    The status page (``GET /tritonflow/webhooks/status`` on the api-server: the last MLflow
    deliveries, the changes acted on, the reconciler's findings) is served by the Airflow
    api-server itself, so the URL is the one the task recorded (:func:`delivery_status_url`).
    """

    name = "Registry deliveries"

    def url(self, info: Mapping[str, Any]) -> str:
        """The recorded status URL (``delivery_status_url``)."""
        return str(info.get("delivery_status_url") or "")


def delivery_status_url(api_base_url: str, prefix: str = URL_PREFIX) -> str:
    """URL of the webhook receiver's delivery status page on the Airflow api-server.

    Args:
        api_base_url: Airflow's ``[api] base_url`` (``http://host:8080`` or with a sub-path);
            ``""``: a path relative to the UI's own origin.
        prefix: Where the plugin mounts the receiver (:data:`tritonflow.registry_events.URL_PREFIX`).

    Returns:
        ``<base>/tritonflow/webhooks/status``.
    """
    return f"{api_base_url.rstrip('/')}{prefix}/webhooks/status"


#: The links of tritonflow's publishing, analysing, promoting and registry-event tasks.
TRITONFLOW_LINKS: tuple[_RecordedInfoLink, ...] = (
    MlflowModelVersionLink(), MlflowRunLink(), EvidentlyReportLink(), TritonModelLink(), GrafanaPanelLink(),
    RegistryDeliveriesLink(),
)


# ---------------------------------------------------------------------------- the decorator
class LinkedPythonOperator(_PythonDecoratedOperator):
    """The operator of ``@task``, declaring tritonflow's extra links (:data:`TRITONFLOW_LINKS`)."""

    operator_extra_links = TRITONFLOW_LINKS


def task_with_links(python_callable: Callable | None = None, multiple_outputs: bool | None = None,
                    **kwargs: Any) -> Any:
    """``@task`` whose task instances show tritonflow's link buttons in the Airflow UI.

    Takes the arguments of ``@task`` (``execution_timeout``, ``outlets``, ``map_index_template``,
    ...) and works with ``.partial()`` / ``.expand()``. Inside the task, :func:`record_link_info`
    says what the links point to; a link with nothing recorded shows no button.

    Example::

        @task_with_links(execution_timeout=timedelta(minutes=10))
        def record(state: dict) -> dict:
            ...
            record_link_info(model_name=state["model"], model_version=str(state["version"]))
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=LinkedPythonOperator,
        **kwargs,
    )
