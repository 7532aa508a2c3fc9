"""Benchmark: from a registry change on a real MLflow server to its DAG run queued in Airflow.

Services (real, on loopback): the MLflow tracking server of the local runtime
(:class:`tritonflow.runtime.services.MlflowServer`, SQLite store, its webhook settings), an Airflow
metadata database (``airflow db migrate``, SQLite) holding a ``model_publish`` DAG, and the
plugin's webhook receiver (:func:`tritonflow_plugin.webhook.create_app`, its real
:class:`~tritonflow_plugin.webhook.DagRunSink`) served by uvicorn; the webhook is registered on
MLflow as ``tritonflow registry webhook register`` does.

Three phases on one registered model:

1. **webhooks**: ``--changes`` moves of alias ``challenger`` (each to another version), one every
   ``--spacing`` seconds; MLflow delivers, the receiver queues a ``model_publish`` run.
2. **reconciler alone**: the webhook is deleted; the reconciler
   (:func:`tritonflow_plugin.registry_watcher.poll_once`, every ``--poll`` seconds) finds
   ``--reconciler-changes`` alias moves, spaced by a bit more than the poll interval (a faster move
   is folded with the next one: the registry keeps no history), and queues their runs as
   ``registry_events`` would. Not included: the scheduler's hop from the trigger's asset event to
   the ``registry_events`` run and its trigger task.
3. **restart**: ``--restart-changes`` new versions with the webhook back and the reconciler
   polling, the receiver stopped for the middle third of them (MLflow drops those deliveries
   after its retries) and started again on the same port.

Latency: from just before ``set_registered_model_alias`` to the DAG run's ``queued_at``. Counted
over every phase: changes with no run (lost) and runs beyond one per change (duplicate), from
the ``model_publish`` runs in the metadata DB.

Goals (issue 26): p95 <= 5 s with webhooks; p95 <= poll interval + 5 s through the reconciler
alone; 0 lost and 0 duplicate runs.

Usage::

    .venv/bin/python benchmarks/registry_delivery.py [--changes 20] [--reconciler-changes 6] [--poll 5]

The last line printed is the standard JSON object (:mod:`benchmarks.report`); the exit status is 0
when it measured, whether or not the goals are met.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from report import at_most, equals, finish  # noqa: E402  (benchmarks/ is the script's folder)

SECRET = "registry-delivery-benchmark"
WEBHOOK_GOAL_S = 5.0
#: The reconciler's goal is its poll interval plus this.
RECONCILER_SLACK_S = 5.0
#: Seconds a change gets to show up as a run before it counts as lost.
SETTLE_S = 30.0
CONSUMER_DAG = textwrap.dedent('''\
    import pendulum
    from airflow.sdk import dag, task

    @dag(schedule=None, start_date=pendulum.datetime(2025, 1, 1, tz="UTC"), catchup=False)
    def model_publish():
        @task
        def publish():
            return "ok"
        publish()

    model_publish()
''')


def airflow_home(tmp: Path) -> Path:
    """A migrated Airflow home (SQLite metadata DB) whose dags folder holds the ``model_publish`` DAG."""
    home, dags = tmp / "airflow", tmp / "dags"
    dags.mkdir(parents=True)
    (dags / "model_publish.py").write_text(CONSUMER_DAG)
    os.environ.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                       "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                       "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
                       "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING", "TRITONFLOW_WEBHOOK_SECRET": SECRET})
    subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                   capture_output=True, timeout=900)
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(str(dags))
    if bag.import_errors:
        raise RuntimeError(f"consumer DAG does not parse: {bag.import_errors}")
    sync_bag_to_db(bag, "dags-folder", None)
    return home


class Receiver:
    """The plugin's webhook app with its real DAG-run sink, served by uvicorn on ``port``."""

    def __init__(self, port: int, store_path: Path, tracking_uri: str) -> None:
        import uvicorn
        from fastapi import FastAPI

        from tritonflow.registry_events import URL_PREFIX
        from tritonflow_plugin.champion_guard import ChampionGuard
        from tritonflow_plugin.webhook import DeliveryStore, VersionLookup, create_app

        app = FastAPI()
        app.mount(URL_PREFIX, create_app(secret=SECRET, tolerance_s=300, deliveries=DeliveryStore(store_path),
                                         champion_guard=ChampionGuard(tracking_uri),
                                         versions=VersionLookup(tracking_uri)))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class Reconciler:
    """The reconciler polling every ``poll_s`` in a thread, starting what it finds as registry_events would."""

    def __init__(self, client, store_path: Path, model: str, poll_s: float) -> None:
        from tritonflow_plugin.registry_watcher import SeenStateStore

        self.client, self.model, self.poll_s = client, model, poll_s
        self.seen = SeenStateStore(store_path)
        self.stop_event = threading.Event()
        self.found = 0
        self.poll()  # the baseline
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def poll(self) -> None:
        """One poll: each change found -> its mapped runs, with the change's run ids."""
        from tritonflow_plugin.change_ledger import ChangeLedger, change_run_id
        from tritonflow_plugin.event_mapping import RegistryChange, actions_for, load_mapping
        from tritonflow_plugin.registry_watcher import poll_once
        from tritonflow_plugin.webhook import DagRunSink

        watch_all = load_mapping(str(REPO / "dags" / "registry_events_watch_all.json"))
        ledger = ChangeLedger(self.seen.store)
        for conf in poll_once(self.client, self.seen, "registry_events", watch_all, [self.model], ledger):
            change = RegistryChange(**conf["registry_event"])
            for action in actions_for(change, load_mapping("")):  # registry_events' fire task
                run_id = change_run_id(str(change.change_key), action.dag_id, change.kind)
                for attempt in range(3):
                    try:
                        DagRunSink().deliver(action, run_id)
                        break
                    except Exception as exc:  # the metadata DB busy: the fire task's retry
                        print(f"reconciler: starting {run_id} failed ({attempt + 1}/3): {exc}", file=sys.stderr)
                        time.sleep(1)
            self.found += 1

    def run(self) -> None:
        while not self.stop_event.wait(self.poll_s):
            try:
                self.poll()
            except Exception as exc:  # a registry hiccup: the next poll retries
                print(f"reconciler poll failed: {exc}", file=sys.stderr)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=60)


