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
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.compose.stack import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(2400)]

#: Host ports of this test's stack (published on 127.0.0.1 only), away from the compose defaults.
PORTS = {
    "AIRFLOW_PORT": 18080, "MLFLOW_PORT": 15000, "MINIO_PORT": 19000, "MINIO_CONSOLE_PORT": 19001,
    "TRITON_HTTP_PORT": 18000, "TRITON_GRPC_PORT": 18001, "TRITON_METRICS_PORT": 18002,
    "GATEWAY_PORT": 18090, "PROMETHEUS_PORT": 19090,
}
PROJECT = "tritonflow-test"
ADMIN = ("admin", "admin")


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
    env = {**os.environ, "COMPOSE_PROJECT_NAME": PROJECT, **{k: str(v) for k, v in PORTS.items()},
           "TRITONFLOW_STACK_WORKERS": "2", "TRITONFLOW_CANARY_BAKE_S": "5"}
    _docker_usable(env)
    s = Stack(env)
    up = s.sh("up")
    if up.returncode != 0:
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


def test_a_version_published_by_the_celery_workers_loads_from_s3_and_serves(stack):
    """Register a NOAA model in the stack's MLflow, run ``model_publish`` through the scheduler and the
    two Celery workers, then infer on the Triton container: its tasks ran on the workers' hosts, and
    the stages that hand files to one another found them whichever worker ran them."""
    from model_registry.datasets import load_noaa
    from model_registry.noaa_model import train_noaa
    from model_registry.training_registration import Lineage, log_and_register

    data = load_noaa()
    window = data.iloc[0:2000]
    reg = log_and_register(train_noaa(window), window, tracking_uri=stack.url("MLFLOW_PORT"),
                           name="noaa_rain_stack", alias="champion", lineage=Lineage(reason="initial"))
    api = _api(stack)
    api.wait_for_dag("model_publish", 600)
    api.unpause("model_publish")
    run_id = f"stack-publish-{int(time.time())}"
    api.post("/dags/model_publish/dagRuns", {"dag_run_id": run_id, "logical_date": None,
                                             "conf": {"model": "noaa_rain_stack",
                                                      "version_or_alias": str(reg.version)}})
    run = _wait_run(api, "model_publish", run_id, 900)
    tis = api.get(f"/dags/model_publish/dagRuns/{run_id}/taskInstances")["task_instances"]
    states = {t["task_id"]: (t["state"], t["hostname"]) for t in tis}
    assert run["state"] == "success", states
    worker_hosts = {w["Config"]["Hostname"] for w in stack.containers("airflow-worker")}
    assert {h for _, h in states.values() if h} <= worker_hosts, (states, worker_hosts)
    ready = urllib.request.urlopen(f"{stack.url('TRITON_HTTP_PORT')}/v2/models/noaa_rain_stack/versions/"
                                   f"{reg.version}/ready", timeout=10)
    assert ready.status == 200
