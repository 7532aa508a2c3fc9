"""The production-like stack: ``docker-compose.yaml`` is valid and wired the way the DAGs expect.

No Docker engine runs on these machines (``../shared/DESIGN.md`` section 3), so the stack is checked
statically: the file is validated against the Compose Specification JSON schema, interpolated the
way ``docker compose`` does with the defaults it carries (``${VAR:-default}``), and its wiring is
checked with the project's own validators (``repository_sync.storage.parse_s3_repository_url`` for
this failure, ``model_registry.preflight.check_artifact_location`` for this failure, ``Settings.from_env``).

The parts that can run here run for real: the gateway's ``deploy/nginx/nginx.conf`` with the
reload watcher ``deploy/nginx/reload-watcher.sh`` under the local NGINX binary (a small HTTP server
stands in for Triton behind it), Triton's flags against the local Triton 2.51 binary (the release
of the ``tritonserver:24.10`` image), MLflow's server arguments against MLflow 3.17.2's own command
line parser and Airflow's commands against Airflow 3.3.2's parser.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import urlsplit

import pytest
import yaml

from tritonflow.runtime.services import NGINX_BINARY, free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_PATH = ROOT / "docker-compose.yaml"
GPU_OVERRIDE_PATH = ROOT / "docker-compose.gpu.yaml"
ENV_EXAMPLE_PATH = ROOT / ".env.example"
#: The CI clone has ``../shared`` beside the checkout (see ../shared/schemas/README.md).
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "shared" / "schemas" / "compose-spec.json"

#: Airflow 3 components and the ``airflow`` sub-command each service runs.
AIRFLOW_COMPONENTS = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
    "airflow-worker": "celery worker",
}
AIRFLOW_SERVICES = (*AIRFLOW_COMPONENTS, "airflow-init")
#: Every service the DAGs (through connections and TRITONFLOW_* settings) or an operator expects.
EXPECTED_SERVICES = {
    "postgres", "redis", *AIRFLOW_SERVICES, "mlflow", "minio", "minio-init", "triton", "gateway",
    "prometheus", "grafana",
}
#: Container ports each user-facing service must publish on the host.
PUBLISHED_PORTS = {
    "airflow-apiserver": {8080},
    "mlflow": {5000},
    "minio": {9000, 9001},
    "triton": {8000, 8001, 8002},
    "gateway": {8080},
    "prometheus": {9090},
    "grafana": {3000},
}
#: Settings every Airflow component must share, with the same value.
SHARED_AIRFLOW_SETTINGS = (
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CELERY__BROKER_URL",
    "AIRFLOW__CELERY__RESULT_BACKEND",
    "AIRFLOW__CORE__AUTH_MANAGER",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY",
    "AIRFLOW__CORE__FERNET_KEY",
)
#: TRITONFLOW_* variables the stack sets that are not ``Settings`` fields (informational only).
DEPLOYMENT_VARIABLES = {
    "TRITONFLOW_TRITON_GRPC_URL",
}


# ============================================================================ compose helpers
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Apply Compose interpolation (``$$``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:?e}``, ``${V:+a}``)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("braced") or m.group("named")
        op, arg, current = m.group("op"), m.group("arg") or "", env.get(name)
        if op == ":-":
            return current if current else arg
        if op == "-":
            return current if current is not None else arg
        if op in (":?", "?"):
            if not current if op == ":?" else current is None:
                raise ValueError(f"required variable {name} is missing: {arg}")
            return current
        if op == ":+":
            return arg if current else ""
        if op == "+":
            return arg if current is not None else ""
        return current or ""

    return _VARIABLE.sub(sub, value)


def variables_used(value: Any) -> set[str]:
    """Names of the variables a loaded Compose document interpolates (comments excluded)."""
    if isinstance(value, dict):
        return set().union(*(variables_used(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(variables_used(v) for v in value)) if value else set()
    if not isinstance(value, str):
        return set()
    return {m.group("braced") or m.group("named") for m in _VARIABLE.finditer(value) if not m.group("escaped")}


def env_of(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment`` as a dict (list or mapping form)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def argv_of(value: Any) -> list[str]:
    """A ``command``/``entrypoint`` as argv (list or shell-form string)."""
    if value is None:
        return []
    return list(map(str, value)) if isinstance(value, list) else shlex.split(str(value))


def container_ports(service: Mapping[str, Any]) -> set[int]:
    """Container ports a service publishes (short ``[ip:]host:container`` or long syntax)."""
    ports = set()
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            ports.add(int(p["target"]))
        else:
            ports.add(int(str(p).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def host_ports(service: Mapping[str, Any]) -> list[int]:
    """Host ports a service publishes."""
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out.append(int(p["published"]))
        else:
            parts = str(p).split("/")[0].split(":")
            out.append(int(parts[-2]))
    return out


def reachable_ports(service: Mapping[str, Any]) -> set[int]:
    """Ports other containers can rely on: published or ``expose``d ones."""
    return container_ports(service) | {int(str(p).split("/")[0]) for p in service.get("expose") or []}


def bind_mounts(service: Mapping[str, Any]) -> dict[str, str]:
    """``{container path: host path}`` of a service's bind mounts (sources starting with . or /)."""
    out = {}
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            if v.get("type") == "bind":
                out[v["target"]] = v["source"]
            continue
        parts = v.split(":")
        if parts[0].startswith((".", "/")):
            out[parts[1]] = parts[0]
    return out


