"""A real Airflow 3.3 deployment on loopback, in one of two shapes.

* **Celery** (:meth:`AirflowConfig.from_settings`, tests/deployment): PostgreSQL metadata DB,
  Redis broker, ``CeleryExecutor``, five processes.
* **Local** (:meth:`AirflowConfig.local`, the main job's embedded default and
  ``tritonflow runtime start --services airflow``): ``LocalExecutor`` (``parallelism`` task slots,
  at least 4) and a SQLite metadata DB in WAL mode under ``AIRFLOW_HOME`` (a PostgreSQL URL in
  ``TRITONFLOW_AIRFLOW_DATABASE_URL`` replaces it), five processes: no broker, no worker (the
  scheduler runs the tasks and serves their logs); on SQLite the execution API runs in an API
  server process of its own (:class:`AirflowExecutionApiServer`; four processes on PostgreSQL).

:class:`AirflowDeployment` runs what a production installation runs, each as its own process with
``AIRFLOW_HOME`` under ``<settings.home>/airflow``:

* ``airflow api-server`` (:class:`AirflowApiServer`) -- REST API, UI, the execution API the
  workers call (unless :class:`AirflowExecutionApiServer` serves it), and tritonflow's plugin (the
  MLflow webhook receiver at ``/tritonflow/webhooks/mlflow``);
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

This module starts and stops the processes; the deployment's configuration and ``airflow.cfg``
are :mod:`tritonflow.runtime.airflow_config`, the REST client the callers drive it with is
:mod:`tritonflow.runtime.airflow_api`.

Usage::

    from tritonflow.runtime.airflow import AirflowDeployment
    from tritonflow.runtime.airflow_config import AirflowConfig
    deployment = AirflowDeployment(AirflowConfig.from_settings(settings))
    deployment.start()          # db create + migrate, five processes, waits until all healthy
    deployment.api_url          # "http://127.0.0.1:8280"
    deployment.stop()

or ``tritonflow runtime start --services airflow``.

Every service raises :class:`~ground.exceptions.RuntimeStartError` with the log tail when it
cannot start, and a failed :meth:`AirflowDeployment.start` leaves nothing running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from ground.exceptions import RuntimeStartError
from ground.settings import PROJECT_ROOT, Settings
from tritonflow.runtime.airflow_config import AirflowConfig
from tritonflow.runtime.services import Service, http_ok, log_tail, port_in_use

#: Seconds ``airflow db migrate`` may take.
MIGRATE_TIMEOUT_S = 600.0
#: The project's packages whose modules the task processes import (besides the DAG and plugins folders).
PROJECT_PACKAGES = ("ground", "drift_checks", "model_registry", "repository_sync", "tritonflow")


def _venv_bin(tool: str) -> str:
    candidate = Path(sys.executable).parent / tool
    return str(candidate)


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
        """Argv of ``airflow api-server`` (``--apps core`` when the execution API has its own)."""
        c = self.config
        apps = ["--apps", "core"] if c.execution_api_port else []
        return [_venv_bin("airflow"), "api-server", "--host", c.host, "--port", str(c.api_port),
                "--workers", "1", *apps]

    def healthy(self) -> bool:
        """The health endpoint answers 2xx."""
        return http_ok(self.health_url())


class AirflowExecutionApiServer(AirflowApiServer):
    """``airflow api-server --apps execution``: the execution API alone, in a process of its own.

    Only where ``config.execution_api_port`` is set (SQLite: why is
    :class:`~tritonflow.runtime.airflow_config.AirflowConfig`'s ``execution_api_port``).
    """

    name = "airflow-execution-api"

    def ports(self) -> Sequence[int]:
        """The execution API's port."""
        return (self.config.execution_api_port,)

    def command(self) -> list[str]:
        """Argv of ``airflow api-server --apps execution``."""
        c = self.config
        return [_venv_bin("airflow"), "api-server", "--host", c.host, "--port", str(c.execution_api_port),
                "--workers", "1", "--apps", "execution"]

    def health_url(self) -> str:
        """The execution API's health endpoint."""
        return f"{self.config.execution_api_url}/execution/health"


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


def precompile_project(config: AirflowConfig) -> list[str]:
    """Write the bytecode of the project's modules when the Airflow processes would not.

    Every task is a fresh process: the LocalExecutor forks it from a forkserver that preloaded the
    third-party libraries only (:data:`~tritonflow.runtime.airflow_config.DEFAULT_TASK_PRELOAD_MODULES`),
    so each task imports the DAG file, the plugin and the pipelines it calls. With
    ``PYTHONDONTWRITEBYTECODE`` set in the deployment's environment (common in containers and CI),
    no ``__pycache__`` is ever written and every task compiles each of those modules from source
    again: 0.3-1 s of CPU per task measured on two cores (``benchmarks/drift_hour.py``). This writes
    it once, at start, in the usual ``__pycache__`` folders (a no-op for modules whose bytecode is
    current). A module changed later is still compiled from its source (Python checks the
    source's mtime), so a changed pipeline takes effect without a restart as before.

    Returns:
        The folders compiled (``[]`` when the processes write their bytecode themselves). A folder
        that cannot be written (a read-only install) is skipped: the tasks compile in memory.
    """
    import compileall

    if not config.environment().get("PYTHONDONTWRITEBYTECODE"):
        return []
    folders = [PROJECT_ROOT / p for p in PROJECT_PACKAGES] + [Path(config.plugins_folder), Path(config.dags_folder)]
    done = []
    for folder in dict.fromkeys(folders):
        if folder.is_dir() and compileall.compile_dir(str(folder), quiet=2, workers=1):
            done.append(str(folder))
    return done


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
        self.execution_api = AirflowExecutionApiServer(config)
        self.scheduler = AirflowScheduler(config)
        self.dag_processor = AirflowDagProcessor(config)
        self.triggerer = AirflowTriggerer(config)
        self.worker = AirflowCeleryWorker(config)

    @property
    def services(self) -> list[AirflowService]:
        """The processes, in start order.

        No worker with the LocalExecutor, no execution API server of its own without
        ``execution_api_port``.
        """
        out = [*self.api_servers, self.dag_processor, self.scheduler, self.triggerer]
        return out + [self.worker] if self.config.is_celery else out

    @property
    def api_servers(self) -> list[AirflowService]:
        """The API server processes: one, or two where the execution API has its own."""
        return [self.api_server, self.execution_api] if self.config.execution_api_port else [self.api_server]

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

        The API server processes start first (the core one reports the others' heartbeats); the
        other processes start side by side.

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
            precompile_project(c)
            migrate(c)
            if c.is_sqlite:
                enable_sqlite_wal(c)
            errors = []
            first = self.api_servers
            for group in (first, self.services[len(first):]):
                with ThreadPoolExecutor(max_workers=4) as pool:
                    futures = [pool.submit(s.start) for s in group]
                    errors += [e for e in (f.exception() for f in futures) if e is not None]
                if errors:
                    break
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
