"""``tritonflow`` command line.

Usage::

    tritonflow runtime start [--services s3,mlflow,triton,gateway,airflow] [--repository URI]
    tritonflow runtime status [--json]
    tritonflow runtime stop [--services ...]     # default: all five, Airflow included
    tritonflow settings            # the settings in effect and their source (exit 1 on a bad value)
    tritonflow settings --reference  # the configuration reference (variables, defaults, meaning)
    tritonflow validate MODEL_URI --sample FILE [--out DIR] [--format onnx|torchscript] ...
    tritonflow status MODEL [--json]   # what serves: weights, aliases, policy, running canary, last decision
    tritonflow promote MODEL VERSION [--wait]          # a canary_promotion run, through Airflow's REST API
    tritonflow rollback MODEL [--to VERSION] --reason TEXT [--wait]   # a canary_rollback run
    tritonflow approve|reject MODEL [--comment TEXT] [--run RUN_ID] [--wait]   # the pending approval
    tritonflow decide MODEL continue|hold|rollback [--comment TEXT] [--run RUN_ID] [--wait]  # a canary pause

``tritonflow validate`` converts a model (``models:/name/version``, ``runs:/...`` or a local MLflow
model folder), runs the pre-push checks and the parity gate against a sample file (CSV/Parquet)
and generates ``config.pbtxt``, without publishing anything. It prints the report as JSON and
exits 0 when the gate passes, 1 when it fails (parity, threshold probes, a pre-push check or a
conversion refusal) and 2 when it could not run (bad arguments, MLflow unreachable).
    tritonflow drift backtest --data T.parquet --time-column ts --reference-rows 5000 --window 1h --out DIR
    tritonflow registry webhook register [--url URL] [--secret S] [--tracking-uri URI]
    tritonflow registry webhook list [--json]
    tritonflow registry webhook test [--event model_version_tag.set] [--url URL | --id ID]

``tritonflow registry webhook register`` creates on the MLflow server the webhook that delivers the
events the receiver maps (``tritonflow.registry_events.SUPPORTED_EVENTS``) to the receiver (default:
the local Airflow api-server's), signed with ``TRITONFLOW_WEBHOOK_SECRET``; run again, it updates
that webhook instead of adding one. When MLflow refuses the URL, it exits 1 saying which MLflow
server variables or which receiver fix it (:mod:`model_registry.webhooks`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, Mapping

from ground.exceptions import RuntimeStartError, TritonflowError
from ground.settings import Settings, get_settings

#: Services ``--services`` may name, in start order (dependencies first); all of them by default.
#: ``airflow`` is the local Airflow deployment (LocalExecutor, SQLite; scheduler, dag-processor,
#: triggerer, api-server on ``TRITONFLOW_AIRFLOW_API_PORT``).
KNOWN_SERVICES = ("s3", "mlflow", "triton", "gateway", "airflow")
#: What ``runtime start`` starts and ``runtime stop`` stops when ``--services`` is not given.
ALL_SERVICES = KNOWN_SERVICES
#: One line per service for ``--help``: what it is and the setting of its port (default value).
SERVICE_DESCRIPTIONS = {
    "s3": "S3-compatible endpoint (moto), TRITONFLOW_S3_PORT ({s3_port})",
    "mlflow": "MLflow tracking server and UI, TRITONFLOW_MLFLOW_PORT ({mlflow_port})",
    "triton": "Triton Inference Server, TRITONFLOW_TRITON_HTTP_PORT/_GRPC_PORT/_METRICS_PORT "
              "({triton_http_port}/{triton_grpc_port}/{triton_metrics_port})",
    "gateway": "NGINX gateway in front of Triton, TRITONFLOW_GATEWAY_PORT ({gateway_port})",
    "airflow": "Airflow 3 (LocalExecutor, SQLite), UI and REST API on TRITONFLOW_AIRFLOW_API_PORT "
               "({airflow_api_port}), the execution API on TRITONFLOW_AIRFLOW_EXECUTION_API_PORT "
               "({airflow_execution_api_port}), task and trigger logs on TRITONFLOW_AIRFLOW_WORKER_LOG_PORT/"
               "_TRIGGERER_LOG_PORT ({airflow_worker_log_port}/{airflow_triggerer_log_port})",
}


def _services(settings: Settings, names: list[str], repository: str | None):
    from tritonflow.runtime.services import MlflowServer, NginxGateway, S3Server, TritonServer

    build = {
        "s3": lambda: S3Server(settings),
        "mlflow": lambda: MlflowServer(settings),
        "triton": lambda: TritonServer(settings, repository=repository),
        "gateway": lambda: NginxGateway(settings),
        "airflow": lambda: _local_airflow(settings),
    }
    return [(name, build[name]()) for name in names]


def _local_airflow(settings: Settings):
    from tritonflow.runtime.airflow import AirflowDeployment
    from tritonflow.runtime.airflow_config import AirflowConfig

    return AirflowDeployment(AirflowConfig.local(settings))


def _parse_services(raw: str) -> list[str]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN_SERVICES]
    if unknown:
        raise SystemExit(f"unknown service(s) {unknown}; expected a subset of {list(KNOWN_SERVICES)}")
    return [n for n in KNOWN_SERVICES if n in names]  # start order: dependencies first


def services_help(settings: Settings | None = None) -> str:
    """The ``--help`` list of service names, one line each with its port setting and default."""
    values = dataclasses.asdict(settings or Settings.from_env({}))
    width = max(len(n) for n in KNOWN_SERVICES)
    return "\n".join(f"  {name:<{width}}  {SERVICE_DESCRIPTIONS[name].format(**values)}" for name in KNOWN_SERVICES)


def service_urls(name: str, service: Any) -> list[str]:
    """Where a user reaches a started service: ``label: URL`` lines (and how to log in)."""
    if name == "s3":
        return [f"S3 endpoint: {service.endpoint_url}"]
    if name == "mlflow":
        return [f"MLflow UI and tracking URI: {service.tracking_uri}"]
    if name == "triton":
        return [f"Triton HTTP: http://{service.http_url}", f"Triton gRPC: {service.grpc_url}",
                f"Triton metrics: {service.metrics_url}"]
    if name == "gateway":
        return [f"gateway (clients' entry point): {service.url}"]
    if name == "airflow":
        return [f"Airflow UI and REST API: {service.api_url} (no login: the simple auth manager lets every "
                "local visitor in as admin; DAGs start paused)"]
    return [f"health: {service.health_url()}"]


def _runtime(args: argparse.Namespace) -> int:
    settings = get_settings()
    names = _parse_services(args.services)
    services = _services(settings, names, getattr(args, "repository", None))
    if args.action == "start":
        started: list[tuple[str, Any]] = []
        for name, service in services:
            if service.healthy():
                print(f"{name}: already running, log {service.log_path}")
            else:
                try:
                    service.start()
                except RuntimeStartError as exc:
                    for _, other in reversed(started):
                        other.stop()
                    print(f"error: {exc}", file=sys.stderr)
                    return 1
                started.append((name, service))
                print(f"{name}: started, log {service.log_path}")
            for line in service_urls(name, service):
                print(f"  {line}")
        return 0
    if args.action == "stop":
        for name, service in reversed(services):
            service.stop()
            print(f"{name}: stopped")
        return 0
    status = {
        name: {"healthy": service.healthy(), "health_url": service.health_url(), "log": str(service.log_path)}
        for name, service in services
    }
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        for name, row in status.items():
            print(f"{name:8s} {'up' if row['healthy'] else 'down':5s} {row['health_url']}  log {row['log']}")
    return 0


def settings_reference(markdown: bool = False) -> str:
    """The configuration reference: every ``TRITONFLOW_*`` variable, its default and meaning."""
    from ground.settings import PROJECT_ROOT

    rows = []
    for name, default, doc in Settings.describe():
        default = default.replace(str(PROJECT_ROOT), "<checkout>")
        rows.append((name, default, doc))
    if not markdown:
        return "\n".join("\t".join(row) for row in rows)
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{n}` | `{d}` | {doc.replace('|', '/')} |" if d else f"| `{n}` | (empty) | {doc.replace('|', '/')} |"
              for n, d, doc in rows]
    return "\n".join(lines)


def effective_settings(environ: Mapping[str, str] | None = None) -> str:
    """The settings in effect: one ``VARIABLE=value  (source)`` line each, sources ``default``/``environment``.

    Raises:
        SettingsError: A ``TRITONFLOW_*`` variable holds a value its setting cannot take (wrong type,
            or a value the code refuses: :func:`ground.settings_checks.settings_problems`).
    """
    import os

    from ground.settings_checks import check_settings

    environ = os.environ if environ is None else environ
    check_settings(Settings.from_env(environ))
    rows = Settings.effective(environ)
    width = max(len(name) for name, _, _ in rows)
    return "\n".join(f"{name:<{width}} = {value}  ({source})" for name, value, source in rows)


def validate(model_uri: str, sample: str, *, out: str | None = None, name: str | None = None,
             export_format: str = "onnx", max_batch_size: int = 32, atol: float | None = None,
             rtol: float | None = None, rows: int = 1000, tracking_uri: str | None = None,
             settings: Settings | None = None) -> tuple[int, dict]:
    """Run the conversion gate on a model without publishing: ``(exit code, report)``.

    Exit code 0: the gate passed; 1: it failed (the report says why); 2: it could not run.
    With ``out``, the model file, ``config.pbtxt`` and the report are written there.
    """
    import os
    import re
    import tempfile
    from pathlib import Path

    from ground.exceptions import DataError
    from tritonflow.pipelines.publish_common import json_safe
    from tritonflow.pipelines.publish_validate import load_dataset

    s = settings or get_settings()
    uri = model_uri.strip()
    if name is None:
        m = re.match(r"^models:/([^/@]+)", uri)
        base = m.group(1) if m else Path(uri.rstrip("/")).name or "model"
        name = re.sub(r"[^A-Za-z0-9_.\-]", "_", base).lstrip("._-") or "model"
    report: dict = {"model_uri": uri, "model_name": name, "export_format": export_format, "published": False}
    try:
        import mlflow

        from model_registry.gate import local_model, validate_model
        from model_registry.triton_config import to_pbtxt

        if not os.path.isdir(uri):
            mlflow.set_tracking_uri(tracking_uri or s.resolved_mlflow_tracking_uri)
        with tempfile.TemporaryDirectory(prefix="tritonflow-validate-") as tmp:
            path, model_io = local_model(uri, download_dir=tmp)
            data = load_dataset(sample, Path(tmp) / "sample")
            gate = validate_model(path, model_io, model_name=name, dataset=data, dataset_rows=rows, atol=atol,
                                  rtol=rtol, max_batch_size=max_batch_size, export_format=export_format, settings=s)
        a = s.parity_atol if atol is None else atol
        r = s.parity_rtol if rtol is None else rtol
        report.update(passed=gate.passed, failure=gate.failure,
                      parity=gate.parity_doc(uri, a, r, s.parity_min_label_agreement),
                      validation=gate.validation_doc(s.target_triton_release), config_pbtxt=to_pbtxt(gate.config))
        if out:
            target = Path(out)
            target.mkdir(parents=True, exist_ok=True)
            (target / gate.model_filename).write_bytes(gate.model_bytes)
            (target / "config.pbtxt").write_text(report["config_pbtxt"])
            (target / "report.json").write_text(json.dumps(json_safe(report), indent=2, sort_keys=True))
        return (0 if gate.passed else 1), json_safe(report)
    except DataError as exc:
        report.update(passed=False, failure=f"{type(exc).__name__}: {exc}")
        return 1, report
    except TritonflowError as exc:
        report.update(passed=False, failure=f"{type(exc).__name__}: {exc}")
        return 2, report
    except Exception as exc:  # noqa: BLE001 - MLflow unreachable, unreadable files: not a verdict
        report.update(passed=False, failure=f"could not run: {type(exc).__name__}: {exc}")
        return 2, report
def _drift_backtest(args: argparse.Namespace) -> int:
    """Run ``tritonflow drift backtest``.

    ``tritonflow drift backtest``: replay a table through the hourly check (see
    :mod:`drift_checks.backtest`); prints the summary as JSON.
    """
    import dataclasses as dc

    from drift_checks.backtest import read_suite, read_table, run_backtest
    from drift_checks.strategies import ReferenceStrategy
    from drift_checks.verdict import CheckConfig
    from ground.exceptions import DataError

    settings = get_settings()
    split = lambda v: [c.strip() for c in v.split(",") if c.strip()] if v else []  # noqa: E731
    importance = None
    if args.importance:
        try:
            from pathlib import Path

            importance = json.loads(Path(args.importance).read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"--importance {args.importance!r}: expected a JSON object "
                            f"{{feature: weight}} ({exc})") from None
    strategy = ReferenceStrategy.from_settings(settings, args.reference_strategy)
    if args.trailing:
        strategy = dc.replace(strategy, trailing=_duration(args.trailing, "--trailing"))
    if args.period:
        strategy = dc.replace(strategy, period=_duration(args.period, "--period"))
    config = CheckConfig.from_settings(settings, evidently_sample_rows=0)
    if args.weighting:
        config = dc.replace(config, alerts=dc.replace(config.alerts, weighting=args.weighting))
    doc = run_backtest(read_table(args.data), time_column=args.time_column, out_dir=args.out,
                       features=split(args.features) or None, categorical=split(args.categorical),
                       reference_rows=args.reference_rows,
                       reference_range=tuple(args.reference_range) if args.reference_range else None,
                       window=args.window, strategy=strategy, importance=importance, config=config,
                       time_unit=args.time_unit, replay_end=args.end, html_report=not args.no_html,
                       engine=args.engine, sketch_k=settings.drift_sketch_k,
                       contract=read_suite(args.suite) if args.suite else None)
    print(json.dumps({"out": args.out, **doc["summary"]}, default=str))
    return 0


def _duration(text: str, option: str):
    import datetime as dt

    import pandas as pd

    from ground.exceptions import DataError

    try:
        d = pd.Timedelta(text).to_pytimedelta()
    except (ValueError, TypeError):
        d = None
    if d is None or d <= dt.timedelta(0):
        raise DataError(f"{option} {text!r}: expected a positive duration such as 7D or 168h")
    return d


def default_receiver_url(settings: Settings) -> str:
    """URL of the webhook receiver of the local Airflow api-server (the plugin mounts it)."""
    from tritonflow.registry_events import URL_PREFIX, WEBHOOK_PATH

    return f"http://{settings.host}:{settings.airflow_api_port}{URL_PREFIX}{WEBHOOK_PATH}"


def _registry_webhook(args: argparse.Namespace) -> int:
    """Run ``tritonflow registry webhook register|list|test`` (logic: :mod:`model_registry.webhooks`)."""
    from mlflow import MlflowClient

    from model_registry import webhooks
    from tritonflow.registry_events import SUPPORTED_EVENTS

    settings = get_settings()
    uri = args.tracking_uri or settings.resolved_mlflow_tracking_uri
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    url = args.url or default_receiver_url(settings)
    if args.action == "list":
        hooks = [webhooks.describe(h) for h in webhooks.list_webhooks(client)]
        if args.json:
            print(json.dumps(hooks, indent=2))
        for h in [] if args.json else hooks:
            print(f"{h['id']}  {h['name']}  {h['status']}  {h['url']}  {','.join(h['events'])}")
        if not hooks and not args.json:
            print(f"no webhooks on {uri}")
        return 0
    if args.action == "register":
        events = [f"{entity}.{action}" for entity, action in SUPPORTED_EVENTS]
        done = webhooks.register_webhook(client, url, args.secret or settings.webhook_secret, events,
                                         name=args.name)
        hook = webhooks.describe(done.webhook)
        print(f"{'created' if done.created else 'updated'} webhook {hook['id']} ({hook['name']}) on {uri}: "
              f"{hook['url']} <- {', '.join(hook['events'])}")
        for removed in done.removed:
            print(f"deleted duplicate webhook {removed} (same URL: it would have started every DAG twice)")
        print("MLflow caches each event's webhooks (MLFLOW_WEBHOOK_CACHE_TTL on its server, default 60 s): "
              "a new or changed webhook applies after that")
        return 0
    result = webhooks.probe_webhook(client, args.event, url=None if args.id else url, webhook_id=args.id)
    print(json.dumps(dataclasses.asdict(result), indent=2))
    if not result.success:
        reason = result.error or f"the receiver answered {result.status}: {result.body}"
        print(f"error: MLflow's test delivery of {result.event} to {result.url} failed: {reason}", file=sys.stderr)
        return 1
    return 0


def _add_registry_parser(sub: Any) -> None:
    """``tritonflow registry webhook ...`` arguments."""
    reg = sub.add_parser("registry", help="MLflow registry tools")
    rsub = reg.add_subparsers(dest="registry_command", required=True)
    wh = rsub.add_parser("webhook", help="the MLflow webhook that delivers registry changes to tritonflow",
                         description="register (create or update), list or test the MLflow webhook that "
                                     "sends registry changes to tritonflow's receiver")
    wh.add_argument("action", choices=["register", "list", "test"])
    wh.add_argument("--tracking-uri", default=None, help="MLflow server (default: TRITONFLOW_MLFLOW_TRACKING_URI "
                                                         "or the local one)")
    wh.add_argument("--url", default=None, help="receiver URL (default: the local Airflow api-server's "
                                                "http://HOST:TRITONFLOW_AIRFLOW_API_PORT/tritonflow/webhooks/mlflow)")
    wh.add_argument("--secret", default=None, help="HMAC secret (default: TRITONFLOW_WEBHOOK_SECRET)")
    wh.add_argument("--name", default="tritonflow", help="webhook name (register)")
    wh.add_argument("--event", default="model_version_tag.set",
                    help="test: event whose MLflow example payload is sent (about model example_model, "
                         "version 1: answered 'gone' where that version does not exist, else a mapped one "
                         "starts its DAGs; the default maps to no DAG)")
    wh.add_argument("--id", default=None, help="test: webhook id instead of --url")
    wh.add_argument("--json", action="store_true", help="list as JSON")


def _add_runtime_parser(sub: Any) -> None:
    """``tritonflow runtime start|status|stop`` arguments."""
    rt = sub.add_parser("runtime", help=f"start, check or stop the local services ({', '.join(KNOWN_SERVICES)})",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="services (start order; ports from the settings, defaults shown):\n"
                               + services_help())
    rt.add_argument("action", choices=["start", "status", "stop"])
    rt.add_argument("--services", default=",".join(ALL_SERVICES),
                    help=f"comma-separated subset of: {', '.join(KNOWN_SERVICES)} (default: all of them)")
    rt.add_argument("--repository", default=None, help="Triton repository: folder or s3://http://host:port/bucket/prefix")
    rt.add_argument("--json", action="store_true", help="status as JSON")


def _add_settings_parser(sub: Any) -> None:
    """``tritonflow settings`` arguments."""
    st = sub.add_parser("settings", help="print the settings in effect and where each comes from; "
                                         "exit 1 on a value that is not valid")
    st.add_argument("--reference", action="store_true",
                    help="print the reference instead (every variable, its default and meaning)")
    st.add_argument("--markdown", action="store_true", help="the reference as a Markdown table (docs/configuration.md)")


def _add_validate_parser(sub: Any) -> None:
    """``tritonflow validate`` arguments."""
    va = sub.add_parser("validate", help="convert, parity-gate and generate config.pbtxt without publishing")
    va.add_argument("model_uri", help="models:/name/version, runs:/<run>/<path> or a local MLflow model folder")
    va.add_argument("--sample", required=True, help="validation rows: CSV or Parquet file (signature columns)")
    va.add_argument("--out", default=None, help="folder for the model file, config.pbtxt and report.json")
    va.add_argument("--name", default=None, help="Triton model name (default: from the URI)")
    va.add_argument("--format", dest="export_format", choices=["onnx", "torchscript"], default="onnx")
    va.add_argument("--max-batch-size", type=int, default=32)
    va.add_argument("--atol", type=float, default=None)
    va.add_argument("--rtol", type=float, default=None)
    va.add_argument("--rows", type=int, default=1000, help="rows of the sample used (the first ones)")
    va.add_argument("--tracking-uri", default=None, help="MLflow tracking URI for models:/ and runs:/ URIs")


def _status(args: argparse.Namespace) -> int:
    """``tritonflow status MODEL``: print what serves; 1 when a part could not be read (named)."""
    from tritonflow.pipelines.serving_status import format_status, serving_status

    status = serving_status(args.model)
    print(json.dumps(status, indent=2, sort_keys=True, default=str) if args.json else format_status(status))
    for problem in status["problems"]:
        print(f"error: could not read {problem}", file=sys.stderr)
    return 1 if status["problems"] else 0


def _add_status_parser(sub: Any) -> None:
    """``tritonflow status MODEL`` arguments."""
    st = sub.add_parser("status", help="what serves a model: versions and weights, aliases, promotion policy, "
                                       "the running canary and its step, the last decision")
    st.add_argument("model", help="registered MLflow model name")
    st.add_argument("--json", action="store_true", help="as JSON")


#: Exit status of ``promote``, ``rollback``, ``approve``, ``reject`` and ``decide``: the run was started (and, with
#: ``--wait``, ended in success), or the answer was taken.
EXIT_OK = 0
#: The run ended ``failed``, or Airflow refused the request (no pending approval, a form value refused).
EXIT_FAILED = 1
#: Airflow could not be reached, or refused the credentials.
EXIT_UNREACHABLE = 2
#: ``--wait`` ran out of time; the run goes on.
EXIT_TIMEOUT = 3
#: The DAGs the CLI starts runs of.
PROMOTION_DAG, ROLLBACK_DAG = "canary_promotion", "canary_rollback"
#: The options of the approval before a canary (Airflow's ``ApprovalOperator``): approve, reject.
APPROVAL_OPTIONS = ("Approve", "Reject")


def airflow_client(settings: Settings) -> Any:
    """The REST client of the Airflow the CLI operates (``TRITONFLOW_AIRFLOW_URL``/``_USERNAME``/``_PASSWORD``)."""
    from tritonflow.runtime.airflow_api import AirflowApi

    return AirflowApi(settings.resolved_airflow_url, username=settings.airflow_username or None,
                      password=settings.airflow_password or None)


def failed_tasks(api: Any, dag_id: str, run_id: str) -> list[str]:
    """The task ids of a run whose state is ``failed`` or ``upstream_failed``, to name in an error."""
    from urllib.parse import quote

    doc = api.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances?limit=500")
    return sorted({t["task_id"] for t in doc.get("task_instances") or []
                   if t.get("state") in ("failed", "upstream_failed")})


def finish_run(api: Any, dag_id: str, run_id: str, *, wait: bool, timeout_s: float) -> int:
    """Without ``wait``: :data:`EXIT_OK`. With it: wait for the run's end; its state decides the exit status."""
    if not wait:
        return EXIT_OK
    try:
        run = api.wait_for_run(dag_id, run_id, timeout_s)
    except TimeoutError as exc:
        print(f"error: {exc}; it goes on (see it with tritonflow status, or in the Airflow UI)", file=sys.stderr)
        return EXIT_TIMEOUT
    if run["state"] == "success":
        print(f"run {run_id} of DAG {dag_id} ended success")
        return EXIT_OK
    tasks = failed_tasks(api, dag_id, run_id)
    print(f"error: run {run_id} of DAG {dag_id} ended {run['state']}"
          + (f"; failed task(s): {', '.join(tasks)} (their logs say why)" if tasks else ""), file=sys.stderr)
    return EXIT_FAILED


