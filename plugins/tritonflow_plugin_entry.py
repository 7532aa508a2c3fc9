"""Airflow plugin registration for tritonflow.

Airflow imports every module of the plugins folder; this one defines :class:`TritonflowPlugin`,
which mounts the MLflow webhook receiver at ``/tritonflow/webhooks/mlflow`` on the API server
and registers the operator extra links. Hooks, the notifier and the trigger are imported
directly by DAG files (``from tritonflow_plugin.hooks import MlflowHook``).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tritonflow_plugin.links import EvidentlyReportLink, MlflowModelVersionLink, TritonModelLink
from tritonflow_plugin.webhook import URL_PREFIX


def _webhook_app():
    from tritonflow_plugin.webhook import create_app

    return create_app()


class TritonflowPlugin(AirflowPlugin):
    """Mounts the webhook receiver and declares tritonflow's operator extra links."""

    name = "tritonflow"
    fastapi_apps = [
        {"app": _webhook_app(), "url_prefix": URL_PREFIX, "name": "tritonflow MLflow webhooks"}
    ]
    operator_extra_links = [MlflowModelVersionLink(), EvidentlyReportLink(), TritonModelLink()]
