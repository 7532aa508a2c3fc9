"""The docker-compose stack, built and started for real (``scripts/stack.sh``), and the loop's first
step run in it: a model version published by the Celery workers, loaded by the Triton container from
the S3 repository and answering inferences.

Needs a Docker engine (``scripts/setup.sh`` installs Debian's ``docker.io`` and ``docker-compose``;
``scripts/stack.sh`` starts ``dockerd`` when it is not running). Where Docker cannot run, the tests
fail saying so: they never skip. Images the machine cannot pull are replaced by the stand-ins of
``deploy/standins`` (``docs/stack.md``); the first build takes several minutes, later ones reuse them.
The stack runs as its own compose project with its own ports, so it never meets a stack a user runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.compose.prestart import PORTS, PROJECT, WEBHOOK_SECRET, prestart_succeeded, stack_env, wait_for_prestart
from tests.compose.stack import ROOT
from tests.polling import wait_until
from tritonflow.demo.stack import ADMIN, ROUTE_CHAMPION, exec_python

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(2400)]

#: The receiver as the stack's MLflow server reaches it, on the stack's own network.
RECEIVER_URL = "http://airflow-apiserver:8080/tritonflow/webhooks/mlflow"


@dataclass
class Stack:
    env: dict[str, str]

    def sh(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ROOT / "scripts/stack.sh"), *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def containers(self, service: str) -> list[dict]:
        ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
                              "--filter", f"label=com.docker.compose.service={service}"],
                             capture_output=True, text=True, check=True).stdout.split()
        if not ids:
            return []
        return json.loads(subprocess.run(["docker", "inspect", *ids], capture_output=True, text=True,
                                         check=True).stdout)

    def url(self, port: str) -> str:
        return f"http://127.0.0.1:{PORTS[port]}"


def _docker_usable(env: dict[str, str]) -> None:
    probe = subprocess.run(["bash", "-c", "command -v dockerd && command -v docker-compose"], env=env,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail("Docker cannot run on this machine: dockerd or docker-compose is missing "
                    "(scripts/setup.sh installs Debian's docker.io and docker-compose)")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    env = stack_env(os.environ)
    _docker_usable(env)
    # scripts/test.sh may have started this stack while the linters ran (tests/compose/prestart.py):
    # wait for that head start, and start the stack here unless it ended with every service healthy
    wait_for_prestart(env)
    s = Stack(env)
    up = None if prestart_succeeded(env) else s.sh("up")
    if up is not None and up.returncode != 0:
        logs = s.sh("logs", "--tail=40", timeout=120)
        s.sh("down", "--volumes", timeout=300)
        pytest.fail(f"scripts/stack.sh up failed ({up.returncode}):\n{up.stderr[-6000:]}\n"
                    f"--- logs ---\n{logs.stdout[-8000:]}")
    try:
        yield s
    finally:
        s.sh("down", "--volumes", timeout=300)


def test_every_service_is_healthy_and_two_workers_run_as_separate_hosts(stack):
    status = stack.sh("status")
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines() if line.strip()]
    running = {r[0] for r in rows if r[1] == "running"}
    assert {"postgres", "redis", "minio", "mlflow", "triton", "gateway", "gateway-exporter", "prometheus",
            "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
            "airflow-worker"} <= running, rows
    assert all(r[2] in ("healthy", "none") for r in rows if r[1] == "running"), rows
    assert {r[0] for r in rows if r[1] == "exited"} <= {"airflow-init", "minio-init"}
    workers = stack.containers("airflow-worker")
    assert len({w["Config"]["Hostname"] for w in workers}) == 2
    # Each worker has its own TRITONFLOW_HOME, as separate hosts would: no volume at that path.
    for w in workers:
        assert not [m for m in w["Mounts"] if m["Destination"] == "/opt/tritonflow-home"], w["Mounts"]


def test_every_published_port_listens_on_loopback_only(stack):
    for service in ("airflow-apiserver", "mlflow", "minio", "triton", "gateway", "prometheus"):
        for c in stack.containers(service):
            bindings = [b for bs in (c["NetworkSettings"]["Ports"] or {}).values() if bs for b in bs]
            assert bindings, service
            assert {b["HostIp"] for b in bindings} == {"127.0.0.1"}, (service, bindings)


def _api(stack):
    from tritonflow.runtime.airflow_api import AirflowApi

    return AirflowApi(stack.url("AIRFLOW_PORT"), username=ADMIN[0], password=ADMIN[1])


def _wait_run(api, dag_id: str, run_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        run = api.get(f"/dags/{dag_id}/dagRuns/{run_id}")
        if run["state"] in ("success", "failed") or time.monotonic() > deadline:
            return run
        time.sleep(2)


MODEL = "noaa_rain_stack"
PROMOTION = "canary_promotion"


def _register(stack, first_day: int, last_day: int, alias: str) -> int:
    from model_registry.datasets import load_noaa
    from model_registry.noaa_model import train_noaa
    from model_registry.training_registration import Lineage, log_and_register

    window = load_noaa().iloc[first_day:last_day]
    reg = log_and_register(train_noaa(window), window, tracking_uri=stack.url("MLFLOW_PORT"), name=MODEL,
                           alias=alias, lineage=Lineage(reason="initial" if alias == "champion" else "manual"))
    return int(reg.version)


def _publish(stack, api, version: int) -> tuple[dict, dict]:
    run_id = f"stack-publish-v{version}-{int(time.time())}"
    api.post("/dags/model_publish/dagRuns", {"dag_run_id": run_id, "logical_date": None,
                                             "conf": {"model": MODEL, "version_or_alias": str(version)}})
    run = _wait_run(api, "model_publish", run_id, 900)
    tis = api.get(f"/dags/model_publish/dagRuns/{run_id}/taskInstances")["task_instances"]
    return run, {t["task_id"]: (t["state"], t["hostname"]) for t in tis}


@pytest.fixture(scope="module")
def champion(stack) -> dict:
    """Version 1 registered @champion, published by ``model_publish`` on the workers, routed 100 %."""
    version = _register(stack, 0, 2000, "champion")
    api = _api(stack)
    for dag_id in ("model_publish", "canary_promotion"):
        api.wait_for_dag(dag_id, 600)
        api.unpause(dag_id)
    run, states = _publish(stack, api, version)
    routed = exec_python(PROJECT, "airflow-scheduler", ROUTE_CHAMPION, MODEL, str(version), env=stack.env)
    return {"version": version, "run": run, "states": states, "routed": routed}


def test_a_version_published_by_the_celery_workers_loads_from_s3_and_serves(stack, champion):
    """``model_publish`` runs through the scheduler and the two Celery workers, then Triton (the
    container) serves it: its tasks ran on the workers' hosts, and the stages that hand files to one
    another found them whichever worker ran them (the staged files travel through S3)."""
    assert champion["run"]["state"] == "success", champion["states"]
    worker_hosts = {w["Config"]["Hostname"] for w in stack.containers("airflow-worker")}
    assert {h for _, h in champion["states"].values() if h} <= worker_hosts, (champion["states"], worker_hosts)
    ready = urllib.request.urlopen(f"{stack.url('TRITON_HTTP_PORT')}/v2/models/{MODEL}/versions/"
                                   f"{champion['version']}/ready", timeout=10)
    assert ready.status == 200
    assert f"routed {MODEL} {champion['version']}" in champion["routed"]


class _Traffic(threading.Thread):
    """Requests to the gateway until stopped; every answer's status and serving version."""

    def __init__(self, url: str):
        from model_registry.datasets import FEATURE_COLUMNS, load_noaa
        from tritonflow.demo.traffic import GatewayClient

        super().__init__(daemon=True)
        self.rows = load_noaa().iloc[2000:2040].reset_index(drop=True)
        self.client = GatewayClient(url, MODEL, list(FEATURE_COLUMNS))
        self.stop = threading.Event()
        self.results: list = []

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            res = self.client.replay(self.rows, [f"kill-test-{n}-{i}" for i in range(len(self.rows))])
            self.results.append(res.assign(t=time.time()))
            n += 1

    def frame(self):
        import pandas as pd

        return pd.concat(self.results, ignore_index=True)


