"""Typed settings of tritonflow, read from ``TRITONFLOW_*`` environment variables.

Every default is a named module constant, documented with its unit. Nothing is read at import
time: call :func:`get_settings` (or :meth:`Settings.from_env` with an explicit mapping in tests).

Example::

    from tritonflow.settings import get_settings
    s = get_settings()
    s.triton_http_port  # 8000 unless TRITONFLOW_TRITON_HTTP_PORT is set
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from tritonflow.exceptions import SettingsError

ENV_PREFIX = "TRITONFLOW_"

# ---------------------------------------------------------------------------- paths
#: Project root (the folder holding ``requirements.txt``).
PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: State folder for logs, pid files, the local repository and stores (``TRITONFLOW_HOME``).
DEFAULT_HOME = PROJECT_ROOT / ".tritonflow"
#: Virtual environment holding the Triton tools (server, perf_analyzer, Model Analyzer).
DEFAULT_TRITON_VENV = PROJECT_ROOT / ".venv-triton"

# ---------------------------------------------------------------------------- local runtime ports
DEFAULT_HOST = "127.0.0.1"
DEFAULT_TRITON_HTTP_PORT = 8000
DEFAULT_TRITON_GRPC_PORT = 8001
DEFAULT_TRITON_METRICS_PORT = 8002
DEFAULT_MLFLOW_PORT = 5000
DEFAULT_S3_PORT = 5555
DEFAULT_GATEWAY_PORT = 8080
#: Seconds to wait for a started service to report healthy.
DEFAULT_START_TIMEOUT_S = 90.0

# ---------------------------------------------------------------------------- MLflow
#: MLflow tracking server backend; empty means SQLite under ``<home>/mlflow/mlflow.db``.
DEFAULT_MLFLOW_BACKEND_URI = ""
#: Tracking URI the clients use; empty means ``http://<host>:<mlflow_port>``.
DEFAULT_MLFLOW_TRACKING_URI = ""

# ---------------------------------------------------------------------------- Triton target
#: Highest ONNX IR version the target Triton release's ONNX Runtime loads (Triton 2.51 ships
#: ONNX Runtime 1.19, which supports IR 10; see ONNX Runtime's compatibility table).
DEFAULT_MAX_ONNX_IR_VERSION = 10
#: Highest default-domain opset the target ONNX Runtime implements (ORT 1.19: opset 21).
DEFAULT_MAX_ONNX_OPSET = 21
#: Seconds to wait for a model version to become READY after a load request.
DEFAULT_LOAD_TIMEOUT_S = 120.0

# ---------------------------------------------------------------------------- XCom discipline
#: Largest serialised return value (bytes) a tritonflow task may push to XCom (case H24).
DEFAULT_MAX_XCOM_BYTES = 48 * 1024


def _field(default: Any, env: str, doc: str) -> Any:
    return dataclasses.field(default=default, metadata={"env": env, "doc": doc})


@dataclasses.dataclass(frozen=True)
class Settings:
    """All tritonflow settings. Build with :meth:`from_env`; fields are immutable."""

    home: Path = _field(DEFAULT_HOME, "HOME", "State folder: logs, pids, local repository, stores.")
    triton_venv: Path = _field(DEFAULT_TRITON_VENV, "TRITON_VENV", "Triton tools virtualenv.")
    host: str = _field(DEFAULT_HOST, "HOST", "Loopback address the local services bind to.")
    triton_http_port: int = _field(DEFAULT_TRITON_HTTP_PORT, "TRITON_HTTP_PORT", "Triton HTTP port.")
    triton_grpc_port: int = _field(DEFAULT_TRITON_GRPC_PORT, "TRITON_GRPC_PORT", "Triton gRPC port.")
    triton_metrics_port: int = _field(
        DEFAULT_TRITON_METRICS_PORT, "TRITON_METRICS_PORT", "Triton Prometheus metrics port."
    )
    mlflow_port: int = _field(DEFAULT_MLFLOW_PORT, "MLFLOW_PORT", "MLflow tracking server port.")
    s3_port: int = _field(DEFAULT_S3_PORT, "S3_PORT", "Local S3-compatible endpoint (moto) port.")
    gateway_port: int = _field(DEFAULT_GATEWAY_PORT, "GATEWAY_PORT", "NGINX gateway port.")
    start_timeout_s: float = _field(
        DEFAULT_START_TIMEOUT_S, "START_TIMEOUT_S", "Seconds to wait for a service to be healthy."
    )
    mlflow_backend_uri: str = _field(
        DEFAULT_MLFLOW_BACKEND_URI, "MLFLOW_BACKEND_URI", "MLflow server store URI (empty: SQLite)."
    )
    mlflow_tracking_uri: str = _field(
        DEFAULT_MLFLOW_TRACKING_URI, "MLFLOW_TRACKING_URI", "Tracking URI (empty: local server)."
    )
    repository_uri: str = _field(
        "", "REPOSITORY_URI", "Triton model repository: a folder or s3://http://host:port/bucket/prefix."
    )
    max_onnx_ir_version: int = _field(
        DEFAULT_MAX_ONNX_IR_VERSION, "MAX_ONNX_IR_VERSION", "Highest ONNX IR version Triton loads."
    )
    max_onnx_opset: int = _field(DEFAULT_MAX_ONNX_OPSET, "MAX_ONNX_OPSET", "Highest ONNX opset.")
    load_timeout_s: float = _field(
        DEFAULT_LOAD_TIMEOUT_S, "LOAD_TIMEOUT_S", "Seconds to wait for a model version to be READY."
    )
    max_xcom_bytes: int = _field(
        DEFAULT_MAX_XCOM_BYTES, "MAX_XCOM_BYTES", "Largest XCom a task may return (bytes)."
    )

    # ------------------------------------------------------------------ derived values
    @property
    def log_dir(self) -> Path:
        """Folder of service logs (``<home>/logs``)."""
        return self.home / "logs"

    @property
    def run_dir(self) -> Path:
        """Folder of pid files and generated service configs (``<home>/run``)."""
        return self.home / "run"

    @property
    def local_repository(self) -> Path:
        """Default filesystem Triton repository (``<home>/model_repository``)."""
        return self.home / "model_repository"

    @property
    def resolved_repository_uri(self) -> str:
        """The configured repository URI, else the local repository folder."""
        return self.repository_uri or str(self.local_repository)

    @property
    def resolved_mlflow_backend_uri(self) -> str:
        """The MLflow server store, SQLite under ``<home>/mlflow`` unless configured."""
        return self.mlflow_backend_uri or f"sqlite:///{self.home / 'mlflow' / 'mlflow.db'}"

    @property
    def resolved_mlflow_tracking_uri(self) -> str:
        """The tracking URI clients use, the local server unless configured."""
        return self.mlflow_tracking_uri or f"http://{self.host}:{self.mlflow_port}"

    @property
    def triton_http_url(self) -> str:
        """``host:port`` of Triton's HTTP endpoint, as tritonclient expects it."""
        return f"{self.host}:{self.triton_http_port}"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Build settings from ``TRITONFLOW_*`` variables, then apply keyword overrides.

        Args:
            environ: Mapping to read (default ``os.environ``).
            **overrides: Field values that win over the environment.

        Raises:
            SettingsError: A variable cannot be converted to its field's type; the message names
                the variable, the value and the expected type.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = ENV_PREFIX + f.metadata["env"]
            if name in environ:
                values[f.name] = _convert(name, environ[name], f.default)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """Rows of (variable, default, description) for the README's configuration reference."""
        return [
            (ENV_PREFIX + f.metadata["env"], str(f.default), f.metadata["doc"])
            for f in dataclasses.fields(cls)
        ]


def _convert(name: str, raw: str, default: Any) -> Any:
    kind = type(default)
    try:
        if isinstance(default, Path):
            return Path(raw).expanduser()
        if kind is bool:
            if raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if raw.lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        raise SettingsError(
            f"{name}={raw!r} is not a valid {kind.__name__} (expected e.g. {default!r})"
        ) from None


def get_settings(**overrides: Any) -> Settings:
    """Return settings from the current environment, with optional overrides."""
    return Settings.from_env(**overrides)