def start_run(api: Any, dag_id: str, conf: dict[str, Any]) -> str:
    """Start a run of ``dag_id`` with ``conf`` (its form's fields) through the REST API; return its run id."""
    import time
    import uuid

    run_id = f"cli__{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}_{uuid.uuid4().hex[:6]}"
    if api.get(f"/dags/{dag_id}").get("is_paused"):
        print(f"warning: DAG {dag_id} is paused: run {run_id} waits until it is unpaused", file=sys.stderr)
    api.trigger(dag_id, conf, run_id)
    print(f"started run {run_id} of DAG {dag_id}: {api.base_url}/dags/{dag_id}/runs/{run_id}")
    return run_id


def hitl_location(row: Mapping[str, Any]) -> tuple[str, str, str, int]:
    """``(dag_id, run_id, task_id, map_index)`` of a required action as the REST API lists it."""
    ti = row.get("task_instance") or row
    return (str(ti["dag_id"]), str(ti.get("dag_run_id") or ti.get("run_id")), str(ti["task_id"]),
            int(ti.get("map_index", -1)))


#: States of a task that waits for its answer: parked (Airflow 3.3+) or deferred (earlier).
WAITING_STATES = ("awaiting_input", "deferred")
#: Seconds an approval request must exist before the CLI answers it. Airflow 3.3.2 fails a task whose
#: deferral is resumed before the executor has reported the deferring process's end (the scheduler
#: logs "finished with state success, but the task instance's state attribute is queued"); an answer
#: within about a second of the request hits that, a person at the UI does not.
APPROVAL_SETTLE_S = 5.0