def _triton_versions(stack) -> dict[str, str]:
    req = urllib.request.Request(f"{stack.url('TRITON_HTTP_PORT')}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        index = json.loads(resp.read())
    return {str(m["version"]): m.get("state", "") for m in index if m["name"] == MODEL}


def test_a_worker_killed_mid_canary_leaves_the_champion_serving_and_the_canary_resolved(stack, champion):
    """``docker kill`` the worker running a canary while its first step bakes: every request keeps
    an answer, the lost attempt is failed by the scheduler, and the retry on a worker takes the
    (expired) promotion lease and runs the canary again from its first step to a verdict; at the end
    one version serves, it is READY and it holds ``@champion``, and no version is left loading."""
    import mlflow

    api = _api(stack)
    challenger = _register(stack, 4000, 6000, "challenger")
    run, states = _publish(stack, api, challenger)
    assert run["state"] == "success", states
    traffic = _Traffic(stack.url("GATEWAY_PORT"))
    traffic.start()
    run_id = f"stack-canary-v{challenger}-{int(time.time())}"
    api.post("/dags/canary_promotion/dagRuns", {
        "dag_run_id": run_id, "logical_date": None,
        "conf": {"model": MODEL, "challenger": str(challenger), "champion": champion["version"],
                 "steps": [25, 100], "bake_s": 30, "min_requests": 5}})
    deadline, killed = time.monotonic() + 600, None
    while killed is None and time.monotonic() < deadline:
        tis = api.get(f"/dags/canary_promotion/dagRuns/{run_id}/taskInstances?task_id=canary")["task_instances"]
        canary = next((t for t in tis if t["task_id"] == "canary"), None)
        if canary and canary["state"] == "running" and canary["hostname"]:
            time.sleep(8)  # inside the first step's bake
            subprocess.run(["docker", "kill", canary["hostname"]], check=True, capture_output=True)
            killed = canary["hostname"]
        time.sleep(1)
    assert killed, "the canary task never ran"
    final = _wait_run(api, "canary_promotion", run_id, 900)
    time.sleep(3)
    traffic.stop.set()
    traffic.join(60)
    frame = traffic.frame()
    tis = api.get(f"/dags/canary_promotion/dagRuns/{run_id}/taskInstances?task_id=canary")["task_instances"]
    canary = next(t for t in tis if t["task_id"] == "canary")
    assert final["state"] in ("success", "failed"), final
    assert canary["try_number"] == 2 and canary["state"] in ("success", "failed"), canary
    assert int((frame["status"] != 200).sum()) == 0, frame[frame["status"] != 200].head()
    served_last = frame[frame["t"] >= frame["t"].max() - 2]
    assert served_last["version"].nunique() == 1, served_last["version"].value_counts()
    serving = str(served_last["version"].iloc[0])
    aliases = mlflow.MlflowClient(tracking_uri=stack.url("MLFLOW_PORT")).get_registered_model(MODEL).aliases
    assert str(aliases["champion"]) == serving
    states = _triton_versions(stack)
    assert states.get(serving) == "READY", states
    assert not [v for v, st in states.items() if st not in ("READY", "UNAVAILABLE", "")], states
    expected = str(challenger) if final["state"] == "success" else str(champion["version"])
    assert serving == expected, (final["state"], serving)


def _champion_alias(stack) -> int:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=stack.url("MLFLOW_PORT"))
    return int(client.get_registered_model(MODEL).aliases["champion"])


