"""A real Airflow deployment: api-server, scheduler, dag-processor, triggerer and a Celery worker
on PostgreSQL + Redis (tritonflow.runtime.airflow), with the repository's DAGs and plugin.

* ``drift_monitor`` runs its hourly schedule for three logical hours (a backfill over them) on
  real NOAA rows replayed as inference logs, and every run succeeds;
* two MLflow webhook deliveries sent back to back, signed with MLflow's own signing function,
  reach the plugin's receiver on the api-server and each creates the ``model_publish`` run the
  mapping names, carrying its event; a replay and a bad signature are refused;
* registry changes the reconciler finds while the scheduler is stopped (no webhook) each get one
  ``model_publish`` run once it is back, none lost, none doubled.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.request
import uuid

import numpy as np
import pandas as pd
import pytest

from tests.deployment.airflow_stack import Stack, get_stack
from tests.polling import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOUR = dt.timedelta(hours=1)
#: First backfilled logical hour (inside drift_monitor's start_date .. now).
T0 = dt.datetime(2025, 3, 1, 0, tzinfo=dt.timezone.utc)
HOURS = 3
#: Seconds for all backfilled runs to finish (a task takes seconds on an idle machine, close to a
#: minute on a 2-core machine shared with other test sessions).
RUNS_TIMEOUT_S = 600
TERMINAL = {"success", "failed"}


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory) -> Stack:
    return get_stack(request, tmp_path_factory)


def _hour_frame(noaa: pd.DataFrame, rows: tuple[int, int], start: dt.datetime) -> pd.DataFrame:
    """NOAA rows replayed as one hour of inference records starting at ``start``."""
    from model_registry.datasets import FEATURE_COLUMNS

    part = noaa.iloc[rows[0]:rows[1]].reset_index(drop=True)
    n = len(part)
    out = part[list(FEATURE_COLUMNS)].copy()
    out.insert(0, "request_id", [f"{start:%Y%m%d%H}-{i}" for i in range(n)])
    out.insert(1, "timestamp", pd.Timestamp(start) + pd.to_timedelta(np.arange(n) * (3599 / n), unit="s"))
    out.insert(2, "model_version", 1)
    out["p_rain"] = 0.3
    return out


def _seed_champion_with_logs(stack: Stack) -> None:
    """Champion v1 of ``stack.model`` in MLflow, its drift reference and three hours of logs."""
    from mlflow import MlflowClient

    from drift_checks.inference_log import InferenceLogWriter, LogSchema
    from drift_checks.reference import save_reference
    from model_registry.datasets import FEATURE_COLUMNS, load_noaa

    client = MlflowClient(stack.env["TRITONFLOW_MLFLOW_TRACKING_URI"])
    client.create_registered_model(stack.model)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    client.create_model_version(stack.model, f"{run.info.artifact_uri}/model", run.info.run_id)
    client.set_registered_model_alias(stack.model, "champion", "1")
    noaa = load_noaa()
    root = stack.env["TRITONFLOW_INFERENCE_LOG_ROOT"]
    save_reference(root, stack.model, 1, noaa.iloc[0:3000][list(FEATURE_COLUMNS)], max_rows=3000)
    writer = InferenceLogWriter(root, stack.model,
                                LogSchema({c: "float" for c in FEATURE_COLUMNS}, {"p_rain": "float"}))
    for h in range(HOURS):  # quiet hours: a year of days from inside the reference period each
        writer.write(_hour_frame(noaa, (1000 + 365 * h, 1365 + 365 * h), T0 + h * HOUR))


def _wait_runs(stack: Stack, dag_id: str, predicate, count: int, timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    runs: list[dict] = []
    while time.monotonic() < deadline:
        try:
            runs = [r for r in stack.api.dag_runs(dag_id) if predicate(r)]
        except (TimeoutError, urllib.error.URLError):  # API server busy: ask again
            time.sleep(2)
            continue
        if len(runs) >= count and all(r["state"] in TERMINAL for r in runs):
            return runs
        time.sleep(2)
    pytest.fail(f"{dag_id}: {count} runs not finished within {timeout_s:.0f} s: "
                f"{[(r['dag_run_id'], r['state']) for r in runs]}; logs under {stack.deployment.log_path}")


def _signed_delivery(secret: str, data: dict) -> tuple[bytes, dict[str, str]]:
    """A ``model_version.created`` delivery exactly as MLflow 3's sender builds and signs it."""
    from mlflow.webhooks.constants import (
        WEBHOOK_DELIVERY_ID_HEADER,
        WEBHOOK_SIGNATURE_HEADER,
        WEBHOOK_TIMESTAMP_HEADER,
    )
    from mlflow.webhooks.delivery import _generate_hmac_signature

    body = json.dumps({"entity": "model_version", "action": "created",
                       "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(), "data": data})
    delivery_id, ts = str(uuid.uuid4()), str(int(time.time()))
    return body.encode(), {
        "Content-Type": "application/json",
        WEBHOOK_DELIVERY_ID_HEADER: delivery_id,
        WEBHOOK_TIMESTAMP_HEADER: ts,
        WEBHOOK_SIGNATURE_HEADER: _generate_hmac_signature(secret, delivery_id, ts, body),
    }


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (loopback)
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_signed_mlflow_webhooks_back_to_back_each_create_their_mapped_model_publish_run(stack):
    """Two versions registered in quick succession: two runs, each with its own version.

    Guards against asset-event folding: as asset events, the second delivery joined the first's
    run (which acts on one change) or waited unconsumed for a later event.
    """
    from mlflow import MlflowClient
    from mlflow.webhooks.types import ModelVersionCreatedPayload

    stack.api.wait_for_dag("model_publish", timeout_s=120)
    stack.api.unpause("model_publish")
    # Real versions: the receiver reads each one from MLflow (its creation time names the change).
    client = MlflowClient(stack.env["TRITONFLOW_MLFLOW_TRACKING_URI"])
    model = f"{stack.model}-webhooks"
    client.create_registered_model(model)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    versions = [client.create_model_version(model, f"{run.info.artifact_uri}/model", run.info.run_id).version
                for _ in range(2)]
    url = f"{stack.url}/tritonflow/webhooks/mlflow"
    sent: dict[str, str] = {}
    run_ids: dict[str, str] = {}  # delivery id -> the change's run id the receiver answered
    for version in versions:
        data = dict(ModelVersionCreatedPayload.example(), name=model, version=version)
        body, headers = _signed_delivery(stack.webhook_secret, data)
        status, doc = _post(url, body, headers)
        assert status == 200, doc
        assert doc["status"] == "accepted" and [a["dag_id"] for a in doc["actions"]] == ["model_publish"]
        sent[headers["X-MLflow-Delivery-Id"]] = version
        run_ids[headers["X-MLflow-Delivery-Id"]] = doc["actions"][0]["run_id"]
    assert _post(url, body, headers)[0] == 409  # the same delivery again: a replay
    forged_body, forged = _signed_delivery("not-the-secret", data)
    assert _post(url, forged_body, forged)[0] == 401

    wanted = set(run_ids.values())
    deadline = time.monotonic() + 300
    runs: dict[str, dict] = {}
    while time.monotonic() < deadline and set(runs) != wanted:
        try:
            runs = {r["dag_run_id"]: r for r in stack.api.dag_runs("model_publish") if r["dag_run_id"] in wanted}
        except (TimeoutError, urllib.error.URLError):  # API server busy: ask again
            pass
        time.sleep(2)
    assert set(runs) == wanted, f"model_publish runs: {stack.api.dag_runs('model_publish')}"
    for did, version in sent.items():
        conf = runs[run_ids[did]]["conf"]
        assert (conf["model_name"], conf["model_version"], conf["delivery_id"]) == (model, version, did)
        assert conf["registry_event"]["kind"] == "version_created" and conf["then"] == ["shadow_evaluation"]


def test_drift_monitor_runs_three_logical_hours_to_success_on_celery(stack):
    _seed_champion_with_logs(stack)
    stack.api.wait_for_dag("drift_monitor", timeout_s=120)
    backfill = stack.api.post("/backfills", {
        "dag_id": "drift_monitor",
        "from_date": T0.isoformat(),
        "to_date": (T0 + (HOURS - 1) * HOUR).isoformat(),
        "dag_run_conf": {"evidently": False, "profile": False},
        "max_active_runs": HOURS,
    })
    stack.api.unpause("drift_monitor")

    runs = _wait_runs(stack, "drift_monitor", lambda r: r["run_type"] == "backfill", HOURS, RUNS_TIMEOUT_S)

    assert backfill["dag_id"] == "drift_monitor"
    starts = sorted(pd.Timestamp(r["data_interval_start"]) for r in runs)
    assert starts == [pd.Timestamp(T0 + h * HOUR) for h in range(HOURS)]
    assert {r["dag_run_id"]: r["state"] for r in runs} == {r["dag_run_id"]: "success" for r in runs}
    # Each hour really checked the model's window on the worker: the check task ran for our model
    # and the drift history holds one value per hour.
    for run in runs:
        tis = stack.api.get(f"/dags/drift_monitor/dagRuns/{run['dag_run_id']}/taskInstances?limit=100")
        checks = [t for t in tis["task_instances"] if t["task_id"] == "check"]
        assert [t["state"] for t in checks] == ["success"], checks
    from drift_checks.history import HistoryStore

    history = HistoryStore(stack.env["TRITONFLOW_DRIFT_HISTORY_DB_URL"]).values(stack.model, "temperature", "psi")
    assert len(history) == HOURS


# ------------------------------------------------------------------ the scheduler restarted
#: Seconds from the scheduler's restart until every change found while it was down has its run:
#: the grace period before the reconciler sends a change again (15 s here), a poll (5 s), two
#: registry_events runs on the Celery worker, with room for a loaded machine.
SCHEDULER_BACK_BOUND_S = 150


def _wait_until(what: str, check, timeout_s: float, state=lambda: ""):
    """``check()``'s first truthy value, polled every second; after ``timeout_s`` fail with ``what`` and ``state()``."""
    return wait_until(what, check, timeout_s, interval_s=1.0, state=state)


def _found_versions(ledger, model: str) -> dict[str, dict]:
    """The changes of ``model`` the change ledger holds: ``{version: entry}`` (``entry["key"]``: the key)."""
    from tritonflow_plugin.change_ledger import CHANGES

    return {v["change"]["version"]: {**v, "key": k} for k, v, _ in ledger.latest(CHANGES, 500)
            if v["change"]["model"] == model}


def _model_publish_runs(stack: Stack, model: str) -> list[dict]:
    doc = stack.api.get("/dags/model_publish/dagRuns?limit=100&order_by=-id")
    return [r for r in doc["dag_runs"] if (r.get("conf") or {}).get("model_name") == model]


def test_registry_changes_found_while_the_scheduler_is_down_each_start_one_run_once_it_is_back(stack):
    """No webhook: the reconciler finds three versions in two or more polls while no scheduler runs.

    Airflow queues the first poll's event and, once the scheduler is back, closes the run's event
    window at that event's time: the second poll's event is left for a later one. The reconciler
    sends a change again until ``registry_events`` has started its runs.
    """
    from mlflow import MlflowClient

    from tritonflow_plugin.change_ledger import ChangeLedger, change_run_id
    from tritonflow_plugin.registry_watcher import SeenStateStore

    url = stack.env["TRITONFLOW_DRIFT_HISTORY_DB_URL"]  # the deployment's coordination database
    seen, ledger = SeenStateStore(url), ChangeLedger(url)
    client = MlflowClient(stack.env["TRITONFLOW_MLFLOW_TRACKING_URI"])
    model = f"{stack.model}-scheduler-down"
    stack.api.wait_for_dag("registry_events", timeout_s=120)
    stack.api.wait_for_dag("model_publish", timeout_s=120)
    stack.api.unpause("registry_events")
    stack.api.reparse("registry_events")  # its watcher starts when the file of the unpaused DAG is parsed
    try:
        _wait_until("the registry watcher's first poll", lambda: seen.store.get_state(seen.SCOPE, "registry_events"),
                    120)
        client.create_registered_model(model)
        run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
        versions: list[str] = []
        stack.deployment.scheduler.stop()
        try:
            for count in (1, 2):  # two polls, two asset events
                versions += [client.create_model_version(model, f"{run.info.artifact_uri}/model",
                                                         run.info.run_id).version for _ in range(count)]
                made = set(versions)
                _wait_until(f"the reconciler finding versions {versions}",
                            lambda made=made: set(_found_versions(ledger, model)) == made, 60)
        finally:
            stack.deployment.scheduler.start()
        back = time.monotonic()
        found = _found_versions(ledger, model)
        wanted = {change_run_id(found[v]["key"], "model_publish", "version_created"): v for v in versions}
        _wait_until(f"a model_publish run for each of versions {versions}",
                    lambda: {r["dag_run_id"] for r in _model_publish_runs(stack, model)} >= set(wanted),
                    SCHEDULER_BACK_BOUND_S,
                    lambda: f"runs of {[r['conf']['model_version'] for r in _model_publish_runs(stack, model)]}")
        print(f"a model_publish run for each of {len(versions)} versions {time.monotonic() - back:.0f} s "
              "after the scheduler's restart")
        _wait_until("each change marked started", lambda: all(
            e["status"] == "started" for e in _found_versions(ledger, model).values()), 60,
            lambda: {v: e["status"] for v, e in _found_versions(ledger, model).items()})
        runs = _model_publish_runs(stack, model)
        assert sorted((r["dag_run_id"], r["conf"]["model_version"]) for r in runs) == sorted(wanted.items())
        # confirmed by registry_events's run that created them, with their run ids
        assert {v: e["runs"] for v, e in _found_versions(ledger, model).items()} == {
            v: [rid] for rid, v in wanted.items()}
    finally:
        stack.api.patch("/dags/registry_events", {"is_paused": True})  # the other tests' changes start nothing
        for run_id in [r["dag_run_id"] for r in _model_publish_runs(stack, model) if r["state"] not in TERMINAL]:
            # versions without a model: their runs need not hold the queue of later tests' runs
            stack.api.patch(f"/dags/model_publish/dagRuns/{run_id}", {"state": "failed"})
