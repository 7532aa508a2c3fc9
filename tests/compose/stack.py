"""The production-like stack read the way ``docker compose`` reads it: paths, the expected services and
ports, and the interpolation helpers the compose tests share (their fixtures are in ``conftest.py``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_PATH = ROOT / "docker-compose.yaml"
GPU_OVERRIDE_PATH = ROOT / "docker-compose.gpu.yaml"
ENV_EXAMPLE_PATH = ROOT / ".env.example"
#: The CI clone has ``../shared`` beside the checkout (see ../shared/schemas/README.md).
SCHEMA_PATH = Path(__file__).resolve().parents[3] / "shared" / "schemas" / "compose-spec.json"

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


def triton_argv(services) -> list[str]:
    return argv_of(services["triton"].get("command"))


def minio_buckets(services) -> set[str]:
    return set(env_of(services["minio-init"])["MINIO_BUCKETS"].split())
