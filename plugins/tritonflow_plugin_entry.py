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

import threading
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from tritonflow.registry_events import URL_PREFIX
from tritonflow_plugin.links import TRITONFLOW_LINKS


class LazyWebhookApp:
    """The webhook receiver's ASGI app, built on its first use (a request, or an attribute such as ``routes``).

    Every Airflow process loads the plugins, each task process included, and only the API server
    serves the app: building it (FastAPI, the receiver's models) cost every task about 0.2-0.6 s
    of CPU on two cores.
    """

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    def app(self) -> Any:
        """The built FastAPI app (:func:`tritonflow_plugin.webhook.create_app`)."""
        if self._app is None:
            with self._lock:
                if self._app is None:
                    from tritonflow_plugin.webhook import create_app

                    self._app = create_app()
        return self._app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one ASGI call with the built app."""
        await self.app()(scope, receive, send)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.app(), name)


class TritonflowPlugin(AirflowPlugin):
    """Mounts the webhook receiver and lists tritonflow's operator extra links."""

    name = "tritonflow"
    fastapi_apps = [
        {"app": LazyWebhookApp(), "url_prefix": URL_PREFIX, "name": "tritonflow MLflow webhooks"}
    ]
    operator_extra_links = list(TRITONFLOW_LINKS)
