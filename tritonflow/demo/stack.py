"""The demo on the docker-compose stack: ``python -m tritonflow.demo --quick --stack compose``.

Everything but the world runs in containers (``scripts/stack.sh up``): the CeleryExecutor with two
worker containers (each its own host and ``TRITONFLOW_HOME``), PostgreSQL for Airflow, MLflow, the
drift history and the leases, Redis, the S3 store holding the Triton repository, the inference logs
and the staged publish files, Triton, the gateway and its reload watcher, the sentinel in the
triggerer. The driver plays the world from the host, through the ports the stack publishes on
127.0.0.1: it trains and registers the champion in MLflow, sends traffic to the gateway, writes the
inference log and the labels to the S3 bucket the stack reads, and creates each logical hour's
``drift_monitor`` run through the api-server's REST API. Two set-up steps a person would also
take: the first champion is published by a ``model_publish`` run the driver creates, and the
gateway is pointed at it by the routing code run in the scheduler container (the canary owns every
later change). The loop's settings (logical hours, canary steps, ...) reach the containers through
a compose override file the driver writes.

The summary adds, per task instance, the host (worker container) that ran it, for each closed
loop the hosts its runs used, and every model-control and promotion lease taken during the run
with the host that held it (read from the coordination database's lease history).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ground.exceptions import RuntimeStartError
from ground.settings import PROJECT_ROOT
from tritonflow.demo.config import (
    LOOP_DAGS,
    SENTINEL_DAG,
    WATCHED_DAG,
    DemoConfig,
    apply_environment,
    environment,
)
from tritonflow.demo.driver import PARSE_TIMEOUT_S, Demo

#: docker-compose.yaml's default host port of each published service (its ``*_PORT`` variables).
COMPOSE_PORTS = {
    "AIRFLOW_PORT": 8080, "MLFLOW_PORT": 5000, "MINIO_PORT": 9000, "MINIO_CONSOLE_PORT": 9001,
    "TRITON_HTTP_PORT": 8000, "TRITON_GRPC_PORT": 8001, "TRITON_METRICS_PORT": 8002,
    "GATEWAY_PORT": 8090, "PROMETHEUS_PORT": 9090,
}


def shifted_ports(shift: int) -> dict[str, int]:
    """The compose stack's host ports moved by ``shift``, so a second stack never meets a user's."""
    return {k: v + shift for k, v in COMPOSE_PORTS.items()}


#: Host ports (on 127.0.0.1) of the demo's stack.
STACK_PORTS = shifted_ports(20000)
#: Compose project of the demo's stack.
STACK_PROJECT = "tritonflow-demo"
#: The compose stack's development credentials (docker-compose.yaml defaults).
ADMIN = ("admin", "admin")
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "tritonflow", "AWS_SECRET_ACCESS_KEY": "tritonflow-minio-secret",
                  "AWS_DEFAULT_REGION": "us-east-1"}
#: Services that run tritonflow's code and read its settings.
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                    "airflow-worker", "airflow-init")
#: Settings of the local demo that are about the host (ports, paths, services): the stack has its own.
HOST_SETTINGS = ("TRITONFLOW_HOME", "TRITONFLOW_TRITON_HTTP_PORT", "TRITONFLOW_TRITON_GRPC_PORT",
                 "TRITONFLOW_TRITON_METRICS_PORT", "TRITONFLOW_MLFLOW_PORT", "TRITONFLOW_GATEWAY_PORT",
                 "TRITONFLOW_AIRFLOW_API_PORT", "TRITONFLOW_AIRFLOW_EXECUTION_API_PORT",
                 "TRITONFLOW_MLFLOW_TRACKING_URI", "TRITONFLOW_REPOSITORY_URI",
                 "TRITONFLOW_INFERENCE_LOG_ROOT", "TRITONFLOW_DRIFT_HISTORY_DB_URL", "TRITONFLOW_SIGNING_KEY_PATH",
                 "TRITONFLOW_SIGNING_TRUSTED_KEYS_DIR", "TRITONFLOW_EVENT_MAPPING_PATH", "TRITONFLOW_START_TIMEOUT_S",
                 "TRITONFLOW_AIRFLOW_DATABASE_URL", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
#: Where the demo's registry mapping is inside the image (the tritonflow package is copied to /opt/tritonflow).
CONTAINER_MAPPING_PATH = "/opt/tritonflow/tritonflow/demo/registry_mapping.json"
#: The stack's inference-log root (docker-compose.yaml's TRITONFLOW_INFERENCE_LOG_ROOT).
STACK_LOG_ROOT = "s3://inference-logs/logs"


def container_environment(cfg: DemoConfig) -> dict[str, str]:
    """The loop settings of a demo run that the stack's containers need (everything but the host's)."""
    env = {k: v for k, v in environment(cfg, {p: 0 for p in (
        "triton_http", "triton_grpc", "triton_metrics", "mlflow", "gateway", "airflow",
        "airflow_execution_api")}).items()
        if k not in HOST_SETTINGS}
    env["TRITONFLOW_EVENT_MAPPING_PATH"] = CONTAINER_MAPPING_PATH
    return env


def driver_environment(cfg: DemoConfig) -> dict[str, str]:
    """The driver's environment: the stack's MLflow, S3 store and gateway through their host ports."""
    mlflow = f"http://127.0.0.1:{STACK_PORTS['MLFLOW_PORT']}"
    s3 = f"http://127.0.0.1:{STACK_PORTS['MINIO_PORT']}"
    return {
        **container_environment(cfg),
        "TRITONFLOW_HOME": str(cfg.home),
        "TRITONFLOW_MLFLOW_TRACKING_URI": mlflow, "MLFLOW_TRACKING_URI": mlflow, "MLFLOW_REGISTRY_URI": mlflow,
        "TRITONFLOW_INFERENCE_LOG_ROOT": STACK_LOG_ROOT,
        "TRITONFLOW_S3_ENDPOINT_URL": s3, "MLFLOW_S3_ENDPOINT_URL": s3, "AWS_ENDPOINT_URL_S3": s3,
        "TRITONFLOW_GATEWAY_URL": f"http://127.0.0.1:{STACK_PORTS['GATEWAY_PORT']}",
        "TRITONFLOW_GATEWAY_PORT": str(STACK_PORTS["GATEWAY_PORT"]),
        **S3_CREDENTIALS,
        "GIT_PYTHON_REFRESH": "quiet", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }


def write_override(path: Path, env: Mapping[str, str]) -> Path:
    """A compose override giving every Airflow service ``env`` (JSON is YAML); returns ``path``."""
    doc = {"services": {name: {"environment": dict(env)} for name in AIRFLOW_SERVICES}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


class ComposeStack:
    """The demo's compose project, driven through ``scripts/stack.sh`` and ``docker-compose``.

    Args:
        override: The compose override file with the demo's settings.
        project: Compose project name.
        workers: Celery worker containers.
    """

    def __init__(self, override: Path, project: str = STACK_PROJECT, workers: int = 2):
        self.override = override
        self.project = project
        self.workers = workers

    def env(self) -> dict[str, str]:
        """The environment ``scripts/stack.sh`` and ``docker-compose`` run with."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONFLOW_", "AIRFLOW", "MLFLOW_"))}
        return {**keep, **{k: str(v) for k, v in STACK_PORTS.items()}, "COMPOSE_PROJECT_NAME": self.project,
                "TRITONFLOW_STACK_WORKERS": str(self.workers), "TRITONFLOW_STACK_OVERRIDES": str(self.override)}

    def stack_sh(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
        """Run ``scripts/stack.sh ARGS`` (output captured)."""
        return subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "stack.sh"), *args], cwd=PROJECT_ROOT,
                              env=self.env(), capture_output=True, text=True, timeout=timeout)

    def up(self) -> None:
        """Build what is missing and start the stack; raise with the tail of its output on failure."""
        proc = self.stack_sh("up")
        if proc.returncode != 0:
            raise RuntimeStartError(f"scripts/stack.sh up failed ({proc.returncode}):\n{proc.stderr[-4000:]}")

    def down(self) -> None:
        """Stop the stack and remove its volumes."""
        self.stack_sh("down", "--volumes", timeout=600)

    def exec_python(self, service: str, code: str, *args: str) -> str:
        """Run ``python - ARGS`` with ``code`` in a running container of ``service``; its stdout."""
        return exec_python(self.project, service, code, *args, files=(str(self.override),), env=self.env())

    def hostnames(self, service: str) -> list[str]:
        """Hostnames of the running containers of ``service``."""
        ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={self.project}",
                              "--filter", f"label=com.docker.compose.service={service}"],
                             capture_output=True, text=True, check=True).stdout.split()
        if not ids:
            return []
        out = subprocess.run(["docker", "inspect", "-f", "{{ .Config.Hostname }}", *ids],
                             capture_output=True, text=True, check=True).stdout
        return sorted(out.split())


