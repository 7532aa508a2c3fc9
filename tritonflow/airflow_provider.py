"""Provider metadata: registers tritonflow's connection types with Airflow.

Airflow 3 lists connection types in its connection form only when a provider declares them.
tritonflow's distribution declares this module's :func:`get_provider_info` under the
``apache_airflow_provider`` entry point (``pyproject.toml``), so the ``mlflow`` and ``triton``
connection types appear in the form with their fields relabelled and their extra fields
(``ui-field-behaviour`` and ``conn-fields``, read without importing the hooks). The hooks live in
the plugin package ``tritonflow_plugin``, which the distribution installs beside ``tritonflow``.
Importing this module imports nothing else.
"""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """Provider info as Airflow's ``provider_info.schema.json`` describes it.

    Returns:
        ``{"package-name": "tritonflow", "name", "description", "connection-types": [...]}``.
    """
    return {
        "package-name": "tritonflow",
        "name": "tritonflow",
        "description": "MLflow models to NVIDIA Triton: publish, drift checks, canary promotion.",
        "connection-types": [
            {
                "connection-type": "mlflow",
                "hook-class-name": "tritonflow_plugin.hooks.MlflowHook",
                "hook-name": "MLflow",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Scheme (http/https)", "login": "Username"},
                    "placeholders": {"host": "127.0.0.1", "port": "5000", "schema": "http"},
                },
                "conn-fields": {
                    "token": {"label": "Token", "description": "MLflow bearer token (instead of a password)",
                              "schema": {"type": ["string", "null"], "format": "password"}},
                },
            },
            {
                "connection-type": "triton",
                "hook-class-name": "tritonflow_plugin.hooks.TritonHook",
                "hook-name": "NVIDIA Triton",
                "ui-field-behaviour": {
                    "hidden-fields": ["login", "password"],
                    "relabeling": {"schema": "Scheme (http/https)", "host": "HTTP host",
                                   "port": "HTTP port"},
                    "placeholders": {"host": "127.0.0.1", "port": "8000", "schema": "http"},
                },
                "conn-fields": {
                    "metrics_url": {"label": "Metrics URL",
                                    "description": "Prometheus metrics (default: port 8002 on the same host)",
                                    "schema": {"type": ["string", "null"]}},
                    "grpc_url": {"label": "gRPC host:port",
                                 "description": "gRPC endpoint (default: port 8001 on the same host)",
                                 "schema": {"type": ["string", "null"]}},
                },
            },
        ],
    }
