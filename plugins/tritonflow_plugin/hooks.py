"""Airflow hooks, one per external system tritonflow talks to.

* :class:`MlflowHook` -- connection type ``mlflow``: ``schema`` (http/https), ``host``, ``port``
  and optional ``login``/``password`` (MLflow basic auth) or extra ``{"token": ...}`` give the
  tracking URI; returns an ``mlflow.MlflowClient``.
* :class:`TritonHook` -- connection type ``triton``: ``host``/``port`` is Triton's HTTP endpoint;
  extra ``{"metrics_url": "http://host:8002/metrics", "grpc_url": "host:8001"}``; returns a
  ``tritonclient.http.InferenceServerClient``.
* S3 goes through the amazon provider's ``S3Hook`` and an ``aws`` connection (endpoint URL in
  the connection's extra ``endpoint_url``); tritonflow has no S3 hook of its own.

Each hook also says what its connection sets in a task's process (:meth:`MlflowHook.settings_values`,
:meth:`TritonHook.settings_values`): every tritonflow task applies the defined connections through
them when it starts (:func:`tritonflow_plugin.connections.apply_connections`), so the pipelines use
the endpoints the connections name.

Connections are read only when ``get_conn()`` runs (task run time), never at DAG parse time.

Example connection, as an environment variable::

    AIRFLOW_CONN_MLFLOW_DEFAULT='{"conn_type": "mlflow", "host": "127.0.0.1", "port": 5000}'
    AIRFLOW_CONN_TRITON_DEFAULT='{"conn_type": "triton", "host": "127.0.0.1", "port": 8000,
                                  "extra": {"metrics_url": "http://127.0.0.1:8002/metrics"}}'
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook

from ground.exceptions import SettingsError

#: Schemes a tracking URI built from a connection may use.
HTTP_SCHEMES = ("http", "https")


def _base_url(conn: Any, *, default_port: int | None, what: str) -> str:
    """Return ``scheme://host[:port]`` from a connection; ``host`` may already hold a scheme."""
    host = (conn.host or "").strip()
    if not host:
        raise SettingsError(f"connection {conn.conn_id!r} has host={host!r}: expected {what} host")
    if "://" in host:
        parts = urlsplit(host)
        scheme, netloc, path = parts.scheme, parts.netloc, parts.path.rstrip("/")
    else:
        scheme, netloc, path = (conn.schema or "http").strip() or "http", host, ""
    if scheme not in HTTP_SCHEMES:
        raise SettingsError(
            f"connection {conn.conn_id!r} has scheme {scheme!r}: expected one of {HTTP_SCHEMES}"
        )
    port = conn.port or default_port
    if port and ":" not in netloc:
        netloc = f"{netloc}:{int(port)}"
    return f"{scheme}://{netloc}{path}"


def tracking_uri_from_connection(conn: Any) -> str:
    """Build the MLflow tracking URI from an ``mlflow`` connection.

    Args:
        conn: An Airflow ``Connection`` (``host``, ``port``, ``schema`` = http/https).

    Returns:
        ``"http://host:port"`` (``host`` may carry a scheme and a path prefix).

    Raises:
        SettingsError: No host, or a scheme other than http/https.
    """
    return _base_url(conn, default_port=None, what="the MLflow tracking server's")


def connection_extra(conn: Any, field: str) -> str:
    """An extra field of a connection, under its name or the form's ``extra__<type>__<name>``."""
    extra = conn.extra_dejson or {}
    return str(extra.get(field) or extra.get(f"extra__{conn.conn_type}__{field}") or "")


def gateway_url_from_connection(conn: Any) -> str:
    """Build the gateway's base URL from an ``http`` connection (``tritonflow_gateway``).

    Returns:
        ``"http://host:port"`` (``host`` may carry a scheme and a path prefix).

    Raises:
        SettingsError: No host, or a scheme other than http/https.
    """
    return _base_url(conn, default_port=None, what="the gateway's")


def triton_urls_from_connection(conn: Any) -> dict[str, str]:
    """Return Triton endpoints from a ``triton`` connection.

    Returns:
        ``{"http_url": "host:port", "metrics_url": ..., "grpc_url": ...}``; ``http_url`` has no
        scheme, as ``tritonclient.http`` expects; ``metrics_url`` defaults to port 8002 on the
        same host and ``grpc_url`` to port 8001.

    Raises:
        SettingsError: No host, or a scheme other than http/https.
    """
    base = _base_url(conn, default_port=8000, what="Triton's HTTP")
    parts = urlsplit(base)
    hostname = parts.hostname or ""
    return {
        "http_url": parts.netloc,
        "scheme": parts.scheme,
        "metrics_url": connection_extra(conn, "metrics_url") or f"{parts.scheme}://{hostname}:8002/metrics",
        "grpc_url": connection_extra(conn, "grpc_url") or f"{hostname}:8001",
    }


