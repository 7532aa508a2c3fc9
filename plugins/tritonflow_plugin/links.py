"""Operator extra links: MLflow model version, Evidently report, Triton model.

How it works in Airflow 3: after a task finishes, the worker calls each link's ``get_link`` and
stores the URL in XCom; the UI shows it as a button. tritonflow tasks record what the links need
with :func:`record_link_info` (one small XCom, key :data:`LINK_INFO_XCOM_KEY`)::

    record_link_info(model_name="churn", model_version="7", triton_model="churn",
                     evidently_report_url="http://minio:9000/reports/drift/2025-01-01T10.html")

and the thin operators declare ``operator_extra_links = TRITONFLOW_LINKS``. The URL builders are
pure functions so they can be tested and reused in notifications.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

#: XCom key holding ``{model_name, model_version, triton_model, triton_version, evidently_report_url,
#: mlflow_run_id, mlflow_experiment_id, evidently_report_path}`` for the links of one task.
LINK_INFO_XCOM_KEY = "tritonflow_links"


def mlflow_base_url(settings: Any | None = None) -> str:
    """MLflow UI base URL: ``Settings.mlflow_ui_url`` or else the resolved tracking URI."""
    if settings is None:
        from tritonflow.settings import get_settings

        settings = get_settings()
    return (settings.mlflow_ui_url or settings.resolved_mlflow_tracking_uri).rstrip("/")


def mlflow_model_version_url(base_url: str, model_name: str, version: str | int) -> str:
    """URL of a model version page in the MLflow UI (``<base>/#/models/<name>/versions/<v>``)."""
    return f"{base_url.rstrip('/')}/#/models/{quote(str(model_name), safe='')}/versions/{version}"


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


def record_link_info(**info: Any) -> dict[str, Any]:
    """Merge ``info`` into the running task's link XCom (key :data:`LINK_INFO_XCOM_KEY`).

    Call from inside a task. Values must be small strings/ints.

    Returns:
        The merged link info.
    """
    from airflow.sdk import get_current_context

    ti = get_current_context()["ti"]
    # Merged in this process (a task instance runs in one process): pulling our own XCom before
    # the first push made the Task SDK log an ERROR "XCom not found" on every successful run.
    key = (ti.dag_id, ti.run_id, ti.task_id, ti.map_index, getattr(ti, "try_number", None))
    merged = {**_RECORDED.get(key, {}), **{k: v for k, v in info.items() if v is not None}}
    _RECORDED[key] = merged
    ti.xcom_push(key=LINK_INFO_XCOM_KEY, value=merged)
    return merged


#: Link info recorded by the task instance(s) running in this process.
_RECORDED: dict[tuple, dict[str, Any]] = {}


def _link_info(ti_key: Any) -> Mapping[str, Any]:
    from airflow.sdk.bases.xcom import BaseXCom

    try:
        value = BaseXCom.get_value(ti_key=ti_key, key=LINK_INFO_XCOM_KEY)
    except Exception:
        return {}
    return value if isinstance(value, Mapping) else {}


def mlflow_link_from_info(info: Mapping[str, Any], base_url: str) -> str:
    """Model version URL from link info, ``""`` when name or version is missing."""
    if info.get("model_name") and info.get("model_version") not in (None, ""):
        return mlflow_model_version_url(base_url, info["model_name"], info["model_version"])
    return ""


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


def triton_link_from_info(info: Mapping[str, Any], http_url: str) -> str:
    """Triton model URL from link info, ``""`` when no model name was recorded."""
    if not info.get("triton_model"):
        return ""
    return triton_model_url(info.get("triton_http_url") or http_url, info["triton_model"],
                            info.get("triton_version"))


class MlflowModelVersionLink(BaseOperatorLink):
    """Button "MLflow model version": the registry page of the version the task handled."""

    name = "MLflow model version"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """Return the model version URL, or ``""`` when the task recorded none."""
        return mlflow_link_from_info(_link_info(ti_key), mlflow_base_url())


class EvidentlyReportLink(BaseOperatorLink):
    """Button "Evidently report": the HTML drift/shadow report the task produced."""

    name = "Evidently report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """Return the report URL, or ``""`` when the task recorded none."""
        return evidently_link_from_info(_link_info(ti_key), mlflow_base_url())


class TritonModelLink(BaseOperatorLink):
    """Button "Triton model": the model (version) metadata on the Triton server."""

    name = "Triton model"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """Return the Triton model URL, or ``""`` when the task recorded none."""
        from tritonflow.settings import get_settings

        return triton_link_from_info(_link_info(ti_key), get_settings().triton_http_url)


#: The three links, for ``operator_extra_links`` of tritonflow's thin operators.
TRITONFLOW_LINKS = (MlflowModelVersionLink(), EvidentlyReportLink(), TritonModelLink())
