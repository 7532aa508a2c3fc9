"""A real MLflow server delivers registry changes to the real receiver, served by uvicorn.

The MLflow server is :class:`tritonflow.runtime.services.MlflowServer` (SQLite store, the local
runtime's webhook settings); the webhook is registered with ``tritonflow registry webhook
register``; the receiver is :func:`tritonflow_plugin.webhook.create_app` on a free loopback port.
MLflow signs and sends every delivery itself; the receiver's sink records what it would start.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from mlflow import MlflowClient

from tests.conftest import make_settings
from tritonflow.cli import main
from tritonflow.registry_events import URL_PREFIX, WEBHOOK_PATH
from tritonflow.runtime.services import MlflowServer, free_port
from tritonflow_plugin.event_mapping import DEFAULT_RULES, parse_rules
from tritonflow_plugin.webhook import DeliveryStore, create_app

pytestmark = pytest.mark.integration

SECRET = "real-mlflow-delivery-secret"
#: The default mapping plus a tag rule, so every delivered kind of change maps to one DAG.
RULES = parse_rules(list(DEFAULT_RULES) + [{"on": "tag_set", "tag_key": "tritonflow.retrain",
                                             "dags": ["model_retrain"]}])
#: Seconds MLflow gets to deliver (it sends from a thread pool right after the change).
DELIVERY_TIMEOUT_S = 30


class RecordingSink:
    """The receiver's sink: keeps (action, delivery id) instead of creating DAG runs."""

    def __init__(self):
        self.actions = []
        self.lock = threading.Lock()

    def deliver(self, action, delivery_id):
        with self.lock:
            self.actions.append((action, delivery_id))
        return f"recorded {action.dag_id}"

    def wait_for(self, count: int, settle_s: float = 2.0) -> list:
        """The recorded actions once there are ``count`` (and no more arrived for ``settle_s``)."""
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while len(self.actions) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(settle_s)
        with self.lock:
            return list(self.actions)


class Receiver:
    """The webhook app served for real by uvicorn in a thread on a free 127.0.0.1 port."""

    def __init__(self, tmp: Path):
        self.sink = RecordingSink()
        self.store = DeliveryStore(tmp / "deliveries.sqlite")
        app = FastAPI()  # mounted under the prefix, as Airflow's api-server mounts the plugin's app
        app.mount(URL_PREFIX, create_app(secret=SECRET, tolerance_s=300, rules=RULES, sink=self.sink,
                                         deliveries=self.store))
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{URL_PREFIX}{WEBHOOK_PATH}"

    def __enter__(self) -> "Receiver":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.server.started, "uvicorn did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory):
    server = MlflowServer(make_settings(tmp_path_factory.mktemp("mlflow_webhooks"), start_timeout_s=180)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def receiver(tmp_path, mlflow):
    with Receiver(tmp_path) as rec:
        yield rec
    client = MlflowClient(tracking_uri=mlflow.tracking_uri, registry_uri=mlflow.tracking_uri)
    for hook in client.list_webhooks():  # the next test's changes must not go to a stopped receiver
        client.delete_webhook(hook.webhook_id)


def _cli(*args: str) -> int:
    return main(["registry", "webhook", *args])


def _register(mlflow, url: str, secret: str = SECRET) -> int:
    return _cli("register", "--tracking-uri", mlflow.tracking_uri, "--url", url, "--secret", secret)


def _new_version(client: MlflowClient, model: str) -> str:
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    return client.create_model_version(model, f"{run.info.artifact_uri}/model", run.info.run_id).version


def test_mlflow_delivers_each_registry_change_once_signed_and_mapped(mlflow, receiver, capsys):
    assert _register(mlflow, receiver.url) == 0
    assert "created webhook" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=mlflow.tracking_uri, registry_uri=mlflow.tracking_uri)
    model = "churn-webhooks"
    client.create_registered_model(model)  # registered_model.created: not subscribed
    version = _new_version(client, model)
    client.set_registered_model_alias(model, "challenger", version)
    client.delete_registered_model_alias(model, "challenger")
    client.set_model_version_tag(model, version, "tritonflow.retrain", "yes")

    got = receiver.sink.wait_for(4)

    # A sink call happens only after the receiver verified MLflow's signature and timestamp.
    kinds = sorted((a.conf["registry_event"]["kind"], a.dag_id, a.conf["registry_event"]["alias"]) for a, _ in got)
    assert kinds == [("alias_deleted", "canary_rollback", "challenger"), ("alias_set", "model_publish", "challenger"),
                     ("tag_set", "model_retrain", None), ("version_created", "model_publish", None)]
    assert {a.conf["model_name"] for a, _ in got} == {model}
    assert len({did for _, did in got}) == 4  # one delivery per change, none repeated
    assert all(not receiver.store.claim(did) for _, did in got)  # each id was recorded by the receiver
    created = next(a for a, _ in got if a.conf["registry_event"]["kind"] == "version_created")
    assert created.conf["model_version"] == version and created.then == ("shadow_evaluation",)


