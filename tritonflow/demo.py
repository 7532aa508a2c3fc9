"""The main job: tritonflow's whole loop on real NOAA weather data, through Airflow DAG runs.

``bash scripts/demo.sh`` (the README's first command) runs ``python -m tritonflow.demo``, which:

1. starts the local runtime (MLflow on SQLite, Triton over a local folder repository, the NGINX
   gateway) on the default ports or free ones, and an Airflow home on SQLite
   (``airflow db migrate``) under the demo's state folder (``TRITONFLOW_HOME=.tritonflow/demo``);
2. trains a champion on the early years of the NOAA series (:mod:`model_registry.datasets`),
   registers it in MLflow with the alias ``champion`` and publishes it through a
   ``model_publish`` DAG run;
3. replays the following years as production traffic *through the gateway* (real HTTP inference
   requests built with tritonclient), writing the inference log and the labels log, with a block
   of days mapped onto each logical hour (:class:`DayHourMapping`);
4. runs ``drift_monitor`` for every logical hour (a backfill: the first hours build the history
   the dynamic P95 thresholds need); on a drift alert it runs ``shadow_evaluation``, ``retrain``,
   ``model_publish`` for the challenger and ``canary_promotion`` as DAG runs, following the DAGs'
   own decisions (a DAG that triggers another fire-and-forget is followed by the driver running
   the triggered DAG itself with the same conf, since ``dag.test`` does not run triggered DAGs);
5. offers once a deliberately bad challenger (trained on flipped labels) that the canary
   analysis must roll back;
6. writes ``<home>/report/index.html`` with PNG plots (:mod:`tritonflow.report`) and prints the
   closed-loop time from the drift alert to the promoted challenger and the wall time.

This module is a *driver*: the loop's logic lives in ``tritonflow/pipelines`` and the DAGs; the
driver only sets up, replays traffic, runs DAGs and reads back what they decided.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from tritonflow.exceptions import DataError, RuntimeStartError, TritonflowError
from tritonflow.settings import PROJECT_ROOT

#: State folder of the demo (wiped at the start of every run).
DEFAULT_DEMO_HOME = PROJECT_ROOT / ".tritonflow" / "demo"
#: Registered model name (MLflow) and Triton model name of the demo.
DEFAULT_MODEL = "noaa_rain"
#: Logical instant of the first replayed hour (UTC).
DEFAULT_LOGICAL_START = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
#: (Not earlier: the DAGs start on 2025-01-01 and a run dated before a DAG's start_date gets no tasks.)
#: Prediction column of the inference log: probability of rain (0-1).
SCORE_COLUMN = "probability_rain"
#: Prediction column of the inference log: predicted class (0/1) at 0.5.
PREDICTION_COLUMN = "rain_predicted"
#: HTTP connections the traffic replay keeps open to the gateway.
REPLAY_CONCURRENCY = 4


# ====================================================================================== config
@dataclasses.dataclass(frozen=True)
class DayHourMapping:
    """How the NOAA days map onto logical hours of traffic.

    Logical hour ``h`` (starting at :attr:`start`) carries the days
    ``[first_day + h * days_per_hour, first_day + (h + 1) * days_per_hour)``; inside the hour the
    days are spread evenly, day ``i`` of the block at ``(i + 0.5) * 3600 / days_per_hour`` seconds.

    Attributes:
        first_day: First replayed day (the day after the champion's training years).
        last_day: Last replayed day, exclusive.
        days_per_hour: Days of data per logical hour (rows per hourly drift window).
        start: Logical instant of hour 0 (UTC).
    """

    first_day: int
    last_day: int
    days_per_hour: int
    start: dt.datetime = DEFAULT_LOGICAL_START

    def __post_init__(self) -> None:
        if self.days_per_hour < 1:
            raise DataError(f"days_per_hour={self.days_per_hour}; expected >= 1")
        if not 0 <= self.first_day < self.last_day:
            raise DataError(f"first_day={self.first_day}, last_day={self.last_day}: expected "
                            "0 <= first_day < last_day")

    @property
    def n_hours(self) -> int:
        """Number of whole logical hours replayed."""
        return (self.last_day - self.first_day) // self.days_per_hour

    def hour_start(self, hour: int) -> dt.datetime:
        """Logical start (UTC) of hour ``hour``."""
        return self.start + dt.timedelta(hours=hour)

    def days_of(self, hour: int) -> range:
        """The days replayed in logical hour ``hour``."""
        a = self.first_day + hour * self.days_per_hour
        return range(a, a + self.days_per_hour)

    def hour_of_day(self, day: int) -> int:
        """The logical hour a day is replayed in."""
        return (day - self.first_day) // self.days_per_hour

    def timestamps(self, hour: int) -> pd.DatetimeIndex:
        """Logical timestamps (UTC) of the days of ``hour``."""
        step = 3600.0 / self.days_per_hour
        base = pd.Timestamp(self.hour_start(hour))
        return pd.DatetimeIndex([base + pd.Timedelta(seconds=(i + 0.5) * step)
                                 for i in range(self.days_per_hour)])

    def describe(self) -> str:
        """One line for the output and the report."""
        return (f"{self.days_per_hour} NOAA days per logical hour: days {self.first_day}.."
                f"{self.first_day + self.n_hours * self.days_per_hour - 1} -> {self.n_hours} hours "
                f"from {self.start:%Y-%m-%d %H:%M} UTC")


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Everything a demo run needs; built by :func:`config_from_args`.

    Attributes:
        home: Demo state folder (``TRITONFLOW_HOME``); wiped first unless ``resume``.
        model: Registered/Triton model name.
        champion_days: ``(first, last)`` days (last exclusive) the champion is trained on.
        mapping: Replay mapping of days onto logical hours.
        min_history_windows: Hourly windows before the dynamic P95 thresholds apply.
        canary_steps: Canary traffic steps (percent, comma-separated).
        canary_bake_s: Seconds each canary step bakes while the driver sends traffic.
        canary_min_requests: Fewest canary requests a step needs.
        canary_rps: Requests per second the driver sends during a canary.
        bad_challenger: Offer a label-flipped challenger once after the first promotion.
        max_alerts_acted: Drift alerts the driver acts on (shadow / retrain / canary).
        keep_running: Leave the services running at the end (URLs are printed).
        quick: The smallest sweep (for tests and a first look).
    """

    home: Path = DEFAULT_DEMO_HOME
    model: str = DEFAULT_MODEL
    champion_days: tuple[int, int] = (0, 8000)
    mapping: DayHourMapping = DayHourMapping(8000, 18159, 48)
    min_history_windows: int = 48
    canary_steps: str = "5,25,50,100"
    canary_bake_s: float = 8.0
    canary_min_requests: int = 20
    canary_rps: float = 40.0
    bad_challenger: bool = True
    max_alerts_acted: int = 3
    keep_running: bool = False
    quick: bool = False
    shadow_hours: int = 10
    retrain_hours: int = 10
    profile: bool = True
    dataset_share: float = 0.125


def quick_config(home: Path = DEFAULT_DEMO_HOME, **overrides: Any) -> DemoConfig:
    """The smallest sweep that still shows the loop: a short history before the concept drift.

    The champion is trained on every day before the replay (days 0-11,327); 48 days per hour;
    14 hours (days 11,328-11,999) before the concept drift at day 12,000 and 10 hours after it;
    the dynamic thresholds apply after 12 windows.
    """
    d = 48
    first = 12_000 - 14 * d
    values = dict(home=home, champion_days=(0, first),
                  mapping=DayHourMapping(first, 12_000 + 10 * d, d), min_history_windows=12,
                  canary_steps="25,100", canary_bake_s=4.0, canary_min_requests=10,
                  max_alerts_acted=3, profile=False, quick=True)
    values.update(overrides)
    return DemoConfig(**values)


# ====================================================================================== progress
class Progress:
    """One line per step with the elapsed wall time; events are kept for the report."""

    def __init__(self, stream=None):
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.stream = stream or sys.stdout
        self.events: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def step(self, message: str, **data: Any) -> None:
        """Print ``[  12.3 s] message`` and record the event."""
        t = self.elapsed()
        self.events.append({"t": t, "message": message, **data})
        print(f"[{t:7.1f} s] {message}", file=self.stream, flush=True)


# ====================================================================================== setup
def _port(preferred: int, taken: set[int]) -> int:
    from tritonflow.runtime.services import free_port, port_in_use

    port = preferred
    if not port or port in taken or port_in_use("127.0.0.1", port):
        port = free_port()
        while port in taken:
            port = free_port()
    taken.add(port)
    return port


def stop_leftovers(home: Path) -> list[str]:
    """Stop services a previous demo run left behind (by their pid files under ``home/run``)."""
    from tritonflow.runtime.services import _read_pid, _terminate_group

    stopped = []
    run_dir = home / "run"
    if run_dir.is_dir():
        for pid_file in sorted(run_dir.glob("*.pid")):
            pid = _read_pid(pid_file)
            if pid is not None:
                _terminate_group(pid, None)
                stopped.append(pid_file.stem)
            pid_file.unlink(missing_ok=True)
    return stopped


def environment(cfg: DemoConfig, ports: Mapping[str, int]) -> dict[str, str]:
    """The ``TRITONFLOW_*`` and ``AIRFLOW_*`` variables of a demo run (set before Airflow loads).

    Args:
        cfg: The demo configuration.
        ports: ``triton_http``, ``triton_grpc``, ``triton_metrics``, ``mlflow``, ``gateway``.
    """
    home = cfg.home
    airflow_home = home / "airflow"
    env = {
        "TRITONFLOW_HOME": str(home),
        "TRITONFLOW_TRITON_HTTP_PORT": str(ports["triton_http"]),
        "TRITONFLOW_TRITON_GRPC_PORT": str(ports["triton_grpc"]),
        "TRITONFLOW_TRITON_METRICS_PORT": str(ports["triton_metrics"]),
        "TRITONFLOW_MLFLOW_PORT": str(ports["mlflow"]),
        "TRITONFLOW_GATEWAY_PORT": str(ports["gateway"]),
        "TRITONFLOW_MLFLOW_TRACKING_URI": f"http://127.0.0.1:{ports['mlflow']}",
        "TRITONFLOW_REPOSITORY_URI": str(home / "model_repository"),
        "TRITONFLOW_INFERENCE_LOG_ROOT": str(home / "inference_logs"),
        "TRITONFLOW_DRIFT_HISTORY_DB_URL": f"sqlite:///{home / 'drift' / 'history.db'}",
        "TRITONFLOW_DRIFT_MIN_HISTORY_WINDOWS": str(cfg.min_history_windows),
        "TRITONFLOW_SIGNING_KEY_PATH": str(home / "keys" / "model_signing.pem"),
        "TRITONFLOW_SIGNING_TRUSTED_KEYS_DIR": str(home / "keys" / "trusted"),
        "TRITONFLOW_CANARY_STEPS": cfg.canary_steps,
        "TRITONFLOW_CANARY_BAKE_S": str(cfg.canary_bake_s),
        "TRITONFLOW_CANARY_MIN_REQUESTS": str(cfg.canary_min_requests),
        # One strongly shifted feature of eight is a dataset drift (see settings).
        "TRITONFLOW_DRIFT_DATASET_SHARE": str(cfg.dataset_share),
        # The demo replays years in minutes: the cooldown is in logical time, not wall time.
        "TRITONFLOW_RETRAIN_COOLDOWN_S": "0",
        "TRITONFLOW_MONITORED_MODELS": cfg.model,
        # Logical time: one hour of log holds ``days_per_hour`` NOAA days.
        "TRITONFLOW_SHADOW_WINDOW_HOURS": str(cfg.shadow_hours),
        "TRITONFLOW_RETRAIN_WINDOW_DAYS": str(cfg.retrain_hours / 24.0),
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{ports['mlflow']}",
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "GIT_PYTHON_REFRESH": "quiet",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "PYTHONWARNINGS": "ignore",
    }
    return env


def apply_environment(env: Mapping[str, str]) -> None:
    """Export ``env`` and put the plugins folder and the project on ``sys.path``."""
    os.environ.update(env)
    extra = [str(PROJECT_ROOT), str(PROJECT_ROOT / "plugins")]
    os.environ["PYTHONPATH"] = os.pathsep.join(extra + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p and p not in extra])
    for p in reversed(extra):
        if p not in sys.path:
            sys.path.insert(0, p)