def runs_of(model: str) -> list[dict]:
    """The ``model_publish`` runs of ``model`` in the metadata DB: change key, version, kind, queued_at."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as s:
        rows = s.query(DagRun).filter(DagRun.dag_id == "model_publish").all()
        return [{"key": r.conf["registry_event"]["change_key"], "kind": r.conf["registry_event"]["kind"],
                 "version": r.conf["model_version"], "delivery": r.conf.get("delivery_id"),
                 "queued_at": r.queued_at.timestamp() if r.queued_at else None}
                for r in rows if (r.conf or {}).get("model_name") == model]


def wait_for_run(key: str, model: str, after: float, timeout_s: float) -> float | None:
    """Seconds from ``after`` to the queued run of the change ``key``; None if it never came."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for run in runs_of(model):
            if run["key"] == key and run["queued_at"] is not None:
                return run["queued_at"] - after
        time.sleep(0.1)
    return None


def new_version(client, model: str) -> str:
    """Register one more version of ``model`` (a run's artifact path; no model files needed)."""
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    return client.create_model_version(model, f"{run.info.artifact_uri}/model", run.info.run_id).version


def move_alias(client, model: str, versions: list[str], moves: range, spacing_s: float,
               wait_s: float) -> list[float | None]:
    """Move ``challenger`` round ``versions`` (move ``i`` to ``versions[i % len]``); each move's latency.

    ``moves`` are the moves' sequence numbers on the alias (1 for its first move): the change key
    tritonflow gives move ``i`` ends with ``|i`` and names the version with its creation time
    (:func:`tritonflow_plugin.change_ledger.change_key`).
    """
    from tritonflow_plugin.change_ledger import change_key
    from tritonflow_plugin.event_mapping import RegistryChange

    created = {v: client.get_model_version(model, v).creation_timestamp for v in set(versions)}
    sent = []
    for i in moves:
        version = versions[i % len(versions)]
        move = RegistryChange(kind="alias_set", model=model, version=version, alias="challenger",
                              version_created_ms=created[version])
        t0 = time.time()
        client.set_registered_model_alias(model, "challenger", version)
        sent.append((change_key(move, i), t0))
        time.sleep(spacing_s)
    return [wait_for_run(key, model, t0, wait_s) for key, t0 in sent]


