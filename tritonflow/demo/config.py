"""Configuration of the demo: the replay mapping, the sweep, the environment, the command line."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ground.exceptions import DataError
from ground.settings import PROJECT_ROOT
from tritonflow.demo.serving import SCORE_COLUMN

#: State folder of the demo (wiped at the start of every run).
DEFAULT_DEMO_HOME = PROJECT_ROOT / ".tritonflow" / "demo"
#: Registered model name (MLflow) and Triton model name of the demo.
DEFAULT_MODEL = "noaa_rain"
#: Logical instant of the first replayed hour (UTC).
#: (Not earlier: the DAGs start on 2025-01-01 and a run dated before a DAG's start_date gets no tasks.)
DEFAULT_LOGICAL_START = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
#: The loop DAGs the demo unpauses and reports on. ``registry_events`` follows the registry with
#: the demo's event mapping (``tritonflow/demo/registry_mapping.json``): only alias ``canary`` set
#: starts anything (``model_publish`` then ``canary_promotion``), so the driver's own
#: registrations (the initial champion, published without a DAG run) and the loop's alias moves
#: start nothing; the bad challenger comes through it (:mod:`tritonflow.demo.bad_challenger`).
LOOP_DAGS = ("drift_monitor", "shadow_evaluation", "retrain", "model_publish", "canary_promotion",
             "registry_events")
#: The loop DAG whose asset watcher follows the registry: the driver has its file parsed again
#: once unpaused (:meth:`~tritonflow.runtime.airflow_api.AirflowApi.reparse`), or the watcher
#: starts only at the file's next regular parse, 2 minutes later; a bad challenger registered
#: before that is the watcher's baseline and never requested (seen once in the quick main job).
WATCHED_DAG = "registry_events"
#: Seconds between two registry polls of the ``registry_events`` watcher in the demo.
REGISTRY_POLL_S = 5
#: The health sentinel DAG, unpaused beside the loop: every promotion's ``CHAMPION_CHANGED`` event
#: arms a sentinel on the new champion in the triggerer. Its runs stay deferred (they end at the
#: 6-hourly renewal), so the demo waits for them to be armed, never for them to finish.
SENTINEL_DAG = "champion_sentinel"
#: The loop DAGs between an alert and a promotion, whose runs the replay waits for
#: (:attr:`DemoConfig.loop_lag_hours`).
PACED_DAGS = ("shadow_evaluation", "retrain", "model_publish", "canary_promotion")
#: The paced DAGs scheduled on an asset (``DRIFT_ALERTS``): an asset event queued for one of them
#: holds the replay like a run in flight until Airflow has made the run.
ASSET_PACED_DAGS = ("shadow_evaluation",)


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
        home: Demo state folder (``TRITONFLOW_HOME``); wiped first.
        model: Registered/Triton model name.
        champion_days: ``(first, last)`` days (last exclusive) the champion is trained on.
        mapping: Replay mapping of days onto logical hours.
        min_history_windows: Hourly windows before the dynamic P95 thresholds apply.
        canary_steps: Canary traffic steps (percent, comma-separated; ``TRITONFLOW_CANARY_STEPS``).
        canary_bake_s: Seconds each canary step bakes while the driver sends traffic.
        canary_min_requests: Fewest canary requests a step needs.
        canary_rps: Requests per second the driver sends while a canary runs.
        keep_running: Leave Airflow, MLflow, Triton and the gateway running (URLs are printed).
        quick: The smallest sweep (for tests and a first look).
        shadow_hours: Logical hours of log a shadow evaluation replays.
        retrain_hours: Logical hours of labelled log a retraining trains on.
        profile: Model Analyzer profiling in ``model_publish`` (``TRITONFLOW_PUBLISH_PROFILE``).
        perf_gate: p99 gate in ``model_publish`` (``TRITONFLOW_PUBLISH_PERF_GATE``).
        dataset_share: ``TRITONFLOW_DRIFT_DATASET_SHARE`` of the run (``None``: the setting's default).
        settle_timeout_s: Seconds the driver waits after the last hour for the runs still in flight.
        airflow_database_url: Metadata DB (empty: SQLite under ``<home>/airflow``).
        bad_challenger: After the loop, register a challenger trained on flipped labels and request
            its canary through the registry (alias ``canary``); the canary must roll it back.
        bad_challenger_timeout_s: Seconds the driver waits for that canary to end.
        stack: ``local`` (the local deployment) or ``compose`` (the docker-compose stack,
            :mod:`tritonflow.demo.stack`; profiling and the p99 gate are off there).
        drift_runs_in_flight: ``drift_monitor`` runs the driver lets run at once (the DAG allows
            4). The next hour's run is created once the previous hour's ``check`` task finished
            (the alert policy reads the windows before), so recording, alerting and the next
            check overlap.
        loop_lag_hours: Logical hours the replay may run ahead of a loop run in flight (a shadow
            evaluation, retraining, publish or canary, :data:`PACED_DAGS`): before replaying an
            hour, the driver waits for every such run first seen more than this many hours
            earlier. A logical hour stands for an hour of traffic, in which the whole loop (about
            a minute here, profiling included) fits; the replay plays an hour in a few seconds, and
            without the wait a challenger served 10 or more logical hours after its alert, judged
            on traffic a real deployment would have served with it. ``None``: no wait (the quick
            sweep, which shows the loop rather than the served AUC).
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
    keep_running: bool = False
    quick: bool = False
    shadow_hours: int = 10
    retrain_hours: int = 10
    profile: bool = True
    perf_gate: bool = True
    dataset_share: float | None = None
    settle_timeout_s: float = 1800.0
    airflow_database_url: str = ""
    drift_runs_in_flight: int = 3
    bad_challenger: bool = True
    bad_challenger_timeout_s: float = 1200.0
    stack: str = "local"
    loop_lag_hours: int | None = 0


def quick_config(home: Path = DEFAULT_DEMO_HOME, **overrides: Any) -> DemoConfig:
    """The smallest sweep that still shows the loop: a short history before the concept drift.

    The champion is trained on every day before the replay (days 0-11,327); 48 days per hour;
    14 hours (days 11,328-11,999) before the concept drift at day 12,000 and 10 hours after it;
    no drift setting is changed (the 24 hours are judged against thresholds learned from the
    reference's own windows: the default history of 48 windows is not reached). No profiling and no p99 gate in
    ``model_publish`` (each costs a minute or more per publish on two cores). Canary steps
    25 %, 100 % of 8 s; a step needs 40 challenger requests, above the default
    ``TRITONFLOW_CANARY_MIN_LABELS`` (30), so a step that passes had enough labelled requests for
    the quality check (with fewer the check is skipped and a label-flipped challenger would pass the
    25 % step, then the 100 % step, where no champion request is left to compare with).
    """
    d = 48
    first = 12_000 - 14 * d
    values: dict[str, Any] = dict(home=home, champion_days=(0, first),
                                  mapping=DayHourMapping(first, 12_000 + 10 * d, d),
                                  canary_steps="25,100", canary_bake_s=8.0, canary_min_requests=40,
                                  profile=False, perf_gate=False, quick=True, settle_timeout_s=1200.0,
                                  loop_lag_hours=None)
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
        """Seconds since this progress started (monotonic clock)."""
        return time.monotonic() - self.t0

    def step(self, message: str, **data: Any) -> None:
        """Print ``[  12.3 s] message`` and record the event."""
        t = self.elapsed()
        self.events.append({"t": t, "message": message, **data})
        print(f"[{t:7.1f} s] {message}", file=self.stream, flush=True)


def pick_port(preferred: int, taken: set[int]) -> int:
    """``preferred`` when it is free on 127.0.0.1 and not ``taken``, else a free port; added to ``taken``.

    Args:
        preferred: The port wanted (0: any).
        taken: Ports already given to other services of this run (updated).

    Returns:
        The port.
    """
    from tritonflow.runtime.services import free_port, port_in_use

    port = preferred
    if not port or port in taken or port_in_use("127.0.0.1", port):
        port = free_port()
        while port in taken:
            port = free_port()
    taken.add(port)
    return port


def stop_leftovers(home: Path) -> list[str]:
    """Stop services a previous demo run left behind.

    Stop services a previous demo run left behind (pid files under ``home/run`` and
    ``home/airflow/run``), never by process name.
    """
    from tritonflow.runtime.services import read_pid, terminate_group

    stopped = []
    for run_dir in (home / "airflow" / "run", home / "run"):
        if not run_dir.is_dir():
            continue
        for pid_file in sorted(run_dir.glob("*.pid")):
            pid = read_pid(pid_file)
            if pid is not None:
                terminate_group(pid, None)
                stopped.append(pid_file.stem)
            pid_file.unlink(missing_ok=True)
    return stopped


def environment(cfg: DemoConfig, ports: Mapping[str, int]) -> dict[str, str]:
    """The ``TRITONFLOW_*`` variables of a demo run: the driver's and every Airflow task's.

    Args:
        cfg: The demo configuration.
        ports: ``triton_http``, ``triton_grpc``, ``triton_metrics``, ``mlflow``, ``gateway``,
            ``airflow`` (API server / UI), ``airflow_execution_api``.
    """
    home = cfg.home
    env = {
        "TRITONFLOW_HOME": str(home),
        "TRITONFLOW_TRITON_HTTP_PORT": str(ports["triton_http"]),
        "TRITONFLOW_TRITON_GRPC_PORT": str(ports["triton_grpc"]),
        "TRITONFLOW_TRITON_METRICS_PORT": str(ports["triton_metrics"]),
        "TRITONFLOW_MLFLOW_PORT": str(ports["mlflow"]),
        "TRITONFLOW_GATEWAY_PORT": str(ports["gateway"]),
        "TRITONFLOW_AIRFLOW_API_PORT": str(ports["airflow"]),
        "TRITONFLOW_AIRFLOW_EXECUTION_API_PORT": str(ports["airflow_execution_api"]),
        "TRITONFLOW_MLFLOW_TRACKING_URI": f"http://127.0.0.1:{ports['mlflow']}",
        "TRITONFLOW_REPOSITORY_URI": str(home / "model_repository"),
        "TRITONFLOW_INFERENCE_LOG_ROOT": str(home / "inference_logs"),
        "TRITONFLOW_DRIFT_HISTORY_DB_URL": f"sqlite:///{home / 'drift' / 'history.db'}",
        "TRITONFLOW_DRIFT_MIN_HISTORY_WINDOWS": str(cfg.min_history_windows),
        # The driver creates every logical hour's drift_monitor run; no run for the wall clock's hour.
        "TRITONFLOW_DRIFT_MONITOR_SCHEDULE": "none",
        "TRITONFLOW_SIGNING_KEY_PATH": str(home / "keys" / "model_signing.pem"),
        "TRITONFLOW_SIGNING_TRUSTED_KEYS_DIR": str(home / "keys" / "trusted"),
        "TRITONFLOW_CANARY_STEPS": cfg.canary_steps,
        "TRITONFLOW_CANARY_BAKE_S": str(cfg.canary_bake_s),
        "TRITONFLOW_CANARY_MIN_REQUESTS": str(cfg.canary_min_requests),
        "TRITONFLOW_PUBLISH_PROFILE": str(cfg.profile).lower(),
        "TRITONFLOW_PUBLISH_PERF_GATE": str(cfg.perf_gate).lower(),
        # The demo replays years in minutes: the cooldown is in logical time, not wall time.
        "TRITONFLOW_RETRAIN_COOLDOWN_S": "0",
        "TRITONFLOW_RETRAIN_SCORE_COLUMN": SCORE_COLUMN,
        "TRITONFLOW_MONITORED_MODELS": cfg.model,
        # Logical time: one hour of log holds ``days_per_hour`` NOAA days.
        "TRITONFLOW_SHADOW_WINDOW_HOURS": str(cfg.shadow_hours),
        "TRITONFLOW_RETRAIN_WINDOW_DAYS": str(cfg.retrain_hours / 24.0),
        "TRITONFLOW_RETRAIN_DEFAULT_MODEL": cfg.model,
        # registry_events: only alias ``canary`` starts anything (model_publish, then canary_promotion).
        "TRITONFLOW_EVENT_MAPPING_PATH": str(Path(__file__).with_name("registry_mapping.json")),
        "TRITONFLOW_REGISTRY_POLL_INTERVAL_S": str(REGISTRY_POLL_S),
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{ports['mlflow']}",
        # the registry is the same server: an inherited MLFLOW_REGISTRY_URI would redirect registrations
        "MLFLOW_REGISTRY_URI": f"http://127.0.0.1:{ports['mlflow']}",
        # Four Airflow processes and three services start side by side on a small machine.
        "TRITONFLOW_START_TIMEOUT_S": "600",
        "GIT_PYTHON_REFRESH": "quiet",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "PYTHONWARNINGS": "ignore",
    }
    if cfg.dataset_share is not None:
        env["TRITONFLOW_DRIFT_DATASET_SHARE"] = str(cfg.dataset_share)
    if cfg.airflow_database_url:
        env["TRITONFLOW_AIRFLOW_DATABASE_URL"] = cfg.airflow_database_url
    return env


def apply_environment(env: Mapping[str, str]) -> None:
    """Export the demo's environment into this process.

    Export ``env`` (dropping inherited ``AIRFLOW*`` variables) and put the plugins folder and
    the project on ``PYTHONPATH``.
    """
    for key in [k for k in os.environ if k.startswith("AIRFLOW")]:
        del os.environ[key]
    os.environ.update(env)
    extra = [str(PROJECT_ROOT), str(PROJECT_ROOT / "plugins")]
    os.environ["PYTHONPATH"] = os.pathsep.join(extra + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p and p not in extra])
    for p in reversed(extra):
        if p not in sys.path:
            sys.path.insert(0, p)


# ====================================================================================== CLI
def _loop_lag_hours(value: str) -> int | None:
    """``--loop-lag-hours``: a whole number of hours >= 0, or ``none``."""
    if value.strip().lower() == "none":
        return None
    try:
        hours = int(value)
    except ValueError:
        hours = -1
    if hours < 0:
        raise SystemExit(f"--loop-lag-hours: {value!r} is not a whole number of hours >= 0 or 'none'")
    return hours


def config_from_args(argv: list[str] | None = None) -> DemoConfig:
    """Parse the command line into a :class:`DemoConfig`."""
    ap = argparse.ArgumentParser(prog="python -m tritonflow.demo",
                                 description="tritonflow's whole loop on NOAA data, on a real local Airflow.")
    ap.add_argument("--quick", action="store_true", help="the smallest sweep (24 logical hours)")
    ap.add_argument("--home", type=Path, default=DEFAULT_DEMO_HOME, help="demo state folder (wiped)")
    ap.add_argument("--days-per-hour", type=int, default=None, help="NOAA days per logical hour")
    ap.add_argument("--first-day", type=int, default=None, help="first replayed day")
    ap.add_argument("--last-day", type=int, default=None, help="last replayed day (exclusive)")
    ap.add_argument("--hours", type=int, default=None, help="replay at most this many logical hours")
    ap.add_argument("--min-history", type=int, default=None, help="windows before dynamic thresholds")
    ap.add_argument("--keep-running", action="store_true",
                    help="leave the Airflow UI, MLflow UI, Triton and the gateway running")
    ap.add_argument("--airflow-db", default="", help="Airflow metadata DB URL (default: SQLite under the home)")
    ap.add_argument("--stack", choices=("local", "compose"), default="local",
                    help="where the loop runs: the local deployment, or the docker-compose stack "
                         "(scripts/stack.sh builds and starts it; Celery with two workers)")
    ap.add_argument("--no-bad-challenger", action="store_true",
                    help="skip the label-flipped challenger requested through the registry after the loop")
    ap.add_argument("--loop-lag-hours", default=None, metavar="N|none",
                    help="logical hours the replay may run ahead of a loop run in flight (default: 0, "
                         "--quick: none, never waits)")
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
                               "airflow_database_url": args.airflow_db,
                               "bad_challenger": not args.no_bad_challenger, "stack": args.stack}
    if args.stack == "compose":
        # Model Analyzer and the p99 gate need the Triton tools beside the task: not in the image.
        updates.update(profile=False, perf_gate=False)
    if args.min_history is not None:
        updates["min_history_windows"] = args.min_history
    if args.loop_lag_hours is not None:
        updates["loop_lag_hours"] = _loop_lag_hours(args.loop_lag_hours)
    if first < cfg.champion_days[1]:
        raise SystemExit(f"--first-day={first} overlaps the champion's training days {cfg.champion_days}")
    return dataclasses.replace(cfg, **updates)