class Runtime:
    """The demo's services (MLflow, Triton, NGINX gateway), started in order and stopped together."""

    def __init__(self, progress: Progress):
        from tritonflow.runtime.services import MlflowServer, NginxGateway, TritonServer
        from tritonflow.settings import get_settings

        self.settings = get_settings()
        self.progress = progress
        self.mlflow = MlflowServer(self.settings)
        self.triton = TritonServer(self.settings)
        self.gateway = NginxGateway(self.settings)
        self.services = [self.mlflow, self.triton, self.gateway]

    def start(self) -> None:
        """Start every service (raises :class:`RuntimeStartError` and stops the others)."""
        started = []
        try:
            for svc in self.services:
                t = time.monotonic()
                svc.start()
                started.append(svc)
                self.progress.step(f"runtime: {svc.name} healthy at {svc.health_url()} "
                                   f"({time.monotonic() - t:.1f} s, log {svc.log_path})")
        except RuntimeStartError:
            for svc in reversed(started):
                svc.stop()
            raise

    def stop(self) -> None:
        for svc in reversed(self.services):
            svc.stop()


def airflow_db_migrate(airflow_home: Path) -> None:
    """``airflow db migrate`` on the demo's SQLite metadata DB (a subprocess, like the CLI)."""
    airflow_home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
                          env=dict(os.environ), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeStartError(f"airflow db migrate failed (AIRFLOW_HOME={airflow_home}):\n"
                                f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


# ====================================================================================== DAG runs
@dataclasses.dataclass
class DagRunOutcome:
    """What a DAG run did.

    Attributes:
        dag_id, run_id: The run.
        state: Final DAG run state (``success`` / ``failed``).
        tasks: ``{task_id: state}``.
        xcoms: ``{task_id: return value}`` (deserialised).
        seconds: Wall time of the run.
        conf: The conf it ran with.
    """

    dag_id: str
    run_id: str
    state: str
    tasks: dict[str, str]
    xcoms: dict[str, Any]
    seconds: float
    conf: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.state == "success"

    def find(self, key: str) -> Any:
        """First value of ``key`` in any task's XCom (dicts searched recursively)."""
        def walk(v: Any) -> Any:
            if isinstance(v, Mapping):
                if key in v:
                    return v[key]
                for x in v.values():
                    r = walk(x)
                    if r is not None:
                        return r
            return None
        for value in self.xcoms.values():
            r = walk(value)
            if r is not None:
                return r
        return None


class DagRunner:
    """Parses ``dags/`` once, syncs it to the metadata DB and runs DAGs in-process (``dag.test``)."""

    def __init__(self, dags_folder: Path, progress: Progress):
        from airflow.dag_processing.bundles.manager import DagBundlesManager
        from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

        self.progress = progress
        DagBundlesManager().sync_bundles_to_db()
        self.bag = DagBag(str(dags_folder))
        if self.bag.import_errors:
            errors = "\n".join(f"{k}: {v.strip().splitlines()[-1]}" for k, v in self.bag.import_errors.items())
            progress.step(f"airflow: DAG import errors (those DAGs are skipped):\n{errors}")
        sync_bag_to_db(self.bag, "dags-folder", None)
        self.runs: list[DagRunOutcome] = []
        # Each DAG's declared param defaults, kept now: a run's conf is merged into the DAG
        # object's params in place, so without them a later run would inherit the previous conf.
        self.dags_folder = Path(dags_folder)

    def has(self, dag_id: str) -> bool:
        return dag_id in self.bag.dags

    def dag(self, dag_id: str):
        return self.bag.dags[dag_id]

    #: DAGs run with the same conf every time (parsed once).
    SAME_CONF_DAGS = ("drift_monitor",)

    def fresh(self, dag_id: str):
        """The DAG object to run: a run's conf is merged in place into the params of the DAG
        object it ran on (and of its tasks), so a DAG run with varying confs is re-parsed from its
        file for every run, else a later run would inherit the previous run's conf."""
        from airflow.dag_processing.dagbag import DagBag

        dag = self.bag.dags[dag_id]
        if dag_id in self.SAME_CONF_DAGS:
            return dag
        bag = DagBag(str(dag.fileloc))
        return bag.dags.get(dag_id, dag)

    def param_names(self, dag_id: str) -> set[str]:
        return set(self.dag(dag_id).params.keys())

    def run(self, dag_id: str, conf: Mapping[str, Any] | None = None, *,
            logical_date: dt.datetime | None = None, quiet: bool = False) -> DagRunOutcome:
        """Run ``dag_id`` once with ``conf`` (passed whole: DAGs also read undeclared keys such as
        ``model_publish``'s ``then``).

        Raises:
            KeyError: The DAG is not in ``dags/``.
        """
        dag = self.fresh(dag_id)
        conf = {k: v for k, v in (conf or {}).items() if v is not None}
        t = time.monotonic()
        kwargs: dict[str, Any] = {"run_conf": conf}
        if logical_date is not None:
            kwargs["logical_date"] = logical_date
        dr = dag.test(**kwargs)
        seconds = time.monotonic() - t
        outcome = self._outcome(dag_id, dr, conf, seconds)
        self.runs.append(outcome)
        if not quiet or not outcome.ok:
            failed = [k for k, v in outcome.tasks.items() if v not in ("success", "skipped")]
            self.progress.step(f"dag {dag_id}: {outcome.state} in {seconds:.1f} s"
                               + (f" (not successful: {failed})" if failed else ""))
        return outcome

    @staticmethod
    def _outcome(dag_id: str, dr: Any, conf: Mapping[str, Any], seconds: float) -> DagRunOutcome:
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        run_id = dr.run_id
        tasks: dict[str, str] = {}
        xcoms: dict[str, Any] = {}
        with create_session() as s:
            for ti in s.query(TaskInstance).filter(TaskInstance.dag_id == dag_id,
                                                   TaskInstance.run_id == run_id):
                key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
                tasks[key] = str(ti.state.value if hasattr(ti.state, "value") else ti.state)
            rows = s.query(XComModel).filter(XComModel.dag_id == dag_id, XComModel.run_id == run_id,
                                             XComModel.key == "return_value").all()
            for row in rows:
                key = row.task_id if row.map_index < 0 else f"{row.task_id}[{row.map_index}]"
                try:
                    xcoms[key] = XComModel.deserialize_value(row)
                except Exception:  # noqa: BLE001 - a value we cannot read is just absent
                    xcoms[key] = None
        state = dr.state.value if hasattr(dr.state, "value") else str(dr.state)
        return DagRunOutcome(dag_id, run_id, state, tasks, xcoms, seconds, dict(conf))


# ====================================================================================== traffic
@dataclasses.dataclass(frozen=True)
class ServedModel:
    """The served model's interface as the gateway reports it (inputs and outputs)."""

    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    batched: bool


class GatewayClient:
    """Real inference requests through the NGINX gateway, one row per request.

    Requests are built and parsed with tritonclient (``InferenceServerClient.generate_request_body``
    and ``InferResult.from_response_body``) and sent over keep-alive HTTP connections, so the
    gateway's response header (``X-Tritonflow-Version``, written by the canary router) is read;
    without it the version comes from Triton's response (``model_version``).

    Args:
        gateway_url: ``http://host:port`` of the gateway.
        model: Model name.
        features: Feature columns, in the model's input order.
        response_header: Header naming the serving version.
        concurrency: Parallel connections.
    """

    def __init__(self, gateway_url: str, model: str, features: Iterable[str], *,
                 response_header: str = "X-Tritonflow-Version", concurrency: int = REPLAY_CONCURRENCY):
        host_port = gateway_url.split("://", 1)[-1].rstrip("/")
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.model = model
        self.features = list(features)
        self.header = response_header
        self.concurrency = concurrency
        self._local = threading.local()
        self._served: ServedModel | None = None
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="replay")

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self._local.conn = conn
        return conn

    def _get_json(self, path: str) -> dict:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise DataError(f"GET {path} through the gateway answered {resp.status}: {body[:300]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def served_model(self, refresh: bool = False) -> ServedModel:
        """Inputs/outputs of the model behind the gateway (cached)."""
        if self._served is None or refresh:
            meta = self._get_json(f"/v2/models/{self.model}")
            config = self._get_json(f"/v2/models/{self.model}/config")
            batched = int(config.get("max_batch_size", 0)) > 0

            def spec(items):
                return tuple((i["name"], i["datatype"], tuple(int(d) for d in i["shape"])) for i in items)

            self._served = ServedModel(spec(meta["inputs"]), spec(meta["outputs"]), batched)
        return self._served

    def _inputs(self, rows: pd.DataFrame):
        import tritonclient.http as httpclient
        from tritonclient.utils import triton_to_np_dtype

        served = self.served_model()
        out = []
        for name, datatype, _shape in served.inputs:
            cols = [name] if name in rows.columns else self.features
            arr = rows[cols].to_numpy(dtype=triton_to_np_dtype(datatype))
            item = httpclient.InferInput(name, list(arr.shape), datatype)
            item.set_data_from_numpy(arr, binary_data=True)
            out.append(item)
        return out

    def infer_rows(self, rows: pd.DataFrame, request_id: str) -> dict[str, Any]:
        """One request for ``rows`` (usually one row); returns score, prediction, version, status."""
        import tritonclient.http as httpclient

        served = self.served_model()
        outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name, _, _ in served.outputs]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            self._inputs(rows), outputs=outputs, request_id=request_id)
        headers = {"Content-Type": "application/octet-stream", "X-Request-Id": request_id}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        t = time.perf_counter()
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request("POST", f"/v2/models/{self.model}/infer", body, headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    return {"status": 0, "version": None, "score": np.nan, "prediction": -1,
                            "latency_ms": (time.perf_counter() - t) * 1000}
        latency = (time.perf_counter() - t) * 1000
        version = resp.getheader(self.header)
        if resp.status != 200:
            return {"status": resp.status, "version": int(version) if version else None,
                    "score": np.nan, "prediction": -1, "latency_ms": latency}
        hlen = resp.getheader("Inference-Header-Content-Length")
        result = httpclient.InferResult.from_response_body(
            data, header_length=int(hlen) if hlen else None)
        if not version:
            version = result.get_response().get("model_version")
        score, pred = self._decode(result, served)
        return {"status": 200, "version": int(version) if version else None, "score": score,
                "prediction": pred, "latency_ms": latency}

    @staticmethod
    def _decode(result: Any, served: ServedModel) -> tuple[float, int]:
        score = pred = None
        for name, datatype, _ in served.outputs:
            arr = result.as_numpy(name)
            if arr is None:
                continue
            arr = np.asarray(arr)
            if datatype.startswith("FP"):
                flat = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(-1, 1)
                score = float(flat[0, -1])  # P(rain) is the last (positive-class) column
            else:
                pred = int(np.asarray(arr).reshape(-1)[0])
        if score is None:
            score = float(pred) if pred is not None else np.nan
        if pred is None:
            pred = int(score >= 0.5)
        return score, pred

    def replay(self, frame: pd.DataFrame, request_ids: list[str]) -> pd.DataFrame:
        """Send each row of ``frame`` as its own request (``concurrency`` in flight).

        Returns:
            One row per request, in order: ``request_id``, ``status``, ``version``, ``score``,
            ``prediction``, ``latency_ms``.
        """
        futures = [self.pool.submit(self.infer_rows, frame.iloc[[i]], rid)
                   for i, rid in enumerate(request_ids)]
        rows = [{"request_id": rid, **f.result()} for rid, f in zip(request_ids, futures)]
        return pd.DataFrame(rows)


class BackgroundTraffic:
    """Steady traffic through the gateway while a canary bakes (a daemon thread).

    Each request is one NOAA day from ``frame`` (cycled); results are collected with their wall
    time. ``on_batch`` receives each finished batch (to write the inference log).
    """

    def __init__(self, client: GatewayClient, frame: pd.DataFrame, rps: float,
                 on_batch: Callable[[pd.DataFrame, pd.DataFrame], Any] | None = None,
                 batch: int = 8):
        self.client, self.frame, self.rps = client, frame.reset_index(drop=True), rps
        self.on_batch, self.batch = on_batch, batch
        self.results: list[pd.DataFrame] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="canary-traffic", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> "BackgroundTraffic":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        i = 0
        n = len(self.frame)
        try:
            while not self._stop.is_set():
                t = time.monotonic()
                idx = [(i + k) % n for k in range(self.batch)]
                i += self.batch
                rows = self.frame.iloc[idx].reset_index(drop=True)
                rids = [uuid.uuid4().hex for _ in idx]
                res = self.client.replay(rows, rids)
                res["wall_time"] = pd.Timestamp.now(tz="UTC")
                self.results.append(res)
                if self.on_batch is not None:
                    self.on_batch(rows, res)
                self._stop.wait(max(0.0, self.batch / self.rps - (time.monotonic() - t)))
        except BaseException as exc:  # noqa: BLE001 - reported by the driver
            self.error = exc


def _followups(runner: "DagRunner", outcome: DagRunOutcome) -> list[tuple[str, dict[str, Any], str]]:
    """DAG runs the finished run asked for but ``dag.test`` does not execute.

    * ``TriggerDagRunOperator`` (fire-and-forget): a *queued* DAG run of the target with its conf;
      the queued row is deleted (the driver runs the target itself).
    * Asset events the run emitted: every parsed DAG scheduled on that asset, with the event's
      ``extra`` as conf; the asset's run queue entries are cleared.

    Returns:
        ``[(dag_id, conf, why)]`` in the order they were asked for.
    """
    from airflow.models.asset import AssetDagRunQueue, AssetEvent, AssetModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    out: list[tuple[str, dict[str, Any], str]] = []
    with create_session() as s:
        queued = (s.query(DagRun).filter(DagRun.state == "queued", DagRun.dag_id != outcome.dag_id)
                  .order_by(DagRun.id).all())
        for dr in queued:
            out.append((dr.dag_id, dict(dr.conf or {}), f"triggered by {outcome.dag_id}"))
            s.delete(dr)
        events = (s.query(AssetEvent, AssetModel).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                  .filter(AssetEvent.source_dag_id == outcome.dag_id,
                          AssetEvent.source_run_id == outcome.run_id).all())
        for ev, asset in events:
            extra = dict(ev.extra or {})
            for dag_id, dag in runner.bag.dags.items():
                if dag_id == outcome.dag_id:
                    continue
                names = {a.name for a in getattr(dag, "schedule", None) or []
                         if hasattr(a, "name")} if isinstance(getattr(dag, "schedule", None), (list, tuple)) else set()
                try:
                    expr = dag.timetable.asset_condition  # AssetAll / AssetAny / Asset
                    names |= {a.name for a in _iter_assets(expr)}
                except AttributeError:
                    pass
                if asset.name in names:
                    # A scheduler would hand the event to the run as ``triggering_asset_events``;
                    # dag.test cannot, so the event travels as the DAG's ``drift_event`` param
                    # (its documented manual equivalent) with the model it names.
                    conf = {"model": extra.get("model"), "drift_event": json.dumps(extra, default=str)}
                    out.append((dag_id, conf, f"asset {asset.name} from {outcome.dag_id}"))
        s.query(AssetDagRunQueue).delete()
    return out


def _iter_assets(expr: Any) -> Iterable[Any]:
    if expr is None:
        return []
    objs = getattr(expr, "objects", None)
    if objs is None:
        return [expr] if hasattr(expr, "name") else []
    found = []
    for o in objs:
        found.extend(_iter_assets(o))
    return found


# ====================================================================================== the demo
@dataclasses.dataclass
class HourRecord:
    """One replayed logical hour (kept for the report)."""

    hour: int
    start: str
    first_day: int
    last_day: int
    rows: int
    failed_requests: int
    versions: dict[str, int]
    drift: bool | None = None
    drift_features: list[str] = dataclasses.field(default_factory=list)
    threshold_source: str | None = None
    dag_seconds: float | None = None
    acted: bool = False
    status: str | None = None
    invalid_features: list[str] = dataclasses.field(default_factory=list)


class Demo:
    """Runs the whole loop; see the module docstring. Build with a :class:`DemoConfig`."""

    def __init__(self, cfg: DemoConfig, progress: Progress | None = None):
        self.cfg = cfg
        self.progress = progress or Progress()
        self.events: list[dict[str, Any]] = []  # alerts, retrains, publishes, canaries, rollbacks
        self.hours: list[HourRecord] = []
        self.traffic: list[pd.DataFrame] = []  # per-request records of the logical replay
        self.runtime: Runtime | None = None
        self.runner: DagRunner | None = None
        self.baseline = None  # the never-retrained champion (TrainedModel)
        self.closed_loops: list[dict[str, Any]] = []
        self.bad_offered = False
        self.alerts_acted = 0
        self.datasets: dict[str, str] = {}  # model version -> training window (Parquet)
        self._last_window_uri: str | None = None
        self._published_once = False
        self._chain_event: str | None = None  # drift event (JSON) of the alert being handled

    # ------------------------------------------------------------------ helpers
    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        ev = {"kind": kind, "t": self.progress.elapsed(), "wall": time.time(), **data}
        self.events.append(ev)
        return ev

    @property
    def settings(self):
        from tritonflow.settings import get_settings

        return get_settings()

    def mlflow_client(self):
        import mlflow

        return mlflow.MlflowClient(tracking_uri=self.settings.resolved_mlflow_tracking_uri)

    def aliases(self) -> dict[str, int]:
        try:
            rm = self.mlflow_client().get_registered_model(self.cfg.model)
        except Exception:  # noqa: BLE001
            return {}
        return {k: int(v) for k, v in (rm.aliases or {}).items()}

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        cfg, p = self.cfg, self.progress
        stopped = stop_leftovers(cfg.home)
        if stopped:
            p.step(f"stopped services left by a previous run: {', '.join(stopped)}")
        if cfg.home.exists():
            shutil.rmtree(cfg.home)
        cfg.home.mkdir(parents=True)
        from tritonflow import settings as st

        taken: set[int] = set()
        ports = {
            "triton_http": _port(st.DEFAULT_TRITON_HTTP_PORT, taken),
            "triton_grpc": _port(st.DEFAULT_TRITON_GRPC_PORT, taken),
            "triton_metrics": _port(st.DEFAULT_TRITON_METRICS_PORT, taken),
            "mlflow": _port(st.DEFAULT_MLFLOW_PORT, taken),
            "gateway": _port(st.DEFAULT_GATEWAY_PORT, taken),
        }
        apply_environment(environment(cfg, ports))
        p.step(f"demo home {cfg.home}; ports {ports}")
        from repository_sync.signing import generate_key_pair

        s = self.settings
        key_id = generate_key_pair(s.signing_key_path, Path(s.signing_trusted_keys_dir) / "demo.pub")
        p.step(f"signing key pair created (key id {key_id[:12]})")
        self.runtime = Runtime(p)
        # The services start while Airflow migrates its DB and parses the DAGs (both are slow).
        errors: list[BaseException] = []

        def start_runtime() -> None:
            try:
                try:
                    self.runtime.start()
                except RuntimeStartError as exc:
                    if "already in use" not in str(exc):
                        raise
                    # Another process took a port between the check and the bind: pick free
                    # ports for every service and try once more.
                    fresh: set[int] = set()
                    again = {k: _port(0, fresh) for k in ports}
                    apply_environment(environment(cfg, again))
                    p.step(f"a port was taken meanwhile ({exc}); retrying on {again}")
                    self.runtime = Runtime(p)
                    self.runtime.start()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        starter = threading.Thread(target=start_runtime, name="runtime-start")
        starter.start()
        try:
            t = time.monotonic()
            airflow_db_migrate(cfg.home / "airflow")
            p.step(f"airflow: metadata DB migrated (SQLite, {time.monotonic() - t:.1f} s)")
            self.runner = DagRunner(PROJECT_ROOT / "dags", p)
            p.step(f"airflow: DAGs parsed: {sorted(self.runner.bag.dags)}")
        finally:
            starter.join()
        if errors:
            raise errors[0]

    def teardown(self) -> None:
        if self.runtime is None:
            return
        if self.cfg.keep_running:
            self.progress.step(f"left running: MLflow {self.runtime.mlflow.tracking_uri}, gateway "
                               f"{self.runtime.gateway.url}, Triton {self.runtime.triton.http_url}; "
                               f"stop with TRITONFLOW_HOME={self.cfg.home} tritonflow runtime stop")
            return
        self.runtime.stop()
        self.progress.step("runtime stopped")

    # ------------------------------------------------------------------ DAG runs
    def run_dag(self, dag_id: str, conf: Mapping[str, Any], *, follow: bool = True,
                logical_date: dt.datetime | None = None, quiet: bool = False,
                depth: int = 0) -> list[DagRunOutcome]:
        """Run ``dag_id``, then (``follow``) the DAGs it triggered, depth first.

        Returns:
            Every outcome, the requested run first.
        """
        assert self.runner is not None
        if not self.runner.has(dag_id):
            self.progress.step(f"dag {dag_id}: not in dags/ (skipped)")
            return []
        conf = {**conf, **self.overrides(dag_id, conf)}
        if dag_id == "canary_promotion":
            outcome = self._run_canary(conf)
        else:
            outcome = self.runner.run(dag_id, conf, logical_date=logical_date, quiet=quiet)
        self._observe(outcome)
        outcomes = [outcome]
        if follow and depth < 6:
            for target, tconf, why in _followups(self.runner, outcome):
                self.progress.step(f"follow: {target} ({why})")
                outcomes += self.run_dag(target, {**self._base_conf(), **tconf}, depth=depth + 1)
        return outcomes

    def overrides(self, dag_id: str, conf: Mapping[str, Any]) -> dict[str, Any]:
        """What the demo adds to a run's conf (also to runs another DAG triggered).

        * ``model_publish``: ``profile`` per :attr:`DemoConfig.profile`, and as ``dataset_uri`` the
          version's training window when the driver knows it (the champion's training years; a
          retraining's window), so the drift reference recorded at publish is a sample of the
          training data rather than the input example.
        * ``canary_promotion``: the demo's short steps and bakes.
        """
        if dag_id == "model_publish":
            out: dict[str, Any] = {"profile": bool(self.cfg.profile and not self._published_once)}
            version = str(conf.get("version_or_alias", ""))
            if not conf.get("dataset_uri") and version in self.datasets:
                out["dataset_uri"] = self.datasets[version]
            elif not conf.get("dataset_uri") and self._last_window_uri:
                out["dataset_uri"] = self._last_window_uri
            return out
        if dag_id in ("shadow_evaluation", "retrain") and self._chain_event:
            # The demo's clock is logical: a run without a window would look at "now" (wall
            # clock); it gets the drift event of the alert being handled instead.
            if not conf.get("drift_event") and not conf.get("window_end"):
                return {"drift_event": self._chain_event}
            return {}
        if dag_id == "canary_promotion":
            return {"steps": [int(x) for x in self.cfg.canary_steps.split(",")],
                    "bake_s": self.cfg.canary_bake_s, "min_requests": self.cfg.canary_min_requests}
        return {}

    def _base_conf(self) -> dict[str, Any]:
        return {"model": self.cfg.model}

    def _observe(self, outcome: DagRunOutcome) -> None:
        """Record publish/retrain/canary events from a finished run."""
        if outcome.dag_id == "retrain":
            window = outcome.xcoms.get("training_window") or {}
            self._last_window_uri = window.get("uri") if isinstance(window, Mapping) else None
        if outcome.dag_id == "model_publish":
            self._published_once = self._published_once or outcome.ok
            self.event("publish", state=outcome.state, seconds=outcome.seconds,
                       version=outcome.find("version"), conf=outcome.conf,
                       timings=outcome.find("timings_s"))
        elif outcome.dag_id == "retrain":
            self.event("retrain", state=outcome.state, seconds=outcome.seconds,
                       version=outcome.find("version"), hour=self._current_hour)
        elif outcome.dag_id == "shadow_evaluation":
            self.event("shadow", state=outcome.state, seconds=outcome.seconds,
                       decision=outcome.find("outcome") or outcome.find("decision"),
                       hour=self._current_hour)

    _current_hour: int | None = None

    def _run_canary(self, conf: Mapping[str, Any]) -> DagRunOutcome:
        """``canary_promotion`` with steady traffic through the gateway while it bakes."""
        assert self.runner is not None
        cfg = self.cfg
        conf = {**self._base_conf(), "challenger": "challenger",
                "steps": [int(x) for x in cfg.canary_steps.split(",")],
                "bake_s": cfg.canary_bake_s, "min_requests": cfg.canary_min_requests, **conf}
        before = self.aliases()
        frame = self._canary_rows()
        writer = self._writer()

        def log_batch(rows: pd.DataFrame, res: pd.DataFrame) -> None:
            from model_registry.datasets import LABEL_COLUMN

            ok = res["status"] == 200
            if ok.any():
                rec = self._records(rows[ok.to_numpy()], res[ok],
                                    pd.DatetimeIndex(res.loc[ok, "wall_time"]))
                writer.write(rec)
                # NOAA's labels are known at once: they arrive during the canary, which compares
                # the challenger's quality with the champion's (how the flipped one is caught)
                writer.write_labels(pd.DataFrame({
                    "request_id": rec["request_id"], "timestamp": rec["timestamp"],
                    LABEL_COLUMN: rows.loc[ok.to_numpy(), LABEL_COLUMN].astype("int64").to_numpy()}))

        t0 = time.time()
        with BackgroundTraffic(self.client, frame, cfg.canary_rps, on_batch=log_batch) as traffic:
            outcome = self.runner.run("canary_promotion", conf)
        seconds = time.time() - t0
        after = self.aliases()
        served = pd.concat(traffic.results, ignore_index=True) if traffic.results else pd.DataFrame()
        failed = int((served["status"] != 200).sum()) if len(served) else 0
        result = self._canary_record(after.get("challenger") or conf.get("challenger"))
        promoted = after.get("champion") not in (None, before.get("champion"))
        outcome_name = result.get("outcome") or ("promoted" if promoted else outcome.state)
        self.event("canary", state=outcome.state, seconds=seconds, outcome=outcome_name,
                   champion=before.get("champion"), challenger=after.get("challenger"),
                   new_champion=after.get("champion"), requests=int(len(served)),
                   failed_requests=failed, rollback=result.get("rollback"),
                   steps=result.get("steps"), started_wall=t0, hour=self._current_hour)
        self.progress.step(f"canary: {outcome_name}; champion {before.get('champion')} -> "
                           f"{after.get('champion')}; {len(served)} requests during the canary, "
                           f"{failed} failed")
        return outcome

    def _canary_record(self, version: Any) -> dict[str, Any]:
        """Outcome, steps and rollback tags the canary wrote on the challenger's model version."""
        try:
            mv = self.mlflow_client().get_model_version(self.cfg.model, str(version))
        except Exception:  # noqa: BLE001
            return {}
        tags = dict(mv.tags or {})
        cid = tags.get("tritonflow.canary.latest")
        if not cid:
            return {}
        prefix = f"tritonflow.canary.{cid}."
        out: dict[str, Any] = {"canary_id": cid, "steps": []}
        for key, value in sorted(tags.items()):
            if not key.startswith(prefix):
                continue
            name = key[len(prefix):]
            try:
                parsed = json.loads(value)
            except (TypeError, ValueError):
                parsed = value
            if name.startswith("step."):
                out["steps"].append(parsed)
            else:
                out[name] = parsed
        return out

    # ------------------------------------------------------------------ data and traffic
    def _writer(self):
        from drift_checks.inference_log import InferenceLogWriter, LogSchema
        from model_registry.datasets import FEATURE_COLUMNS

        schema = LogSchema({c: "float" for c in FEATURE_COLUMNS},
                           {SCORE_COLUMN: "float", PREDICTION_COLUMN: "int"})
        s = self.settings
        return InferenceLogWriter(s.inference_log_root, self.cfg.model, schema)

    def _records(self, rows: pd.DataFrame, res: pd.DataFrame, stamps: pd.DatetimeIndex) -> pd.DataFrame:
        from model_registry.datasets import FEATURE_COLUMNS

        rec = pd.DataFrame({
            "request_id": res["request_id"].astype(str).to_numpy(),
            "timestamp": pd.DatetimeIndex(stamps).tz_convert("UTC"),
            "model_version": res["version"].fillna(-1).astype("int64").to_numpy(),
        })
        for c in FEATURE_COLUMNS:
            rec[c] = rows[c].to_numpy(dtype="float64")
        rec[SCORE_COLUMN] = res["score"].astype("float64").to_numpy()
        rec[PREDICTION_COLUMN] = res["prediction"].astype("int64").to_numpy()
        return rec

    def _canary_rows(self) -> pd.DataFrame:
        """Rows the canary traffic cycles through: the days of the next logical hours."""
        h = (self._current_hour or 0) + 1
        m = self.cfg.mapping
        a = m.first_day + h * m.days_per_hour
        b = min(a + 4 * m.days_per_hour, m.last_day)
        if b - a < m.days_per_hour:
            a, b = max(m.first_day, m.last_day - 4 * m.days_per_hour), m.last_day
        return self.data.iloc[a:b]

    def replay_hour(self, hour: int) -> pd.DataFrame:
        """Send the hour's days through the gateway; write the inference and labels logs."""
        from model_registry.datasets import FEATURE_COLUMNS, LABEL_COLUMN

        m = self.cfg.mapping
        days = m.days_of(hour)
        rows = self.data.iloc[days.start:days.stop].reset_index(drop=True)
        stamps = m.timestamps(hour)
        rids = [f"noaa-day-{d:05d}-{uuid.uuid4().hex[:8]}" for d in days]
        res = self.client.replay(rows, rids)
        ok = (res["status"] == 200).to_numpy()
        rec = self._records(rows[ok], res[ok], stamps[ok])
        writer = self._writer()
        writer.write(rec)
        labels = pd.DataFrame({"request_id": rec["request_id"], "timestamp": rec["timestamp"],
                               LABEL_COLUMN: rows.loc[ok, LABEL_COLUMN].astype("int64").to_numpy()})
        writer.write_labels(labels)
        full = rec.assign(day=np.asarray(list(days))[ok], hour=hour,
                          label=labels[LABEL_COLUMN].to_numpy(),
                          baseline_score=self.baseline.predict_scores(rows[ok][list(FEATURE_COLUMNS)]),
                          latency_ms=res.loc[ok, "latency_ms"].to_numpy())
        self.traffic.append(full)
        versions = {str(k): int(v) for k, v in rec["model_version"].value_counts().items()}
        self.hours.append(HourRecord(hour=hour, start=m.hour_start(hour).isoformat(),
                                     first_day=days.start, last_day=days.stop - 1, rows=int(ok.sum()),
                                     failed_requests=int((~ok).sum()), versions=versions))
        return full

    # ------------------------------------------------------------------ the loop
    def train_champion(self) -> int:
        """Train on the early years, register with alias ``champion``; returns the version."""
        from model_registry.training import Lineage, log_and_register, train_noaa

        a, b = self.cfg.champion_days
        window = self.data.iloc[a:b]
        t = time.monotonic()
        self.baseline = train_noaa(window)
        reg = log_and_register(self.baseline, window, tracking_uri=self.settings.resolved_mlflow_tracking_uri,
                               name=self.cfg.model, alias="champion",
                               lineage=Lineage(reason="initial", extra={"demo": "noaa"}))
        path = self.cfg.home / "datasets" / f"{self.cfg.model}-v{reg.version}-training-window.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        window.to_parquet(path, index=False)
        self.datasets[str(reg.version)] = str(path)
        auc = self.baseline.metrics.get("validation_auc", float("nan"))
        self.progress.step(f"champion trained on days {a}..{b - 1} (hold-out AUC {auc:.3f}), "
                           f"registered as {self.cfg.model} version {reg.version} @champion "
                           f"({time.monotonic() - t:.1f} s)")
        self.event("champion", version=int(reg.version), days=[a, b - 1])
        return int(reg.version)

    def publish(self, version: int | str, why: str) -> list[DagRunOutcome]:
        """Publish a model version through a ``model_publish`` DAG run (and what it triggers)."""
        self.progress.step(f"publish {self.cfg.model} version {version} ({why})")
        conf = {**self._base_conf(), "version_or_alias": str(version)}
        return self.run_dag("model_publish", conf)

    def route_champion(self, version: int) -> None:
        """Point the gateway at the first champion (100 %): what serving starts from.

        The canary DAG owns every later routing change; the first champion has nothing to canary
        against, so the driver writes its single-version plan with the same router.
        """
        from repository_sync.router import TrafficPlan, wait_live
        from tritonflow.pipelines.canary import CanaryEnvironment

        env = CanaryEnvironment.from_settings(self.settings, gateway=self.runtime.gateway)
        plan = TrafficPlan.single(self.cfg.model, version, name=f"{self.cfg.model}:initial")
        env.router().apply(plan)
        wait_live(env.gateway_url, plan)
        self.progress.step(f"gateway: 100 % of {self.cfg.model} -> version {version}")

    def drift_conf(self, hour: int) -> dict[str, Any]:
        """Params of the hourly run: this model only; Evidently and whylogs off (they decide
        nothing and cost 15-30 s per hour); an alert hour is re-run with them on."""
        return {"models": [self.cfg.model], "evidently": False, "profile": False}

    def check_drift(self, hour: int) -> DagRunOutcome | None:
        """``drift_monitor`` for logical hour ``hour`` (no follow-ups: the driver decides)."""
        if not self.runner.has("drift_monitor"):
            return None
        # CronDataIntervalTimetable: a run at logical date T checks the hour [T - 1 h, T).
        end = self.cfg.mapping.hour_start(hour + 1)
        out = self.runner.run("drift_monitor", self.drift_conf(hour), logical_date=end, quiet=True)
        rec = self.hours[-1]
        rec.dag_seconds = out.seconds
        summary = next((v for k, v in out.xcoms.items() if k.startswith("check") and isinstance(v, Mapping)), {})
        event = next((v for k, v in out.xcoms.items() if k.startswith("drift_event") and isinstance(v, Mapping)), None)
        rec.status = summary.get("status")
        rec.drift = event is not None
        rec.drift_features = list((event or {}).get("features") or [])
        sources = set()
        for f in rec.drift_features:
            for st in ((summary.get("features") or {}).get(f, {}).get("statistics") or {}).values():
                if isinstance(st, Mapping) and st.get("flagged"):
                    sources.add(st.get("threshold_source"))
        rec.threshold_source = ("dynamic" if sources == {"dynamic"} else
                                "static" if sources == {"static"} else ",".join(sorted(map(str, sources))) or None)
        rec.invalid_features = [f for f, v in (summary.get("features") or {}).items()
                                if isinstance(v, Mapping) and v.get("severity") == "invalid"]
        return out

    def handle_alert(self, hour: int, drift_out: DagRunOutcome) -> None:
        """A drift alert: shadow evaluation -> retrain -> publish -> canary, as the DAGs decide."""
        p = self.progress
        self.alerts_acted += 1
        self.hours[-1].acted = True
        before = self.aliases().get("champion")
        alert = self.event("alert", hour=hour, features=self.hours[-1].drift_features,
                           champion=before)
        p.step(f"DRIFT ALERT at logical hour {hour} (days {self.hours[-1].first_day}.."
               f"{self.hours[-1].last_day}): {', '.join(self.hours[-1].drift_features) or 'dataset'}")
        event = next((v for k, v in drift_out.xcoms.items()
                      if k.startswith("drift_event") and isinstance(v, Mapping)), None)
        self._chain_event = json.dumps(event, default=str) if event else None
        followed = _followups(self.runner, drift_out)
        if not followed:
            p.step("drift_monitor emitted no asset event for this alert: nothing to follow")
        for target, conf, why in followed:
            p.step(f"follow: {target} ({why})")
            self.run_dag(target, {**self._base_conf(), **conf})
        after = self.aliases().get("champion")
        if after is not None and after != before:
            loop = {"alert_hour": hour, "from": before, "to": after,
                    "seconds": time.time() - alert["wall"]}
            self.closed_loops.append(loop)
            self.event("promoted", hour=hour, version=after, previous=before,
                       closed_loop_s=loop["seconds"])
            p.step(f"closed loop: drift alert -> version {after} promoted in {loop['seconds']:.1f} s")
            if self.cfg.bad_challenger and not self.bad_offered:
                self.offer_bad_challenger(hour)

    def offer_bad_challenger(self, hour: int) -> None:
        """Register a challenger trained on flipped labels, publish it, canary it: must roll back."""
        from model_registry.training import Lineage, log_and_register, train_noaa

        self.bad_offered = True
        m = self.cfg.mapping
        b = m.days_of(hour).stop
        a = max(m.first_day, b - self.cfg.retrain_hours * m.days_per_hour)
        window = self.data.iloc[a:b].copy()
        # Labels flipped (a label-encoding bug). A shuffled-label model is no use here: its scores
        # are as close to the champion's as a good retrained model's, so no label-free canary
        # analysis can tell them apart (measured: KS 0.28 vs 0.37).
        window["rain"] = 1 - window["rain"].to_numpy()
        model = train_noaa(window)
        reg = log_and_register(model, window, tracking_uri=self.settings.resolved_mlflow_tracking_uri,
                               name=self.cfg.model, alias="challenger",
                               lineage=Lineage(reason="demo_bad_challenger",
                                               extra={"labels": "flipped"}))
        self.progress.step(f"BAD CHALLENGER: version {reg.version} trained on days {a}..{b - 1} with "
                           f"flipped labels (hold-out AUC {model.metrics.get('validation_auc', float('nan')):.3f})")
        path = self.cfg.home / "datasets" / f"{self.cfg.model}-v{reg.version}-training-window.parquet"
        window.to_parquet(path, index=False)
        self.datasets[str(reg.version)] = str(path)
        self.event("bad_challenger", version=int(reg.version), hour=hour)
        before = self.aliases().get("champion")
        self.publish(reg.version, "bad challenger")
        t0 = time.time()
        self.run_dag("canary_promotion", {**self._base_conf(), "challenger": str(reg.version)},
                     follow=False)
        after = self.aliases().get("champion")
        rolled_back = after == before
        self.event("bad_challenger_result", version=int(reg.version), rolled_back=rolled_back,
                   seconds=time.time() - t0)
        self.progress.step("bad challenger " + ("ROLLED BACK by the canary analysis"
                                                if rolled_back else "was PROMOTED (unexpected)"))

    def run(self) -> dict[str, Any]:
        """The whole demo; returns the summary written beside the report."""
        from model_registry.datasets import load_noaa

        cfg, p = self.cfg, self.progress
        p.step(f"tritonflow demo ({'quick' if cfg.quick else 'full'}): {cfg.mapping.describe()}")
        self.data = load_noaa()
        self.setup()
        champion = self.train_champion()
        published = self.publish(champion, "initial champion")
        if not published or not published[0].ok:
            raise TritonflowError(f"publishing the first champion (version {champion}) failed: "
                                  f"{published[0].tasks if published else 'no model_publish DAG'}; "
                                  f"logs under {cfg.home / 'airflow'}")
        self.route_champion(champion)
        self.client = GatewayClient(self.runtime.gateway.url, cfg.model,
                                    [c for c in self.data.columns if c not in ("day", "rain")],
                                    response_header=self.settings.gateway_response_header)
        m = cfg.mapping
        p.step(f"replaying {m.n_hours} logical hours through the gateway {self.runtime.gateway.url}; "
               f"drift_monitor runs every hour (dynamic P95 thresholds after {cfg.min_history_windows} "
               "windows)")
        for hour in range(m.n_hours):
            self._current_hour = hour
            t = time.monotonic()
            self.replay_hour(hour)
            out = self.check_drift(hour)
            rec = self.hours[-1]
            p.step(f"hour {hour:3d} days {rec.first_day}-{rec.last_day}: {rec.rows} requests "
                   f"(versions {rec.versions}), {rec.status}, drift={rec.drift}"
                   + (f" {rec.drift_features} ({rec.threshold_source} thresholds)" if rec.drift else "")
                   + (f", contract-invalid {rec.invalid_features}" if rec.invalid_features else "")
                   + f" ({time.monotonic() - t:.1f} s)")
            if out is not None and rec.drift:
                if rec.threshold_source != "dynamic":
                    p.step(f"  alert on {rec.threshold_source} thresholds while the history builds "
                           f"(< {cfg.min_history_windows} windows): backfill, not acted on")
                    _followups(self.runner, out)  # drop the queued asset event
                elif self.alerts_acted >= cfg.max_alerts_acted:
                    p.step(f"  alert not acted on: the demo acts on {cfg.max_alerts_acted} alerts")
                    _followups(self.runner, out)
                else:
                    self.handle_alert(hour, out)
        self.client.close()
        return self.finish()

    def finish(self) -> dict[str, Any]:
        from tritonflow.report import write_report

        p = self.progress
        traffic = pd.concat(self.traffic, ignore_index=True) if self.traffic else pd.DataFrame()
        summary = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self.cfg).items()},
            "mapping": self.cfg.mapping.describe(),
            "hours": [dataclasses.asdict(h) for h in self.hours],
            "events": self.events,
            "closed_loops": self.closed_loops,
            "dag_runs": [{"dag_id": r.dag_id, "state": r.state, "seconds": r.seconds}
                         for r in (self.runner.runs if self.runner else [])],
            "wall_s": p.elapsed(),
        }
        report = write_report(self.cfg.home / "report", summary, traffic,
                              history_url=self.settings.drift_history_db_url, model=self.cfg.model)
        summary["report"] = str(report)
        for loop in self.closed_loops:
            p.step(f"closed loop (drift alert -> promoted challenger): {loop['seconds']:.1f} s "
                   "(issue 8 benchmark: reference 23 min, goal < 5 min)")
        p.step(f"report: {report}")
        return summary


