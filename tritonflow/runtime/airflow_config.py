"""Configuration of a local Airflow deployment: :class:`AirflowConfig` and its ``airflow.cfg``.

An :class:`AirflowConfig` says everything that distinguishes one deployment from another: the
executor (``CeleryExecutor`` with PostgreSQL and Redis, or ``LocalExecutor`` with SQLite in WAL
mode or PostgreSQL), ``AIRFLOW_HOME``, ports, DAG and plugin folders, secrets. It builds the
``airflow.cfg`` (:meth:`AirflowConfig.write_airflow_cfg`) and the environment every Airflow
process of the deployment runs with (:meth:`AirflowConfig.environment`). Starting the processes
is :mod:`tritonflow.runtime.airflow`'s :class:`~tritonflow.runtime.airflow.AirflowDeployment`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from pathlib import Path
from typing import Any, Mapping

from ground.settings import PROJECT_ROOT, Settings

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
#: Seconds after which an unchanged DAG file is parsed again. A changed file is parsed at the next scan
#: whatever this says (Airflow 3.3's ``file_parsing_sort_mode = modified_time``, the default, queues
#: files modified since their last parse). At 10 s the dag-processor parsed the nine DAG files about
#: once a second, 16-28 % of a core for as long as the deployment ran, idle or not
#: (``benchmarks/drift_hour.py``): CPU the tasks did not get on two cores.
DEFAULT_MIN_FILE_PROCESS_INTERVAL_S = 120
#: Task slots of the LocalExecutor (``[core] parallelism``).
DEFAULT_LOCAL_PARALLELISM = 4
#: Libraries the LocalExecutor's worker processes import once, before they fork any task.
#: Every task is a fresh process forked from a worker; without this, each task that talks to MLflow
#: or touches a model imports them again: ``mlflow`` 3-13 s, ``skops.io`` (MLflow's scikit-learn
#: loader; it imports every scikit-learn estimator and through them ``torch``) 2-7 s, ``evidently``
#: 3-14 s, measured on two cores idle to loaded. With them preloaded (Airflow 3.3's
#: ``[scheduler] mp_start_method = forkserver`` and ``mp_forkserver_preload``) a task inherits
#: them copy-on-write (the forkserver holds about 600 MB). The Airflow modules a task process needs
#: to parse its DAG file are preloaded too (with ``fork`` it inherited them from the scheduler).
#: Third-party libraries only, then :mod:`tritonflow.runtime.forkserver_preload`, which freezes
#: them for the garbage collector: the project's pipelines are still imported by each task, so a
#: changed pipeline takes effect without a scheduler restart. ``multiprocessing`` skips a module
#: it cannot import.
DEFAULT_TASK_PRELOAD_MODULES = (
    "airflow", "airflow.executors.local_executor", "airflow.sdk.execution_time.task_runner",
    "airflow.sdk.plugins_manager", "airflow.dag_processing.dagbag", "airflow.dag_processing.bundles.manager",
    "airflow.dag_processing.bundles.local", "airflow.providers.standard.operators.python",
    "airflow.providers.standard.operators.trigger_dagrun", "airflow.providers.standard.operators.empty",
    "airflow.providers.amazon.aws.hooks.s3",
    "mlflow", "mlflow.pyfunc", "mlflow.sklearn", "mlflow.models", "pandas", "pyarrow.parquet",
    "scipy.stats", "sklearn.ensemble", "sklearn.inspection", "skops.io", "onnx", "onnxruntime",
    "skl2onnx", "tritonclient.http", "evidently", "evidently.presets",
    "tritonflow.runtime.forkserver_preload",  # last: gc.freeze() of everything above
)
#: ``[workers] min_heartbeat_interval`` (seconds) of the LocalExecutor deployment (Airflow's default: 5).
#: A task's supervisor waits in ``select`` for at most this long; when the task process exits after
#: its sockets reached EOF, the supervisor only notices at the end of that wait, and until then
#: the worker and its executor slot stay busy. Measured in the quick main job: about half of the
#: task processes held their slot 5.1 s after the task had succeeded (the next queued tasks waited
#: for a slot); with 1 s the wait is at most 1 s. The cost: a running task heartbeats once a
#: second instead of every 5 s.
LOCAL_MIN_HEARTBEAT_INTERVAL_S = 1
#: ``[scheduler] scheduler_idle_sleep_time`` (seconds) of the LocalExecutor deployment (Airflow's
#: default: 1). After a loop that queued nothing and saw no task finish, the scheduler sleeps this
#: long, so a task whose upstream has just succeeded waits up to that long to be queued; the loop's
#: chains (``drift_monitor``'s ``models`` -> ``check``, the closed loop's ~35 tasks in sequence) pay it
#: once per task. The cost: an idle scheduler runs its few queries five times a second.
LOCAL_SCHEDULER_IDLE_SLEEP_S = 0.2
#: Executors :class:`AirflowConfig` knows how to deploy.
EXECUTORS = ("CeleryExecutor", "LocalExecutor")

_AIRFLOW_ENV_PREFIXES = ("AIRFLOW__", "AIRFLOW_HOME", "AIRFLOW_CONFIG")

@dataclasses.dataclass(frozen=True)
class AirflowConfig:
    """Everything that distinguishes one Airflow deployment from another.

    Attributes:
        home: ``AIRFLOW_HOME`` (``airflow.cfg``, logs, pid files).
        api_port: API server port (UI, REST, and the execution API unless ``execution_api_port``).
        execution_api_port: Port of a second API server process that serves only the execution
            API (``airflow api-server --apps execution``) the tasks and the triggerer call; 0: the
            API server on ``api_port`` serves it. :meth:`local` on SQLite sets it
            (``TRITONFLOW_AIRFLOW_EXECUTION_API_PORT``): Airflow
            3.3's audit log (``action_logging``, on every REST write such as triggering a run)
            commits synchronously on the API server's event loop; when an execution-API request
            of the same process holds SQLite's write lock until its session is closed, which also
            needs that loop, both wait out SQLite's 5 s busy timeout. The run's POST fails with
            HTTP 500, and the task's XCom push and every other writer (the scheduler too) stall
            for those 5 s; seen twice in one quick main job. In a process of its own the execution
            API commits at once. PostgreSQL locks rows, not the database: one process serves both.
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
        task_preload_modules: LocalExecutor only: modules its workers import before forking tasks
            (``[scheduler] mp_start_method = forkserver`` + ``mp_forkserver_preload``); empty: the
            platform's ``fork`` from the scheduler, every task imports its libraries itself.
    """

    home: Path
    api_port: int = DEFAULT_API_PORT
    execution_api_port: int = 0
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
    task_preload_modules: tuple[str, ...] = DEFAULT_TASK_PRELOAD_MODULES

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
        ``settings.airflow_worker_log_port`` and ``settings.airflow_triggerer_log_port``; on SQLite
        the execution API has a process of its own on ``settings.airflow_execution_api_port``.
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
        config = cls.from_settings(settings, **values)
        if config.is_sqlite and "execution_api_port" not in overrides:
            return dataclasses.replace(config, execution_api_port=settings.airflow_execution_api_port)
        return config

    # ------------------------------------------------------------------ derived
    @property
    def api_url(self) -> str:
        """Base URL of the API server (``http://host:port``)."""
        return f"http://{self.host}:{self.api_port}"

    @property
    def execution_api_url(self) -> str:
        """Base URL of the API server process serving the execution API (``http://host:port``)."""
        return f"http://{self.host}:{self.execution_api_port}" if self.execution_api_port else self.api_url

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
                "execution_api_server_url": f"{self.execution_api_url}/execution/",
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
            cfg["workers"] = {"min_heartbeat_interval": str(LOCAL_MIN_HEARTBEAT_INTERVAL_S)}
            cfg["scheduler"]["scheduler_idle_sleep_time"] = str(LOCAL_SCHEDULER_IDLE_SLEEP_S)
            if self.task_preload_modules:
                cfg["scheduler"]["mp_start_method"] = "forkserver"
                cfg["scheduler"]["mp_forkserver_preload"] = ",".join(self.task_preload_modules)
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