def pending_requests(api: Any, model: str, dag_id: str = PROMOTION_DAG,
                     task_id: str = "approval") -> list[dict[str, Any]]:
    """The unanswered requests of task ``task_id`` in ``dag_id`` runs of ``model``, each with its plan.

    Only requests whose task already waits count: an answer written between the request and the
    task's parking is kept by Airflow 3.3.2 but does not resume the task until its timeout.
    Each: ``{"run_id", "task_id", "map_index", "plan", "subject", "options", "created_at"}``.
    """
    out = []
    for row in api.hitl_details(dag_id, pending=True):
        dag_id, run_id, row_task, map_index = hitl_location(row)
        if row_task != task_id or (row.get("task_instance") or row).get("state") not in WAITING_STATES:
            continue
        plan = api.xcom(dag_id, run_id, "resolve_versions") or {}
        if isinstance(plan, dict) and plan.get("model") == model:
            out.append({"run_id": run_id, "task_id": row_task, "map_index": map_index, "plan": plan,
                        "subject": row.get("subject"), "options": list(row.get("options") or []),
                        "created_at": row.get("created_at")})
    return out


def pending_approvals(api: Any, model: str, dag_id: str = PROMOTION_DAG) -> list[dict[str, Any]]:
    """The unanswered ``approval`` requests of ``dag_id`` runs of ``model`` (:func:`pending_requests`)."""
    return pending_requests(api, model, dag_id, "approval")