def test_register_again_updates_the_one_webhook_and_test_reports_the_receivers_answer(mlflow, receiver, capsys):
    assert _register(mlflow, receiver.url, secret="not-the-receivers-secret") == 0
    assert _cli("test", "--tracking-uri", mlflow.tracking_uri, "--url", receiver.url) == 1
    out, err = capsys.readouterr()
    assert '"status": 401' in out and "X-MLflow-Signature does not match" in err

    assert _register(mlflow, receiver.url) == 0
    assert "updated webhook" in capsys.readouterr().out
    assert _cli("test", "--tracking-uri", mlflow.tracking_uri, "--url", receiver.url) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["success"], result["status"], result["event"]) == (True, 200, "model_version_tag.set")
    assert json.loads(result["body"])["status"] == "accepted"

    assert _cli("list", "--tracking-uri", mlflow.tracking_uri) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if receiver.url in line]
    assert len(listed) == 1, listed
    assert "model_version.created" in listed[0] and "model_version_tag.set" in listed[0]
    assert receiver.sink.actions == []  # the test event (a tag on example_model) maps to no DAG


def test_a_webhook_created_before_a_restart_still_delivers(mlflow, receiver):
    assert _register(mlflow, receiver.url) == 0
    key = mlflow.webhook_key_path.read_text()
    mlflow.stop()
    mlflow.start()
    assert mlflow.webhook_key_path.read_text() == key
    client = MlflowClient(tracking_uri=mlflow.tracking_uri, registry_uri=mlflow.tracking_uri)
    client.create_registered_model("churn-restart")
    version = _new_version(client, "churn-restart")

    (action, _), = receiver.sink.wait_for(1, settle_s=1.0)
    assert (action.dag_id, action.conf["model_name"], action.conf["model_version"]) == (
        "model_publish", "churn-restart", version)


@pytest.fixture
def strict_mlflow(tmp_path, monkeypatch):
    """An MLflow server with MLflow's default webhook rules (https only, public addresses only)."""
    monkeypatch.setenv("MLFLOW_WEBHOOK_ALLOWED_SCHEMES", "https")
    monkeypatch.setenv("MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS", "false")
    server = MlflowServer(make_settings(tmp_path / "strict", start_timeout_s=180)).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_refused_url_exits_1_naming_the_server_variables_and_the_https_alternative(strict_mlflow, capsys):
    port = free_port()
    assert _register(strict_mlflow, f"http://127.0.0.1:{port}/tritonflow/webhooks/mlflow") == 1
    err = capsys.readouterr().err
    assert "Invalid webhook URL scheme: 'http'" in err
    for line in ("MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true",
                 "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY=", "SSRF", "https://<public-name>/tritonflow/webhooks/mlflow"):
        assert line in err, err

    assert _register(strict_mlflow, f"https://127.0.0.1:{port}/tritonflow/webhooks/mlflow") == 1
    err = capsys.readouterr().err
    assert "must not resolve to a non-public IP address" in err
    assert "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true" in err and "MLFLOW_WEBHOOK_ALLOWED_SCHEMES" not in err
    assert _cli("list", "--tracking-uri", strict_mlflow.tracking_uri) == 0
    assert "no webhooks" in capsys.readouterr().out