def _gateway_versions(stack) -> set[str]:
    """Versions the gateway's live plan routes the model to (its conf, read in the gateway container)."""
    from repository_sync.routing.gateway_probe import served_by

    seen = set()
    for _ in range(20):
        version, _, _ = served_by(stack.url("GATEWAY_PORT"), MODEL)
        if version:
            seen.add(str(version))
    return seen


def _canary_log_mentions(api, run_id: str, text: str) -> bool | None:
    """Whether the canary task's log (every try) mentions ``text`` (None when it cannot be read)."""
    try:
        tis = api.get(f"/dags/canary_promotion/dagRuns/{run_id}/taskInstances?task_id=canary")["task_instances"]
        tries = next(t for t in tis if t["task_id"] == "canary")["try_number"]
        return any(text in json.dumps(api.get(f"/dags/canary_promotion/dagRuns/{run_id}/taskInstances/canary/"
                                              f"logs/{n}?full_content=true")) for n in range(1, tries + 1))
    except Exception:  # noqa: BLE001 - informational only
        return None


def test_triton_restarted_mid_canary_resolves_the_canary_and_serves_a_ready_version(stack, champion):
    """``docker restart`` the Triton container while a canary's first step bakes. Triton in explicit
    model-control mode forgets what it had loaded. The canary must still resolve (promote or roll
    back), the desired versions must be loaded again, and at the end the gateway routes only to
    READY versions, ``@champion`` is the version that serves, and no version is left loading.
    Requests that failed while Triton was down are counted and printed (none may fail after)."""
    api = _api(stack)
    before = _champion_alias(stack)  # the worker-kill test may have promoted its challenger
    challenger = _register(stack, 6000, 8000, "challenger")
    run, states = _publish(stack, api, challenger)
    assert run["state"] == "success", states
    traffic = _Traffic(stack.url("GATEWAY_PORT"))
    traffic.start()
    run_id = f"stack-canary-triton-restart-v{challenger}-{int(time.time())}"
    api.post("/dags/canary_promotion/dagRuns", {
        "dag_run_id": run_id, "logical_date": None,
        "conf": {"model": MODEL, "challenger": str(challenger), "champion": before,
                 "steps": [25, 100], "bake_s": 20, "min_requests": 5}})
    deadline, restarted = time.monotonic() + 300, None
    while restarted is None and time.monotonic() < deadline:
        tis = api.get(f"/dags/canary_promotion/dagRuns/{run_id}/taskInstances?task_id=canary")["task_instances"]
        canary = next((t for t in tis if t["task_id"] == "canary"), None)
        if canary and canary["state"] == "running":
            time.sleep(8)  # inside the first step's bake
            triton = stack.containers("triton")[0]["Id"]
            restarted = time.time()
            subprocess.run(["docker", "restart", "-t", "5", triton], check=True, capture_output=True)
            back = time.time()
        time.sleep(1)
    assert restarted, "the canary task never ran"
    final = _wait_run(api, "canary_promotion", run_id, 600)
    resolved = time.time()
    time.sleep(10)
    traffic.stop.set()
    traffic.join(60)
    frame = traffic.frame()
    failed = frame[frame["status"] != 200]
    after = frame[frame["t"] > resolved + 1]
    observed = {"restart_s": round(back - restarted, 1), "canary": final["state"],
                "requests": len(frame), "failed": len(failed),
                "failed_statuses": {str(k): int(v) for k, v in failed["status"].value_counts().items()},
                "failed_after_resolution": int((after["status"] != 200).sum()),
                "triton": _triton_versions(stack), "gateway_routes": sorted(_gateway_versions(stack)),
                "model_control_retried": _canary_log_mentions(api, run_id, "retrying the model-control change")}
    print("triton restart mid-canary:", json.dumps(observed))
    assert final["state"] in ("success", "failed"), final
    assert len(after) > 0 and observed["failed_after_resolution"] == 0, observed
    serving = str(_champion_alias(stack))
    expected = str(challenger) if final["state"] == "success" else str(before)
    assert serving == expected, (final["state"], serving, observed)
    assert observed["triton"].get(serving) == "READY", observed
    assert set(observed["gateway_routes"]) == {serving}, observed
    assert not [v for v, st in observed["triton"].items() if st not in ("READY", "UNAVAILABLE", "")], observed
    assert {str(int(v)) for v in after["version"]} == {serving}, after["version"].value_counts()