def p95(values: list[float | None]) -> float | None:
    """The 95th percentile of the measured values (nearest rank), None when a value is missing."""
    if not values or any(v is None for v in values):
        return None
    ordered = sorted(values)  # type: ignore[type-var]
    return round(float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]), 3)


def phase_restart(client, model: str, receiver_at, store: Path, n: int) -> tuple[list[str], float]:
    """``n`` new versions, the receiver down for the middle third; returns the versions and its downtime."""
    versions = [new_version(client, model) for _ in range(n // 3)]
    receiver_at["receiver"].stop()
    down = time.monotonic()
    versions += [new_version(client, model) for _ in range(n // 3)]
    time.sleep(10)  # MLflow's 3 retries fail too: it drops those deliveries
    receiver_at["receiver"] = Receiver(receiver_at["port"], store, receiver_at["uri"])
    downtime = time.monotonic() - down
    versions += [new_version(client, model) for _ in range(n - 2 * (n // 3))]
    return versions, downtime


def count_lost_and_duplicates(model: str, expected: dict[str, int]) -> dict[str, int]:
    """Lost: expected changes (per kind) without a run; duplicate: runs beyond one per change key."""
    runs = runs_of(model)
    keys = {r["key"] for r in runs}
    per_kind = {k: len({r["key"] for r in runs if r["kind"] == k}) for k in expected}
    return {"runs": len(runs), "changes_started": len(keys),
            "lost": sum(max(0, n - per_kind[k]) for k, n in expected.items()),
            "duplicate": len(runs) - len(keys)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=20, help="alias moves delivered by webhooks")
    ap.add_argument("--spacing", type=float, default=0.5, help="seconds between two webhook-phase moves")
    ap.add_argument("--reconciler-changes", type=int, default=6, help="alias moves found by the reconciler alone")
    ap.add_argument("--poll", type=float, default=5.0, help="reconciler poll interval (s)")
    ap.add_argument("--restart-changes", type=int, default=12, help="new versions around a receiver restart")
    args = ap.parse_args()
    for name in ("changes", "reconciler_changes", "restart_changes"):
        if getattr(args, name) < 3:
            ap.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected at least 3")
    if args.poll <= 0 or args.spacing < 0:
        ap.error(f"--poll={args.poll} / --spacing={args.spacing}: expected a positive poll and spacing >= 0")

    with tempfile.TemporaryDirectory(prefix="tf_registry_delivery_") as tmpdir:
        tmp = Path(tmpdir)
        airflow_home(tmp)
        from mlflow import MlflowClient

        from ground.settings import Settings
        from model_registry.webhooks import register_webhook
        from tritonflow.registry_events import SUPPORTED_EVENTS, URL_PREFIX, WEBHOOK_PATH
        from tritonflow.runtime.services import MlflowServer, free_port

        settings = Settings.from_env({}, home=tmp / "home", mlflow_port=free_port(), start_timeout_s=300)
        mlflow = MlflowServer(settings).start()
        try:
            return run_phases(args, tmp, mlflow, MlflowClient(tracking_uri=mlflow.tracking_uri,
                                                              registry_uri=mlflow.tracking_uri),
                              register_webhook, SUPPORTED_EVENTS, f"{URL_PREFIX}{WEBHOOK_PATH}", free_port())
        finally:
            mlflow.stop()


def run_phases(args, tmp: Path, mlflow, client, register_webhook, events, path: str, port: int) -> int:
    """Run the three phases and print the report (see the module docstring)."""
    store = tmp / "coordination.sqlite"
    model = f"churn-delivery-{uuid.uuid4().hex[:6]}"
    client.create_registered_model(model)
    versions = [new_version(client, model) for _ in range(4)]
    at = {"port": port, "uri": mlflow.tracking_uri, "receiver": Receiver(port, store, mlflow.tracking_uri)}
    hook = register_webhook(client, f"http://127.0.0.1:{port}{path}", SECRET,
                            [f"{entity}.{action}" for entity, action in events]).webhook
    time.sleep(3)  # MLflow's webhook cache (2 s on the local runtime's server)
    webhook_s = move_alias(client, model, versions, range(1, args.changes + 1), args.spacing, SETTLE_S)

    client.delete_webhook(hook.webhook_id)
    time.sleep(3)
    reconciler = Reconciler(client, store, model, args.poll)
    moves = range(args.changes + 1, args.changes + args.reconciler_changes + 1)
    reconciler_s = move_alias(client, model, versions, moves, args.poll * 1.2, args.poll + SETTLE_S)

    hook = register_webhook(client, f"http://127.0.0.1:{port}{path}", SECRET,
                            [f"{entity}.{action}" for entity, action in events]).webhook
    time.sleep(3)
    restart_versions, downtime = phase_restart(client, model, at, store, args.restart_changes)
    time.sleep(args.poll * 2 + 5)  # the reconciler's next polls start what MLflow dropped
    reconciler.stop()
    deadline = time.monotonic() + SETTLE_S
    # the first versions were registered before the webhook and the reconciler's baseline: no runs
    expected = {"alias_set": args.changes + args.reconciler_changes, "version_created": len(restart_versions)}
    counts = count_lost_and_duplicates(model, expected)
    while counts["lost"] and time.monotonic() < deadline:
        time.sleep(1)
        counts = count_lost_and_duplicates(model, expected)
    at["receiver"].stop()
    client.delete_webhook(hook.webhook_id)
    return report(args, webhook_s, reconciler_s, counts, downtime)


def report(args, webhook_s, reconciler_s, counts, downtime) -> int:
    """Print the per-phase figures and the standard last line."""
    def summary(values):
        got = [v for v in values if v is not None]
        return {"n": len(values), "missing": len(values) - len(got),
                "median_s": round(statistics.median(got), 3) if got else None,
                "p95_s": p95(values), "max_s": round(max(got), 3) if got else None}

    web, rec = summary(webhook_s), summary(reconciler_s)
    print(f"webhooks: {json.dumps(web)}")
    print(f"reconciler alone (poll {args.poll:g} s): {json.dumps(rec)}")
    print(f"restart phase: receiver down {downtime:.1f} s; all phases: {json.dumps(counts)}")
    goals = {
        "webhook_p95_s": at_most(web["p95_s"], WEBHOOK_GOAL_S, "s"),
        "reconciler_p95_s": at_most(rec["p95_s"], args.poll + RECONCILER_SLACK_S, "s"),
        "lost_runs": equals(counts["lost"], 0),
        "duplicate_runs": equals(counts["duplicate"], 0),
    }
    finish("registry_delivery",
           f"alias set on a real MLflow server -> model_publish run queued in Airflow's metadata DB: "
           f"{args.changes} moves by webhook, {args.reconciler_changes} by the reconciler alone (poll "
           f"{args.poll:g} s, without the scheduler's asset-event hop), {args.restart_changes} new versions "
           "around a receiver restart", goals,
           webhook=web, reconciler=rec, counts=counts, receiver_down_s=round(downtime, 1), poll_s=args.poll)
    return 0


if __name__ == "__main__":
    sys.exit(main())
