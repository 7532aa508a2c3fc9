"""The production-like stack: ``docker-compose.yaml`` is valid and wired the way the DAGs expect.

No Docker engine runs on these machines (``../shared/DESIGN.md`` section 3), so the stack is checked
statically: the file is validated against the Compose Specification JSON schema, interpolated the
way ``docker compose`` does with the defaults it carries (``${VAR:-default}``), and its wiring is
checked with the project's own validators (``repository_sync.storage.s3.parse_s3_repository_url`` for
this failure, ``model_registry.preflight.check_artifact_location`` for this failure, ``Settings.from_env``).

The parts that can run here run for real: the gateway's ``deploy/nginx/nginx.conf`` with the
reload watcher ``deploy/nginx/reload-watcher.sh`` under the local NGINX binary (a small HTTP server
stands in for Triton behind it), Triton's flags against the local Triton 2.51 binary (the release
of the ``tritonserver:24.10`` image), MLflow's server arguments against MLflow 3.17.2's own command
line parser and Airflow's commands against Airflow 3.3.2's parser.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.compose.stack import (
    AIRFLOW_COMPONENTS,
    AIRFLOW_SERVICES,
    DEPLOYMENT_VARIABLES,
    ENV_EXAMPLE_PATH,
    EXPECTED_SERVICES,
    GPU_OVERRIDE_PATH,
    POSTGRES_URL,
    PUBLISHED_PORTS,
    ROOT,
    SHARED_AIRFLOW_SETTINGS,
    argv_of,
    bind_mounts,
    container_ports,
    env_of,
    flag_value,
    host_ports,
    interpolate,
    minio_buckets,
    named_volumes,
    reachable_ports,
    triton_argv,
    variables_used,
)


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
    from repository_sync.storage.s3 import parse_s3_repository_url

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
    from ground.settings import Settings
    from tritonflow.runtime.services import triton_environment, triton_server_binary

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
    from repository_sync.storage.s3 import parse_s3_repository_url

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


def test_the_stack_schedules_with_the_local_deployments_timings(services, tmp_path):
    # the stack kept Airflow's defaults (1 s idle sleep, 5 s supervisor wait, 30 s re-parse) while the
    # local deployment had measured and changed them: one definition, airflow_config's
    from ground.settings import Settings
    from tritonflow.runtime.airflow_config import AirflowConfig

    local = AirflowConfig.local(Settings.from_env({}, home=tmp_path)).airflow_cfg()
    for name in AIRFLOW_SERVICES:
        env = env_of(services[name])
        assert float(env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"]) == float(
            local["scheduler"]["scheduler_idle_sleep_time"])
        assert env["AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL"] == local["workers"]["min_heartbeat_interval"]
        for key in ("min_file_process_interval", "refresh_interval"):
            assert env[f"AIRFLOW__DAG_PROCESSOR__{key.upper()}"] == local["dag_processor"][key], key


def test_airflow_services_run_the_project_image_and_mount_dags_and_plugins(services):
    images = {services[n]["image"] for n in AIRFLOW_SERVICES}
    assert len(images) == 1, f"Airflow services run different images: {images}"
    for name in AIRFLOW_SERVICES:
        svc = services[name]
        assert svc["build"]["dockerfile"] == "deploy/airflow/Dockerfile"
        mounts = bind_mounts(svc)
        assert mounts.get("/opt/airflow/dags") == "./dags", name
        assert mounts.get("/opt/airflow/plugins") == "./plugins", name
        assert {"signing-keys", "gateway-conf", "gateway-logs", "airflow-logs"} <= set(named_volumes(svc)), name
        assert "tritonflow-home" not in named_volumes(svc), f"{name}: each container has its own TRITONFLOW_HOME"
        if name != "airflow-init":
            assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
            assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_airflow_dockerfile_installs_the_pinned_requirements_and_the_packages():
    dockerfile = (ROOT / "deploy/airflow/Dockerfile").read_text()
    # The official image by default; scripts/stack.sh's offline build gives the same name to its stand-in.
    assert re.search(r"^ARG AIRFLOW_IMAGE=apache/airflow:3\.3\.2-python3\.11\s*$", dockerfile, re.M)
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == ["${AIRFLOW_IMAGE}", "${AIRFLOW_IMAGE}"]
    assert re.search(r"-r /opt/tritonflow/requirements\.txt\s*\\\s*\n"
                     r"\s*-c /opt/tritonflow/constraints/constraints\.txt", dockerfile)
    assert re.search(r"--no-deps -r /opt/tritonflow/constraints/requirements-nodeps\.txt", dockerfile)
    copied = [src for flags, src in re.findall(r"^COPY((?:\s+--\S+)*)\s+(\S+)\s+\S+\s*$", dockerfile, re.M)
              if "--from=" not in flags]
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
    script = (
        "import json, sys\n"
        "from airflow.cli import cli_parser\n"
        "from tritonflow_plugin.hooks import MlflowHook, TritonHook\n"
        "parser = cli_parser.get_parser()\n"
        "out = {'hooks': [MlflowHook.default_conn_name, TritonHook.default_conn_name], 'parsed': {}}\n"
        "for name, argv in json.loads(sys.argv[1]).items():\n"
        "    try:\n"
        "        out['parsed'][name] = getattr(parser.parse_args(argv).func, '__name__', 'ok')\n"
        "    except SystemExit:\n"
        "        out['parsed'][name] = None\n"
        "print('RESULT' + json.dumps(out))\n"
    )
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path_factory.mktemp("airflow_home")),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "plugins")]),
               AIRFLOW__CORE__LOAD_EXAMPLES="false")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(commands)], env=env,
                          capture_output=True, text=True, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"Airflow CLI probe failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(line[len("RESULT"):])


def test_airflow_commands_are_valid_airflow_3_3_cli_commands(airflow_cli):
    assert {k: v for k, v in airflow_cli["parsed"].items() if not v} == {}


#: The light health check (tritonflow/runtime/stack_health.py) each Airflow service runs, by service.
HEALTH_CHECKS = {
    "airflow-dag-processor": ["job", "--job-type", "DagProcessorJob", "--hostname", "${HOSTNAME}"],
    "airflow-triggerer": ["job", "--job-type", "TriggererJob", "--hostname", "${HOSTNAME}"],
    "airflow-worker": ["celery", "--hostname", "${HOSTNAME}"],
}


@pytest.mark.parametrize("name", sorted(HEALTH_CHECKS))
def test_airflow_services_check_their_health_without_importing_airflow(services, name):
    from tritonflow.runtime import stack_health

    test = services[name]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL", test
    argv = shlex.split(test[1].replace("$$", "$"))
    assert argv[:3] == ["python", "-m", "tritonflow.runtime.stack_health"], argv
    assert argv[3:] == HEALTH_CHECKS[name]
    # the arguments are ones the check accepts (it exits 2 on a usage error, before any I/O)
    with pytest.raises(SystemExit) as exit_:
        stack_health.main([*argv[3:], "--help"])
    assert exit_.value.code == 0


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
    from ground.settings import ENV_PREFIX, Settings

    known = {ENV_PREFIX + f.metadata["env"] for f in dataclasses.fields(Settings)}
    used = {k for k in worker_env if k.startswith(ENV_PREFIX)}
    assert used - known - DEPLOYMENT_VARIABLES == set(), "unknown TRITONFLOW_* variables"
    settings = Settings.from_env(worker_env)  # raises SettingsError on a badly typed value
    tracking = urlsplit(settings.resolved_mlflow_tracking_uri)
    assert tracking.hostname == "mlflow" and tracking.port in container_ports(services["mlflow"])
    assert worker_env["MLFLOW_TRACKING_URI"] == settings.resolved_mlflow_tracking_uri
    assert settings.triton_metrics_port == int(flag_value(triton_argv(services), "--metrics-port"))
    assert settings.triton_http_port == int(flag_value(triton_argv(services), "--http-port"))
    # Each worker is a host of its own (TRITONFLOW_HOME in the container); the signing keys persist in
    # the volume every Airflow container mounts.
    volumes = named_volumes(services["airflow-worker"])
    assert str(settings.home) not in volumes.values()
    assert settings.s3_endpoint_url == worker_env["MLFLOW_S3_ENDPOINT_URL"]
    assert settings.signing_key_path.is_relative_to(volumes["signing-keys"]), "the signing key must persist in a volume"
    assert settings.signing_trusted_keys_dir.is_relative_to(volumes["signing-keys"])


def test_gateway_status_log_is_on_a_volume_nginx_and_every_airflow_service_see_at_one_path(services, worker_env):
    """The router writes the log's path into NGINX's config and the canary opens the same path."""
    from ground.settings import Settings
    from tritonflow.pipelines.canary import CanaryEnvironment

    log = PurePosixPath(worker_env["TRITONFLOW_GATEWAY_ACCESS_LOG"])
    assert log.is_absolute() and log.suffix == ".jsonl", log
    gateway = services["gateway"]
    assert env_of(gateway).get("TRITONFLOW_GATEWAY_ACCESS_LOG") == str(log), "gateway.sh creates another folder"
    shared = [(v, p) for v, p in named_volumes(gateway).items() if log.is_relative_to(p)]
    assert len(shared) == 1, f"NGINX writes {log} to no volume (or several): {named_volumes(gateway)}"
    volume, path = shared[0]
    assert volume != "gateway-conf", "the gateway conf dir is mounted at different paths in the two containers"
    for name in AIRFLOW_SERVICES:
        assert named_volumes(services[name]).get(volume) == path, f"{name} does not see {log}"
        assert env_of(services[name])["TRITONFLOW_GATEWAY_ACCESS_LOG"] == str(log), name
    settings = Settings.from_env(worker_env)
    assert settings.gateway_reload == "watcher"
    env = CanaryEnvironment.from_settings(settings)
    assert (env.gateway_status_log, env.gateway_status_note) == (str(log), ""), "the canary falls back to Triton"


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
    from repository_sync.canary.metrics import DURATION_METRIC, FAILURE_METRIC, QUEUE_METRIC, SUCCESS_METRIC

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
    for metric in (SUCCESS_METRIC, FAILURE_METRIC, DURATION_METRIC, QUEUE_METRIC):
        per_version = [e for e in exprs if metric in e and re.search(r"by \([^)]*version", e)]
        assert per_version, f"no panel shows {metric} per model version"
    assert "nv_inference_request_failure" in text and "nv_inference_queue_duration_us" in text


# ============================================================================ .env.example
def test_every_variable_the_stack_reads_is_documented_in_env_example(raw):
    documented = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", ENV_EXAMPLE_PATH.read_text(), re.M))
    used = variables_used(raw) | variables_used(yaml.safe_load(GPU_OVERRIDE_PATH.read_text()))
    assert used - documented == set()
