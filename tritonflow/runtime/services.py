"""Local runtime: start, health-check and stop real services on loopback.

Services (each on configurable ports, logs under ``<home>/logs/<service>.log``):

* :class:`TritonServer` -- Triton 2.51 from the ``nvidia-pytriton`` wheel in explicit
  model-control mode, over a local folder or ``s3://http://host:port/bucket/prefix``, with the
  Python backend and tritonflow's Python-based ``onnxruntime`` backend.
* :class:`MlflowServer` -- an MLflow tracking server (SQLite by default, PostgreSQL when
  ``TRITONFLOW_MLFLOW_BACKEND_URI`` says so) that also serves artifacts.
* :class:`S3Server` -- an S3-compatible endpoint for tests (``moto_server``).
* :class:`NginxGateway` -- NGINX in front of Triton; the canary router writes its split rules into
  ``<conf_dir>/http.d/*.conf`` and ``<conf_dir>/locations.d/*.conf``.

A service that fails to start raises :class:`~ground.exceptions.RuntimeStartError` saying why
(port taken, binary missing, the process exited, or a timeout, with the log tail) and leaves
nothing running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

from ground.exceptions import RuntimeStartError
from ground.settings import Settings

#: Lines of the service log quoted in a start-up error.
LOG_TAIL_LINES = 25
#: Seconds a stopping service gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 10.0
#: Seconds between two health probes during start-up.
HEALTH_POLL_S = 0.25

_BACKENDS_SRC = Path(__file__).resolve().parent / "backends"


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts connections or holds a bind on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when ``GET url`` answers with a 2xx status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback only)
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Service:
    """A child process with ports, a log file, a pid file and an HTTP health check.

    Subclasses define :attr:`name`, :meth:`command`, :meth:`ports` and :meth:`health_url`.
    """

    name = "service"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.process: subprocess.Popen | None = None

    # -------------------------------------------------------------- subclass interface
    def command(self) -> list[str]:
        """Argv of the service process."""
        raise NotImplementedError

    def ports(self) -> Sequence[int]:
        """Ports the service binds (checked before start)."""
        raise NotImplementedError

    def health_url(self) -> str:
        """URL that answers 2xx once the service is ready."""
        raise NotImplementedError

    def environment(self) -> Mapping[str, str]:
        """Environment of the service process (default: ours)."""
        return dict(os.environ)

    def prepare(self) -> None:
        """Write config files before the process starts (default: nothing)."""

    # -------------------------------------------------------------- paths
    @property
    def log_path(self) -> Path:
        """Log file of this service."""
        return self.settings.log_dir / f"{self.name}.log"

    @property
    def pid_path(self) -> Path:
        """Pid file of this service, so another process (the CLI) can stop it."""
        return self.settings.run_dir / f"{self.name}.pid"

    # -------------------------------------------------------------- lifecycle
    def healthy(self) -> bool:
        """True when the health URL answers 2xx."""
        return http_ok(self.health_url())

    def start(self) -> "Service":
        """Start the service and wait until it is healthy.

        Raises:
            RuntimeStartError: binary missing, a port taken, the process exited early, or it was
                not healthy within ``settings.start_timeout_s``; nothing is left running.
        """
        argv = self.command()
        binary = argv[0]
        if not (Path(binary).exists() or shutil.which(binary)):
            raise RuntimeStartError(
                f"{self.name}: binary {binary} is missing; run scripts/setup.sh to install it"
            )
        host = self.settings.host
        for port in self.ports():
            if port_in_use(host, port):
                raise RuntimeStartError(
                    f"{self.name}: port {host}:{port} is already in use; stop whatever holds it "
                    f"or choose another port (TRITONFLOW_*_PORT settings)"
                )
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,
            )
        finally:
            log.close()
        self.pid_path.write_text(str(self.process.pid))
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.stop()
                raise RuntimeStartError(
                    f"{self.name}: exited with code {code} during start-up; log "
                    f"{self.log_path}:\n{log_tail(self.log_path)}"
                )
            if self.healthy():
                return self
            time.sleep(HEALTH_POLL_S)
        self.stop()
        raise RuntimeStartError(
            f"{self.name}: not healthy at {self.health_url()} after "
            f"{self.settings.start_timeout_s:.0f} s; log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def stop(self) -> None:
        """Stop the service's whole process group (SIGTERM, then SIGKILL) and remove its pid file."""
        pid = self.process.pid if self.process else read_pid(self.pid_path)
        if pid is not None:
            terminate_group(pid, self.process)
        self.process = None
        self.pid_path.unlink(missing_ok=True)

    def __enter__(self) -> "Service":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def read_pid(path: Path) -> int | None:
    """The process id written in a service's pid file, ``None`` when the file is missing or not a number."""
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def terminate_group(pid: int, process: subprocess.Popen | None) -> None:
    """Stop the process group led by ``pid``: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S` seconds.

    Returns once the leader is gone (then SIGKILL to the group, so no child survives), or after the
    SIGKILL's 5 s wait. A group already gone is not an error.

    Args:
        pid: The group leader's process id (a service started in its own session).
        process: Its ``Popen`` when this process started it (polled, so it is reaped), else ``None``
            (the pid is probed with signal 0).
    """
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if process is not None:
                if process.poll() is not None:
                    # The leader is gone; make sure no child of the group survives.
                    try:
                        os.killpg(pgid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    return
            else:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
            time.sleep(0.05)


# ================================================================================== Triton
def triton_site_packages(settings: Settings) -> Path:
    """site-packages of the Triton tools environment."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return settings.triton_venv / "lib" / version / "site-packages"


#: Variables of the caller's environment that would change which Python, or which packages, the
#: Triton tools and the Python backend stub use; never inherited (the tools get their own).
INHERITED_PYTHON_VARIABLES = ("PYTHONHOME", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONSAFEPATH",
                              "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR", "PYTHONNOUSERSITE", "VIRTUAL_ENV",
                              "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "__PYVENV_LAUNCHER__")
#: System folders always on the tools' PATH (a worker may start with an empty or odd PATH).
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


def triton_environment(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver, perf_analyzer, Model Analyzer and the Python backend stub.

    Explicit, from ``settings.triton_venv`` (``.venv-triton``), and independent of the Python
    environment of the process that asks (an Airflow worker inherits whatever its supervisor had):
    the caller's Python variables (:data:`INHERITED_PYTHON_VARIABLES`: ``PYTHONHOME``,
    ``PYTHONPATH``, ``VIRTUAL_ENV``, ...) are dropped; ``PYTHONPATH`` is the Triton venv's
    site-packages (the stub imports numpy and onnxruntime from there) and ``PYTHONNOUSERSITE=1``;
    ``PATH`` is the venv's ``bin`` then the system folders, then the caller's; ``LD_LIBRARY_PATH``
    starts with the wheel's bundled libraries and ``libcudart.so.12`` (perf_analyzer); ``HOME``
    defaults to ``settings.home`` when the caller has none. Everything else (S3 credentials,
    locale, proxies) is kept.

    Args:
        settings: Where the Triton tools environment is.
        base: The environment to start from (default ``os.environ``).
    """
    sp = triton_site_packages(settings)
    env = {k: v for k, v in dict(os.environ if base is None else base).items()
           if k not in INHERITED_PYTHON_VARIABLES}
    libs = [str(sp / "nvidia_pytriton.libs"), str(sp / "nvidia" / "cuda_runtime" / "lib")]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    env["PYTHONPATH"] = str(sp)
    env["PYTHONNOUSERSITE"] = "1"
    path = [str(settings.triton_venv / "bin"), *SYSTEM_PATH]
    path += [p for p in env.get("PATH", "").split(":") if p and p not in path]
    env["PATH"] = ":".join(path)
    env.setdefault("HOME", str(settings.home))
    return env


def triton_server_binary(settings: Settings) -> Path:
    """Path of the tritonserver binary inside the Triton tools environment."""
    return triton_site_packages(settings) / "pytriton" / "tritonserver" / "bin" / "tritonserver"


def triton_backend_directory(settings: Settings) -> Path:
    """Assemble ``<run_dir>/triton-backends`` with ``python/`` and the ``onnxruntime/`` backend.

    ``python`` links to the wheel's Python backend (which has the stub copied in by
    ``scripts/setup_triton_env.sh``); ``onnxruntime/model.py`` is tritonflow's Python-based
    ONNX Runtime backend, copied fresh on every start.
    """
    target = settings.run_dir / "triton-backends"
    target.mkdir(parents=True, exist_ok=True)
    python_backend = triton_site_packages(settings) / "pytriton" / "tritonserver" / "backends" / "python"
    link = target / "python"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(python_backend, target_is_directory=True)
    for backend in _BACKENDS_SRC.iterdir():
        if (backend / "model.py").exists():
            dest = target / backend.name
            dest.mkdir(exist_ok=True)
            shutil.copy2(backend / "model.py", dest / "model.py")
    return target


class TritonServer(Service):
    """Triton Inference Server in explicit model-control mode on loopback.

    Args:
        settings: Ports, host and the Triton tools environment.
        repository: A local folder or ``s3://http(s)://host:port/bucket/prefix`` (AWS credentials
            from the environment). Defaults to ``settings.resolved_repository_uri``.
        name: Service name (log and pid file names), so several servers can run side by side.
        exit_timeout_s: ``--exit-timeout-secs``: seconds Triton waits on shutdown for open
            connections, in-flight requests and model unloads (``None``: Triton's default, 30 s,
            which a serving Triton draining requests wants; a throwaway one passes a second or so).
    """

    name = "triton"

    def __init__(self, settings: Settings, repository: str | None = None, name: str = "triton",
                 exit_timeout_s: int | None = None):
        super().__init__(settings)
        self.name = name
        self.repository = repository or settings.resolved_repository_uri
        self.exit_timeout_s = exit_timeout_s

    def ports(self) -> Sequence[int]:
        """Triton's HTTP, gRPC and metrics ports."""
        s = self.settings
        return (s.triton_http_port, s.triton_grpc_port, s.triton_metrics_port)

    def prepare(self) -> None:
        """Create the repository folder (a local repository only)."""
        if not self.repository.startswith("s3://"):
            Path(self.repository).mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        """Argv of ``tritonserver`` with explicit model control."""
        s = self.settings
        return [
            str(triton_server_binary(s)),
            f"--model-repository={self.repository}",
            f"--backend-directory={triton_backend_directory(s)}",
            "--model-control-mode=explicit",
            "--strict-model-config=true",
            f"--http-address={s.host}",
            f"--http-port={s.triton_http_port}",
            f"--grpc-address={s.host}",
            f"--grpc-port={s.triton_grpc_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            f"--metrics-address={s.host}",
            f"--metrics-port={s.triton_metrics_port}",
            "--metrics-interval-ms=1000",
            "--exit-on-error=false",
            "--log-verbose=0",
        ] + ([f"--exit-timeout-secs={int(self.exit_timeout_s)}"] if self.exit_timeout_s is not None else [])

    def environment(self) -> Mapping[str, str]:
        """Environment of the Triton process (its tools' own)."""
        return triton_environment(self.settings)

    def health_url(self) -> str:
        """Triton's liveness endpoint."""
        return f"http://{self.settings.host}:{self.settings.triton_http_port}/v2/health/live"

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint (tritonclient form)."""
        return f"{self.settings.host}:{self.settings.triton_http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint."""
        return f"{self.settings.host}:{self.settings.triton_grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Prometheus metrics URL."""
        return f"http://{self.settings.host}:{self.settings.triton_metrics_port}/metrics"


# ================================================================================== MLflow
def _venv_bin(tool: str) -> str:
    """Path of a console script installed beside the running interpreter."""
    candidate = Path(sys.executable).parent / tool
    return str(candidate) if candidate.exists() else (shutil.which(tool) or str(candidate))


#: MLflow server variables of the local runtime (each one only when the caller has not set it):
#: webhooks may target its loopback receiver over http (the local deployment binds 127.0.0.1 only;
#: this lifts MLflow's SSRF check for every webhook of this server), and no job runner (MLflow's
#: job runner and its huey consumers: eight processes, about 1.5 GiB, for jobs tritonflow never submits).
#: ``MLFLOW_WEBHOOK_CACHE_TTL``: MLflow caches each event's webhook list (60 s by default, also
#: an empty list), so a webhook registered right after a registry change would miss changes for a
#: minute.
MLFLOW_LOCAL_SERVER_ENV = {
    "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
    "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
    "MLFLOW_WEBHOOK_CACHE_TTL": "2",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}
#: File under ``<home>/mlflow`` holding the Fernet key MLflow encrypts stored webhook secrets with.
WEBHOOK_KEY_FILE = "webhook-secret-encryption.key"


def webhook_encryption_key(path: Path) -> str:
    """The Fernet key in ``path``, generated (mode 0600) on first use and kept from then on.

    MLflow encrypts each webhook's secret in its database with ``MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY``
    and, when it is unset, with a key drawn per process: after a restart it could no longer read
    the secrets of webhooks created before, and deliveries to them would fail.

    Raises:
        RuntimeStartError: the file holds no valid Fernet key (the message names the file).
    """
    from cryptography.fernet import Fernet

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(Fernet.generate_key())
    key = path.read_text().strip()
    try:
        Fernet(key)
    except ValueError:
        raise RuntimeStartError(
            f"mlflow: {path} holds no valid Fernet key: expected 32 url-safe base64 bytes (delete the file "
            "to draw a new key; webhooks created with the old one then need 'tritonflow registry webhook register')"
        ) from None
    return key


class MlflowServer(Service):
    """MLflow tracking server with artifact serving, SQLite under ``<home>/mlflow`` by default.

    Started with :data:`MLFLOW_LOCAL_SERVER_ENV` and a webhook-secret encryption key kept in
    ``<home>/mlflow/`` (:data:`WEBHOOK_KEY_FILE`), so webhooks to the local receiver deliver, also
    after a restart.
    """

    name = "mlflow"

    def ports(self) -> Sequence[int]:
        """The MLflow server's port."""
        return (self.settings.mlflow_port,)

    @property
    def artifacts_dir(self) -> Path:
        """Where the server stores artifacts it serves (``<home>/mlflow/artifacts``)."""
        return self.settings.home / "mlflow" / "artifacts"

    def prepare(self) -> None:
        """Create the artifacts folder."""
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        """Argv of ``mlflow server``."""
        s = self.settings
        return [
            _venv_bin("mlflow"),
            "server",
            "--backend-store-uri",
            s.resolved_mlflow_backend_uri,
            "--artifacts-destination",
            str(self.artifacts_dir),
            "--serve-artifacts",
            "--host",
            s.host,
            "--port",
            str(s.mlflow_port),
            "--workers",
            "1",
        ]

    @property
    def webhook_key_path(self) -> Path:
        """File of the key MLflow encrypts webhook secrets with (``<home>/mlflow/<WEBHOOK_KEY_FILE>``)."""
        return self.settings.home / "mlflow" / WEBHOOK_KEY_FILE

    def environment(self) -> Mapping[str, str]:
        """Our environment plus, unless set, :data:`MLFLOW_LOCAL_SERVER_ENV`, the webhook key, no proxied multipart."""
        env = dict(os.environ)
        env.setdefault("MLFLOW_ENABLE_PROXY_MULTIPART_UPLOAD", "false")
        for name, value in MLFLOW_LOCAL_SERVER_ENV.items():
            env.setdefault(name, value)
        if not env.get("MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"):
            env["MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"] = webhook_encryption_key(self.webhook_key_path)
        return env

    def health_url(self) -> str:
        """The MLflow server's health endpoint."""
        return f"http://{self.settings.host}:{self.settings.mlflow_port}/health"

    @property
    def tracking_uri(self) -> str:
        """Tracking URI of this server."""
        return f"http://{self.settings.host}:{self.settings.mlflow_port}"


# ================================================================================== S3 (moto)
class S3Server(Service):
    """S3-compatible endpoint for tests and the embedded demo (``moto_server``)."""

    name = "s3"

    def ports(self) -> Sequence[int]:
        """The S3 endpoint's port."""
        return (self.settings.s3_port,)

    def command(self) -> list[str]:
        """Argv of ``moto_server``."""
        return [_venv_bin("moto_server"), "-H", self.settings.host, "-p", str(self.settings.s3_port)]

    def health_url(self) -> str:
        """The moto API endpoint."""
        return f"{self.endpoint_url}/moto-api/"

    @property
    def endpoint_url(self) -> str:
        """``http://host:port`` for boto3's ``endpoint_url``."""
        return f"http://{self.settings.host}:{self.settings.s3_port}"

    def triton_url(self, bucket: str, prefix: str = "") -> str:
        """Triton's form of a repository on this endpoint: ``s3://http://host:port/bucket/prefix``."""
        tail = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
        return f"s3://{self.endpoint_url}/{bucket}{tail}"


# ================================================================================== NGINX
NGINX_BINARY = "/usr/sbin/nginx"
#: Seconds :meth:`NginxGateway.reload` waits for the workers of the previous config to exit.
GATEWAY_DRAIN_TIMEOUT_S = 10.0


def _proc_status(pid: int | str) -> dict[str, str]:
    """``/proc/PID/status`` as a dict (empty once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def _alive(status: dict[str, str]) -> bool:
    """A process whose status this is exists and is not a zombie waiting for its parent."""
    return not status.get("State", "Z").startswith("Z")


def is_running(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie waiting for its parent."""
    return _alive(_proc_status(pid))


def child_pids(parent: int, name: str) -> set[int]:
    """PIDs of the running children of ``parent`` whose process name is ``name``, from ``/proc``."""
    out: set[int] = set()
    for pid in (int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()):
        status = _proc_status(pid)
        if status.get("PPid") == str(parent) and status.get("Name") == name and _alive(status):
            out.add(pid)
    return out


class NginxGateway(Service):
    """NGINX gateway in front of a Triton HTTP endpoint.

    The main config includes ``<conf_dir>/http.d/*.conf`` inside ``http {}`` (``upstream``,
    ``map``, ``split_clients``) and ``<conf_dir>/locations.d/*.conf`` inside ``server {}``, before
    the default ``location /`` that proxies to the upstream named ``triton``. The canary router
    owns those two folders; :meth:`reload` applies its changes gracefully.

    Args:
        settings: Host, gateway port and state folders.
        triton_http: ``host:port`` of the Triton HTTP endpoint behind the gateway, or a sequence of
            them (replicas sharing one repository); default ``settings.triton_replica_http_urls``.
        name: Service name (log, pid and config folder names).
    """

    name = "gateway"

    def __init__(self, settings: Settings, triton_http: str | Sequence[str] | None = None, name: str = "gateway"):
        super().__init__(settings)
        self.name = name
        if triton_http is None:
            servers = list(settings.triton_replica_http_urls)
        else:
            servers = [triton_http] if isinstance(triton_http, str) else list(triton_http)
        #: Every Triton replica the ``triton`` upstream balances over (round robin).
        self.triton_servers = servers
        self.triton_http = servers[0]

    @property
    def conf_dir(self) -> Path:
        """Folder of the gateway's config (``nginx.conf``, ``http.d/``, ``locations.d/``)."""
        return self.settings.run_dir / self.name

    @property
    def conf_path(self) -> Path:
        """The main ``nginx.conf``."""
        return self.conf_dir / "nginx.conf"

    @property
    def nginx_pid_path(self) -> Path:
        """The pid file NGINX's master writes (its ``pid`` directive)."""
        return self.conf_dir / "nginx.pid"

    @property
    def url(self) -> str:
        """Base URL of the gateway."""
        return f"http://{self.settings.host}:{self.settings.gateway_port}"

    def ports(self) -> Sequence[int]:
        """The gateway's port."""
        return (self.settings.gateway_port,)

    def prepare(self) -> None:
        """Create the configuration folders and write the NGINX configuration."""
        for sub in ("http.d", "locations.d", "temp", "logs"):
            (self.conf_dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(self.render_config())

    def render_config(self) -> str:
        """The main NGINX config (static; per-model routing lives in the include folders)."""
        d = self.conf_dir
        user = "user root;\n" if os.geteuid() == 0 else ""
        servers = "\n".join(f"        server {u};" for u in self.triton_servers)
        return f"""# Generated by tritonflow.runtime.services.NginxGateway; do not edit.
{user}daemon off;
worker_processes 1;
pid {self.nginx_pid_path};
error_log {self.log_path} notice;
events {{ worker_connections 1024; }}
http {{
    access_log {d / 'logs' / 'access.log'};
    client_body_temp_path {d / 'temp' / 'body'};
    proxy_temp_path {d / 'temp' / 'proxy'};
    fastcgi_temp_path {d / 'temp' / 'fastcgi'};
    uwsgi_temp_path {d / 'temp' / 'uwsgi'};
    scgi_temp_path {d / 'temp' / 'scgi'};
    client_max_body_size 64m;
    upstream triton {{
{servers}
        keepalive 16;
    }}
    include {d / 'http.d'}/*.conf;
    server {{
        listen {self.settings.host}:{self.settings.gateway_port};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location = /gateway/health {{ return 200 "ok\\n"; }}
        include {d / 'locations.d'}/*.conf;
        location / {{ proxy_pass http://triton; }}
    }}
}}
"""

    def nginx_cmd(self, *args: str) -> list[str]:
        """Argv to run nginx against this gateway's config with extra arguments."""
        return [NGINX_BINARY, "-p", str(self.conf_dir), "-c", str(self.conf_path), *args]

    def command(self) -> list[str]:
        """Argv of NGINX with the gateway's configuration."""
        return self.nginx_cmd()

    def health_url(self) -> str:
        """The gateway's health endpoint."""
        return f"{self.url}/gateway/health"

    def test_config(self) -> None:
        """Run ``nginx -t`` on the current files.

        Raises:
            RuntimeStartError: NGINX rejected the config; the message is NGINX's own.
        """
        proc = subprocess.run(self.nginx_cmd("-t"), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeStartError(f"{self.name}: nginx -t failed:\n{proc.stderr.strip()}")

    def reload(self) -> None:
        """Check the config with ``nginx -t``, reload gracefully, and wait for the old workers to exit.

        NGINX starts the new config's workers first, then lets the old ones finish the requests
        they admitted. A request admitted under the previous config may still be on its way to a
        version the caller unloads next (a canary's rollback unloads the challenger), so this
        returns once those workers have exited, or after :data:`GATEWAY_DRAIN_TIMEOUT_S`.

        Raises:
            RuntimeStartError: the config test or the reload signal failed.
        """
        self.test_config()
        master = read_pid(self.nginx_pid_path)
        old_workers = child_pids(master, "nginx") if master is not None else set()
        proc = subprocess.run(self.nginx_cmd("-s", "reload"), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeStartError(f"{self.name}: nginx reload failed:\n{proc.stderr.strip()}")
        deadline = time.monotonic() + GATEWAY_DRAIN_TIMEOUT_S
        while any(is_running(pid) for pid in old_workers) and time.monotonic() < deadline:
            time.sleep(0.05)


def python_site_packages() -> Path:
    """site-packages of the running (application) interpreter."""
    return Path(sysconfig.get_paths()["purelib"])
