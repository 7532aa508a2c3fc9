"""A real Airflow 3.3 deployment on loopback, in one of two shapes.

* **Celery** (:meth:`AirflowConfig.from_settings`, tests/deployment): PostgreSQL metadata DB,
  Redis broker, ``CeleryExecutor``, five processes.
* **Local** (:meth:`AirflowConfig.local`, the main job's embedded default and
  ``tritonflow runtime start --services airflow``): ``LocalExecutor`` (``parallelism`` task slots,
  at least 4) and a SQLite metadata DB in WAL mode under ``AIRFLOW_HOME`` (a PostgreSQL URL in
  ``TRITONFLOW_AIRFLOW_DATABASE_URL`` replaces it), four processes: no broker, no worker (the
  scheduler runs the tasks and serves their logs).

:class:`AirflowDeployment` runs what a production installation runs, each as its own process with
``AIRFLOW_HOME`` under ``<settings.home>/airflow``:

* ``airflow api-server`` (:class:`AirflowApiServer`) -- REST API, UI, the execution API the
  workers call, and tritonflow's plugin (the MLflow webhook receiver at
  ``/tritonflow/webhooks/mlflow``);
* ``airflow scheduler`` (:class:`AirflowScheduler`) with the ``CeleryExecutor``;
* ``airflow dag-processor`` (:class:`AirflowDagProcessor`) parsing ``<repo>/dags``;
* ``airflow triggerer`` (:class:`AirflowTriggerer`) running deferred tasks and asset watchers
  (the registry watcher);
* ``airflow celery worker`` (:class:`AirflowCeleryWorker`) consuming a Redis queue (Celery only).

The metadata DB is a PostgreSQL database of its own (created by :meth:`AirflowDeployment.start`,
dropped by :meth:`AirflowDeployment.stop` when ``drop_database=True``), the Celery broker is Redis
and the Celery result backend is the same PostgreSQL database. The simple auth manager makes every
visitor an admin (``[core] simple_auth_manager_all_admins``), so the UI needs no login and the
REST API hands out tokens at ``GET /auth/token``: loopback use only.

Usage::

    from tritonflow.runtime.airflow import AirflowConfig, AirflowDeployment
    deployment = AirflowDeployment(AirflowConfig.from_settings(settings))
    deployment.start()          # db create + migrate, five processes, waits until all healthy
    deployment.api_url          # "http://127.0.0.1:8280"
    deployment.stop()

or ``tritonflow runtime start --services airflow``.

Every service raises :class:`~tritonflow.exceptions.RuntimeStartError` with the log tail when it
cannot start, and a failed :meth:`AirflowDeployment.start` leaves nothing running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from tritonflow.exceptions import RuntimeStartError
from tritonflow.runtime.services import Service, http_ok, log_tail, port_in_use
from tritonflow.settings import Settings
from tritonflow.settings_defaults import PROJECT_ROOT

#: PostgreSQL server (no database part) holding the metadata DB; trust authentication.
DEFAULT_POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432"
#: Redis server (no database part) used as the Celery broker.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"
#: Redis logical database of the broker.
DEFAULT_REDIS_DB = 0
#: Metadata database name of the CLI deployment (tests use ``tritonflow_af_<random>``).
DEFAULT_DATABASE = "tritonflow_airflow"
#: API server port of the CLI deployment (8080, Airflow's default, is the gateway's).
DEFAULT_API_PORT = 8280
#: Port the Celery worker serves task logs on (Airflow's default).
DEFAULT_WORKER_LOG_PORT = 8793
#: Port the triggerer serves trigger logs on (Airflow's default).
DEFAULT_TRIGGERER_LOG_PORT = 8794
#: Celery queue the scheduler sends tasks to and the worker consumes.
DEFAULT_QUEUE = "tritonflow"
#: Celery worker processes (task slots).
DEFAULT_WORKER_CONCURRENCY = 2
#: Seconds between two scans of the DAG folder for new or changed files.
DEFAULT_DAG_REFRESH_INTERVAL_S = 5
#: Seconds after which an unchanged DAG file is parsed again.
DEFAULT_MIN_FILE_PROCESS_INTERVAL_S = 10
#: Task slots of the LocalExecutor (``[core] parallelism``).
DEFAULT_LOCAL_PARALLELISM = 4
#: Executors :class:`AirflowConfig` knows how to deploy.
EXECUTORS = ("CeleryExecutor", "LocalExecutor")
#: Seconds ``airflow db migrate`` may take.
MIGRATE_TIMEOUT_S = 600.0
#: Seconds between two polls of the REST API while waiting for a state.
POLL_S = 1.0
#: Attempts of a REST call that the API server answers with HTTP 5xx, and the first delay (s).
API_RETRIES = 4
API_RETRY_DELAY_S = 2.0

_AIRFLOW_ENV_PREFIXES = ("AIRFLOW__", "AIRFLOW_HOME", "AIRFLOW_CONFIG")


def _venv_bin(tool: str) -> str:
    candidate = Path(sys.executable).parent / tool
    return str(candidate)


@dataclasses.dataclass(frozen=True)
class AirflowConfig:
    """Everything that distinguishes one Airflow deployment from another.

    Attributes:
        home: ``AIRFLOW_HOME`` (``airflow.cfg``, logs, pid files).
        api_port: API server port (UI, REST, execution API) on ``host``.
        worker_log_port: Port the Celery worker serves task logs on.
        triggerer_log_port: Port the triggerer serves trigger logs on.
        database: PostgreSQL database name of the metadata DB (created if missing).
        host: Loopback address every process binds to.
        postgres_url: SQLAlchemy URL of the PostgreSQL server, without the database.
        redis_url: Redis server URL, without the database number.
        redis_db: Redis logical database of the broker.
        queue: Celery queue name (a unique one isolates deployments sharing a Redis).
        dags_folder: Folder the dag-processor parses.
        plugins_folder: Airflow plugins folder (tritonflow's plugin).
        jwt_secret: ``[api_auth] jwt_secret`` (signs API and execution-API tokens).
        api_secret_key: ``[api] secret_key`` (signs log-server requests and sessions).
        worker_concurrency: Celery worker processes.
        dags_paused_at_creation: ``[core] dags_are_paused_at_creation``.
        dag_refresh_interval_s: ``[dag_processor] refresh_interval`` (seconds).
        min_file_process_interval_s: ``[dag_processor] min_file_process_interval`` (seconds).
        extra_env: Environment added to every Airflow process (``TRITONFLOW_*`` for the tasks).
        executor: ``CeleryExecutor`` (with a worker process) or ``LocalExecutor`` (tasks run by
            the scheduler, no broker).
        database_url: Full SQLAlchemy URL of the metadata DB (``sqlite:////abs/path.db`` or a
            PostgreSQL URL); empty: ``postgres_url/database``.
        parallelism: ``[core] parallelism``: task slots of the LocalExecutor (>= 4).
    """

    home: Path
    api_port: int = DEFAULT_API_PORT
    worker_log_port: int = DEFAULT_WORKER_LOG_PORT
    triggerer_log_port: int = DEFAULT_TRIGGERER_LOG_PORT
    database: str = DEFAULT_DATABASE
    host: str = "127.0.0.1"
    postgres_url: str = DEFAULT_POSTGRES_URL
    redis_url: str = DEFAULT_REDIS_URL
    redis_db: int = DEFAULT_REDIS_DB
    queue: str = DEFAULT_QUEUE
    dags_folder: Path = PROJECT_ROOT / "dags"
    plugins_folder: Path = PROJECT_ROOT / "plugins"
    jwt_secret: str = ""
    api_secret_key: str = ""
    worker_concurrency: int = DEFAULT_WORKER_CONCURRENCY
    dags_paused_at_creation: bool = True
    dag_refresh_interval_s: int = DEFAULT_DAG_REFRESH_INTERVAL_S
    min_file_process_interval_s: int = DEFAULT_MIN_FILE_PROCESS_INTERVAL_S
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    executor: str = "CeleryExecutor"
    database_url: str = ""
    parallelism: int = DEFAULT_LOCAL_PARALLELISM

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor={self.executor!r}; expected one of {EXECUTORS}")
        if self.executor == "LocalExecutor" and self.parallelism < 4:
            raise ValueError(f"parallelism={self.parallelism}; expected >= 4 (runs of different DAGs "
                             "overlap: the drift monitor, a canary and a retraining at once)")
        if self.executor == "CeleryExecutor" and self.is_sqlite:
            raise ValueError(f"database_url={self.database_url!r}: the CeleryExecutor needs PostgreSQL")
        if not self.database.replace("_", "").isalnum() or not self.database[0].isalpha():
            raise ValueError(
                f"database={self.database!r} is invalid: expected letters, digits and '_' "
                "starting with a letter"
            )

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> "AirflowConfig":
        """Config rooted at ``<settings.home>/airflow`` whose tasks see ``settings``.

        Secrets are kept in ``<home>/run/airflow_secrets.json`` so that a restarted deployment
        validates the tokens it issued before.
        """
        home = Path(overrides.pop("home", settings.home / "airflow"))
        secrets_file = settings.run_dir / "airflow_secrets.json"
        try:
            stored = json.loads(secrets_file.read_text())
        except (FileNotFoundError, ValueError):
            stored = {"jwt_secret": secrets.token_urlsafe(32), "api_secret_key": secrets.token_urlsafe(32)}
            secrets_file.parent.mkdir(parents=True, exist_ok=True)
            secrets_file.write_text(json.dumps(stored))
            secrets_file.chmod(0o600)
        env = {
            "TRITONFLOW_HOME": str(settings.home),
            "TRITONFLOW_MLFLOW_TRACKING_URI": settings.resolved_mlflow_tracking_uri,
        }
        env.update(overrides.pop("extra_env", {}))
        values = dict(host=settings.host, jwt_secret=stored["jwt_secret"],
                      api_secret_key=stored["api_secret_key"], extra_env=env)
        values.update(overrides)
        return cls(home=home, **values)

    @classmethod
    def local(cls, settings: Settings, **overrides: Any) -> "AirflowConfig":
        """The embedded local deployment: ``LocalExecutor`` and SQLite (WAL) under ``AIRFLOW_HOME``.

        ``settings.airflow_database_url`` (``TRITONFLOW_AIRFLOW_DATABASE_URL``), when set, is the
        metadata DB instead (PostgreSQL for more than one host). The API server listens on
        ``settings.airflow_api_port`` (8080 is the gateway's), task and trigger logs are served on
        ``settings.airflow_worker_log_port`` and ``settings.airflow_triggerer_log_port``.
        """
        home = Path(overrides.get("home", settings.home / "airflow"))
        values: dict[str, Any] = {
            "executor": "LocalExecutor",
            "database_url": settings.airflow_database_url or f"sqlite:///{home / 'airflow.db'}",
            "api_port": settings.airflow_api_port,
            "worker_log_port": settings.airflow_worker_log_port,
            "triggerer_log_port": settings.airflow_triggerer_log_port,
            "parallelism": settings.airflow_parallelism,
            "dags_paused_at_creation": True,
        }
        values.update(overrides)
        return cls.from_settings(settings, **values)

    # ------------------------------------------------------------------ derived
    @property
    def api_url(self) -> str:
        """Base URL of the API server (``http://host:port``)."""
        return f"http://{self.host}:{self.api_port}"

    @property
    def is_sqlite(self) -> bool:
        """The metadata DB is a SQLite file."""
        return self.database_url.startswith("sqlite")

    @property
    def is_celery(self) -> bool:
        """Tasks go through Celery (Redis broker, a worker process)."""
        return self.executor == "CeleryExecutor"

    @property
    def sql_alchemy_conn(self) -> str:
        """SQLAlchemy URL of the metadata DB."""
        return self.database_url or f"{self.postgres_url}/{self.database}"

    @property
    def broker_url(self) -> str:
        """Celery broker URL."""
        return f"{self.redis_url}/{self.redis_db}"

    @property
    def result_backend(self) -> str:
        """Celery result backend (the metadata DB through SQLAlchemy)."""
        url = self.sql_alchemy_conn.replace("postgresql+psycopg2://", "postgresql://", 1)
        return f"db+{url}"

    @property
    def config_path(self) -> Path:
        """``airflow.cfg`` of this deployment."""
        return self.home / "airflow.cfg"

    def airflow_cfg(self) -> dict[str, dict[str, str]]:
        """The ``airflow.cfg`` sections this deployment sets (names checked against Airflow 3.3)."""
        cfg = {
            "core": {
                "dags_folder": str(self.dags_folder),
                "plugins_folder": str(self.plugins_folder),
                "executor": self.executor,
                "parallelism": str(self.parallelism),
                "load_examples": "False",
                "auth_manager": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
                "simple_auth_manager_all_admins": "True",
                "simple_auth_manager_passwords_file": str(self.home / "simple_auth_manager_passwords.json"),
                "execution_api_server_url": f"{self.api_url}/execution/",
                "dags_are_paused_at_creation": str(self.dags_paused_at_creation),
                "unit_test_mode": "False",
            },
            "database": {"sql_alchemy_conn": self.sql_alchemy_conn},
            "celery": {
                "broker_url": self.broker_url,
                "result_backend": self.result_backend,
                "worker_concurrency": str(self.worker_concurrency),
            },
            "operators": {"default_queue": self.queue},
            "api": {
                "host": self.host,
                "port": str(self.api_port),
                "base_url": self.api_url,
                "workers": "1",
                "secret_key": self.api_secret_key,
                "expose_config": "False",
            },
            "api_auth": {"jwt_secret": self.jwt_secret},
            "dag_processor": {
                "refresh_interval": str(self.dag_refresh_interval_s),
                "min_file_process_interval": str(self.min_file_process_interval_s),
                "parsing_processes": "1",
                "bundle_refresh_check_interval": str(self.dag_refresh_interval_s),
            },
            "scheduler": {"enable_health_check": "False"},
            "logging": {
                "base_log_folder": str(self.home / "logs"),
                "dag_processor_child_process_log_directory": str(self.home / "logs" / "dag_processor"),
                "worker_log_server_port": str(self.worker_log_port),
                "trigger_log_server_port": str(self.triggerer_log_port),
                "colored_console_log": "False",
            },
        }
        if not self.is_celery:
            del cfg["celery"]
        return cfg

    def write_airflow_cfg(self) -> Path:
        """Write ``airflow.cfg`` (mode 0600: it holds secrets) and return its path."""
        self.home.mkdir(parents=True, exist_ok=True)
        lines = ["# Written by tritonflow.runtime.airflow; edits are overwritten on start.", ""]
        for section, options in self.airflow_cfg().items():
            lines.append(f"[{section}]")
            # ``%`` would start configparser interpolation.
            lines.extend(f"{key} = {value.replace('%', '%%')}" for key, value in options.items())
            lines.append("")
        self.config_path.write_text("\n".join(lines))
        self.config_path.chmod(0o600)
        return self.config_path

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment of every Airflow process: ours minus inherited ``AIRFLOW_*`` variables.

        Inherited ``AIRFLOW__SECTION__KEY`` variables would override ``airflow.cfg`` (a test
        session that imported Airflow has some), so they are dropped.
        """
        env = {k: v for k, v in dict(os.environ if base is None else base).items()
               if not k.startswith(_AIRFLOW_ENV_PREFIXES)}
        env["AIRFLOW_HOME"] = str(self.home)
        env["AIRFLOW_CONFIG"] = str(self.config_path)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), str(self.plugins_folder), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env


def _airflow_settings(config: AirflowConfig) -> Settings:
    """Settings for the Airflow deployment's own services.

    Settings whose log and pid folders are the deployment's (``<AIRFLOW_HOME>/{logs,run}``);
    the start timeout is the environment's (``TRITONFLOW_START_TIMEOUT_S``).
    """
    return Settings.from_env({}, home=config.home, host=config.host,
                             start_timeout_s=Settings.from_env().start_timeout_s)


class AirflowService(Service):
    """One Airflow process of a deployment; its log is ``<AIRFLOW_HOME>/logs/<name>.log``."""

    name = "airflow"
    #: Component key in ``GET /api/v2/monitor/health`` (``None``: checked otherwise).
    health_component: str | None = None

    def __init__(self, config: AirflowConfig):
        super().__init__(_airflow_settings(config))
        self.config = config

    def environment(self) -> Mapping[str, str]:
        """Environment of the Airflow process (the deployment's)."""
        return self.config.environment()

    def ports(self) -> Sequence[int]:
        """Ports the service binds (none by default)."""
        return ()

    def health_url(self) -> str:
        """The API server's health endpoint."""
        return f"{self.config.api_url}/api/v2/monitor/health"

    def healthy(self) -> bool:
        """The API server reports this component's heartbeat as healthy."""
        if self.process is not None and self.process.poll() is not None:
            return False
        report = api_health(self.config)
        if self.health_component is None:  # no heartbeat in the health report to read
            return False
        return bool(report) and (report.get(self.health_component) or {}).get("status") == "healthy"


def api_health(config: AirflowConfig) -> dict[str, Any]:
    """``GET /api/v2/monitor/health`` of the deployment ({} when the API server is down)."""
    try:
        with urllib.request.urlopen(f"{config.api_url}/api/v2/monitor/health", timeout=5) as resp:  # noqa: S310
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return {}


class AirflowApiServer(AirflowService):
    """``airflow api-server``: REST API, UI, execution API, plugin FastAPI apps."""

    name = "airflow-api-server"

    def ports(self) -> Sequence[int]:
        """The API server's port."""
        return (self.config.api_port,)

    def command(self) -> list[str]:
        """Argv of ``airflow api-server``."""
        c = self.config
        return [_venv_bin("airflow"), "api-server", "--host", c.host, "--port", str(c.api_port),
                "--workers", "1"]

    def healthy(self) -> bool:
        """The health endpoint answers 2xx."""
        return http_ok(self.health_url())


class AirflowScheduler(AirflowService):
    """The ``airflow scheduler`` service.

    ``airflow scheduler``; with the LocalExecutor it runs the tasks and serves their logs
    (on ``worker_log_port``), with Celery the worker does both.
    """

    name = "airflow-scheduler"
    health_component = "scheduler"

    def ports(self) -> Sequence[int]:
        """The log-serving port (LocalExecutor only)."""
        return () if self.config.is_celery else (self.config.worker_log_port,)

    def command(self) -> list[str]:
        """Argv of ``airflow scheduler`` (no log serving under Celery)."""
        if self.config.is_celery:
            return [_venv_bin("airflow"), "scheduler", "--skip-serve-logs"]
        return [_venv_bin("airflow"), "scheduler"]


class AirflowDagProcessor(AirflowService):
    """``airflow dag-processor`` parsing the dags folder."""

    name = "airflow-dag-processor"
    health_component = "dag_processor"

    def command(self) -> list[str]:
        """Argv of ``airflow dag-processor``."""
        return [_venv_bin("airflow"), "dag-processor"]


class AirflowTriggerer(AirflowService):
    """``airflow triggerer``: deferred tasks and asset watchers."""

    name = "airflow-triggerer"
    health_component = "triggerer"

    def ports(self) -> Sequence[int]:
        """The triggerer's log-serving port."""
        return (self.config.triggerer_log_port,)

    def command(self) -> list[str]:
        """Argv of ``airflow triggerer``."""
        return [_venv_bin("airflow"), "triggerer"]


class AirflowCeleryWorker(AirflowService):
    """``airflow celery worker`` consuming the deployment's queue.

    Healthy once it answers a Celery ``ping`` broadcast on the broker under its own node name.
    """

    name = "airflow-worker"

    @property
    def node_name(self) -> str:
        """Celery node name (``tritonflow-<queue>@<host>``)."""
        return f"tritonflow-{self.config.queue}@{self.config.host}"

    def ports(self) -> Sequence[int]:
        """The worker's log-serving port."""
        return (self.config.worker_log_port,)

    def command(self) -> list[str]:
        """Argv of ``airflow celery worker`` on the deployment's queue."""
        c = self.config
        return [_venv_bin("airflow"), "celery", "worker", "--queues", c.queue,
                "--concurrency", str(c.worker_concurrency), "--celery-hostname", self.node_name,
                "--without-gossip", "--without-mingle"]

    def health_url(self) -> str:
        """The broker and node name the health check pings (for messages)."""
        return f"{self.config.broker_url} (celery ping {self.node_name})"

    def healthy(self) -> bool:
        """The process runs and answers a Celery ``ping`` under its node name."""
        if self.process is not None and self.process.poll() is not None:
            return False
        try:
            from celery import Celery

            app = Celery(broker=self.config.broker_url)
            try:
                replies = app.control.ping(destination=[self.node_name], timeout=1.0)
            finally:
                app.close()
        except Exception:  # broker not reachable yet
            return False
        return any(self.node_name in reply for reply in replies)


def create_database(config: AirflowConfig) -> bool:
    """Create the metadata database if it does not exist; ``True`` when it was created.

    Raises:
        RuntimeStartError: PostgreSQL is not reachable at ``config.postgres_url``.
    """
    conn = _admin_connection(config)
    name = _database_name(config)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone():
                return False
            cur.execute(f'CREATE DATABASE "{name}"')
            return True
    finally:
        conn.close()


def drop_database(config: AirflowConfig) -> None:
    """Drop the metadata database, closing any connection still open on it."""
    conn = _admin_connection(config)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{_database_name(config)}" WITH (FORCE)')
    finally:
        conn.close()


def _database_name(config: AirflowConfig) -> str:
    from sqlalchemy.engine import make_url

    name = make_url(config.sql_alchemy_conn).database or config.database
    if not name.replace("_", "").isalnum() or not name[0].isalpha():
        raise ValueError(f"metadata database name {name!r} is invalid: expected letters, digits and '_'")
    return name


def _admin_connection(config: AirflowConfig):
    import psycopg2
    from sqlalchemy.engine import make_url

    url = make_url(config.sql_alchemy_conn)
    try:
        conn = psycopg2.connect(host=url.host, port=url.port or 5432, user=url.username,
                                password=url.password, dbname="postgres", connect_timeout=10)
    except psycopg2.OperationalError as exc:
        raise RuntimeStartError(
            f"airflow: PostgreSQL at {url.host}:{url.port or 5432} is not reachable ({exc}); "
            "start it (Debian: service postgresql start) or set postgres_url"
        ) from None
    conn.autocommit = True
    return conn


def enable_sqlite_wal(config: AirflowConfig) -> str:
    """Switch the SQLite metadata DB to write-ahead logging (persistent in the file).

    With WAL, readers (the API server, the UI) do not block the scheduler's writes and the four
    processes wait less on ``database is locked``.

    Returns:
        The journal mode SQLite reports afterwards (``wal``).

    Raises:
        RuntimeStartError: The SQLAlchemy URL names no database file.
    """
    import sqlite3

    from sqlalchemy.engine import make_url

    path = make_url(config.sql_alchemy_conn).database
    if path is None:
        raise RuntimeStartError(f"airflow: {config.sql_alchemy_conn!r} names no SQLite database file")
    conn = sqlite3.connect(path, timeout=30)
    try:
        return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
    finally:
        conn.close()


def purge_broker_queue(config: AirflowConfig) -> None:
    """Delete the deployment's Celery queue and bindings from Redis (nothing else)."""
    import redis

    client = redis.Redis.from_url(config.broker_url)
    try:
        client.delete(config.queue, f"_kombu.binding.{config.queue}")
    finally:
        client.close()


def migrate(config: AirflowConfig) -> None:
    """``airflow db migrate`` against the deployment's metadata DB.

    Raises:
        RuntimeStartError: the migration failed or timed out (output tail quoted).
    """
    log_path = config.home / "logs" / "airflow-db-migrate.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run([_venv_bin("airflow"), "db", "migrate"], env=config.environment(),
                                  stdout=log, stderr=subprocess.STDOUT, timeout=MIGRATE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeStartError(
                f"airflow db migrate: timed out after {MIGRATE_TIMEOUT_S:.0f} s; log {log_path}:\n"
                f"{log_tail(log_path)}"
            ) from None
    if proc.returncode != 0:
        raise RuntimeStartError(
            f"airflow db migrate: exited with code {proc.returncode}; log {log_path}:\n{log_tail(log_path)}"
        )


class AirflowDeployment:
    """The whole deployment: metadata DB, ``airflow.cfg``, migration and the five processes.

    Args:
        config: The deployment's configuration.
        drop_database: Drop the metadata DB on :meth:`stop` (tests); the CLI keeps it.
    """

    name = "airflow"

    def __init__(self, config: AirflowConfig, *, drop_database: bool = False):
        self.config = config
        self.drop_database = drop_database
        self.api_server = AirflowApiServer(config)
        self.scheduler = AirflowScheduler(config)
        self.dag_processor = AirflowDagProcessor(config)
        self.triggerer = AirflowTriggerer(config)
        self.worker = AirflowCeleryWorker(config)

    @property
    def services(self) -> list[AirflowService]:
        """The processes, in start order (no worker with the LocalExecutor)."""
        out = [self.api_server, self.dag_processor, self.scheduler, self.triggerer]
        return out + [self.worker] if self.config.is_celery else out

    @property
    def api_url(self) -> str:
        """Base URL of the API server."""
        return self.config.api_url

    @property
    def log_path(self) -> Path:
        """Folder holding every component's log."""
        return self.config.home / "logs"

    def health_url(self) -> str:
        """The API server's component health report."""
        return self.api_server.health_url()

    def healthy(self) -> bool:
        """Every process is up and reports healthy."""
        return all(s.healthy() for s in self.services)

    def start(self) -> "AirflowDeployment":
        """Create and migrate the metadata DB, then start every process and wait for health.

        The API server starts first (it reports the others' heartbeats); the other four start
        side by side.

        Raises:
            RuntimeStartError: PostgreSQL/Redis unreachable, a port taken, the migration failed or
                a process did not become healthy; everything started is stopped again.
        """
        c = self.config
        for service in self.services:
            for port in service.ports():
                if port_in_use(c.host, port):
                    raise RuntimeStartError(
                        f"{service.name}: port {c.host}:{port} is already in use; choose another port"
                    )
        if c.is_celery:
            self._check_redis()
        try:
            if not c.is_sqlite:
                create_database(c)
            c.write_airflow_cfg()
            migrate(c)
            if c.is_sqlite:
                enable_sqlite_wal(c)
            self.api_server.start()
            with ThreadPoolExecutor(max_workers=4) as pool:
                futures = [pool.submit(s.start) for s in self.services[1:]]
                errors = [f.exception() for f in futures]
            errors = [e for e in errors if e is not None]
            if errors:
                raise RuntimeStartError("; ".join(str(e) for e in errors))
        except BaseException:
            self.stop()
            raise
        return self

    def _check_redis(self) -> None:
        import redis

        client = redis.Redis.from_url(self.config.broker_url, socket_connect_timeout=5)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise RuntimeStartError(
                f"airflow: Redis broker {self.config.broker_url} is not reachable ({exc}); start it "
                "(Debian: service redis-server start) or set redis_url"
            ) from None
        finally:
            client.close()

    def stop(self) -> None:
        """Stop every process (reverse order), purge the queue, drop the DB if asked."""
        for service in reversed(self.services):
            service.stop()
        if self.config.is_celery:
            try:
                purge_broker_queue(self.config)
            except Exception:  # broker gone: nothing to purge
                pass
        if self.drop_database and not self.config.is_sqlite:
            drop_database(self.config)

    def __enter__(self) -> "AirflowDeployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class AirflowApi:
    """Small client of the deployment's REST API (``/api/v2``) with a simple-auth-manager token.

    Args:
        base_url: API server base URL.
        timeout: Seconds per request.
    """

    def __init__(self, base_url: str, timeout: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None

    def token(self) -> str:
        """JWT from ``GET /auth/token`` (all-admins mode hands one out without credentials)."""
        if self._token is None:
            doc = self._request("GET", "/auth/token", auth=False)
            self._token = doc["access_token"]
        return self._token

    def _request(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        """One REST call, retried on a server error or on no answer in time.

        A server error is HTTP 5xx (e.g. SQLite's ``database is locked``). Requests that create
        something carry their own id, so a retry of one that did succeed answers 409.

        Raises:
            AirflowApiError: A client error, or a server error after :data:`API_RETRIES` attempts.
            TimeoutError / URLError: No answer after :data:`API_RETRIES` attempts.
        """
        for attempt in range(API_RETRIES):
            try:
                return self._request_once(method, path, body, auth=auth)
            except AirflowApiError as exc:
                if exc.status < 500 or attempt == API_RETRIES - 1:
                    raise
            except (TimeoutError, urllib.error.URLError):  # no answer in time (URLError: refused)
                if attempt == API_RETRIES - 1:
                    raise
            time.sleep(API_RETRY_DELAY_S * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _request_once(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (loopback)
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise AirflowApiError(exc.code, f"{method} {path}: HTTP {exc.code}: {detail}") from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        """``GET /api/v2<path>``."""
        return self._request("GET", f"/api/v2{path}")

    def post(self, path: str, body: Any) -> Any:
        """``POST /api/v2<path>`` with a JSON body."""
        return self._request("POST", f"/api/v2{path}", body)

    def patch(self, path: str, body: Any) -> Any:
        """``PATCH /api/v2<path>`` with a JSON body."""
        return self._request("PATCH", f"/api/v2{path}", body)

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """DAG runs of ``dag_id`` (up to 100, oldest logical date first)."""
        doc = self.get(f"/dags/{dag_id}/dagRuns?limit=100&order_by=id")
        return doc["dag_runs"]

    def wait_for_dag(self, dag_id: str, timeout_s: float) -> dict[str, Any]:
        """Wait until the dag-processor has parsed ``dag_id``; return the DAG.

        Raises:
            TimeoutError: naming the DAG and any import errors the API reports.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return self.get(f"/dags/{dag_id}")
            except AirflowApiError as exc:
                if exc.status != 404:
                    raise
            time.sleep(POLL_S)
        errors = self.get("/importErrors").get("import_errors", [])
        raise TimeoutError(f"DAG {dag_id!r} not parsed within {timeout_s:.0f} s; import errors: {errors}")

    def unpause(self, dag_id: str) -> None:
        """Unpause ``dag_id``."""
        self.patch(f"/dags/{dag_id}", {"is_paused": False})


class AirflowApiError(RuntimeError):
    """The Airflow REST API answered with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