class MlflowHook(BaseHook):
    """Hook to an MLflow tracking server and model registry.

    Args:
        mlflow_conn_id: Connection of type ``mlflow`` (default ``mlflow_default``).
    """

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = "mlflow"
    hook_name = "MLflow"

    def __init__(self, mlflow_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id

    @staticmethod
    def settings_values(conn: Any) -> dict[str, str]:
        """What an ``mlflow`` connection sets in a task's process.

        Args:
            conn: An Airflow ``Connection`` of type ``mlflow``.

        Returns:
            ``{"MLFLOW_TRACKING_URI": uri}`` (a ``TRITONFLOW_`` setting) plus, when the connection
            has them, MLflow's own credential variables, keyed with a leading ``@``
            (``@MLFLOW_TRACKING_USERNAME``/``PASSWORD`` from ``login``/``password``,
            ``@MLFLOW_TRACKING_TOKEN`` from the extra ``token``): MLflow's REST client reads them.

        Raises:
            SettingsError: No host, or a scheme other than http/https.
        """
        values = {"MLFLOW_TRACKING_URI": tracking_uri_from_connection(conn)}
        if conn.login:
            values["@MLFLOW_TRACKING_USERNAME"] = conn.login
            values["@MLFLOW_TRACKING_PASSWORD"] = conn.password or ""
        token = connection_extra(conn, "token")
        if token:
            values["@MLFLOW_TRACKING_TOKEN"] = token
        return values

    def get_tracking_uri(self) -> str:
        """Return the tracking URI of the connection (reads the connection now)."""
        return tracking_uri_from_connection(self.get_connection(self.mlflow_conn_id))

    def get_conn(self) -> Any:
        """Return an ``mlflow.MlflowClient`` for the connection's tracking and registry URI.

        Credentials (``login``/``password`` or extra ``token``) are exported as MLflow's
        ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``/``TOKEN`` variables of this process, which is
        how MLflow's REST client reads them.
        """
        values = self.settings_values(self.get_connection(self.mlflow_conn_id))
        os.environ.update({k[1:]: v for k, v in values.items() if k.startswith("@")})
        uri = values["MLFLOW_TRACKING_URI"]
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=uri, registry_uri=uri)

    def test_connection(self) -> tuple[bool, str]:
        """List one registered model; return ``(ok, message)`` for the UI's Test button."""
        try:
            self.get_conn().search_registered_models(max_results=1)
        except Exception as exc:  # the UI shows the message
            return False, str(exc)
        return True, "MLflow registry answered"


class TritonHook(BaseHook):
    """Hook to an NVIDIA Triton Inference Server (HTTP/REST, KServe v2 protocol).

    Args:
        triton_conn_id: Connection of type ``triton`` (default ``triton_default``).
    """

    conn_name_attr = "triton_conn_id"
    default_conn_name = "triton_default"
    conn_type = "triton"
    hook_name = "NVIDIA Triton"

    def __init__(self, triton_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.triton_conn_id = triton_conn_id

    @staticmethod
    def settings_values(conn: Any) -> dict[str, str]:
        """What a ``triton`` connection sets in a task's process.

        Args:
            conn: An Airflow ``Connection`` of type ``triton``.

        Returns:
            ``{"TRITON_URL": "host:port", "TRITON_METRICS_URL": url}`` (``TRITONFLOW_`` settings;
            see :func:`triton_urls_from_connection`).

        Raises:
            SettingsError: No host, or a scheme other than http/https.
        """
        urls = triton_urls_from_connection(conn)
        return {"TRITON_URL": urls["http_url"], "TRITON_METRICS_URL": urls["metrics_url"]}

    def get_urls(self) -> dict[str, str]:
        """Return ``http_url``, ``metrics_url``, ``grpc_url`` (reads the connection now)."""
        return triton_urls_from_connection(self.get_connection(self.triton_conn_id))

    def get_conn(self) -> Any:
        """Return a ``tritonclient.http.InferenceServerClient`` for the connection."""
        urls = self.get_urls()
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(url=urls["http_url"], ssl=urls["scheme"] == "https")

    def test_connection(self) -> tuple[bool, str]:
        """Ask Triton whether it is live; return ``(ok, message)``."""
        try:
            live = self.get_conn().is_server_live()
        except Exception as exc:
            return False, str(exc)
        return bool(live), "Triton is live" if live else "Triton is not live"
