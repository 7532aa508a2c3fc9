"""``tritonflow`` command line.

Usage::

    tritonflow runtime start [--services triton,mlflow,s3,gateway] [--repository URI]
    tritonflow runtime status [--json]
    tritonflow runtime stop [--services ...]
    tritonflow settings            # the configuration reference (variables, defaults, meaning)
"""

from __future__ import annotations

import argparse
import json
import sys

from tritonflow.exceptions import RuntimeStartError, TritonflowError
from tritonflow.settings import Settings, get_settings

ALL_SERVICES = ("s3", "mlflow", "triton", "gateway")


def _services(settings: Settings, names: list[str], repository: str | None):
    from tritonflow.runtime.services import MlflowServer, NginxGateway, S3Server, TritonServer

    build = {
        "s3": lambda: S3Server(settings),
        "mlflow": lambda: MlflowServer(settings),
        "triton": lambda: TritonServer(settings, repository=repository),
        "gateway": lambda: NginxGateway(settings),
    }
    return [(name, build[name]()) for name in names]


def _parse_services(raw: str) -> list[str]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_SERVICES]
    if unknown:
        raise SystemExit(f"unknown service(s) {unknown}; expected a subset of {list(ALL_SERVICES)}")
    return [n for n in ALL_SERVICES if n in names]  # start order: dependencies first


def _runtime(args: argparse.Namespace) -> int:
    settings = get_settings()
    names = _parse_services(args.services)
    services = _services(settings, names, getattr(args, "repository", None))
    if args.action == "start":
        started = []
        for name, service in services:
            if service.healthy():
                print(f"{name}: already running at {service.health_url()}")
                continue
            try:
                service.start()
            except RuntimeStartError as exc:
                for _, other in reversed(started):
                    other.stop()
                print(f"error: {exc}", file=sys.stderr)
                return 1
            started.append((name, service))
            print(f"{name}: started, log {service.log_path}")
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
    from tritonflow.settings import PROJECT_ROOT

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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tritonflow`` command."""
    parser = argparse.ArgumentParser(prog="tritonflow")
    sub = parser.add_subparsers(dest="command", required=True)
    rt = sub.add_parser("runtime", help="start, check or stop the local services")
    rt.add_argument("action", choices=["start", "status", "stop"])
    rt.add_argument("--services", default=",".join(ALL_SERVICES), help="comma-separated subset")
    rt.add_argument("--repository", default=None, help="Triton repository: folder or s3://http://host:port/bucket/prefix")
    rt.add_argument("--json", action="store_true", help="status as JSON")
    st = sub.add_parser("settings", help="print the configuration reference")
    st.add_argument("--markdown", action="store_true", help="as a Markdown table (the README's)")
    args = parser.parse_args(argv)
    try:
        if args.command == "runtime":
            return _runtime(args)
        print(settings_reference(markdown=args.markdown))
        return 0
    except TritonflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