def _set_policy(stack, policy: str | None) -> None:
    """Set (``None``: delete) the model's promotion policy tag in the stack's MLflow."""
    from mlflow import MlflowClient

    from tritonflow.pipelines.promotion_policy import POLICY_TAG

    client = MlflowClient(stack.url("MLFLOW_PORT"))
    if policy is None:
        client.delete_registered_model_tag(MODEL, POLICY_TAG)
    else:
        client.set_registered_model_tag(MODEL, POLICY_TAG, policy)


def _pending(requests: list[dict], run_id: str) -> list[dict]:
    """The requests of ``requests`` (:func:`tritonflow.cli.pending_requests`) that run ``run_id`` asks."""
    return [r for r in requests if r["run_id"] == run_id]


def test_the_policies_that_wait_for_a_person_work_on_the_celery_workers(stack, champion):
    """The two promotion policies that wait for a person, in the stack: the approval and each pause
    are human-in-the-loop tasks the triggerer parks and a Celery worker resumes once answered (the
    CLI's answers, over the api-server's REST API). Under ``approve-steps`` a person approves, then
    rolls the canary back at its first pause: the champion serves alone again and the challenger
    is not judged. Under ``approve`` a person rejects the same version before any traffic moves: it
    is tagged rejected at stage ``approval``. (``auto``, the default, is every other canary here.)"""
    from mlflow import MlflowClient

    from tritonflow import cli

    api = _api(stack)
    client = MlflowClient(stack.url("MLFLOW_PORT"))
    before = _champion_alias(stack)
    challenger = _register(stack, 8000, 10000, "challenger")
    run, states = _publish(stack, api, challenger)
    assert run["state"] == "success", states
    conf = {"model": MODEL, "challenger": str(challenger), "champion": before,
            "steps": [50, 100], "bake_s": 10, "min_requests": 5}
    traffic = _Traffic(stack.url("GATEWAY_PORT"))
    traffic.start()
    try:
        _set_policy(stack, "approve-steps")
        steps_run = cli.start_run(api, PROMOTION, conf)
        wait_until("the approval before the canary", lambda: _pending(cli.pending_approvals(api, MODEL), steps_run),
                   600)
        assert cli.answer_approval(api, MODEL, approve=True, run_id=steps_run) == cli.EXIT_OK
        pause = wait_until("the first pause", lambda: _pending(cli.pending_pauses(api, MODEL), steps_run), 600)[0]
        assert pause["subject"].startswith(f"Canary of {MODEL} v{challenger} at 50 %"), pause
        assert cli.decide_pause(api, MODEL, "rollback", comment="stack test", run_id=steps_run) == cli.EXIT_OK
        final = _wait_run(api, PROMOTION, steps_run, 600)
        assert final["state"] == "failed", final  # a rolled-back canary fails its run
        tags = client.get_model_version(MODEL, str(challenger)).tags
        prefix = f"tritonflow.canary.{tags['tritonflow.canary.latest']}."
        pauses = {int(k[len(prefix + "pause."):]): json.loads(v) for k, v in tags.items()
                  if k.startswith(prefix + "pause.") and k[len(prefix + "pause."):].isdigit()}
        first = pauses[1]
        assert (first["decision"], first["source"], first["policy"]) == ("rollback", "person", "approve-steps"), first
        # a person's rollback is no verdict on the challenger: it is not tagged rejected
        assert tags[prefix + "outcome"] == "rolled_back" and tags.get("tritonflow.status") != "rejected", tags
        assert tags["tritonflow.approval.answer"] == "approved", tags
        assert _champion_alias(stack) == before and _gateway_versions(stack) == {str(before)}

        _set_policy(stack, "approve")
        approve_run = cli.start_run(api, PROMOTION, conf)
        wait_until("the approval before the canary", lambda: _pending(cli.pending_approvals(api, MODEL), approve_run),
                   600)
        assert cli.answer_approval(api, MODEL, approve=False, comment="not this week", run_id=approve_run) \
            == cli.EXIT_OK
        final = _wait_run(api, PROMOTION, approve_run, 600)
        tis = api.get(f"/dags/{PROMOTION}/dagRuns/{approve_run}/taskInstances?limit=100")["task_instances"]
        canary = [t["state"] for t in tis if t["task_id"] == "canary"]
        assert final["state"] == "success" and canary == ["skipped"], (final, tis)
        tags = client.get_model_version(MODEL, str(challenger)).tags
        assert (tags["tritonflow.approval.answer"], tags["tritonflow.approval.policy"],
                tags["tritonflow.approval.note"]) == ("rejected", "approve", "not this week"), tags
        assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "approval", tags
        assert _champion_alias(stack) == before and _gateway_versions(stack) == {str(before)}
    finally:
        traffic.stop.set()
        traffic.join(60)
        _set_policy(stack, None)
    frame = traffic.frame()
    assert int((frame["status"] != 200).sum()) == 0, frame[frame["status"] != 200].head()