# ====================================================================================== CLI
def config_from_args(argv: list[str] | None = None) -> DemoConfig:
    """Parse the command line into a :class:`DemoConfig`."""
    ap = argparse.ArgumentParser(prog="python -m tritonflow.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the smallest sweep (about 24 logical hours)")
    ap.add_argument("--home", type=Path, default=DEFAULT_DEMO_HOME, help="demo state folder (wiped)")
    ap.add_argument("--days-per-hour", type=int, default=None, help="NOAA days per logical hour")
    ap.add_argument("--first-day", type=int, default=None, help="first replayed day")
    ap.add_argument("--last-day", type=int, default=None, help="last replayed day (exclusive)")
    ap.add_argument("--hours", type=int, default=None, help="replay at most this many logical hours")
    ap.add_argument("--min-history", type=int, default=None, help="windows before dynamic thresholds")
    ap.add_argument("--no-bad-challenger", action="store_true", help="skip the label-flipped challenger")
    ap.add_argument("--keep-running", action="store_true", help="leave MLflow/Triton/NGINX running")
    args = ap.parse_args(argv)
    cfg = quick_config(args.home) if args.quick else DemoConfig(home=args.home)
    m = cfg.mapping
    d = args.days_per_hour or m.days_per_hour
    first = args.first_day if args.first_day is not None else m.first_day
    last = args.last_day if args.last_day is not None else m.last_day
    if args.hours:
        last = min(last, first + args.hours * d)
    updates: dict[str, Any] = {"mapping": DayHourMapping(first, last, d),
                               "keep_running": args.keep_running,
                               "bad_challenger": not args.no_bad_challenger}
    if args.min_history is not None:
        updates["min_history_windows"] = args.min_history
    if first < cfg.champion_days[1]:
        raise SystemExit(f"--first-day={first} overlaps the champion's training days {cfg.champion_days}")
    return dataclasses.replace(cfg, **updates)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tritonflow.demo``."""
    cfg = config_from_args(argv)
    progress = Progress()
    demo = Demo(cfg, progress)
    code = 0
    try:
        summary = demo.run()
        (cfg.home / "report" / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    except KeyboardInterrupt:
        progress.step("interrupted")
        code = 130
    except TritonflowError as exc:
        progress.step(f"FAILED: {type(exc).__name__}: {exc}")
        code = 1
    finally:
        demo.teardown()
        progress.step(f"wall time {progress.elapsed():.1f} s")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