def pending_pauses(api: Any, model: str, dag_id: str = PROMOTION_DAG) -> list[dict[str, Any]]:
    """The canary pauses of ``model`` waiting for a decision (``step_decision`` requests, :func:`pending_requests`)."""
    from tritonflow.pipelines.canary_pauses import PAUSE_TASK_ID

    return pending_requests(api, model, dag_id, PAUSE_TASK_ID)


def _one_pending(pending: list[dict[str, Any]], what: str, model: str, run_id: str | None, dag_id: str) -> Any:
    """The one request in ``pending``; else ``None`` after saying on stderr why (none, or several)."""
    if not pending:
        where = f"run {run_id} of DAG {dag_id}" if run_id else f"any run of DAG {dag_id}"
        print(f"error: no {what} of model {model!r} is waiting in {where}", file=sys.stderr)
        return None
    if len(pending) > 1:
        runs = ", ".join(f"{p['run_id']} (v{p['plan'].get('challenger')})" for p in pending)
        print(f"error: {len(pending)} {what}s of model {model!r} are waiting: {runs}; pick one with --run",
              file=sys.stderr)
        return None
    settle_s = APPROVAL_SETTLE_S - seconds_since(pending[0].get("created_at"))
    if settle_s > 0:  # see APPROVAL_SETTLE_S
        time.sleep(min(settle_s, APPROVAL_SETTLE_S))
    return pending[0]