def exec_python(project: str, service: str, code: str, *args: str, files: tuple[str, ...] = (),
                env: Mapping[str, str] | None = None) -> str:
    """Run ``python - ARGS`` with ``code`` in a running container of ``service`` of compose ``project``.

    Returns:
        Its stdout.

    Raises:
        RuntimeStartError: The command failed (its stderr's tail in the message).
    """
    cmd = ["docker-compose", "-p", project, "-f", "docker-compose.yaml",
           *[a for f in files for a in ("-f", f)], "exec", "-T", service, "python", "-", *args]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=dict(env) if env is not None else None, input=code,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeStartError(f"{service}: python failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return proc.stdout


#: Routing code run in an Airflow container (argv: model, version): the first champion at 100 %.
ROUTE_CHAMPION = """
import sys
from repository_sync.routing.gateway_probe import wait_live
from repository_sync.routing.traffic_plan import TrafficPlan
from tritonflow.pipelines.canary import CanaryEnvironment
from ground.settings import get_settings
model, version = sys.argv[1], int(sys.argv[2])
env = CanaryEnvironment.from_settings(get_settings())
plan = TrafficPlan.single(model, version, name=f"{model}:initial")
env.router().apply(plan)
wait_live(env.gateway_url, plan)
print("routed", model, version)
"""


#: Code run in an Airflow container: the model-control and promotion lease history (JSON on stdout).
LEASE_HISTORY = """
import json
from ground.coordination import MODEL_CONTROL, PROMOTION, coordination_store
print(json.dumps(coordination_store().lease_history(purposes=(MODEL_CONTROL, PROMOTION))))
"""


def lease_holders(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The lease history as the summary shows it: each lease with its host, and counts per host.

    Args:
        rows: :meth:`ground.coordination.CoordinationStore.lease_history` rows.

    Returns:
        ``{"leases": [{"purpose", "name", "token", "holder", "host", "acquired_at", "released_at",
        "held_s"}], "per_host": {purpose: {host: count}}}``; ``held_s`` is ``None`` for a lease
        never released (lost with its worker, or still held).
    """
    leases: list[dict[str, Any]] = []
    per_host: dict[str, dict[str, int]] = {}
    for r in rows:
        released = r.get("released_at")
        held = round(float(released) - float(r["acquired_at"]), 2) if released is not None else None
        leases.append({"purpose": r["purpose"], "name": r["name"], "token": r["token"], "holder": r.get("holder"),
                       "host": r.get("host"), "acquired_at": r["acquired_at"], "released_at": released,
                       "held_s": held})
        hosts = per_host.setdefault(str(r["purpose"]), {})
        hosts[str(r.get("host"))] = hosts.get(str(r.get("host")), 0) + 1
    return {"leases": leases, "per_host": per_host}


class StackDemo(Demo):
    """:class:`~tritonflow.demo.driver.Demo` on the docker-compose stack instead of the local deployment."""

    def __init__(self, cfg: DemoConfig, progress: Any = None):
        super().__init__(cfg, progress)
        self.stack = ComposeStack(cfg.home.parent / f"{cfg.home.name}-stack-override.json")

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        """Fresh home and override; the stack built and started; the loop DAGs parsed and unpaused."""
        import shutil

        from tritonflow.runtime.airflow_api import AirflowApi

        cfg, p = self.cfg, self.progress
        if cfg.home.exists():
            shutil.rmtree(cfg.home)
        cfg.home.mkdir(parents=True)
        write_override(self.stack.override, container_environment(cfg))
        self.stack.down()  # a stack left by an earlier run: start from empty volumes
        apply_environment(driver_environment(cfg))
        t = time.monotonic()
        self.stack.up()
        workers = self.stack.hostnames("airflow-worker")
        p.step(f"compose stack {self.stack.project} healthy ({time.monotonic() - t:.1f} s): CeleryExecutor, "
               f"workers {workers}, PostgreSQL, Redis, S3, MLflow, Triton, gateway; ports {STACK_PORTS}")
        self.api = AirflowApi(f"http://127.0.0.1:{STACK_PORTS['AIRFLOW_PORT']}", username=ADMIN[0],
                              password=ADMIN[1])
        for dag_id in (*LOOP_DAGS, SENTINEL_DAG):
            self.api.wait_for_dag(dag_id, PARSE_TIMEOUT_S)
            self.api.unpause(dag_id)
        self.api.reparse(WATCHED_DAG)
        p.step(f"airflow: loop DAGs parsed and unpaused ({time.monotonic() - t:.1f} s)")

    def wait_for_airflow(self) -> None:
        """Airflow is up once :meth:`setup` returns."""

    @property
    def gateway_url(self) -> str:
        """The gateway container's published port."""
        return f"http://127.0.0.1:{STACK_PORTS['GATEWAY_PORT']}"

    def publish_champion(self, version: int, dataset_uri: str) -> None:
        """Publish the first champion with a ``model_publish`` run (the training window as its dataset).

        The window is logged as an artifact of the version's MLflow run, so the workers read it as
        ``runs:/<run>/datasets/<file>``.
        """
        client = self.mlflow_client()
        mv = client.get_model_version(self.cfg.model, str(version))
        client.log_artifact(mv.run_id, dataset_uri, "datasets")
        uri = f"runs:/{mv.run_id}/datasets/{Path(dataset_uri).name}"
        t = time.monotonic()
        run_id = f"demo_initial_publish_v{version}"
        self._api.post("/dags/model_publish/dagRuns", {
            "dag_run_id": run_id, "logical_date": None,
            "conf": {"model": self.cfg.model, "version_or_alias": str(version), "dataset_uri": uri},
            "note": "tritonflow demo: the first champion (the driver, as a user)"})
        run = self.wait_run("model_publish", run_id, 1200)
        seconds = time.monotonic() - t
        if run.get("state") != "success":
            raise RuntimeStartError(f"model_publish {run_id} of the first champion ended {run.get('state')}")
        self.event("publish", state="success", seconds=seconds, version=version, run_id=run_id,
                   how="model_publish run created by the driver (initial champion)")
        self.progress.step(f"initial champion version {version} published by model_publish {run_id} "
                           f"on the Celery workers ({seconds:.1f} s)")

    def route_champion(self, version: int) -> None:
        """Point the gateway at the first champion (100 %) from the scheduler container."""
        self.stack.exec_python("airflow-scheduler", ROUTE_CHAMPION, self.cfg.model, str(int(version)))
        self.progress.step(f"gateway: 100 % of {self.cfg.model} -> version {version}")

    def teardown(self) -> None:
        """Stop the traffic; stop the stack unless ``keep_running``."""
        super().teardown()
        if self.cfg.keep_running:
            return
        self.stack.down()
        self.progress.step("compose stack stopped")

    # ------------------------------------------------------------------ report
    def deployment(self) -> dict[str, Any]:
        """What ran the loop: the compose stack and its workers."""
        return {"executor": "CeleryExecutor", "stack": self.stack.project, "metadata_db": "postgresql",
                "workers": self.stack.hostnames("airflow-worker"),
                "airflow_ui": f"http://127.0.0.1:{STACK_PORTS['AIRFLOW_PORT']}"}

    def finish(self) -> dict[str, Any]:
        """The local demo's summary plus the host of every task instance and of each closed loop."""
        summary = super().finish()
        hosts = task_hosts(self._api, summary["dag_runs"])
        summary["task_instances"] = hosts
        by_host: dict[str, int] = {}
        for ti in hosts:
            by_host[ti["hostname"] or "?"] = by_host.get(ti["hostname"] or "?", 0) + 1
        summary["tasks_per_host"] = by_host
        for loop in summary["closed_loops"]:
            loop["hosts"] = loop_hosts(loop, summary["dag_runs"], hosts)
        out = self.stack.exec_python("airflow-scheduler", LEASE_HISTORY).strip().splitlines()
        held = lease_holders(json.loads(out[-1]) if out else [])
        summary["leases"], summary["lease_holders_per_host"] = held["leases"], held["per_host"]
        self.progress.step(f"leases held per host: {json.dumps(held['per_host'])}")
        self.progress.step(f"task instances per host: {json.dumps(by_host)}; closed loops on hosts: "
                           f"{[loop['hosts'] for loop in summary['closed_loops']]}")
        return summary


def task_hosts(api: Any, dag_runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every run's task instances: where each ran and how long it took and waited.

    Returns:
        ``[{"dag_id", "run_id", "task_id", "map_index", "state", "hostname", "duration_s", "queued_s"}]``
        (``queued_s``: from queued to started, the executor's share).
    """
    out = []
    for r in dag_runs:
        doc = api.get(f"/dags/{r['dag_id']}/dagRuns/{r['run_id']}/taskInstances?limit=200")
        for ti in doc.get("task_instances") or []:
            out.append({"dag_id": r["dag_id"], "run_id": r["run_id"], "task_id": ti["task_id"],
                        "map_index": ti.get("map_index"), "state": ti.get("state"),
                        "hostname": ti.get("hostname") or None, "duration_s": ti.get("duration"),
                        "queued_s": _seconds_between(ti.get("queued_when"), ti.get("start_date"))})
    return out


def _seconds_between(start: Any, end: Any) -> float | None:
    """Seconds from one Airflow timestamp to another (``None`` when either is missing)."""
    from tritonflow.demo.runs import parse_time

    s, e = parse_time(start), parse_time(end)
    return round((e - s).total_seconds(), 2) if s is not None and e is not None else None


def loop_hosts(loop: Mapping[str, Any], dag_runs: Sequence[Mapping[str, Any]],
               hosts: Sequence[Mapping[str, Any]]) -> list[str]:
    """Hosts of the task instances of the runs from a closed loop's alert run to its canary run."""
    from tritonflow.demo.runs import parse_time

    by_id = {r["run_id"]: r for r in dag_runs}
    root, canary = by_id.get(loop.get("alert_run")), by_id.get(loop.get("canary_run"))
    if root is None or canary is None:
        return []
    start, end = parse_time(root["start"]), parse_time(canary["end"])
    inside = {r["run_id"] for r in dag_runs
              if (s := parse_time(r["start"])) is not None and start is not None and end is not None
              and start <= s <= end}
    return sorted({h["hostname"] for h in hosts if h["run_id"] in inside and h["hostname"]})
