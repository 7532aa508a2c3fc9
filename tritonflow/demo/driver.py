"""The demo's driver: it sets up, plays the world and reads back what the scheduler did.

The driver never runs a DAG itself and never creates a run of a DAG other than
``drift_monitor``: every other run is the scheduler's (the drift asset event starts
``shadow_evaluation``, whose ``TriggerDagRunOperator`` starts ``retrain`` or
``canary_promotion``; ``retrain`` starts ``model_publish``, which starts the next
``shadow_evaluation``). Runs overlap: the next logical hours replay while a retraining or a
canary is in flight. After the loop the driver, as a data scientist, registers a label-flipped
version with alias ``canary`` (:mod:`tritonflow.demo.bad_challenger`); ``registry_events`` turns
that into ``model_publish`` then ``canary_promotion``, which must roll it back.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

import numpy as np
import pandas as pd

from ground.exceptions import RuntimeStartError
from ground.settings import PROJECT_ROOT
from tritonflow.demo.bad_challenger import run_version
from tritonflow.demo.config import (
    ASSET_PACED_DAGS,
    LOOP_DAGS,
    PACED_DAGS,
    SENTINEL_DAG,
    WATCHED_DAG,
    DemoConfig,
    Progress,
    apply_environment,
    environment,
    pick_port,
    stop_leftovers,
)
from tritonflow.demo.runs import HourRecord
from tritonflow.demo.serving import Runtime, inference_log_writer, inference_records
from tritonflow.demo.traffic import BackgroundTraffic, GatewayClient

if TYPE_CHECKING:
    from model_registry.training import TrainedModel
    from tritonflow.runtime.airflow import AirflowDeployment
    from tritonflow.runtime.airflow_api import AirflowApi

_T = TypeVar("_T")


def _started(value: _T | None, what: str) -> _T:
    """``value`` once the demo has made it; a clear error when a step runs before it."""
    if value is None:
        raise RuntimeStartError(f"demo: {what} is not started yet")
    return value


#: Seconds between two looks of the watcher thread at the deployment (one request for every loop DAG's
#: recent runs) and the registry.
WATCH_S = 2.0
#: Seconds between two looks at the previous hour's ``check`` task instances (the next hour waits on
#: them: this paces the replay). One request a look.
POLL_S = 0.25
#: Seconds between two state lines of Airflow's run-wait endpoint while the driver waits for a run's end.
RUN_WAIT_S = 0.5
#: Newest runs of the loop DAGs the watcher reads each look.
WATCH_RUNS = 100
#: Every how many looks at the ``check`` task instances the run's own state is read too (a run that
#: ended without a check, e.g. cleared).
RUN_LOOK_EVERY = 8
#: Seconds an asset event may stay queued for a paced DAG with no run of it queued or running before
#: the driver has the DAG's file parsed again (:meth:`Demo.note_queued_events`).
STALE_QUEUE_S = 8.0
#: Seconds a drift_monitor run may take before the driver gives up on it.
DRIFT_RUN_TIMEOUT_S = 900.0
#: Seconds the dag-processor may take to parse the loop DAGs.
PARSE_TIMEOUT_S = 600.0
#: Seconds the sentinel runs started by the last promotions may take to arm (golden set + defer).
SENTINEL_ARM_TIMEOUT_S = 300.0
#: DAG run states that are final.
FINAL_STATES = ("success", "failed")
#: Task instance states that are final.
TI_FINAL_STATES = ("success", "failed", "skipped", "upstream_failed", "removed")


def run_after(data_interval_end: dt.datetime) -> dt.datetime:
    """The ``run_after`` of a run the driver creates for a logical hour: its end, at the latest a second ago.

    A scheduled run's ``run_after`` is its data interval's end; the REST API's default is the
    request's time, and the scheduler starts a queued run once ``run_after <= now()`` in the
    metadata DB, whose ``now()`` has whole seconds on SQLite: the run waited 0.4-0.8 s for the next
    second (``benchmarks/drift_hour.py``). A replayed hour ended long ago.
    """
    return min(data_interval_end, dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1))


class Demo:
    """Runs the whole loop on the real local deployment; build with a :class:`DemoConfig`."""

    def __init__(self, cfg: DemoConfig, progress: Progress | None = None):
        self.cfg = cfg
        self.progress = progress or Progress()
        self.events: list[dict[str, Any]] = []
        self.hours: list[HourRecord] = []
        self.served_after_loop: dict[str, int] = {}
        self.traffic: list[pd.DataFrame] = []
        self.runtime: Runtime | None = None
        self.airflow: AirflowDeployment | None = None
        self.api: AirflowApi | None = None
        self.baseline: TrainedModel | None = None
        self.client: GatewayClient | None = None
        self.canary_traffic: BackgroundTraffic | None = None
        self.driver_runs: dict[str, int] = {}  # drift_monitor run_id -> logical hour
        self.promotions: list[dict[str, Any]] = []
        self.bad_challenger: dict[str, Any] | None = None
        self._current_hour = 0
        self._stop_watch = threading.Event()
        self._seen_states: dict[tuple[str, str], str] = {}
        # runs of PACED_DAGS queued or running -> the logical hour the watcher first saw them in
        self._in_flight: dict[tuple[str, str], int] = {}
        self._queued_since: dict[str, float] = {}  # paced DAG -> when its stalled asset event was seen
        self._in_flight_lock = threading.Lock()
        self.watch_error: str | None = None

    # ------------------------------------------------------------------ helpers
    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        """Record a demo event for the report and return it."""
        ev = {"kind": kind, "t": self.progress.elapsed(), "wall": time.time(), **data}
        self.events.append(ev)
        return ev

    @property
    def settings(self):
        """The typed settings of the demo's environment."""
        from ground.settings import get_settings

        return get_settings()

    def mlflow_client(self):
        """An MLflow client on the demo's tracking server."""
        import mlflow

        return mlflow.MlflowClient(tracking_uri=self.settings.resolved_mlflow_tracking_uri)

    def aliases(self) -> dict[str, int]:
        """The demo model's aliases (``{alias: version}``; empty while the registry is unreachable)."""
        try:
            rm = self.mlflow_client().get_registered_model(self.cfg.model)
        except Exception:  # noqa: BLE001 - registry not reachable yet: no aliases
            return {}
        return {k: int(v) for k, v in (rm.aliases or {}).items()}

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        """Fresh home, ports, environment, keys; MLflow/Triton/gateway and Airflow start side by side."""
        cfg, p = self.cfg, self.progress
        stopped = stop_leftovers(cfg.home)
        if stopped:
            p.step(f"stopped services left by a previous run: {', '.join(stopped)}")
        if cfg.home.exists():
            shutil.rmtree(cfg.home)
        cfg.home.mkdir(parents=True)
        from ground.settings import DEFAULTS
        from tritonflow.runtime import airflow_config as af

        taken: set[int] = set()
        self.ports = {
            "triton_http": pick_port(DEFAULTS.triton_http_port, taken),
            "triton_grpc": pick_port(DEFAULTS.triton_grpc_port, taken),
            "triton_metrics": pick_port(DEFAULTS.triton_metrics_port, taken),
            "mlflow": pick_port(DEFAULTS.mlflow_port, taken),
            "gateway": pick_port(DEFAULTS.gateway_port, taken),
            "airflow": pick_port(DEFAULTS.airflow_api_port, taken),
            "airflow_execution_api": pick_port(DEFAULTS.airflow_execution_api_port, taken),
            "airflow_task_logs": pick_port(af.DEFAULT_WORKER_LOG_PORT, taken),
            "airflow_trigger_logs": pick_port(af.DEFAULT_TRIGGERER_LOG_PORT, taken),
        }
        apply_environment(environment(cfg, self.ports))
        p.step(f"demo home {cfg.home}; ports {self.ports}")
        from repository_sync.signing import generate_key_pair

        s = self.settings
        key_id = generate_key_pair(s.signing_key_path, Path(s.signing_trusted_keys_dir) / "demo.pub")
        p.step(f"signing key pair created (key id {key_id[:12]})")
        self.runtime = Runtime(p)
        self._airflow_error: BaseException | None = None
        self._airflow_thread = threading.Thread(target=self._start_airflow, name="airflow-start")
        self._airflow_thread.start()
        self.runtime.start()

    def _start_airflow(self) -> None:
        from tritonflow.runtime.airflow import AirflowDeployment
        from tritonflow.runtime.airflow_api import AirflowApi
        from tritonflow.runtime.airflow_config import AirflowConfig

        try:
            t = time.monotonic()
            config = AirflowConfig.local(self.settings, api_port=self.ports["airflow"],
                                         execution_api_port=self.ports["airflow_execution_api"],
                                         worker_log_port=self.ports["airflow_task_logs"],
                                         triggerer_log_port=self.ports["airflow_trigger_logs"],
                                         dags_folder=PROJECT_ROOT / "dags")
            self.airflow = AirflowDeployment(config)
            self.airflow.start()
            db = "SQLite (WAL)" if config.is_sqlite else "PostgreSQL"
            self.progress.step(f"airflow: {config.executor} (parallelism {config.parallelism}), {db} "
                               f"metadata DB; scheduler, dag-processor, triggerer, api-server healthy at "
                               f"{config.api_url} ({time.monotonic() - t:.1f} s, logs {self.airflow.log_path})")
            self.api = AirflowApi(config.api_url)
            for dag_id in (*LOOP_DAGS, SENTINEL_DAG):
                self.api.wait_for_dag(dag_id, PARSE_TIMEOUT_S)
                self.api.unpause(dag_id)
            self.api.reparse(WATCHED_DAG)
            self.progress.step(f"airflow: loop DAGs parsed and unpaused: {', '.join(LOOP_DAGS)}, and "
                               f"{SENTINEL_DAG} (armed by each promotion) ({time.monotonic() - t:.1f} s)")
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait_for_airflow
            self._airflow_error = exc

    def wait_for_airflow(self) -> None:
        """Wait for the Airflow start-up thread; re-raise its error."""
        self._airflow_thread.join()
        if self._airflow_error is not None:
            raise self._airflow_error

    def teardown(self) -> None:
        """Stop the watcher and the traffic; stop every service unless ``keep_running``."""
        self._stop_watch.set()
        if self.canary_traffic is not None:
            self.canary_traffic.__exit__(None, None, None)
        if self.client is not None:
            self.client.close()
        if getattr(self, "_airflow_thread", None) is not None:
            self._airflow_thread.join()
        if self.cfg.keep_running and self.runtime is not None:
            self.progress.step(
                "left running:\n"
                f"  Airflow UI   {self.airflow.api_url if self.airflow else '(not started)'}  "
                "(login: none, simple auth manager, every visitor is admin)\n"
                f"  MLflow UI    {self.runtime.mlflow.tracking_uri}\n"
                f"  gateway      {self.runtime.gateway.url}  (Triton {self.runtime.triton.http_url})\n"
                f"  stop with:   TRITONFLOW_HOME={self.cfg.home} TRITONFLOW_AIRFLOW_API_PORT="
                f"{self.ports['airflow']} .venv/bin/python -m tritonflow.cli runtime stop "
                "--services mlflow,triton,gateway,airflow")
            return
        if self.airflow is not None:
            self.airflow.stop()
        if self.runtime is not None:
            self.runtime.stop()
        self.progress.step("runtime and airflow stopped")

    # ------------------------------------------------------------------ started parts
    @property
    def gateway_url(self) -> str:
        """Where the driver sends traffic (the local gateway)."""
        return self._rt.gateway.url

    def deployment(self) -> dict[str, Any]:
        """What ran the loop, for the summary: executor, parallelism, metadata DB, UI."""
        return {"executor": self._af.config.executor, "parallelism": self._af.config.parallelism,
                "metadata_db": "sqlite" if self._af.config.is_sqlite else "postgresql",
                "airflow_ui": self._af.api_url}

    @property
    def _rt(self) -> Runtime:
        return _started(self.runtime, "the runtime (MLflow, Triton, gateway)")

    @property
    def _af(self) -> AirflowDeployment:
        return _started(self.airflow, "Airflow")

    @property
    def _api(self) -> AirflowApi:
        return _started(self.api, "the Airflow API client")

    @property
    def _gw(self) -> GatewayClient:
        return _started(self.client, "the gateway client")

    @property
    def _canary(self) -> BackgroundTraffic:
        return _started(self.canary_traffic, "the canary traffic")

    @property
    def _champion0(self) -> TrainedModel:
        return _started(self.baseline, "the never-retrained champion")

    # ------------------------------------------------------------------ champion
    def train_champion(self) -> tuple[int, str]:
        """Train on the early years, register with alias ``champion``; returns (version, data)."""
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
        auc = self._champion0.metrics.get("validation_auc", float("nan"))
        self.progress.step(f"champion trained on days {a}..{b - 1} (hold-out AUC {auc:.3f}), "
                           f"registered as {self.cfg.model} version {reg.version} @champion "
                           f"({time.monotonic() - t:.1f} s)")
        self.event("champion", version=int(reg.version), days=[a, b - 1])
        return int(reg.version), str(path)

    def publish_champion(self, version: int, dataset_uri: str) -> None:
        """Publish the first champion with the publish pipeline, in this process (no DAG run).

        Serving has to start from something before the loop can run; every later publish is a
        ``model_publish`` run the scheduler starts. With profiling on it waits for Airflow's start-up
        first: Model Analyzer beside a starting scheduler, dag-processor, triggerer and api-server
        ended "inconclusive", and a challenger reuses only a champion's measured config, so every
        later publish of the replay paid a full sweep instead of the p99 gate's confirmation.
        """
        from tritonflow.pipelines.publish import publish

        if self.cfg.profile:
            self.wait_for_airflow()
        t = time.monotonic()
        summary = publish(f"{self.cfg.model}/{version}", dataset_uri=dataset_uri,
                          profile_enabled=self.cfg.profile, perf_gate_enabled=False)
        seconds = time.monotonic() - t
        doc = summary if isinstance(summary, Mapping) else {}
        self.event("publish", state="success", seconds=seconds, version=version,
                   how="publish pipeline in the driver (initial champion, no DAG run)",
                   timings=doc.get("timings_s"), profile=doc.get("profile"))
        self.progress.step(f"initial champion version {version} published with the publish pipeline "
                           f"({seconds:.1f} s, profile {doc.get('profile', 'unknown')}; not a DAG run)")

    def route_champion(self, version: int) -> None:
        """Point the gateway at the first champion (100 %); the canary DAG owns later changes."""
        from repository_sync.routing.gateway_probe import wait_live
        from repository_sync.routing.traffic_plan import TrafficPlan
        from tritonflow.pipelines.canary import CanaryEnvironment

        env = CanaryEnvironment.from_settings(self.settings, gateway=self._rt.gateway)
        plan = TrafficPlan.single(self.cfg.model, version, name=f"{self.cfg.model}:initial")
        env.router().apply(plan)
        wait_live(env.gateway_url, plan)
        self.progress.step(f"gateway: 100 % of {self.cfg.model} -> version {version}")

    # ------------------------------------------------------------------ traffic
    def _canary_rows(self) -> pd.DataFrame:
        """Rows the canary traffic cycles through: the days of the next logical hours."""
        m = self.cfg.mapping
        a = m.first_day + (self._current_hour + 1) * m.days_per_hour
        b = min(a + 4 * m.days_per_hour, m.last_day)
        if b - a < m.days_per_hour:
            a, b = max(m.first_day, m.last_day - 4 * m.days_per_hour), m.last_day
        return self.data.iloc[a:b]

    def _log_canary_batch(self, rows: pd.DataFrame, res: pd.DataFrame) -> None:
        """Canary traffic is logged with its wall time; its labels arrive at once (NOAA's are known)."""
        from model_registry.datasets import LABEL_COLUMN

        ok = (res["status"] == 200).to_numpy()
        if not ok.any():
            return
        writer = inference_log_writer(self.settings.inference_log_root, self.cfg.model)
        rec = inference_records(rows[ok], res[ok], pd.DatetimeIndex(res.loc[ok, "wall_time"]))
        writer.write(rec)
        writer.write_labels(pd.DataFrame({
            "request_id": rec["request_id"], "timestamp": rec["timestamp"],
            LABEL_COLUMN: rows.loc[ok, LABEL_COLUMN].astype("int64").to_numpy()}))

    def replay_hour(self, hour: int) -> HourRecord:
        """Send the hour's days through the gateway; write the inference log, then the labels."""
        from model_registry.datasets import FEATURE_COLUMNS, LABEL_COLUMN

        m = self.cfg.mapping
        days = m.days_of(hour)
        rows = self.data.iloc[days.start:days.stop].reset_index(drop=True)
        stamps = m.timestamps(hour)
        rids = [f"noaa-day-{d:05d}-{uuid.uuid4().hex[:8]}" for d in days]
        res = self._gw.replay(rows, rids)
        ok = (res["status"] == 200).to_numpy()
        rec = inference_records(rows[ok], res[ok], stamps[ok])
        writer = inference_log_writer(self.settings.inference_log_root, self.cfg.model)
        writer.write(rec)
        labels = pd.DataFrame({"request_id": rec["request_id"], "timestamp": rec["timestamp"],
                               LABEL_COLUMN: rows.loc[ok, LABEL_COLUMN].astype("int64").to_numpy()})
        writer.write_labels(labels)  # the hour's labels "arrive" once its traffic is served
        self.traffic.append(rec.assign(
            day=np.asarray(list(days))[ok], hour=hour, label=labels[LABEL_COLUMN].to_numpy(),
            baseline_score=self._champion0.predict_scores(rows[ok][list(FEATURE_COLUMNS)]),
            latency_ms=res.loc[ok, "latency_ms"].to_numpy()))
        versions = {str(k): int(v) for k, v in rec["model_version"].value_counts().items()}
        record = HourRecord(hour=hour, start=m.hour_start(hour).isoformat(), first_day=days.start,
                            last_day=days.stop - 1, rows=int(ok.sum()), failed_requests=int((~ok).sum()),
                            versions=versions)
        self.hours.append(record)
        return record

    # ------------------------------------------------------------------ drift_monitor via REST
    def drift_conf(self) -> dict[str, Any]:
        """Conf of the hourly run: this model; Evidently and whylogs off (they decide nothing)."""
        return {"models": [self.cfg.model], "evidently": False, "profile": False}

    def trigger_drift(self, hour: int) -> str:
        """Create the ``drift_monitor`` run of logical hour ``hour`` (REST, data interval = the hour)."""
        from tritonflow.runtime.airflow_api import AirflowApiError

        m = self.cfg.mapping
        start, end = m.hour_start(hour), m.hour_start(hour + 1)
        run_id = f"demo_hour_{hour:04d}__{start:%Y-%m-%dT%H:%M}"
        try:
            self._api.post("/dags/drift_monitor/dagRuns", {
                "dag_run_id": run_id, "logical_date": start.isoformat(),
                "data_interval_start": start.isoformat(), "data_interval_end": end.isoformat(),
                "run_after": run_after(end).isoformat(),
                "conf": self.drift_conf(), "note": f"tritonflow demo: logical hour {hour}"})
        except AirflowApiError as exc:
            # a retried request whose first attempt created the run (the answer was lost)
            if exc.status != 409:
                raise
        self.driver_runs[run_id] = hour
        return run_id

    def wait_run(self, dag_id: str, run_id: str, timeout_s: float) -> dict[str, Any]:
        """Wait until a DAG run is final or ``timeout_s`` passed; return its last state.

        Through Airflow's run-wait endpoint (one state line every :data:`RUN_WAIT_S`): polling the
        run every 0.25 s kept the api-server at about 12 % of a core for the whole replay
        (``benchmarks/drift_hour.py``), CPU the loop's own tasks did not get on two cores.
        """
        try:
            return self._api.wait_for_run(dag_id, run_id, timeout_s, interval_s=RUN_WAIT_S)
        except TimeoutError:
            return self._api.get(f"/dags/{dag_id}/dagRuns/{run_id}")

    def wait_checked(self, run_id: str, timeout_s: float) -> None:
        """Wait until the ``check`` task(s) of a ``drift_monitor`` run (or the run) have finished.

        One request every :data:`POLL_S` (the ``check`` task instances: failed upstream, they are
        final too), the run's own state every :data:`RUN_LOOK_EVERY` looks.
        """
        deadline = time.monotonic() + timeout_s
        looks = 0
        while time.monotonic() < deadline:
            tis = self._api.get(f"/dags/drift_monitor/dagRuns/{run_id}/taskInstances?task_id=check")
            checks = [t for t in tis.get("task_instances") or [] if t.get("task_id") == "check"]
            if checks and all(t.get("state") in TI_FINAL_STATES for t in checks):
                return
            looks += 1
            if looks % RUN_LOOK_EVERY == 0 and \
                    self._api.get(f"/dags/drift_monitor/dagRuns/{run_id}").get("state") in FINAL_STATES:
                return
            time.sleep(POLL_S)

    def read_hour(self, record: HourRecord, run: Mapping[str, Any]) -> None:
        """Status, drift verdict and threshold source of the hour from the run's XComs."""
        from tritonflow.demo.runs import parse_time, xcom_values

        record.run_state = run.get("state")
        s, e = parse_time(run.get("start_date")), parse_time(run.get("end_date"))
        record.dag_seconds = (e - s).total_seconds() if s and e else None
        checks = xcom_values(self._api, "drift_monitor", run["dag_run_id"], "return_value", ["check"])
        summary = next((v for _t, _mi, val in checks for v in (val if isinstance(val, list) else [val])
                        if isinstance(v, Mapping) and v.get("model") == self.cfg.model), {}) or {}
        events = xcom_values(self._api, "drift_monitor", run["dag_run_id"], "return_value", ["drift_event"])
        event = next((v for _t, _mi, v in events if isinstance(v, Mapping)), None)
        record.status = summary.get("status")
        record.drift = event is not None
        record.acted = event is not None
        record.drift_features = list((event or {}).get("features") or [])
        sources = set()
        for f in record.drift_features:
            for stat in ((summary.get("features") or {}).get(f, {}).get("statistics") or {}).values():
                if isinstance(stat, Mapping) and stat.get("flagged"):
                    sources.add(stat.get("threshold_source"))
        record.threshold_source = ("dynamic" if sources == {"dynamic"} else "static" if sources == {"static"}
                                   else ",".join(sorted(map(str, sources))) or None)
        record.invalid_features = [f for f, v in (summary.get("features") or {}).items()
                                   if isinstance(v, Mapping) and v.get("severity") == "invalid"]
        if event is not None:
            self.event("alert", hour=record.hour, features=record.drift_features,
                       champion=self.aliases().get("champion"), run_id=run["dag_run_id"])

    # ------------------------------------------------------------------ watcher
    def _watch(self) -> None:
        """Follow the scheduler's runs (progress lines), drive canary traffic, see promotions."""
        champion = self.aliases().get("champion")
        while not self._stop_watch.wait(WATCH_S):
            try:
                canary_active = False
                # read before the runs: an event consumed in between shows as the run it became
                queued = {d: len(self._api.get(f"/dags/{d}/assets/queuedEvents").get("queued_events") or [])
                          for d in ASSET_PACED_DAGS}
                # one request for every loop DAG but drift_monitor (one per DAG cost the api-server 5)
                doc = self._api.post("/dags/~/dagRuns/list", {"dag_ids": list(LOOP_DAGS[1:]), "order_by": "-id",
                                                              "page_limit": WATCH_RUNS})
                for run in doc.get("dag_runs") or []:
                    dag_id = run["dag_id"]
                    key = (dag_id, run["dag_run_id"])
                    state = run.get("state")
                    if dag_id == "canary_promotion" and state in ("queued", "running"):
                        canary_active = True
                    self.note_loop_run(dag_id, run["dag_run_id"], state)
                    if self._seen_states.get(key) != state:
                        self._seen_states[key] = state
                        self.progress.step(f"  scheduler: {dag_id} {run['dag_run_id']} "
                                           f"({run.get('run_type')}) {state}")
                self._look_at_queued_events(queued, doc.get("dag_runs") or [])
                if canary_active and not self._canary.active.is_set():
                    self._canary.set_frame(self._canary_rows())
                    self._canary.active.set()
                elif not canary_active:
                    self._canary.active.clear()
                now = self.aliases().get("champion")
                if now is not None and champion is not None and now != champion:
                    seen = dt.datetime.now(dt.timezone.utc).isoformat()
                    self.promotions.append({"from": champion, "to": now, "seen_at": seen,
                                            "alert_hour": None})
                    self.event("promoted", version=now, previous=champion, hour=self._current_hour)
                    self.progress.step(f"  champion alias moved: version {champion} -> {now}")
                champion = now if now is not None else champion
            except Exception as exc:  # noqa: BLE001 - one missed look; reported at the end
                self.watch_error = f"{type(exc).__name__}: {exc}"

    def note_loop_run(self, dag_id: str, run_id: str, state: str | None) -> None:
        """Keep the logical hour a run of :data:`PACED_DAGS` was first seen queued or running in."""
        if dag_id not in PACED_DAGS:
            return
        with self._in_flight_lock:
            if state in ("queued", "running"):
                self._in_flight.setdefault((dag_id, run_id), self._current_hour)
            else:
                self._in_flight.pop((dag_id, run_id), None)

    def _look_at_queued_events(self, queued: dict[str, int], runs: list[dict[str, Any]]) -> None:
        """Hold the replay on queued asset events; have a stalled DAG's file parsed again."""
        for dag_id, count in queued.items():
            active = any(r["dag_id"] == dag_id and r.get("state") in ("queued", "running") for r in runs)
            stalled_s = self.note_queued_events(dag_id, count, active, time.monotonic())
            if stalled_s is not None:
                self._api.reparse(dag_id)
                self.event("asset_queue_reparse", dag_id=dag_id, hour=self._current_hour, stalled_s=stalled_s)
                self.progress.step(f"  {dag_id}: asset event queued {stalled_s:.0f} s with no run of it active "
                                   "(Airflow's stale max_active_runs flag, apache/airflow#56050): file parsed again")

    def note_queued_events(self, dag_id: str, queued: int, active: bool, now: float) -> float | None:
        """Count ``dag_id``'s queued asset events as a loop run in flight; say when they stalled.

        A drift alert's asset event is queued for ``shadow_evaluation`` until the scheduler makes
        the run: until then the loop has reacted to nothing, so the replay must wait as for a run
        (:meth:`loop_behind`). Airflow 3.3 can hide a DAG with queued events behind a stale
        ``exceeds_max_non_backfill`` flag (the dag-processor's count of active runs, written just
        after the run it counted ended) until the file's next parse, 2 minutes later here
        (apache/airflow#56050): a replayed hour lasts seconds, so that is tens of logical hours.

        Args:
            dag_id: A DAG of :data:`~tritonflow.demo.config.ASSET_PACED_DAGS`.
            queued: Its queued asset events now.
            active: Whether a run of it is queued or running (then the events wait for that run).
            now: ``time.monotonic()``.

        Returns:
            Seconds the events have waited with no run active when that reached
            :data:`STALE_QUEUE_S` (the caller has the file parsed again; counted afresh from
            here), else None.
        """
        key = (dag_id, "queued asset events")
        with self._in_flight_lock:
            if not queued:
                self._in_flight.pop(key, None)
                self._queued_since.pop(dag_id, None)
                return None
            self._in_flight.setdefault(key, self._current_hour)
            if active:
                self._queued_since.pop(dag_id, None)
                return None
            since = self._queued_since.setdefault(dag_id, now)
            if now - since < STALE_QUEUE_S:
                return None
            self._queued_since[dag_id] = now
            return now - since

    def loop_behind(self, hour: int) -> list[str]:
        """Loop runs in flight for more than ``loop_lag_hours`` logical hours before ``hour``."""
        lag = self.cfg.loop_lag_hours
        if lag is None:
            return []
        with self._in_flight_lock:
            return sorted(f"{dag_id}/{run_id}" for (dag_id, run_id), first in self._in_flight.items()
                          if hour - first > lag)

    def wait_for_loop(self, hour: int) -> None:
        """Hold the replay before ``hour`` while :meth:`loop_behind` names a run (canary traffic on).

        Gives up after ``settle_timeout_s`` and says so; the wait is an event of the report.
        """
        behind = self.loop_behind(hour)
        if not behind:
            return
        self.progress.step(f"hour {hour:3d} waits for the loop in flight: {', '.join(behind)}")
        t = time.monotonic()
        deadline = t + self.cfg.settle_timeout_s
        while behind and time.monotonic() < deadline:
            time.sleep(WATCH_S / 2)
            behind = self.loop_behind(hour)
        waited = round(time.monotonic() - t, 1)
        self.event("loop_wait", hour=hour, seconds=waited, gave_up=bool(behind))
        self.progress.step(f"hour {hour:3d} waited {waited:.1f} s for the loop in flight"
                           + (f"; gave up, still in flight: {behind}" if behind else ""))

    def busy(self) -> list[str]:
        """Runs of the loop DAGs that are queued or running."""
        out = []
        for dag_id in LOOP_DAGS:
            for state in ("queued", "running"):
                doc = self._api.get(f"/dags/{dag_id}/dagRuns?state={state}&limit=50")
                out += [f"{dag_id}/{r['dag_run_id']}" for r in doc.get("dag_runs") or []]
        return out

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        """The whole demo; returns the summary written beside the report."""
        from model_registry.datasets import load_noaa

        cfg, p = self.cfg, self.progress
        p.step(f"tritonflow demo ({'quick' if cfg.quick else 'full'}): {cfg.mapping.describe()}")
        self.data = load_noaa()
        self.setup()
        champion, dataset = self.train_champion()
        self.publish_champion(champion, dataset)
        self.route_champion(champion)
        self.client = GatewayClient(self.gateway_url, cfg.model,
                                    [c for c in self.data.columns if c not in ("day", "rain")],
                                    response_header=self.settings.gateway_response_header)
        self.canary_traffic = BackgroundTraffic(self.client, self._canary_rows(), cfg.canary_rps,
                                                on_batch=self._log_canary_batch)
        self._canary.__enter__()
        self.wait_for_airflow()
        watcher = threading.Thread(target=self._watch, name="scheduler-watch", daemon=True)
        watcher.start()
        m = cfg.mapping
        p.step(f"replaying {m.n_hours} logical hours through the gateway {self.gateway_url}; one "
               f"drift_monitor run per hour through the REST API (dynamic P95 thresholds after "
               f"{cfg.min_history_windows} windows); the scheduler runs everything else")
        self.loop_t0 = time.time()
        pending: list[tuple[HourRecord, str]] = []
        for hour in range(m.n_hours):
            # runs the loop starts during the wait count as the previous hour's
            self.wait_for_loop(hour)
            self._current_hour = hour
            t = time.monotonic()
            record = self.replay_hour(hour)
            while len(pending) >= cfg.drift_runs_in_flight:
                self._finish_hour(*pending.pop(0))
            if pending:
                # the previous hour's statistics must be in the history (the alert policy reads
                # the windows before) before this hour is checked: its check task has finished
                self.wait_checked(pending[-1][1], DRIFT_RUN_TIMEOUT_S)
            record.run_id = self.trigger_drift(hour)
            pending.append((record, record.run_id))
            p.step(f"hour {hour:3d} days {record.first_day}-{record.last_day}: {record.rows} requests "
                   f"(versions {record.versions}); drift_monitor {record.run_id} created "
                   f"({time.monotonic() - t:.1f} s)")
        for item in pending:
            self._finish_hour(*item)
        self.settle()
        self.served_after_loop = self.serving_check()
        if cfg.bad_challenger:
            from tritonflow.demo import bad_challenger

            self.bad_challenger = bad_challenger.offer(self, cfg.bad_challenger_timeout_s)
            self.settle()
        self.wait_sentinels_armed()
        return self.finish()

    def wait_sentinels_armed(self) -> None:
        """Wait until every sentinel run has started its watches (deferred in the triggerer) or ended.

        A promotion's ``CHAMPION_CHANGED`` event starts a ``champion_sentinel`` run; its watch
        builds the golden set on a worker and then defers, so the sentinel is armed a little
        after the canary run ends. Gives up after ``SENTINEL_ARM_TIMEOUT_S`` and says so.
        """
        from tritonflow.demo import runs as rr

        settled = {"deferred", "success", "skipped", "failed", "upstream_failed", "removed"}
        deadline = time.monotonic() + SENTINEL_ARM_TIMEOUT_S
        pending: list[str] = []
        while time.monotonic() < deadline:
            found = rr.sentinels(self._api, rr.dag_runs(self._api, (SENTINEL_DAG,), set()))
            pending = [s["run_id"] for s in found
                       if s["state"] in ("queued", "running") and not s["armed"]
                       and not (s["watch"] and all(w["state"] in settled for w in s["watch"]))]
            if not pending:
                return
            time.sleep(3.0)
        self.progress.step(f"sentinel runs not armed after {SENTINEL_ARM_TIMEOUT_S:.0f} s: {pending}")

    def serving_check(self) -> dict[str, int]:
        """Versions that answer the gateway once every loop run has finished.

        The last replayed hour's days are sent again (not logged: they are not new traffic), so a
        promotion near the end of the replay still shows the promoted version serving.

        Returns:
            ``{version: requests answered}``; ``{}`` when no hour was replayed.
        """
        if not self.hours:
            return {}
        last = self.hours[-1]
        rows = self.data.iloc[last.first_day:last.last_day + 1].reset_index(drop=True)
        res = self._gw.replay(rows, [f"serving-check-{uuid.uuid4().hex[:12]}" for _ in range(len(rows))])
        ok = res[res["status"] == 200]
        versions = {str(k): int(v) for k, v in ok["version"].value_counts().items()}
        self.progress.step(f"serving check after the loop: {len(ok)}/{len(res)} answered, versions {versions}")
        return versions

    def _finish_hour(self, record: HourRecord, run_id: str) -> None:
        run = self.wait_run("drift_monitor", run_id, DRIFT_RUN_TIMEOUT_S)
        self.read_hour(record, run)
        self.progress.step(
            f"hour {record.hour:3d}: drift_monitor {record.run_state} in {record.dag_seconds or 0:.1f} s, "
            f"{record.status}, drift={record.drift}"
            + (f" {record.drift_features} ({record.threshold_source} thresholds) -> asset event"
               if record.drift else "")
            + (f", contract-invalid {record.invalid_features}" if record.invalid_features else ""))

    def settle(self) -> None:
        """Wait (canary traffic on) until no loop DAG run is queued or running."""
        deadline = time.monotonic() + self.cfg.settle_timeout_s
        quiet_since = None
        while time.monotonic() < deadline:
            busy = self.busy()
            if busy:
                quiet_since = None
            else:
                # asset events are turned into runs on the scheduler's next loop: be sure
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 15:
                    self.progress.step("every loop DAG run has finished")
                    return
            time.sleep(3.0)
        self.progress.step(f"still in flight after {self.cfg.settle_timeout_s:.0f} s: {self.busy()}")

    def finish(self) -> dict[str, Any]:
        """Read the runs, alerts and benchmarks back; write the report; return the summary."""
        from tritonflow.demo import runs as rr
        from tritonflow.report import write_report

        p = self.progress
        self._stop_watch.set()
        dag_runs = rr.dag_runs(self._api, LOOP_DAGS, set(self.driver_runs))
        for r in dag_runs:
            s, e = rr.parse_time(r["start"]), rr.parse_time(r["end"])
            r["seconds"] = round((e - s).total_seconds(), 1) if s and e else None
        for r in dag_runs:  # the scheduler's publishes and canaries, for the report's timings
            if r["seconds"] is None:
                continue
            if r["dag_id"] == "model_publish":
                self.event("publish", state=r["state"], seconds=r["seconds"], run_id=r["run_id"],
                           version=run_version(r["conf"]))
            elif r["dag_id"] == "canary_promotion":
                self.event("canary", state=r["state"], seconds=r["seconds"], run_id=r["run_id"],
                           challenger=run_version(r["conf"]), outcome=r["state"])
        alerts = rr.alerts(self._api, dag_runs, self.driver_runs)
        loops = rr.closed_loops(dag_runs, self.promotions)
        for loop in loops:
            root = loop.get("alert_run")
            loop["alert_hour"] = self.driver_runs.get(root) if root else None
        latency = rr.scheduling_latency_s(dag_runs)
        sentinels = rr.sentinels(self._api, rr.dag_runs(self._api, (SENTINEL_DAG,), set()))
        traffic = pd.concat(self.traffic, ignore_index=True) if self.traffic else pd.DataFrame()
        summary: dict[str, Any] = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self.cfg).items()},
            "mapping": self.cfg.mapping.describe(),
            "deployment": self.deployment(),
            "hours": [dataclasses.asdict(h) for h in self.hours],
            "events": self.events,
            "dag_runs": dag_runs,
            "alerts": alerts,
            "closed_loops": [lp for lp in loops if lp.get("seconds") is not None],
            "unmatched_promotions": [lp for lp in loops if lp.get("seconds") is None],
            "scheduling_latency_s": latency,
            "sentinels": sentinels,
            "canary_requests": int(sum(len(r) for r in self._canary.results)),
            "served_after_loop": self.served_after_loop,
            "watch_error": self.watch_error,
            "bad_challenger": self.bad_challenger,
            "wall_s": p.elapsed(),
        }
        report = write_report(self.cfg.home / "report", summary, traffic,
                              history_url=self.settings.drift_history_db_url, model=self.cfg.model)
        summary["report"] = str(report)
        by_dag: dict[str, dict[str, int]] = {}
        for r in dag_runs:
            by_dag.setdefault(r["dag_id"], {}).setdefault(str(r["state"]), 0)
            by_dag[r["dag_id"]][str(r["state"])] += 1
        p.step(f"DAG runs (scheduler): {json.dumps(by_dag)}")
        p.step(f"alerts: {len(alerts)}, acted on: {rr.acted_count(alerts)} "
               f"(source: {sorted({a['source'] for a in alerts}) or '-'})")
        for loop in summary["closed_loops"]:
            p.step(f"closed loop (drift alert at hour {loop['alert_hour']} -> version {loop['to']} promoted): "
                   f"{loop['seconds']:.1f} s (goal <= 60 s on --quick)")
        for sentinel in sentinels:
            states = ", ".join(str(w["state"]) for w in sentinel["watch"]) or "no watch yet"
            p.step(f"sentinel: {SENTINEL_DAG} {sentinel['run_id']} ({sentinel['triggered_by']}"
                   + (f" from {', '.join(sentinel['promoted_by'])}" if sentinel["promoted_by"] else "")
                   + f"): {'armed' if sentinel['armed'] else 'not armed'} (watch: {states})")
        p.step(f"scheduling latency (median s): {json.dumps(latency)}")
        p.step(f"report: {report}")
        return summary