def seconds_since(timestamp: Any) -> float:
    """Seconds from an ISO 8601 timestamp of the REST API to now (0 when it is missing or unreadable)."""
    import datetime as dt

    try:
        then = dt.datetime.fromisoformat(str(timestamp))
    except ValueError:
        return 0.0
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.timezone.utc)
    return (dt.datetime.now(dt.timezone.utc) - then).total_seconds()


def answer_approval(api: Any, model: str, *, approve: bool, comment: str = "", run_id: str | None = None,
                    wait: bool = False, timeout_s: float = 0.0, dag_id: str = PROMOTION_DAG) -> int:
    """Approve or reject the pending canary approval of ``model`` (``run_id`` picks one of several).

    Returns:
        :data:`EXIT_FAILED` when none (or several, without ``run_id``) wait; else as :func:`finish_run`.
    """
    p = _one_pending([p for p in pending_approvals(api, model, dag_id) if run_id in (None, p["run_id"])],
                     "approval", model, run_id, dag_id)
    if p is None:
        return EXIT_FAILED
    answer = APPROVAL_OPTIONS[0] if approve else APPROVAL_OPTIONS[1]
    api.answer_hitl(dag_id, p["run_id"], p["task_id"], [answer], map_index=p["map_index"],
                    params_input={"comment": comment} if comment else {})
    verb = "approved" if approve else "rejected"
    print(f"{verb} the canary of model {model!r} version {p['plan'].get('challenger')} "
          f"(run {p['run_id']} of DAG {dag_id})")
    return finish_run(api, dag_id, p["run_id"], wait=wait, timeout_s=timeout_s)


