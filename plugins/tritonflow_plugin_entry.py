"""Airflow plugin registration for tritonflow.

Airflow imports every module of the plugins folder; this one defines :class:`TritonflowPlugin`,
which mounts the MLflow webhook receiver at ``/tritonflow/webhooks/mlflow`` on the API server
and lists tritonflow's operator extra links. Hooks, the notifier, the trigger and the
``@task_with_links`` decorator are imported directly by DAG files
(``from tritonflow_plugin.links import task_with_links``).

The links need no registration to work in Airflow 3: the decorator's operator declares them, the
worker stores their URLs in XCom and the api-server reads them back. They are listed here so
``airflow plugins`` and ``GET /api/v2/plugins`` show them; their ``operators`` list is empty, so
they attach to no other operator.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tritonflow.registry_events import URL_PREFIX
from tritonflow_plugin.links import TRITONFLOW_LINKS


def _webhook_app():
    from tritonflow_plugin.webhook import create_app

    return create_app()


class TritonflowPlugin(AirflowPlugin):
    """Mounts the webhook receiver and lists tritonflow's operator extra links."""

    name = "tritonflow"
    fastapi_apps = [
        {"app": _webhook_app(), "url_prefix": URL_PREFIX, "name": "tritonflow MLflow webhooks"}
    ]
    operator_extra_links = list(TRITONFLOW_LINKS)
