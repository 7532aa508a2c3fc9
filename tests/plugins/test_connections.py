"""Airflow Connections as the way in: which settings a defined connection gives, and their source.

Service-free: connections are Airflow ``Connection`` objects handed to
:func:`tritonflow_plugin.connections.connection_settings` by a lookup function (the task-time
lookup goes to Airflow's secrets backends; see tests/plugins/test_connections_airflow.py for a
connection created through the REST API of a real deployment and used by a task).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from airflow.models.connection import Connection

from ground.exceptions import SettingsError
from ground.settings import CONNECTION_SOURCES_ENV, Settings
from tritonflow.airflow_provider import get_provider_info
from tritonflow_plugin.connections import connection_settings


def _lookup(*conns: Connection):
    by_id = {c.conn_id: c for c in conns}
    return lambda conn_id: by_id.get(conn_id)


def test_defined_connections_fill_endpoints_and_credentials_and_name_their_source():
    mlflow = Connection(conn_id="mlflow_default", conn_type="mlflow", host="mlflow.internal", port=5000,
                        login="svc", password="s3cret")
    triton = Connection(conn_id="triton_default", conn_type="triton", host="triton-0", port=8000,
                        extra=json.dumps({"metrics_url": "http://triton-0:9102/metrics"}))
    gateway = Connection(conn_id="tritonflow_gateway", conn_type="http", host="https://gw.internal", port=443)
    aws = Connection(conn_id="aws_default", conn_type="aws", login="AKIAEXAMPLE", password="secret-key",
                     extra=json.dumps({"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"}))
    values, sources = connection_settings(_lookup(mlflow, triton, gateway, aws), environ={})
    assert values["TRITONFLOW_MLFLOW_TRACKING_URI"] == "http://mlflow.internal:5000"
    assert (values["MLFLOW_TRACKING_USERNAME"], values["MLFLOW_TRACKING_PASSWORD"]) == ("svc", "s3cret")
    assert values["TRITONFLOW_TRITON_URL"] == "triton-0:8000"
    assert values["TRITONFLOW_TRITON_METRICS_URL"] == "http://triton-0:9102/metrics"
    assert values["TRITONFLOW_GATEWAY_URL"] == "https://gw.internal:443"
    assert values["TRITONFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert (values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"]) == ("AKIAEXAMPLE", "secret-key")
    assert values["AWS_DEFAULT_REGION"] == "eu-west-1"
    # credentials are never reported as settings; each setting names its connection
    assert sources == {"TRITONFLOW_MLFLOW_TRACKING_URI": "mlflow_default",
                       "TRITONFLOW_TRITON_URL": "triton_default",
                       "TRITONFLOW_TRITON_METRICS_URL": "triton_default",
                       "TRITONFLOW_GATEWAY_URL": "tritonflow_gateway",
                       "TRITONFLOW_S3_ENDPOINT_URL": "aws_default"}


def test_without_connections_the_settings_stay_the_fallback():
    asked: list[str] = []

    def lookup(conn_id):
        asked.append(conn_id)
        return None

    assert connection_settings(lookup, environ={}) == ({}, {})
    assert asked == ["mlflow_default", "triton_default", "tritonflow_gateway", "aws_default"]


def test_connection_ids_are_settings_and_an_empty_id_is_not_looked_up():
    asked: list[str] = []
    mlflow = Connection(conn_id="mlflow_prod", conn_type="mlflow", host="https://mlflow.example.com/prefix")

    def lookup(conn_id):
        asked.append(conn_id)
        return mlflow if conn_id == "mlflow_prod" else None

    environ = {"TRITONFLOW_MLFLOW_CONN_ID": "mlflow_prod", "TRITONFLOW_TRITON_CONN_ID": "",
               "TRITONFLOW_GATEWAY_CONN_ID": "", "TRITONFLOW_AWS_CONN_ID": ""}
    values, sources = connection_settings(lookup, environ=environ)
    assert asked == ["mlflow_prod"]
    assert values == {"TRITONFLOW_MLFLOW_TRACKING_URI": "https://mlflow.example.com/prefix"}
    assert sources == {"TRITONFLOW_MLFLOW_TRACKING_URI": "mlflow_prod"}


def test_a_malformed_connection_is_a_settings_error_naming_the_connection_and_field():
    no_host = Connection(conn_id="triton_default", conn_type="triton", host="")
    with pytest.raises(SettingsError, match="'triton_default'.*host=''"):
        connection_settings(_lookup(no_host), environ={})
    ftp = Connection(conn_id="mlflow_default", conn_type="mlflow", host="ftp://mlflow")
    with pytest.raises(SettingsError, match="'mlflow_default'.*'ftp'.*http"):
        connection_settings(_lookup(ftp), environ={})


def test_extra_fields_saved_by_the_connection_form_are_read_under_their_prefixed_names():
    triton = Connection(conn_id="triton_default", conn_type="triton", host="triton-1",
                        extra=json.dumps({"extra__triton__metrics_url": "http://triton-1:8002/metrics"}))
    values, _ = connection_settings(_lookup(triton), environ={})
    assert values["TRITONFLOW_TRITON_METRICS_URL"] == "http://triton-1:8002/metrics"


def test_settings_report_names_the_connection_a_value_came_from():
    environ = {"TRITONFLOW_MLFLOW_TRACKING_URI": "http://mlflow.internal:5000",
               CONNECTION_SOURCES_ENV: "TRITONFLOW_MLFLOW_TRACKING_URI=mlflow_default",
               "TRITONFLOW_GATEWAY_PORT": "8081"}
    rows = {name: (value, source) for name, value, source in Settings.effective(environ)}
    assert rows["TRITONFLOW_MLFLOW_TRACKING_URI"] == ("http://mlflow.internal:5000", "connection mlflow_default")
    assert rows["TRITONFLOW_GATEWAY_PORT"] == ("8081", "environment")
    assert rows["TRITONFLOW_TRITON_URL"] == ("", "default")
    assert CONNECTION_SOURCES_ENV not in rows


def test_provider_info_declares_the_connection_types_with_their_form_fields():
    from importlib.resources import files

    schema = json.loads(files("airflow").joinpath("provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    types = {t["connection-type"]: t for t in info["connection-types"]}
    assert set(types) == {"mlflow", "triton"}
    assert types["triton"]["hook-class-name"] == "tritonflow_plugin.hooks.TritonHook"
    assert set(types["triton"]["conn-fields"]) == {"metrics_url", "grpc_url"}
    assert types["mlflow"]["conn-fields"]["token"]["schema"]["format"] == "password"