def decide_pause(api: Any, model: str, decision: str, *, comment: str = "", run_id: str | None = None,
                 wait: bool = False, timeout_s: float = 0.0, dag_id: str = PROMOTION_DAG) -> int:
    """Continue, hold or roll back the canary of ``model`` waiting at a pause (policy ``approve-steps``).

    Args:
        api: The Airflow REST client.
        model: Registered model name.
        decision: ``continue``, ``hold`` or ``rollback``.
        comment: Why (recorded with the decision on the MLflow version).
        run_id: The run, when several wait.
        wait: Wait for the run's end.
        timeout_s: Seconds ``wait`` waits.
        dag_id: The promotion DAG.

    Returns:
        :data:`EXIT_FAILED` when no pause (or several, without ``run_id``) waits, or the decision is
        not offered there (``hold`` once the step has no extension left); else as :func:`finish_run`.
    """
    from tritonflow.pipelines.canary_pauses import OPTION_LABELS

    p = _one_pending([p for p in pending_pauses(api, model, dag_id) if run_id in (None, p["run_id"])],
                     "canary pause", model, run_id, dag_id)
    if p is None:
        return EXIT_FAILED
    label = OPTION_LABELS[decision]
    if p["options"] and label not in p["options"]:
        print(f"error: {decision!r} is not offered at this pause of model {model!r} (run {p['run_id']}): "
              f"offered {', '.join(p['options'])}", file=sys.stderr)
        return EXIT_FAILED
    api.answer_hitl(dag_id, p["run_id"], p["task_id"], [label], map_index=p["map_index"],
                    params_input={"comment": comment} if comment else {})
    print(f"{decision}: {p['subject']} (run {p['run_id']} of DAG {dag_id}, pause {p['map_index'] + 1})")
    return finish_run(api, dag_id, p["run_id"], wait=wait, timeout_s=timeout_s)