def _delivery_status(stack, api) -> dict:
    req = urllib.request.Request(f"{stack.url('AIRFLOW_PORT')}/tritonflow/webhooks/status?limit=100",
                                 headers={"Authorization": f"Bearer {api.token()}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_the_stacks_mlflow_delivers_registry_changes_to_the_api_servers_receiver(stack, champion):
    """The README's registry steps in the stack, with MLflow's own delivery: ``tritonflow registry
    webhook register`` creates the webhook on the stack's MLflow (http to a private address, which
    the stack's MLflow allows), a tag set on a version arrives signed at the api-server's receiver,
    and alias ``challenger`` set in MLflow starts exactly one ``model_publish`` run. Last in this
    module: the run it starts is left to the stack's teardown."""
    import sys

    from mlflow import MlflowClient

    api = _api(stack)
    tracking = stack.url("MLFLOW_PORT")
    cli = subprocess.run([sys.executable, "-c", "from tritonflow.cli import main; raise SystemExit(main())",
                          "registry", "webhook", "register", "--url", RECEIVER_URL, "--secret", WEBHOOK_SECRET,
                          "--tracking-uri", tracking], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "webhook" in cli.stdout, cli.stdout + cli.stderr
    client = MlflowClient(tracking)
    version = str(champion["version"])
    time.sleep(6)  # the stack's MLflow caches each event's webhooks for MLFLOW_WEBHOOK_CACHE_TTL=5 s
    before = {r["dag_run_id"] for r in api.dag_runs("model_publish")}
    client.set_model_version_tag(MODEL, version, "stack.webhook.probe", "1")
    client.set_registered_model_alias(MODEL, "challenger", version)
    deadline, status, started = time.monotonic() + 120, {}, []
    while time.monotonic() < deadline:
        status = _delivery_status(stack, api)
        events = {d["event"] for d in status["deliveries"]["last"]}
        started = [r for r in api.dag_runs("model_publish") if r["dag_run_id"] not in before]
        if {"model_version_tag.set", "model_version_alias.created"} <= events and started:
            break
        time.sleep(2)
    assert {"model_version_tag.set", "model_version_alias.created"} <= events, status
    time.sleep(10)  # a second run for the same change would show by now
    started = [r for r in api.dag_runs("model_publish") if r["dag_run_id"] not in before]
    status = _delivery_status(stack, api)  # the run can show before the receiver records its outcome
    assert len(started) == 1, (started, status)
    assert (started[0].get("conf") or {}).get("model_name") == MODEL, started[0]
    alias = [d for d in status["deliveries"]["last"] if d["event"] == "model_version_alias.created"]
    # "duplicate" when the registry watcher (the reconciler) found the change first: one run either way
    assert len(alias) == 1 and alias[0]["outcome"] in ("started", "duplicate"), status
