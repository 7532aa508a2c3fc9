"""Hooks (connections read at run time), operator extra link URLs, failure notifier, plugin."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ground.exceptions import SettingsError
from tritonflow_plugin.hooks import MlflowHook, TritonHook
from tritonflow_plugin.links import (
    evidently_link_from_info,
    grafana_link_from_info,
    mlflow_link_from_info,
    mlflow_model_version_url,
    mlflow_run_link_from_info,
    triton_link_from_info,
)
from tritonflow_plugin.notifications import TritonflowFailureNotifier


def test_mlflow_hook_builds_client_from_connection_at_call_time(monkeypatch, mlflow_tracking_uri):
    hook = MlflowHook("mlflow_test")  # no connection exists yet: constructing must not read it
    host, port = mlflow_tracking_uri.removeprefix("http://").split(":")
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST",
                       json.dumps({"conn_type": "mlflow", "host": host, "port": int(port)}))
    assert hook.get_tracking_uri() == mlflow_tracking_uri
    client = hook.get_conn()
    assert client._registry_uri == mlflow_tracking_uri
    assert hook.test_connection()[0] is True


def test_mlflow_hook_refuses_a_non_http_scheme(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_BAD",
                       json.dumps({"conn_type": "mlflow", "host": "ftp://registry", "port": 21}))
    with pytest.raises(SettingsError, match="'ftp'"):
        MlflowHook("mlflow_bad").get_tracking_uri()


def test_triton_hook_urls_and_client(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TRITON_TEST", json.dumps(
        {"conn_type": "triton", "host": "127.0.0.1", "port": 18000,
         "extra": {"metrics_url": "http://127.0.0.1:18002/metrics"}}))
    hook = TritonHook("triton_test")
    urls = hook.get_urls()
    assert urls["http_url"] == "127.0.0.1:18000"
    assert urls["metrics_url"] == "http://127.0.0.1:18002/metrics"
    assert urls["grpc_url"] == "127.0.0.1:8001"
    import tritonclient.http as httpclient

    assert isinstance(hook.get_conn(), httpclient.InferenceServerClient)


def test_extra_link_urls_from_recorded_info():
    info = {"model_name": "churn head", "model_version": "7", "triton_model": "churn",
            "triton_version": "7", "mlflow_run_id": "abc", "mlflow_experiment_id": "3",
            "evidently_report_path": "drift/report.html"}
    assert mlflow_link_from_info(info, "http://mlflow:5000/") == "http://mlflow:5000/#/models/churn%20head/versions/7"
    assert mlflow_model_version_url("http://m", "a/b", 1) == "http://m/#/models/a%2Fb/versions/1"
    assert evidently_link_from_info(info, "http://m") == "http://m/#/experiments/3/runs/abc/artifacts/drift/report.html"
    assert evidently_link_from_info({"evidently_report_url": "https://r/x.html"}, "http://m") == "https://r/x.html"
    assert triton_link_from_info(info, "127.0.0.1:8000") == "http://127.0.0.1:8000/v2/models/churn/versions/7"
    assert mlflow_link_from_info({}, "http://m") == "" and triton_link_from_info({}, "h:1") == ""
    assert mlflow_run_link_from_info(info, "http://m/") == "http://m/#/experiments/3/runs/abc"
    # without an experiment id: MLflow's direct run route, which finds the experiment itself
    assert mlflow_run_link_from_info({"mlflow_run_id": "abc"}, "http://m") == "http://m/#/runs/abc"
    assert mlflow_run_link_from_info({}, "http://m") == ""
    # docker-compose: the tasks reach triton:8000, a browser reaches the public URL
    inside = {**info, "triton_http_url": "triton:8000"}
    assert triton_link_from_info(inside, "h:1", "http://localhost:8000") == "http://localhost:8000/v2/models/churn/versions/7"
    assert triton_link_from_info(inside, "h:1") == "http://triton:8000/v2/models/churn/versions/7"
    dashboard = "http://localhost:3000/d/tritonflow-triton"
    assert grafana_link_from_info(info, dashboard) == f"{dashboard}?var-model=churn&viewPanel=1"
    assert grafana_link_from_info(info, dashboard + "?orgId=1") == f"{dashboard}?orgId=1&var-model=churn&viewPanel=1"
    assert grafana_link_from_info(info, "") == "" and grafana_link_from_info({}, dashboard) == ""


def test_a_link_base_url_a_browser_cannot_open_is_refused_naming_the_variable():
    from ground.settings import Settings

    with pytest.raises(SettingsError, match=r"TRITONFLOW_GRAFANA_DASHBOARD_URL='grafana:3000/d/x'.*http\(s\)://"):
        Settings.from_env({"TRITONFLOW_GRAFANA_DASHBOARD_URL": "grafana:3000/d/x"})
    with pytest.raises(SettingsError, match="TRITONFLOW_TRITON_PUBLIC_URL"):
        Settings.from_env({"TRITONFLOW_TRITON_PUBLIC_URL": "localhost:8000"})
    ok = Settings.from_env({"TRITONFLOW_GRAFANA_DASHBOARD_URL": "https://g.example/d/x"})
    assert ok.grafana_dashboard_url == "https://g.example/d/x" and ok.triton_public_url == ""


class _Receiver(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


class _Ti:
    """Task instance attributes a failure callback context carries (no Airflow run here)."""

    dag_id, task_id, run_id, try_number, log_url = "drift_monitor", "compute_drift", "scheduled__x", 2, None


def test_failure_notifier_logs_and_posts_to_the_configured_webhook(monkeypatch, caplog):
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("TRITONFLOW_ALERT_WEBHOOK_URL", f"http://127.0.0.1:{server.server_port}/hook")
        context = {"ti": _Ti(), "exception": ValueError("PSI column missing")}
        with caplog.at_level(logging.ERROR):
            TritonflowFailureNotifier()(context)
    finally:
        server.shutdown()
    (body,) = _Receiver.bodies
    assert body["dag_id"] == "drift_monitor" and body["task_id"] == "compute_drift"
    assert "ValueError: PSI column missing" in body["text"]
    assert "drift_monitor.compute_drift failed" in caplog.text


def test_failure_notifier_without_webhook_only_logs_and_never_raises(monkeypatch, caplog):
    monkeypatch.setenv("TRITONFLOW_ALERT_WEBHOOK_URL", "")
    with caplog.at_level(logging.ERROR):
        TritonflowFailureNotifier()({"ti": _Ti(), "exception": RuntimeError("boom")})
    assert "boom" in caplog.text
    # an unreachable receiver is logged, the callback does not raise
    TritonflowFailureNotifier(webhook_url="http://127.0.0.1:9/x", timeout_s=1)({"ti": _Ti()})
    assert "failure notification to http://127.0.0.1:9/x failed" in caplog.text


def test_plugin_mounts_the_webhook_app_and_declares_links():
    from airflow import plugins_manager

    apps, _middlewares = plugins_manager.get_fastapi_plugins()
    ours = [a for a in apps if a.get("url_prefix") == "/tritonflow"]
    assert len(ours) == 1
    paths = {r.path for r in ours[0]["app"].routes}
    assert "/webhooks/mlflow" in paths and "/health" in paths
    # built on its first use only: every task process loads the plugin, only the api-server serves it
    from tritonflow_plugin_entry import LazyWebhookApp

    lazy = LazyWebhookApp()
    assert lazy._app is None
    assert {r.path for r in lazy.routes} == paths and lazy._app is not None