def rollback_conf(args: argparse.Namespace) -> dict[str, Any]:
    """The ``canary_rollback`` form's fields from ``tritonflow rollback``'s arguments."""
    conf: dict[str, Any] = {"model": args.model, "reason": args.reason}
    if args.to is not None:
        conf["to_version"] = args.to
    return conf


def _operate(args: argparse.Namespace) -> int:
    """``tritonflow promote|rollback|approve|reject|decide``: through the Airflow REST API, exit statuses above."""
    import urllib.error

    from tritonflow.runtime.airflow_api import AirflowApiError

    settings = get_settings()
    api = airflow_client(settings)
    timeout_s = args.timeout
    try:
        if args.command in ("promote", "rollback"):
            dag_id, conf = ((PROMOTION_DAG, {"model": args.model, "challenger": str(args.version)})
                            if args.command == "promote" else (ROLLBACK_DAG, rollback_conf(args)))
            run_id = start_run(api, dag_id, conf)
            return finish_run(api, dag_id, run_id, wait=args.wait, timeout_s=timeout_s)
        if args.command == "decide":
            return decide_pause(api, args.model, args.decision, comment=args.comment or "", run_id=args.run,
                                wait=args.wait, timeout_s=timeout_s)
        return answer_approval(api, args.model, approve=args.command == "approve", comment=args.comment or "",
                               run_id=args.run, wait=args.wait, timeout_s=timeout_s)
    except AirflowApiError as exc:
        print(f"error: Airflow at {api.base_url} refused: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE if exc.status in (401, 403) else EXIT_FAILED
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        print(f"error: Airflow at {api.base_url} could not be reached ({exc}); set TRITONFLOW_AIRFLOW_URL",
              file=sys.stderr)
        return EXIT_UNREACHABLE


def _add_operate_parsers(sub: Any) -> None:
    """``tritonflow promote|rollback|approve|reject|decide`` arguments."""
    exits = (f"exit status: {EXIT_OK} started (with --wait: ended success) or answered; {EXIT_FAILED} the run "
             f"failed or Airflow refused the request; {EXIT_UNREACHABLE} Airflow unreachable or credentials "
             f"refused; {EXIT_TIMEOUT} --wait ran out of time (the run goes on)")

    def common(p: Any) -> None:
        p.add_argument("model", help="registered MLflow model name")
        p.add_argument("--wait", action="store_true", help="wait until the run ends (Airflow's run-wait "
                                                           "endpoint, else polling)")
        p.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds --wait waits (default 4 h)")

    pr = sub.add_parser("promote", help=f"start a canary of a version (a run of DAG {PROMOTION_DAG})", epilog=exits)
    common(pr)
    pr.add_argument("version", help="version number (e.g. 7) or alias (e.g. challenger) to promote")
    rb = sub.add_parser("rollback", help=f"roll a model back (a run of DAG {ROLLBACK_DAG})", epilog=exits)
    common(rb)
    rb.add_argument("--reason", required=True, help="why (recorded on the MLflow versions)")
    rb.add_argument("--to", type=int, default=None, metavar="VERSION",
                    help="a version tritonflow published and signed (default: alias previous_champion)")
    for name, verb in (("approve", "approve"), ("reject", "reject")):
        ap = sub.add_parser(name, help=f"{verb} the canary of a model waiting for approval", epilog=exits)
        common(ap)
        ap.add_argument("--comment", default="", help="a comment recorded with the answer")
        ap.add_argument("--run", default=None, help=f"the {PROMOTION_DAG} run, when several wait")
    de = sub.add_parser("decide", help="continue, hold or roll back a canary waiting at a pause "
                                       "(promotion policy approve-steps)", epilog=exits)
    common(de)
    de.add_argument("decision", choices=["continue", "hold", "rollback"],
                    help="continue: next step (at 100 %%: promote); hold: bake this step once more; "
                         "rollback: all traffic back to the champion now")
    de.add_argument("--comment", default="", help="a comment recorded with the decision")
    de.add_argument("--run", default=None, help=f"the {PROMOTION_DAG} run, when several wait")


def _add_drift_parser(sub: Any) -> None:
    """``tritonflow drift backtest`` arguments."""
    dr = sub.add_parser("drift", help="drift tools")
    dsub = dr.add_subparsers(dest="drift_command", required=True)
    bt = dsub.add_parser("backtest", help="replay a historical table through the hourly drift check",
                         description="Replay a Parquet/CSV table through exactly the check drift_monitor "
                                     "runs (contract, statistics, thresholds, verdict, alert policy) and "
                                     "write backtest.json and index.html to --out.")
    bt.add_argument("--data", required=True, help="Parquet or CSV table")
    bt.add_argument("--time-column", required=True, help="column holding each row's time")
    bt.add_argument("--time-unit", default=None, help="unit of a numeric time column (s, ms, h, D; default s)")
    bt.add_argument("--features", default="", help="comma-separated feature columns (default: all but time)")
    bt.add_argument("--categorical", default="", help="comma-separated columns scored as categories")
    ref = bt.add_mutually_exclusive_group(required=True)
    ref.add_argument("--reference-rows", type=int, help="the reference is the first N rows")
    ref.add_argument("--reference-range", nargs=2, metavar=("START", "END"),
                     help="the reference is the rows with START <= time < END")
    bt.add_argument("--window", default="1h", help="window: N rows (e.g. 48) or a duration (e.g. 1h, 2D)")
    bt.add_argument("--end", default=None, help="stop replaying at this time (default: the end)")
    bt.add_argument("--reference-strategy", default=None,
                    choices=["training", "trailing", "seasonal", "training_seasonal"],
                    help="what each window is compared with (default: TRITONFLOW_DRIFT_REFERENCE_STRATEGY)")
    bt.add_argument("--trailing", default=None, help="span of the trailing reference, data time (e.g. 7D)")
    bt.add_argument("--period", default=None,
                    help="period of the seasonal and training_seasonal references and of the season-matched run "
                         "rule, data time (e.g. 168h, 365.25D; default: TRITONFLOW_DRIFT_SEASONAL_PERIOD_HOURS, and "
                         "when that is 0 a week for seasonal and, for the reference's season, the longest of a "
                         "year, a week and a day its times cover twice)")
    bt.add_argument("--importance", default=None, help="JSON file {feature: weight} for the dataset verdict")
    bt.add_argument("--weighting", choices=["importance", "uniform"], default=None,
                    help="dataset weights (default: TRITONFLOW_DRIFT_WEIGHTING)")
    bt.add_argument("--suite", default=None,
                    help="JSON suite of your own expectations (GX 1.x suite or tritonflow contract), "
                         "added to the contract derived from the reference")
    bt.add_argument("--out", required=True, help="output folder (backtest.json, index.html)")
    bt.add_argument("--no-html", action="store_true", help="only backtest.json")
    bt.add_argument("--engine", choices=["exact", "streamed"], default="exact",
                    help="score each window whole (exact) or from its streamed bin counts and sketches")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tritonflow`` command.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 on a failed check or a :class:`~ground.exceptions.TritonflowError`
        (its message printed on stderr).
    """
    parser = argparse.ArgumentParser(prog="tritonflow")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_runtime_parser(sub)
    _add_settings_parser(sub)
    _add_validate_parser(sub)
    _add_drift_parser(sub)
    _add_registry_parser(sub)
    _add_status_parser(sub)
    _add_operate_parsers(sub)
    args = parser.parse_args(argv)
    try:
        if args.command in ("promote", "rollback", "approve", "reject", "decide"):
            return _operate(args)
        if args.command == "status":
            return _status(args)
        if args.command == "registry":
            return _registry_webhook(args)
        if args.command == "validate":
            rc, report = validate(args.model_uri, args.sample, out=args.out, name=args.name,
                                  export_format=args.export_format, max_batch_size=args.max_batch_size,
                                  atol=args.atol, rtol=args.rtol, rows=args.rows, tracking_uri=args.tracking_uri)
            print(json.dumps(report, indent=2, sort_keys=True, default=str))
            if rc:
                print(f"validate: {report.get('failure') or 'failed'}", file=sys.stderr)
            return rc
        if args.command == "runtime":
            return _runtime(args)
        if args.command == "drift":
            return _drift_backtest(args)
        if args.reference or args.markdown:
            print(settings_reference(markdown=args.markdown))
            return 0
        print(effective_settings())
        return 0
    except TritonflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
