"""A real MLflow server delivers registry changes to the real receiver, served by uvicorn.

The MLflow server is :class:`tritonflow.runtime.services.MlflowServer` (SQLite store, the local
runtime's webhook settings); the webhook is registered with ``tritonflow registry webhook
register``; the receiver is :func:`tritonflow_plugin.webhook.create_app` on a free loopback port.
MLflow signs and sends every delivery itself; the receiver's sink records what it would start.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from mlflow import MlflowClient

from tests.conftest import make_settings
from tritonflow.cli import main
from tritonflow.registry_events import STATUS_PATH, URL_PREFIX, WEBHOOK_PATH
from tritonflow.runtime.services import MlflowServer, free_port
from tritonflow_plugin.champion_guard import ChampionGuard
from tritonflow_plugin.change_ledger import change_run_id
from tritonflow_plugin.event_mapping import DEFAULT_RULES, RegistryChange, load_mapping, mapped_tag_keys, parse_rules
from tritonflow_plugin.registry_watcher import SeenStateStore, poll_once
from tritonflow_plugin.webhook import (
    DELIVERY_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    DeliveryStore,
    VersionLookup,
    create_app,
    sign,
)

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
    """The webhook app served for real by uvicorn in a thread on a free 127.0.0.1 port.

    ``gate``: while cleared, deliveries wait before they reach the receiver (MLflow has sent them).
    """

    def __init__(self, tmp: Path, tracking_uri: str, sink=None, port: int | None = None,
                 guard: ChampionGuard | None = None, status_auth=None):
        self.sink = sink or RecordingSink()
        self.store = DeliveryStore(tmp / "deliveries.sqlite")
        self.guard = guard or ChampionGuard()
        self.gate = threading.Event()
        self.gate.set()
        app = FastAPI()  # mounted under the prefix, as Airflow's api-server mounts the plugin's app

        @app.middleware("http")
        async def hold(request, call_next):
            await asyncio.to_thread(self.gate.wait, 20)
            return await call_next(request)

        app.mount(URL_PREFIX, create_app(secret=SECRET, tolerance_s=300, rules=RULES, sink=self.sink,
                                         deliveries=self.store, champion_guard=self.guard,
                                         status_auth=status_auth, versions=VersionLookup(tracking_uri)))
        self.port = port or free_port()
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
    with Receiver(tmp_path, mlflow.tracking_uri, guard=ChampionGuard(mlflow.tracking_uri)) as rec:
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
    deliveries = {a.conf["delivery_id"] for a, _ in got}
    assert len(deliveries) == len({run_id for _, run_id in got}) == 4  # one delivery and run per change
    # each delivery was stored by the receiver, in the shared store, and finished
    assert all(receiver.store.delivery(did)["status"] == "done" for did in deliveries)
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
    # MLflow's test event names version 1 of example_model, which this registry does not hold: the
    # receiver checked the signature, then read MLflow to name the version, and found none
    assert json.loads(result["body"])["status"] == "gone"

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



# ------------------------------------------------------------------ one run per change, both paths
#: The reconciler's mapping (every change to registry_events, which applies RULES itself).
WATCH_ALL = load_mapping(str(Path(__file__).parents[2] / "dags" / "registry_events_watch_all.json"))


class RunsSink:
    """Stands in for Airflow's DAG runs: one per ``(dag_id, run_id)``, as ``trigger_dag`` refuses a second.

    ``fail``: how many calls raise (the metadata DB down) before calls succeed; ``on_call`` sees
    each action first (to check what was stored before the receiver answers).
    """

    def __init__(self, fail: int = 0, on_call=None):
        self.runs: dict[tuple[str, str], object] = {}
        self.calls = 0
        self.fail = fail
        self.on_call = on_call
        self.lock = threading.Lock()

    def deliver(self, action, run_id):
        with self.lock:
            self.calls += 1
            if self.on_call is not None:
                self.on_call(action)
            if self.fail > 0:
                self.fail -= 1
                raise RuntimeError("metadata DB unavailable")
            if (action.dag_id, run_id) in self.runs:
                return f"dag run {run_id} (already created)"
            self.runs[(action.dag_id, run_id)] = action
            return f"dag run {run_id}"

    def of(self, dag_id: str, model: str) -> list:
        with self.lock:
            return [a for (d, _), a in self.runs.items() if d == dag_id and a.conf["model_name"] == model]

    def wait_for(self, dag_id: str, model: str, count: int, settle_s: float = 1.5) -> list:
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while len(self.of(dag_id, model)) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(settle_s)
        return self.of(dag_id, model)


def reconcile(mlflow, receiver, model: str) -> int:
    """One reconciler poll (the registry_events watcher) and the runs registry_events would fire."""
    client = MlflowClient(tracking_uri=mlflow.tracking_uri, registry_uri=mlflow.tracking_uri)
    confs = poll_once(client, SeenStateStore(receiver.store.store.url), "registry_events", WATCH_ALL, [model],
                      tag_keys=mapped_tag_keys(RULES))  # the tags the mapping names, as the trigger reads them
    for conf in confs:
        change = RegistryChange(**conf["registry_event"])
        for action in receiver.guard.actions(change, RULES, receiver.store):  # what map_changes fires
            receiver.sink.deliver(action, change_run_id(str(change.change_key), action.dag_id, change.kind))
    return len(confs)


@pytest.fixture
def runs_receiver(tmp_path, mlflow, request):
    with Receiver(tmp_path, mlflow.tracking_uri, sink=RunsSink(**getattr(request, "param", {})),
                  guard=ChampionGuard(mlflow.tracking_uri)) as rec:
        assert _register(mlflow, rec.url) == 0
        yield rec
    client = MlflowClient(tracking_uri=mlflow.tracking_uri, registry_uri=mlflow.tracking_uri)
    for hook in client.list_webhooks():
        client.delete_webhook(hook.webhook_id)


def _model(mlflow, receiver, name: str) -> MlflowClient:
    client = MlflowClient(tracking_uri=mlflow.tracking_uri, registry_uri=mlflow.tracking_uri)
    client.create_registered_model(name)
    assert reconcile(mlflow, receiver, name) == 0  # the reconciler's baseline
    return client


@pytest.mark.parametrize("runs_receiver", [{"fail": 1}, {"fail": 100}], indirect=True,
                         ids=["mlflow-retry", "reconciler"])
def test_a_delivery_is_stored_before_the_2xx_and_a_failure_after_storing_still_gives_one_run(
        mlflow, runs_receiver):
    sink, store = runs_receiver.sink, runs_receiver.store
    stored = []
    sink.on_call = lambda action: "delivery_id" in action.conf and stored.append(
        store.delivery(action.conf["delivery_id"]))
    time.sleep(3)  # MLflow's webhook cache (2 s here)
    model = f"churn-stored-{uuid.uuid4().hex[:6]}"
    client = _model(mlflow, runs_receiver, model)
    version = _new_version(client, model)

    # the failed call and MLflow's retry; or, failing throughout, the call and MLflow's 3 retries
    calls = 2 if sink.fail == 1 else 4
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while sink.calls < calls and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stored and all(s and '"model_version"' in s["body"] for s in stored)  # stored before answering
    if sink.fail:  # every MLflow retry failed too: the reconciler starts the change it stored
        time.sleep(1)
        assert sink.calls == 4 and sink.of("model_publish", model) == []
        sink.fail = 0
        assert reconcile(mlflow, runs_receiver, model) == 1
    (run,) = sink.wait_for("model_publish", model, 1)
    assert run.conf["model_version"] == version
    assert reconcile(mlflow, runs_receiver, model) == 0  # nothing left to start
    assert len(sink.of("model_publish", model)) == 1


@pytest.mark.parametrize("first", ["webhook", "watcher"])
def test_one_change_seen_by_the_webhook_and_the_watcher_in_either_order_gives_one_run(
        mlflow, runs_receiver, first):
    model = f"churn-both-{first}"
    time.sleep(3)
    client = _model(mlflow, runs_receiver, model)
    version = _new_version(client, model)
    runs_receiver.sink.wait_for("model_publish", model, 1)
    if first == "watcher":
        runs_receiver.gate.clear()  # MLflow's deliveries wait at the door
    client.set_registered_model_alias(model, "champion", version)
    client.set_model_version_tag(model, version, "tritonflow.retrain", "yes")
    if first == "watcher":
        time.sleep(1)
        assert reconcile(mlflow, runs_receiver, model) == 2
        assert len(runs_receiver.sink.of("canary_promotion", model)) == 1
        runs_receiver.gate.set()
    else:
        runs_receiver.sink.wait_for("canary_promotion", model, 1)
        runs_receiver.sink.wait_for("model_retrain", model, 1, settle_s=0)
        assert reconcile(mlflow, runs_receiver, model) == 0
    time.sleep(3)  # the held deliveries arrive: duplicates
    (run,) = runs_receiver.sink.of("canary_promotion", model)
    assert run.conf["model_version"] == version
    (retrain,) = runs_receiver.sink.of("model_retrain", model)
    assert (retrain.conf["model_version"], retrain.conf["registry_event"]["tag_value"]) == (version, "yes")
    assert len(runs_receiver.sink.of("model_publish", model)) == 1


def test_a_mapped_tag_set_while_no_webhook_delivers_is_started_once_by_the_reconciler(mlflow, runs_receiver):
    model, sink = f"churn-tag-lost-{uuid.uuid4().hex[:6]}", runs_receiver.sink
    time.sleep(3)
    client = _model(mlflow, runs_receiver, model)
    version = _new_version(client, model)
    sink.wait_for("model_publish", model, 1, settle_s=0)
    for hook in client.list_webhooks():  # the tag's delivery is lost: MLflow has no webhook to send it to
        client.delete_webhook(hook.webhook_id)
    time.sleep(3)  # MLflow's webhook cache (2 s here)
    client.set_model_version_tag(model, version, "tritonflow.retrain", "yes")
    client.set_model_version_tag(model, version, "owner", "alice")  # no rule names it: nothing to start

    assert reconcile(mlflow, runs_receiver, model) == 1
    (run,) = sink.of("model_retrain", model)
    assert (run.conf["model_version"], run.conf["registry_event"]["source"]) == (version, "watcher")
    assert reconcile(mlflow, runs_receiver, model) == 0


@pytest.mark.parametrize("first", ["webhook", "watcher"])
def test_a_model_deleted_and_created_again_gets_one_run_per_change_of_its_new_version_1_by_either_path(
        mlflow, runs_receiver, first):
    """MLflow numbers the new model's versions from 1 again: they are not the old version 1's changes."""
    model, sink = f"churn-again-{first}-{uuid.uuid4().hex[:6]}", runs_receiver.sink
    time.sleep(3)
    client = _model(mlflow, runs_receiver, model)

    def changes() -> str:
        version = _new_version(client, model)
        client.set_registered_model_alias(model, "challenger", version)
        client.set_model_version_tag(model, version, "tritonflow.retrain", "yes")
        return version

    old = changes()
    sink.wait_for("model_publish", model, 2, settle_s=0)
    sink.wait_for("model_retrain", model, 1)
    assert reconcile(mlflow, runs_receiver, model) == 0
    client.delete_registered_model(model)
    client.create_registered_model(model)
    if first == "watcher":
        runs_receiver.gate.clear()  # MLflow's deliveries wait at the door: the reconciler sees the changes first
    new = changes()
    assert new == old
    if first == "watcher":
        time.sleep(1)
        assert reconcile(mlflow, runs_receiver, model) == 3
        runs_receiver.gate.set()
        time.sleep(3)  # the held deliveries arrive: duplicates
    else:
        sink.wait_for("model_publish", model, 4, settle_s=0)
        sink.wait_for("model_retrain", model, 2)
        assert reconcile(mlflow, runs_receiver, model) == 0

    publish, retrain = sink.of("model_publish", model), sink.of("model_retrain", model)
    assert sorted(r.conf["registry_event"]["kind"] for r in publish) == ["alias_set"] * 2 + ["version_created"] * 2
    assert len(retrain) == 2
    assert len({r.conf["registry_event"]["change_key"] for r in publish + retrain}) == 6  # one run per change
    created = client.get_model_version(model, new).creation_timestamp
    assert sum(r.conf["registry_event"]["version_created_ms"] == created for r in publish + retrain) == 3
    assert reconcile(mlflow, runs_receiver, model) == 0


def test_an_alias_moved_1_2_1_gives_three_runs_a_replayed_delivery_none_and_each_knows_its_previous(
        mlflow, runs_receiver):
    model = "churn-moves"
    time.sleep(3)
    client = _model(mlflow, runs_receiver, model)
    v1, v2 = _new_version(client, model), _new_version(client, model)
    for n, version in enumerate([v1, v2, v1], start=1):
        client.set_registered_model_alias(model, "champion", version)
        assert len(runs_receiver.sink.wait_for("canary_promotion", model, n, settle_s=0.5)) == n
    runs = runs_receiver.sink.of("canary_promotion", model)
    events = [r.conf["registry_event"] for r in runs]
    # tritonflow's own record of the holder each move replaced (MLflow's payload does not say)
    assert [(e["version"], e["previous_version"]) for e in events] == [(v1, None), (v2, v1), (v1, v2)]
    assert len({e["change_key"] for e in events}) == 3
    assert reconcile(mlflow, runs_receiver, model) == 0

    # A replay: the last delivery again, correctly signed, with the same delivery id.
    delivery_id = runs[-1].conf["delivery_id"]
    body = runs_receiver.store.delivery(delivery_id)["body"]
    ts = str(int(time.time()))
    resp = requests.post(runs_receiver.url, data=body, headers={
        "Content-Type": "application/json", DELIVERY_ID_HEADER: delivery_id, TIMESTAMP_HEADER: ts,
        SIGNATURE_HEADER: sign(SECRET, delivery_id, ts, body)}, timeout=10)
    assert resp.status_code == 409 and "replay" in resp.json()["detail"]
    # The same change under a new delivery id (a second webhook, a resend): acknowledged, no run.
    other = str(uuid.uuid4())
    resp = requests.post(runs_receiver.url, data=body, headers={
        "Content-Type": "application/json", DELIVERY_ID_HEADER: other, TIMESTAMP_HEADER: ts,
        SIGNATURE_HEADER: sign(SECRET, other, ts, body)}, timeout=10)
    assert resp.status_code == 200 and resp.json()["status"] == "duplicate"
    assert len(runs_receiver.sink.of("canary_promotion", model)) == 3


def test_the_previous_champion_recorded_is_tritonflows_not_the_payloads(mlflow, runs_receiver):
    model = "churn-previous"
    time.sleep(3)
    client = _model(mlflow, runs_receiver, model)
    v1, v2, v3 = (_new_version(client, model) for _ in range(3))
    client.set_registered_model_alias(model, "champion", v1)
    runs_receiver.sink.wait_for("canary_promotion", model, 1, settle_s=0.5)
    # A signed delivery claiming another previous holder (v2) for champion -> v3.
    delivery_id, ts = str(uuid.uuid4()), str(int(time.time()))
    body = json.dumps({"entity": "model_version_alias", "action": "created", "timestamp": ts,
                       "data": {"name": model, "alias": "champion", "version": v3,
                                "previous_version": v2, "previous": {"version": v2}}})
    resp = requests.post(runs_receiver.url, data=body, headers={
        "Content-Type": "application/json", DELIVERY_ID_HEADER: delivery_id, TIMESTAMP_HEADER: ts,
        SIGNATURE_HEADER: sign(SECRET, delivery_id, ts, body)}, timeout=10)
    assert resp.status_code == 200, resp.text
    moved = [r.conf["registry_event"] for r in runs_receiver.sink.of("canary_promotion", model)]
    assert [(e["version"], e["previous_version"]) for e in moved] == [(v1, None), (v3, v1)]
    key = moved[-1]["change_key"]
    assert runs_receiver.store.change(key)["previous"] == v1


def test_thirty_versions_with_the_receiver_restarted_in_the_middle_give_thirty_runs(mlflow, tmp_path):
    """10 versions delivered, 10 while the receiver is down (MLflow drops them), 10 after it restarts."""
    sink = RunsSink()
    first = Receiver(tmp_path, mlflow.tracking_uri, sink=sink).__enter__()
    second = None
    model = f"churn-restarts-{uuid.uuid4().hex[:6]}"
    try:
        assert _register(mlflow, first.url) == 0
        time.sleep(3)
        client = _model(mlflow, first, model)
        versions = [_new_version(client, model) for _ in range(10)]
        sink.wait_for("model_publish", model, 10, settle_s=0.5)
        first.__exit__()
        versions += [_new_version(client, model) for _ in range(10)]
        time.sleep(12)  # MLflow's 3 retries (1, 2, 4 s, plus jitter) fail too: it drops those deliveries
        second = Receiver(tmp_path, mlflow.tracking_uri, sink=sink, port=first.port).__enter__()
        versions += [_new_version(client, model) for _ in range(10)]
        sink.wait_for("model_publish", model, 20, settle_s=0.5)
        assert len(sink.of("model_publish", model)) == 20  # the 10 MLflow dropped are missing
        assert reconcile(mlflow, second, model) == 10  # the reconciler starts exactly those
        runs = sink.wait_for("model_publish", model, 30)
        # 0 lost, 0 doubled
        assert sorted(int(r.conf["model_version"]) for r in runs) == sorted(int(v) for v in versions)
        assert reconcile(mlflow, second, model) == 0
    finally:
        (second or first).__exit__()
        for hook in client_of(mlflow).list_webhooks():
            client_of(mlflow).delete_webhook(hook.webhook_id)


def client_of(mlflow) -> MlflowClient:
    return MlflowClient(tracking_uri=mlflow.tracking_uri, registry_uri=mlflow.tracking_uri)


# ------------------------------------------------------------------ @champion moves only through the gates
def _promoted(mlflow, receiver, name: str) -> tuple[MlflowClient, str, str]:
    """A model whose v1 tritonflow promoted (its audit trail says so) and a v2 nobody promoted."""
    from model_registry.registry import DatabaseLock, RegistryClient

    client = _model(mlflow, receiver, name)
    v1, v2 = _new_version(client, name), _new_version(client, name)
    RegistryClient(mlflow.tracking_uri, lock=DatabaseLock(receiver.store.store)).promote(name, v1)
    return client, v1, v2


def _champion(client: MlflowClient, model: str) -> str:
    return str(client.get_registered_model(model).aliases["champion"])


def test_a_champion_moved_by_hand_is_put_back_and_the_new_holder_goes_through_publish_and_the_canary(
        mlflow, runs_receiver):
    model, sink = f"churn-hand-moved-{uuid.uuid4().hex[:6]}", runs_receiver.sink
    time.sleep(3)
    client, v1, v2 = _promoted(mlflow, runs_receiver, model)
    (own,) = sink.wait_for("canary_promotion", model, 1)  # tritonflow's own move: the plain mapping
    assert own.conf["model_version"] == v1

    client.set_registered_model_alias(model, "champion", v2)  # out of band
    published = sink.wait_for("model_publish", model, 3)  # v1, v2 created, then the request
    (request,) = [a for a in published if a.conf["registry_event"]["kind"] == "alias_set"]
    assert (request.conf["model_version"], request.then) == (v2, ("canary_promotion",))
    assert _champion(client, model) == v1  # what serves stays what the registry names
    assert len(sink.of("canary_promotion", model)) == 1  # the put-back started nothing
    tags_v2, tags_v1 = (client.get_model_version(model, v).tags for v in (v2, v1))
    assert (tags_v2["tritonflow.champion_move"], tags_v2["tritonflow.champion_move_serving"]) == ("requested", v1)
    assert tags_v1["tritonflow.champion_restored_from"] == v2
    assert reconcile(mlflow, runs_receiver, model) == 0  # the reconciler finds nothing left


def test_under_refuse_a_hand_move_seen_by_the_reconciler_is_put_back_and_alerted_and_starts_nothing(
        mlflow, runs_receiver):
    model, sink, alerts = f"churn-refused-{uuid.uuid4().hex[:6]}", runs_receiver.sink, []
    runs_receiver.guard.policy, runs_receiver.guard.notify = "refuse", alerts.append
    time.sleep(3)
    client, v1, v2 = _promoted(mlflow, runs_receiver, model)
    sink.wait_for("canary_promotion", model, 1)
    runs_receiver.gate.clear()  # MLflow's delivery waits at the door: the reconciler sees the move first
    client.set_registered_model_alias(model, "champion", v2)
    time.sleep(1)
    assert reconcile(mlflow, runs_receiver, model) == 1  # the change; its mapping starts nothing
    assert _champion(client, model) == v1
    assert [(a["version"], a["serving"]) for a in alerts] == [(v2, v1)] and "refuse" in alerts[0]["text"]
    runs_receiver.gate.set()
    time.sleep(4)  # the held delivery arrives: the move it reports is already undone
    assert len(alerts) == 1 and len(sink.of("canary_promotion", model)) == 1
    assert [a for a in sink.of("model_publish", model) if a.conf["registry_event"]["kind"] == "alias_set"] == []
    assert client.get_model_version(model, v2).tags["tritonflow.champion_move"] == "refused"


# ------------------------------------------------------------------ delivery status
def _operator_login(request: Request):  # stands in for Airflow's login (its own test: tests/plugins/test_webhook.py)
    if request.headers.get("Authorization") != "Bearer operator":
        raise HTTPException(401, "Not authenticated")


def test_the_status_shows_what_was_received_deduped_and_started_and_what_the_reconciler_found(mlflow, tmp_path):
    sink = RunsSink()
    with Receiver(tmp_path, mlflow.tracking_uri, sink=sink, guard=ChampionGuard(mlflow.tracking_uri),
                  status_auth=_operator_login) as rec:
        assert _register(mlflow, rec.url) == 0
        time.sleep(3)
        model = f"churn-status-{uuid.uuid4().hex[:6]}"
        client = _model(mlflow, rec, model)
        version = _new_version(client, model)
        sink.wait_for("model_publish", model, 1)
        rec.gate.clear()  # the alias's delivery waits: the reconciler finds the change first
        client.set_registered_model_alias(model, "challenger", version)
        time.sleep(1)
        assert reconcile(mlflow, rec, model) == 1
        rec.gate.set()
        time.sleep(3)
        url = f"http://127.0.0.1:{rec.port}{URL_PREFIX}{STATUS_PATH}"
        assert requests.get(url, timeout=10).status_code == 401
        status = requests.get(url, headers={"Authorization": "Bearer operator"}, timeout=10).json()
        for hook in client.list_webhooks():
            client.delete_webhook(hook.webhook_id)
    mine = [d for d in status["deliveries"]["last"] if model in (d["change_key"] or "")]
    assert sorted((d["event"], d["outcome"]) for d in mine) == [
        ("model_version.created", "started"), ("model_version_alias.created", "duplicate")]
    (found,) = [c for c in status["reconciler"]["found"] if c["model"] == model]
    assert (found["kind"], found["alias"], found["status"]) == ("alias_set", "challenger", "started")
    assert "registry_events" in status["reconciler"]["polled_at"] and status["reconciler"]["unstarted"] == []


# ------------------------------------------------------------------ restarts during many changes
class Poller:
    """The reconciler polling every ``every_s`` in a thread (the triggerer's part; its state is in the shared DB)."""

    def __init__(self, mlflow, at: dict, model: str, every_s: float = 1.0):
        self.stop_event, self.errors = threading.Event(), []
        self.thread = threading.Thread(target=self.run, args=(mlflow, at, model, every_s), daemon=True)
        self.thread.start()

    def run(self, mlflow, at, model, every_s):
        while not self.stop_event.wait(every_s):
            try:
                reconcile(mlflow, at["receiver"], model)
            except Exception as exc:  # MLflow restarting, the store busy: the next poll retries
                self.errors.append(repr(exc))

    def stop(self):
        self.stop_event.set()
        self.thread.join(timeout=60)


@pytest.mark.slow
def test_two_hundred_changes_with_mlflow_the_receiver_and_the_reconciler_restarted_give_one_run_each(
        mlflow, tmp_path):
    """200 new versions; the receiver, MLflow and the reconciler are each restarted once among them."""
    sink = RunsSink()
    at = {"receiver": Receiver(tmp_path, mlflow.tracking_uri, sink=sink,
                              guard=ChampionGuard(mlflow.tracking_uri)).__enter__()}
    port, model = at["receiver"].port, f"churn-200-{uuid.uuid4().hex[:6]}"
    try:
        assert _register(mlflow, at["receiver"].url) == 0
        time.sleep(3)
        _model(mlflow, at["receiver"], model)  # the reconciler's baseline
        poller, versions = Poller(mlflow, at, model), []
        for i in range(200):
            if i == 50:  # the receiver (the api-server) goes down for 10 versions
                at["receiver"].__exit__()
            if i == 60:
                at["receiver"] = Receiver(tmp_path, mlflow.tracking_uri, sink=sink, port=port,
                                          guard=ChampionGuard(mlflow.tracking_uri)).__enter__()
            if i == 100:  # MLflow restarts (deliveries it had queued are gone)
                mlflow.stop()
                mlflow.start()
            if i == 150:  # the reconciler restarts
                poller.stop()
                poller = Poller(mlflow, at, model)
            versions.append(_new_version(client_of(mlflow), model))
        runs = sink.wait_for("model_publish", model, 200, settle_s=3.0)
        poller.stop()
    finally:
        at["receiver"].__exit__()
        for hook in client_of(mlflow).list_webhooks():
            client_of(mlflow).delete_webhook(hook.webhook_id)
    got = sorted(int(r.conf["model_version"]) for r in runs)
    assert got == sorted(int(v) for v in versions), (len(got), poller.errors[-3:])  # 0 lost, 0 duplicate