def named_volumes(service: Mapping[str, Any]) -> dict[str, str]:
    """``{volume name: container path}`` of a service's named volumes."""
    out = {}
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            if v.get("type") == "volume":
                out[v["source"]] = v["target"]
            continue
        parts = v.split(":")
        if len(parts) >= 2 and not parts[0].startswith((".", "/")):
            out[parts[0]] = parts[1]
    return out


def flag_value(argv: list[str], flag: str) -> str | None:
    """Value of ``--flag=value`` or ``--flag value`` in argv (None when absent)."""
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


POSTGRES_URL = re.compile(
    r"postgresql(?:\+\w+)?://(?P<user>[^:@/]+):(?P<password>[^@/]*)@(?P<host>[^:/]+)(?::(?P<port>\d+))?/(?P<db>\w+)"
)


@pytest.fixture(scope="module")
def raw() -> dict:
    """docker-compose.yaml as YAML (anchors and merge keys resolved, variables not)."""
    return yaml.safe_load(COMPOSE_PATH.read_text())


@pytest.fixture(scope="module")
def compose(raw) -> dict:
    """docker-compose.yaml as ``docker compose`` sees it with no .env: every default applied."""
    return interpolate(raw, {})


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


@pytest.fixture(scope="module")
def worker_env(services) -> dict[str, str]:
    return env_of(services["airflow-worker"])


@pytest.fixture(scope="module")
def schema() -> dict:
    if not SCHEMA_PATH.is_file():
        pytest.skip(f"Compose Specification schema not found at {SCHEMA_PATH} (expected ../shared beside the checkout)")
    return json.loads(SCHEMA_PATH.read_text())


def triton_argv(services) -> list[str]:
    return argv_of(services["triton"].get("command"))


def minio_buckets(services) -> set[str]:
    return set(env_of(services["minio-init"])["MINIO_BUCKETS"].split())


# ============================================================================ schema
def schema_errors(schema: dict, document: Any) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_is_valid_against_the_compose_specification(schema, raw, compose):
    assert schema_errors(schema, raw) == []
    assert schema_errors(schema, compose) == []


