"""Airflow Connections as the way in: endpoints of MLflow, Triton, the gateway and S3.

An Airflow user configures external systems as Connections (UI, CLI, REST API or a secrets
backend). Every tritonflow task applies them when it starts (:func:`apply_connections`, the
``on_execute_callback`` of :data:`tritonflow_plugin.dag_defaults.DEFAULT_ARGS`): each connection
that exists overrides the matching ``TRITONFLOW_*`` setting of the task's process, so the
pipelines, which read :func:`ground.settings.get_settings`, use it. A connection that does not
exist leaves the setting (environment or default) in effect: the ``TRITONFLOW_*`` variables stay
the fallback and the defaults.

=====================  ===========================  ==========================================
connection id setting   default id / type           settings it fills
=====================  ===========================  ==========================================
``MLFLOW_CONN_ID``      ``mlflow_default`` (mlflow)  ``MLFLOW_TRACKING_URI`` (+ MLflow credentials)
``TRITON_CONN_ID``      ``triton_default`` (triton)  ``TRITON_URL``, ``TRITON_METRICS_URL``
``GATEWAY_CONN_ID``     ``tritonflow_gateway`` (http)  ``GATEWAY_URL``
``AWS_CONN_ID``         ``aws_default`` (aws)        ``S3_ENDPOINT_URL`` (extra ``endpoint_url``),
                                                     boto3 credentials and region
=====================  ===========================  ==========================================

Which settings came from which connection is recorded in the process environment
(:data:`CONNECTION_SOURCES_ENV`), so ``tritonflow settings`` run inside a task shows
``connection <id>`` as their source. Connections are read only at task run time, never while a
DAG file is parsed.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from ground.exceptions import SettingsError
from ground.settings import CONNECTION_SOURCES_ENV, ENV_PREFIX, Settings
from tritonflow_plugin.hooks import MlflowHook, TritonHook, gateway_url_from_connection

log = logging.getLogger(__name__)


def _gateway_values(conn: Any) -> dict[str, str]:
    return {"GATEWAY_URL": gateway_url_from_connection(conn)}


def _aws_values(conn: Any) -> dict[str, str]:
    from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper

    wrapped = AwsConnectionWrapper(conn=conn)
    values: dict[str, str] = {}
    if wrapped.endpoint_url:
        values["S3_ENDPOINT_URL"] = str(wrapped.endpoint_url)
    if wrapped.aws_access_key_id:  # boto3 reads its credentials and region from these variables
        values["@AWS_ACCESS_KEY_ID"] = wrapped.aws_access_key_id
        values["@AWS_SECRET_ACCESS_KEY"] = wrapped.aws_secret_access_key or ""
        if wrapped.aws_session_token:
            values["@AWS_SESSION_TOKEN"] = wrapped.aws_session_token
    if wrapped.region_name:
        values["@AWS_DEFAULT_REGION"] = wrapped.region_name
    return values


#: ``(Settings field naming the connection id, what the connection fills)``: tritonflow's own
#: connection types through their hooks, the gateway's ``http`` and the amazon provider's ``aws``
#: here. A value key starting with ``@`` is a third-party variable (credentials) set as is; the
#: others are ``TRITONFLOW_`` settings.
CONNECTION_KINDS: tuple[tuple[str, Callable[[Any], dict[str, str]]], ...] = (
    ("mlflow_conn_id", MlflowHook.settings_values),
    ("triton_conn_id", TritonHook.settings_values),
    ("gateway_conn_id", _gateway_values),
    ("aws_conn_id", _aws_values),
)


def _get_connection(conn_id: str) -> Any | None:
    """The connection ``conn_id``, or ``None`` when it is not defined anywhere."""
    from airflow.sdk import BaseHook

    try:
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError:  # pragma: no cover - older Task SDK layouts
        from airflow.exceptions import AirflowNotFoundException
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def connection_settings(get_connection: Callable[[str], Any | None] = _get_connection,
                        environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Variables the defined connections set, and the connection each setting came from.

    Args:
        get_connection: Returns a connection by id, ``None`` when it is not defined.
        environ: Environment the connection ids are read from (default ``os.environ``).

    Returns:
        ``({variable: value}, {TRITONFLOW_ variable: connection id})``; variables are full names
        (``TRITONFLOW_MLFLOW_TRACKING_URI``, ``AWS_ACCESS_KEY_ID``).

    Raises:
        SettingsError: A connection exists but cannot give what it is for (no host, a scheme
            other than http/https); the message names the connection and the field.
    """
    settings = Settings.from_env(environ)
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    for field, extract in CONNECTION_KINDS:
        conn_id = str(getattr(settings, field) or "").strip()
        if not conn_id:
            continue
        conn = get_connection(conn_id)
        if conn is None:
            continue
        try:
            found = extract(conn)
        except SettingsError:
            raise
        except Exception as exc:  # noqa: BLE001 - a malformed connection is a settings error
            raise SettingsError(f"connection {conn_id!r} cannot be used for {field}: {exc}") from exc
        for key, value in found.items():
            if key.startswith("@"):
                values[key[1:]] = value
            else:
                values[ENV_PREFIX + key] = value
                sources[ENV_PREFIX + key] = conn_id
    return values, sources


def apply_connections(context: Any = None) -> dict[str, str]:
    """Apply the defined connections to this task process's settings (``on_execute_callback``).

    Args:
        context: The task context (unused; the signature of an Airflow task callback).

    Returns:
        ``{TRITONFLOW_ variable: connection id}`` of the settings the connections set.

    Raises:
        SettingsError: A defined connection is malformed (see :func:`connection_settings`).
    """
    values, sources = connection_settings()
    os.environ.update(values)
    if sources:
        os.environ[CONNECTION_SOURCES_ENV] = ",".join(f"{k}={v}" for k, v in sorted(sources.items()))
        log.info("settings from Airflow connections: %s",
                 ", ".join(f"{k} <- {v}" for k, v in sorted(sources.items())))
    return sources


__all__ = ["CONNECTION_KINDS", "apply_connections", "connection_settings"]