def test_gpu_override_is_valid_and_reserves_nvidia_gpus_for_triton_only(schema, services):
    override = yaml.safe_load(GPU_OVERRIDE_PATH.read_text())
    assert schema_errors(schema, override) == []
    assert set(override["services"]) == {"triton"}
    devices = interpolate(override, {})["services"]["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    assert "deploy" not in services["triton"], "the base file must run Triton without a GPU"


def test_schema_validation_rejects_a_broken_service(schema, raw):
    broken = json.loads(json.dumps(raw))
    broken["services"]["triton"]["depends_on"] = {"minio-init": {"condition": "when_ready"}}
    assert schema_errors(schema, broken), "the schema check must be able to fail"


# ============================================================================ services and wiring
def test_every_service_the_dags_expect_is_defined(services):
    assert EXPECTED_SERVICES <= set(services), f"missing: {sorted(EXPECTED_SERVICES - set(services))}"


def test_every_depends_on_target_exists_and_waits_on_the_right_condition(services):
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        deps = {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
        for target, spec in deps.items():
            assert target in services, f"{name} depends on undefined service {target!r}"
            condition = spec.get("condition", "service_started")
            if condition == "service_healthy":
                assert "healthcheck" in services[target], (
                    f"{name} waits for {target} to be healthy, which has no healthcheck"
                )
            if services[target].get("restart") == "no":
                assert condition == "service_completed_successfully", (
                    f"{name} must wait for the one-shot {target} to complete, not {condition}"
                )


def test_long_running_services_have_healthchecks_and_restart(services):
    one_shot = {n for n, s in services.items() if s.get("restart") == "no"}
    assert one_shot == {"airflow-init", "minio-init"}
    for name in EXPECTED_SERVICES - one_shot:
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
        assert services[name].get("restart") in ("always", "unless-stopped"), f"{name} is not restarted"


def test_user_facing_services_publish_their_ports_on_distinct_host_ports(services):
    for name, ports in PUBLISHED_PORTS.items():
        assert ports <= container_ports(services[name]), (
            f"{name} publishes {container_ports(services[name])}, needs {ports}"
        )
    published = [p for svc in services.values() for p in host_ports(svc)]
    assert len(published) == len(set(published)), f"host ports collide: {sorted(published)}"


def test_named_volumes_are_declared_and_data_services_persist(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for volume in named_volumes(svc):
            assert volume in declared, f"{name} mounts undeclared volume {volume!r}"
    assert named_volumes(services["postgres"]).get("postgres-data") == "/var/lib/postgresql/data"
    assert named_volumes(services["minio"]).get("minio-data") == "/data"


def test_every_referenced_file_exists(services):
    for name, svc in services.items():
        build = svc.get("build")
        if build:
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            assert context.is_dir(), f"{name}: build context {context} missing"
            dockerfile = context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
            assert dockerfile.is_file(), f"{name}: Dockerfile {dockerfile} missing"
        mounts = bind_mounts(svc)
        for source in mounts.values():
            assert (ROOT / source).exists(), f"{name}: bind mount source {source} missing"
        for arg in argv_of(svc.get("entrypoint")) + argv_of(svc.get("command")):
            if arg.endswith((".sh", ".sql", ".py")) and arg.startswith("/"):
                assert arg in mounts, f"{name} runs {arg}, which no bind mount provides"


def test_one_shot_scripts_parse(services):
    for script in ("deploy/airflow/init.sh", "deploy/minio/init.sh", "deploy/nginx/gateway.sh",
                   "deploy/nginx/reload-watcher.sh"):
        shell = "bash" if "airflow" in script else "sh"
        proc = subprocess.run([shell, "-n", str(ROOT / script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"


# ============================================================================ Triton and S3
def test_triton_runs_nvidia_2_51_image_in_explicit_mode(services):
    triton = services["triton"]
    assert triton["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"
    argv = triton_argv(services)
    assert argv[0] == "tritonserver"
    assert flag_value(argv, "--model-control-mode") == "explicit"


def test_triton_repository_on_minio_matches_the_workers_s3_endpoint(services, worker_env):
    from repository_sync.s3_storage import parse_s3_repository_url

    repository = flag_value(triton_argv(services), "--model-repository")
    assert repository and repository.startswith("s3://http://"), repository
    endpoint = worker_env["MLFLOW_S3_ENDPOINT_URL"]
    # Raises SettingsError when Triton's host:port differs from where the workers push.
    location = parse_s3_repository_url(repository, endpoint_url=endpoint)
    assert location.triton_uri == repository
    assert worker_env["AWS_ENDPOINT_URL_S3"] == endpoint == worker_env["TRITONFLOW_S3_ENDPOINT_URL"]
    assert location.host == "minio" and location.port in reachable_ports(services["minio"])
    workers_location = parse_s3_repository_url(worker_env["TRITONFLOW_REPOSITORY_URI"], endpoint_url=endpoint)
    assert workers_location == location, "the workers publish to another repository than Triton reads"
    assert location.bucket in minio_buckets(services)


def test_triton_and_the_workers_use_the_minio_credentials(services, worker_env):
    minio = env_of(services["minio"])
    for name in ("triton", "mlflow", *AIRFLOW_SERVICES):
        env = env_of(services[name])
        assert env.get("AWS_ACCESS_KEY_ID") == minio["MINIO_ROOT_USER"], name
        assert env.get("AWS_SECRET_ACCESS_KEY") == minio["MINIO_ROOT_PASSWORD"], name


def test_triton_flags_exist_in_the_local_triton_2_51_server(services):
    from tritonflow.runtime.services import triton_environment, triton_server_binary
    from tritonflow.settings import Settings

    settings = Settings.from_env({})
    binary = triton_server_binary(settings)
    if not binary.exists():
        pytest.skip(f"local Triton server not installed at {binary} (scripts/setup_triton_env.sh)")
    proc = subprocess.run([str(binary), "--help"], env=triton_environment(settings), capture_output=True,
                          text=True, timeout=60)
    known = set(re.findall(r"--[a-z][a-z0-9-]+", proc.stdout + proc.stderr))
    assert "--model-repository" in known
    used = {arg.split("=", 1)[0] for arg in triton_argv(services)[1:] if arg.startswith("--")}
    assert used - known == set()


def test_minio_init_creates_every_bucket_the_stack_uses(services, worker_env):
    from repository_sync.layout import find_layout_problems
    from repository_sync.s3_storage import parse_s3_repository_url

    buckets = minio_buckets(services)
    repository = parse_s3_repository_url(flag_value(triton_argv(services), "--model-repository"))
    artifacts = flag_value(argv_of(services["mlflow"]["command"]), "--artifacts-destination")
    logs = worker_env["TRITONFLOW_INFERENCE_LOG_ROOT"]
    for uri in (f"s3://{repository.bucket}", artifacts, logs):
        assert urlsplit(uri).netloc in buckets, f"{uri} is in no bucket minio-init creates ({sorted(buckets)})"
    # Triton refuses an S3 repository path with no object under it: minio-init writes a marker
    # there, and the marker must not count as a model of the repository.
    marker = env_of(services["minio-init"])["TRITON_REPOSITORY_MARKER"]
    bucket, _, key = marker.partition("/")
    assert bucket == repository.bucket and key.startswith(repository.prefix + "/")
    assert find_layout_problems([key[len(repository.prefix) + 1:]]) == []
    assert services["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"
    for name in ("triton", "mlflow", "airflow-worker"):
        assert services[name]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"


# ============================================================================ Airflow
def test_airflow_services_share_executor_database_and_broker(services):
    reference = env_of(services["airflow-worker"])
    assert reference["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    for name in AIRFLOW_SERVICES:
        env = env_of(services[name])
        for key in SHARED_AIRFLOW_SETTINGS:
            assert key in env, f"{name} lacks {key}"
            assert env[key] == reference[key], f"{name}: {key} differs from the worker's"
    db = POSTGRES_URL.search(reference["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert db and db.group("host") == "postgres"
    assert reference["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://")
    broker = urlsplit(reference["AIRFLOW__CELERY__BROKER_URL"])
    assert broker.scheme == "redis" and broker.hostname == "redis"
    assert broker.port in reachable_ports(services["redis"])
    execution = urlsplit(reference["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert execution.hostname == "airflow-apiserver" and execution.path.rstrip("/") == "/execution"
    assert execution.port in container_ports(services["airflow-apiserver"])
    assert reference["AIRFLOW__CORE__AUTH_MANAGER"].startswith("airflow.")


def test_airflow_services_run_the_project_image_and_mount_dags_and_plugins(services):
    images = {services[n]["image"] for n in AIRFLOW_SERVICES}
    assert len(images) == 1, f"Airflow services run different images: {images}"
    for name in AIRFLOW_SERVICES:
        svc = services[name]
        assert svc["build"]["dockerfile"] == "deploy/airflow/Dockerfile"
        mounts = bind_mounts(svc)
        assert mounts.get("/opt/airflow/dags") == "./dags", name
        assert mounts.get("/opt/airflow/plugins") == "./plugins", name
        assert {"tritonflow-home", "gateway-conf", "airflow-logs"} <= set(named_volumes(svc)), name
        if name != "airflow-init":
            assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
            assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_airflow_dockerfile_installs_the_pinned_requirements_and_the_packages():
    dockerfile = (ROOT / "deploy/airflow/Dockerfile").read_text()
    assert re.search(r"^FROM apache/airflow:3\.3\.2-python3\.11\s*$", dockerfile, re.M)
    assert re.search(r"-r /opt/tritonflow/requirements\.txt\s*\\\s*\n"
                     r"\s*-c /opt/tritonflow/constraints/constraints\.txt", dockerfile)
    assert re.search(r"--no-deps -r /opt/tritonflow/constraints/requirements-nodeps\.txt", dockerfile)
    copied = re.findall(r"^COPY(?:\s+--\S+)*\s+(\S+)\s+\S+\s*$", dockerfile, re.M)
    for package in ("tritonflow/", "model_registry/", "drift_checks/", "repository_sync/"):
        assert package in copied, f"{package} is not copied into the image"
    for source in copied:
        assert (ROOT / source).exists(), f"COPY source {source} missing"
    ignore = (ROOT / "deploy/airflow/Dockerfile.dockerignore").read_text().split()
    for source in copied:
        assert f"!{source}" in ignore, f"{source} is excluded from the build context"
    assert "dags" not in " ".join(copied) and "plugins" not in " ".join(copied), "dags/plugins are mounted"


@pytest.fixture(scope="module")
def airflow_cli(services, tmp_path_factory) -> dict:
    """Parse every Airflow command of the stack with Airflow 3.3.2's own CLI parser (subprocess,
    with a throw-away AIRFLOW_HOME, so this test process never imports Airflow's configuration)."""
    commands = {name: argv_of(services[name]["command"]) for name in AIRFLOW_COMPONENTS}
    commands["init: db migrate"] = ["db", "migrate"]
    commands["init: connections add"] = ["connections", "add", "x", "--conn-json", "{}"]
    for name in ("airflow-dag-processor", "airflow-triggerer"):
        test = services[name]["healthcheck"]["test"]
        commands[f"{name} healthcheck"] = shlex.split(test[1])[1:]
    worker_check = shlex.split(services["airflow-worker"]["healthcheck"]["test"][1])
    celery_app = flag_value(worker_check, "--app")
    script = (
        "import importlib, json, sys\n"
        "from airflow.cli import cli_parser\n"
        "from tritonflow_plugin.hooks import MlflowHook, TritonHook\n"
        "parser = cli_parser.get_parser()\n"
        "out = {'hooks': [MlflowHook.default_conn_name, TritonHook.default_conn_name], 'parsed': {}}\n"
        "for name, argv in json.loads(sys.argv[1]).items():\n"
        "    try:\n"
        "        out['parsed'][name] = getattr(parser.parse_args(argv).func, '__name__', 'ok')\n"
        "    except SystemExit:\n"
        "        out['parsed'][name] = None\n"
        "module, _, attr = sys.argv[2].rpartition('.')\n"
        "out['celery_app'] = type(getattr(importlib.import_module(module), attr)).__name__\n"
        "print('RESULT' + json.dumps(out))\n"
    )
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path_factory.mktemp("airflow_home")),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "plugins")]),
               AIRFLOW__CORE__LOAD_EXAMPLES="false")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(commands), celery_app], env=env,
                          capture_output=True, text=True, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"Airflow CLI probe failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(line[len("RESULT"):])


def test_airflow_commands_are_valid_airflow_3_3_cli_commands(airflow_cli):
    assert {k: v for k, v in airflow_cli["parsed"].items() if not v} == {}


def test_worker_healthcheck_pings_an_importable_celery_app(airflow_cli):
    assert airflow_cli["celery_app"] == "Celery"


def test_airflow_init_creates_the_connections_the_hooks_use(services, worker_env, airflow_cli):
    init_env = env_of(services["airflow-init"])
    connections = {
        key[len("_TRITONFLOW_CONN_"):].lower(): json.loads(value)
        for key, value in init_env.items() if key.startswith("_TRITONFLOW_CONN_")
    }
    assert set(airflow_cli["hooks"]) | {"aws_default"} <= set(connections)
    mlflow = connections["mlflow_default"]
    assert (mlflow["host"], mlflow["port"]) == ("mlflow", 5000)
    assert mlflow["port"] in container_ports(services["mlflow"])
    triton = connections["triton_default"]
    assert triton["host"] == "triton" and triton["port"] in container_ports(services["triton"])
    metrics = urlsplit(triton["extra"]["metrics_url"])
    assert (metrics.hostname, metrics.port) == ("triton", int(flag_value(triton_argv(services), "--metrics-port")))
    aws = connections["aws_default"]
    assert aws["extra"]["endpoint_url"] == worker_env["MLFLOW_S3_ENDPOINT_URL"]
    assert (aws["login"], aws["password"]) == (worker_env["AWS_ACCESS_KEY_ID"], worker_env["AWS_SECRET_ACCESS_KEY"])
    init_script = (ROOT / "deploy/airflow/init.sh").read_text()
    assert "airflow_bin\" db migrate" in init_script and "_TRITONFLOW_CONN_" in init_script


# ============================================================================ tritonflow settings
def test_worker_tritonflow_variables_are_settings_and_parse(worker_env, services):
    from tritonflow.settings import ENV_PREFIX, Settings

    known = {ENV_PREFIX + f.metadata["env"] for f in dataclasses.fields(Settings)}
    used = {k for k in worker_env if k.startswith(ENV_PREFIX)}
    assert used - known - DEPLOYMENT_VARIABLES == set(), "unknown TRITONFLOW_* variables"
    settings = Settings.from_env(worker_env)  # raises SettingsError on a badly typed value
    tracking = urlsplit(settings.resolved_mlflow_tracking_uri)
    assert tracking.hostname == "mlflow" and tracking.port in container_ports(services["mlflow"])
    assert worker_env["MLFLOW_TRACKING_URI"] == settings.resolved_mlflow_tracking_uri
    assert settings.triton_metrics_port == int(flag_value(triton_argv(services), "--metrics-port"))
    assert settings.triton_http_port == int(flag_value(triton_argv(services), "--http-port"))
    assert str(settings.home) in named_volumes(services["airflow-worker"]).values()
    assert settings.s3_endpoint_url == worker_env["MLFLOW_S3_ENDPOINT_URL"]
    assert settings.signing_key_path.is_relative_to(settings.home), "the signing key must persist in a volume"
    assert settings.signing_trusted_keys_dir.is_relative_to(settings.home)


def test_worker_environment_passes_the_mlflow_artifact_preflight(worker_env, services):
    """the worker uploads artifacts itself, so it needs the MinIO endpoint too."""
    from model_registry.preflight import check_artifact_location

    artifacts = flag_value(argv_of(services["mlflow"]["command"]), "--artifacts-destination")
    result = check_artifact_location(f"{artifacts}/1/run/artifacts", env=worker_env, head_bucket=False)
    assert result.applies and result.endpoint_url == worker_env["MLFLOW_S3_ENDPOINT_URL"]
    endpoint = urlsplit(result.endpoint_url)
    assert endpoint.hostname == "minio" and endpoint.port in reachable_ports(services["minio"])
    assert env_of(services["mlflow"])["MLFLOW_S3_ENDPOINT_URL"] == result.endpoint_url


# ============================================================================ MLflow and PostgreSQL
def test_mlflow_server_stores_runs_in_postgresql_and_artifacts_on_minio(services, monkeypatch):
    from mlflow.cli import server as server_command

    mlflow = services["mlflow"]
    argv = argv_of(mlflow["command"])
    assert argv[:2] == ["mlflow", "server"]
    env = env_of(mlflow)
    monkeypatch.setenv("MLFLOW_BACKEND_STORE_URI", env["MLFLOW_BACKEND_STORE_URI"])
    params = server_command.make_context("server", argv[2:]).params  # MLflow 3.17.2's own parser
    backend = POSTGRES_URL.match(params["backend_store_uri"])
    assert backend and backend.group("host") == "postgres" and backend.group("db") == "mlflow"
    assert params["serve_artifacts"] is True
    assert urlsplit(params["artifacts_destination"]).scheme == "s3"
    assert params["port"] == 5000 and params["host"] == "0.0.0.0"
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"
    dockerfile = (ROOT / "deploy/mlflow/Dockerfile").read_text()
    for pin in ("mlflow==3.17.2", "psycopg2-binary==", "boto3=="):
        assert pin in dockerfile


def test_mlflow_server_accepts_the_host_name_the_workers_call_it_by(services, worker_env):
    from mlflow.server.security_utils import is_allowed_host_header

    allowed = [h.strip() for h in env_of(services["mlflow"])["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")]
    assert is_allowed_host_header(allowed, urlsplit(worker_env["TRITONFLOW_MLFLOW_TRACKING_URI"]).netloc)
    assert is_allowed_host_header(allowed, f"localhost:{host_ports(services['mlflow'])[0]}")
    assert not is_allowed_host_header(allowed, "attacker.example:5000")


def test_every_database_the_stack_uses_is_created_by_init_sql(services):
    postgres = env_of(services["postgres"])
    created = set(re.findall(r"CREATE\s+DATABASE\s+(\w+)", (ROOT / "deploy/postgres/init.sql").read_text(), re.I))
    created.add(postgres.get("POSTGRES_DB", postgres["POSTGRES_USER"]))
    init_sql = bind_mounts(services["postgres"]).get("/docker-entrypoint-initdb.d/10-tritonflow.sql")
    assert init_sql == "./deploy/postgres/init.sql"
    urls = [m for svc in services.values() for v in env_of(svc).values() for m in POSTGRES_URL.finditer(v)]
    assert {m.group("db") for m in urls} >= {"airflow", "mlflow"}
    for m in urls:
        assert m.group("host") == "postgres"
        assert m.group("db") in created, f"database {m.group('db')!r} is never created"
        assert (m.group("user"), m.group("password")) == (postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"])


# ============================================================================ monitoring
def test_prometheus_scrapes_triton_metrics_port_and_every_target_exists(services):
    prometheus = services["prometheus"]
    config_path = bind_mounts(prometheus)["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load((ROOT / config_path).read_text())
    targets = {
        job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        for job in config["scrape_configs"]
    }
    metrics_port = int(flag_value(triton_argv(services), "--metrics-port"))
    assert f"triton:{metrics_port}" in targets.get("triton", [])
    for job, hosts in targets.items():
        for target in hosts:
            host, port = target.rsplit(":", 1)
            if host == "localhost":
                continue
            assert host in services, f"job {job}: {host} is not a service"
            assert int(port) in reachable_ports(services[host]) | {metrics_port if host == "triton" else -1}, (
                f"job {job}: {target} is neither published nor exposed"
            )


def test_grafana_dashboard_uses_the_provisioned_datasource_and_triton_metrics(services):
    from repository_sync import canary

    grafana = services["grafana"]
    mounts = bind_mounts(grafana)
    datasources_dir = ROOT / mounts["/etc/grafana/provisioning/datasources"]
    datasources = yaml.safe_load((datasources_dir / "prometheus.yml").read_text())
    uid = datasources["datasources"][0]["uid"]
    assert urlsplit(datasources["datasources"][0]["url"]).hostname == "prometheus"
    providers = yaml.safe_load((ROOT / mounts["/etc/grafana/provisioning/dashboards"] / "tritonflow.yml").read_text())
    dashboards_dir = providers["providers"][0]["options"]["path"]
    assert dashboards_dir in mounts, "the dashboard provider reads a folder no mount provides"
    dashboards = list((ROOT / mounts[dashboards_dir]).glob("*.json"))
    assert dashboards
    exprs = []
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == uid, f"{path.name}: panel {panel['title']!r}"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == uid
                exprs.append(target["expr"])
    text = "\n".join(exprs)
    for metric in (canary.SUCCESS_METRIC, canary.FAILURE_METRIC, canary.DURATION_METRIC, canary.QUEUE_METRIC):
        per_version = [e for e in exprs if metric in e and re.search(r"by \([^)]*version", e)]
        assert per_version, f"no panel shows {metric} per model version"
    assert "nv_inference_request_failure" in text and "nv_inference_queue_duration_us" in text


# ============================================================================ .env.example
def test_every_variable_the_stack_reads_is_documented_in_env_example(raw):
    documented = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", ENV_EXAMPLE_PATH.read_text(), re.M))
    used = variables_used(raw) | variables_used(yaml.safe_load(GPU_OVERRIDE_PATH.read_text()))
    assert used - documented == set()


# ============================================================================ gateway
def nginx_blocks(text: str) -> list[tuple[tuple[str, ...], str]]:
    """``(enclosing block names, directive)`` for every directive of an NGINX config."""
    text = re.sub(r"#[^\n]*", "", re.sub(r'"[^"]*"', '""', text))
    out, stack, current = [], [], ""
    for ch in text:
        if ch == "{":
            stack.append(current.split()[0] if current.split() else "")
            current = ""
        elif ch == "}":
            stack.pop()
            current = ""
        elif ch == ";":
            out.append((tuple(stack), " ".join(current.split())))
            current = ""
        else:
            current += ch
    return out


def test_gateway_shares_its_snippet_folders_with_the_workers(services):
    from repository_sync.nginx_router import NginxRouter

    gateway, worker = services["gateway"], services["airflow-worker"]
    gateway_dir = env_of(gateway)["TRITONFLOW_GATEWAY_CONF_DIR"]
    worker_dir = env_of(worker)["TRITONFLOW_GATEWAY_CONF_DIR"]
    volume = next(v for v, path in named_volumes(gateway).items() if path == gateway_dir)
    assert named_volumes(worker).get(volume) == worker_dir, "the workers write snippets the gateway never reads"
    conf = (ROOT / bind_mounts(gateway)["/etc/nginx/nginx.conf"]).read_text()
    directives = nginx_blocks(conf)
    assert (("http",), f"include {gateway_dir}/http.d/*.conf") in directives
    assert (("http", "server"), f"include {gateway_dir}/locations.d/*.conf") in directives
    upstream = NginxRouter(Path("/unused"), reload=["true"]).upstream
    assert (("http", "upstream"), f"server triton:{flag_value(triton_argv(services), '--http-port')}") in directives
    assert f"upstream {upstream}" in " ".join(conf.split())
    listen = [d for blocks, d in directives if blocks == ("http", "server") and d.startswith("listen")]
    assert f"listen {env_of(worker)['TRITONFLOW_GATEWAY_PORT']}" in listen
    assert int(env_of(worker)["TRITONFLOW_GATEWAY_PORT"]) in container_ports(gateway)
    assert urlsplit(env_of(worker)["TRITONFLOW_GATEWAY_URL"]).hostname == "gateway"
    assert services["gateway"]["depends_on"]["triton"]["condition"] == "service_healthy"
    probe = urlsplit(env_of(gateway)["TRITONFLOW_GATEWAY_PROBE_URL"])
    assert probe.hostname == "127.0.0.1" and f"listen {probe.port}" in listen, "the watcher probes another server"
    assert f"location = {probe.path}" in " ".join(conf.split())


class _FakeTriton(http.server.BaseHTTPRequestHandler):
    """Stands in for Triton behind the gateway: answers 200 with the path it was asked for."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@dataclasses.dataclass
class LocalGateway:
    """deploy/nginx/nginx.conf and reload-watcher.sh running under the local NGINX binary."""

    conf_dir: Path
    url: str
    nginx: subprocess.Popen
    watcher: subprocess.Popen


def request_reload(conf_dir: Path, timeout_s: float = 30.0) -> str:
    """Client side of the reload-watcher protocol, as the canary router uses it."""
    from repository_sync.nginx_router import WatcherReload

    return WatcherReload(conf_dir, timeout_s=timeout_s)()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def local_gateway(tmp_path, services) -> Iterator[LocalGateway]:
    """The stack's gateway config with container paths and host names mapped into ``tmp_path``."""
    if not Path(NGINX_BINARY).exists():
        pytest.skip(f"NGINX not installed at {NGINX_BINARY} (scripts/setup.sh installs nginx-light)")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeTriton)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    gateway_dir = env_of(services["gateway"])["TRITONFLOW_GATEWAY_CONF_DIR"]
    conf_dir, state = tmp_path / "gateway-conf", tmp_path / "nginx"
    for d in (conf_dir / "http.d", conf_dir / "locations.d", state / "logs", state / "temp"):
        d.mkdir(parents=True)
    (state / "mime.types").write_text("types { application/json json; text/plain txt; }\n")
    port, status_port = free_port(), free_port()
    temp = "".join(f" {kind}_temp_path {state / 'temp' / kind};"
                   for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    mapping = {
        "user nginx;": "user root;" if os.geteuid() == 0 else "",
        "/var/run/nginx.pid": str(state / "nginx.pid"),
        "/var/log/nginx": str(state / "logs"),
        "/etc/nginx/mime.types": str(state / "mime.types"),
        gateway_dir: str(conf_dir),
        "server triton:8000;": f"server 127.0.0.1:{upstream.server_address[1]};",
        "listen 8080;": f"listen 127.0.0.1:{port};",
        "listen 8081;": f"listen 127.0.0.1:{status_port};",
        "client_max_body_size 64m;": "client_max_body_size 64m;" + temp,
    }
    conf = (ROOT / bind_mounts(services["gateway"])["/etc/nginx/nginx.conf"]).read_text()
    for old, new in mapping.items():
        assert old in conf, f"deploy/nginx/nginx.conf no longer contains {old!r}; update this fixture"
        conf = conf.replace(old, new)
    conf_path = state / "nginx.conf"
    conf_path.write_text(conf)
    nginx_argv = [NGINX_BINARY, "-p", str(state), "-c", str(conf_path), "-e", str(state / "logs" / "error.log")]
    nginx = subprocess.Popen([*nginx_argv, "-g", "daemon off;"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watcher = subprocess.Popen(
        ["sh", str(ROOT / "deploy/nginx/reload-watcher.sh")],
        env=dict(os.environ, TRITONFLOW_GATEWAY_CONF_DIR=str(conf_dir), TRITONFLOW_GATEWAY_RELOAD_POLL_S="0.1",
                 TRITONFLOW_GATEWAY_PROBE_URL=f"http://127.0.0.1:{port}/gateway/reload-token",
                 NGINX_CMD=shlex.join(nginx_argv)),
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    gw = LocalGateway(conf_dir, f"http://127.0.0.1:{port}", nginx, watcher)
    try:
        deadline = time.monotonic() + 30
        while not _get(gw.url + "/gateway/health")[0] == 200:
            if nginx.poll() is not None:
                pytest.fail(f"nginx exited: {nginx.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "gateway not healthy within 30 s"
            time.sleep(0.1)
        yield gw
    finally:
        _stop(watcher)
        _stop(nginx)
        upstream.shutdown()
        upstream.server_close()


def _get(url: str, data: bytes | None = None) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as resp:
            raw = resp.read()
            is_json = resp.headers.get("Content-Type", "").startswith("application/json")
            return resp.status, dict(resp.headers), json.loads(raw) if is_json else {"text": raw.decode()}
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), {}
    except (urllib.error.URLError, OSError):
        return 0, {}, {}


def test_workers_canary_plan_reaches_the_gateway_through_the_reload_watcher(local_gateway):
    from repository_sync.nginx_router import NginxRouter
    from repository_sync.traffic_plan import TrafficPlan

    gw = local_gateway
    router = NginxRouter(gw.conf_dir, reload=lambda: request_reload(gw.conf_dir), test=None)
    status, _, body = _get(gw.url + "/v2/models/churn/infer", data=b"{}")
    assert (status, body["path"]) == (200, "/v2/models/churn/infer"), "no route before any plan"

    router.apply(TrafficPlan.single("churn", 7))
    status, headers, body = _get(gw.url + "/v2/models/churn/infer", data=b"{}")
    assert status == 200 and body["path"] == "/v2/models/churn/versions/7/infer"
    assert headers.get("X-Tritonflow-Version") == "7"

    router.apply(TrafficPlan.canary("churn", champion=7, challenger=8, percent=50))
    served = {_get(gw.url + "/v2/models/churn/infer", data=b"{}")[2]["path"] for _ in range(40)}
    assert served == {"/v2/models/churn/versions/7/infer", "/v2/models/churn/versions/8/infer"}


def test_reload_watcher_reports_a_refused_config_and_nginx_keeps_serving(local_gateway):
    from repository_sync.nginx_router import NginxRouter
    from repository_sync.traffic_plan import TrafficPlan

    gw = local_gateway
    from tritonflow.exceptions import GatewayConfigError

    router = NginxRouter(gw.conf_dir, reload=lambda: request_reload(gw.conf_dir), test=None)
    router.apply(TrafficPlan.single("churn", 3))
    (gw.conf_dir / "http.d" / "broken.conf").write_text("this is not nginx;\n")
    with pytest.raises(GatewayConfigError, match="unknown directive"):
        request_reload(gw.conf_dir)
    status, _, body = _get(gw.url + "/v2/models/churn/infer", data=b"{}")
    assert status == 200 and body["path"] == "/v2/models/churn/versions/3/infer"
    (gw.conf_dir / "http.d" / "broken.conf").unlink()
    assert request_reload(gw.conf_dir) is not None
