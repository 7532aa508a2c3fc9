"""The compose stack's gateway: ``deploy/nginx/nginx.conf`` and its reload watcher run under the local NGINX
binary, with a small HTTP server standing in for Triton behind it (no Docker engine here)."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest

from tests.compose.stack import (
    ROOT,
    bind_mounts,
    container_ports,
    env_of,
    flag_value,
    named_volumes,
    triton_argv,
)
from tests.slow_upstream import SlowVersion
from tritonflow.runtime.services import NGINX_BINARY, free_port

#: The gateway runs under the local NGINX, a real service.
pytestmark = pytest.mark.integration


# ============================================================================ gateway
def nginx_blocks(text: str) -> list[tuple[tuple[str, ...], str]]:
    """``(enclosing block names, directive)`` for every directive of an NGINX config."""
    text = re.sub(r"#[^\n]*", "", re.sub(r'"[^"]*"', '""', text))
    out, stack, current = [], [], ""
    for ch in text:
        if ch == "{":
            stack.append(current.split()[0] if current.split() else "")
            current = ""
        elif ch == "}":
            stack.pop()
            current = ""
        elif ch == ";":
            out.append((tuple(stack), " ".join(current.split())))
            current = ""
        else:
            current += ch
    return out


def test_gateway_shares_its_snippet_folders_with_the_workers(services):
    from repository_sync.routing.nginx_router import NginxRouter

    gateway, worker = services["gateway"], services["airflow-worker"]
    gateway_dir = env_of(gateway)["TRITONFLOW_GATEWAY_CONF_DIR"]
    worker_dir = env_of(worker)["TRITONFLOW_GATEWAY_CONF_DIR"]
    volume = next(v for v, path in named_volumes(gateway).items() if path == gateway_dir)
    assert named_volumes(worker).get(volume) == worker_dir, "the workers write snippets the gateway never reads"
    conf = (ROOT / bind_mounts(gateway)["/etc/nginx/nginx.conf"]).read_text()
    directives = nginx_blocks(conf)
    assert (("http",), f"include {gateway_dir}/http.d/*.conf") in directives
    assert (("http", "server"), f"include {gateway_dir}/locations.d/*.conf") in directives
    upstream = NginxRouter(Path("/unused"), reload=["true"]).upstream
    assert (("http", "upstream"), f"server triton:{flag_value(triton_argv(services), '--http-port')}") in directives
    assert f"upstream {upstream}" in " ".join(conf.split())
    listen = [d for blocks, d in directives if blocks == ("http", "server") and d.startswith("listen")]
    assert f"listen {env_of(worker)['TRITONFLOW_GATEWAY_PORT']}" in listen
    assert int(env_of(worker)["TRITONFLOW_GATEWAY_PORT"]) in container_ports(gateway)
    assert urlsplit(env_of(worker)["TRITONFLOW_GATEWAY_URL"]).hostname == "gateway"
    assert services["gateway"]["depends_on"]["triton"]["condition"] == "service_healthy"
    probe = urlsplit(env_of(gateway)["TRITONFLOW_GATEWAY_PROBE_URL"])
    assert probe.hostname == "127.0.0.1" and f"listen {probe.port}" in listen, "the watcher probes another server"
    assert f"location = {probe.path}" in " ".join(conf.split())


#: A version the stand-in Triton answers with an error (a challenger that fails).
FAILING_VERSION = 9
#: Inferences of this version are answered 3 s late (a request in flight across a reload).
SLOW = SlowVersion()


class _FakeTriton(http.server.BaseHTTPRequestHandler):
    """Stands in for Triton behind the gateway: answers 200 with the path it was asked for
    (500 for :data:`FAILING_VERSION`)."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        SLOW.hold(self.path)
        body = json.dumps({"path": self.path}).encode()
        self.send_response(500 if f"/versions/{FAILING_VERSION}/" in self.path else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@dataclasses.dataclass
class LocalGateway:
    """The gateway container's entry point (deploy/nginx/gateway.sh: the reload watcher beside an
    NGINX it then becomes) with deploy/nginx/nginx.conf, under the local NGINX binary."""

    conf_dir: Path
    url: str
    process: subprocess.Popen  # the NGINX master, whose children are its workers and the watcher
    logs_dir: Path  # where the gateway-logs volume's path is mapped


def request_reload(conf_dir: Path, timeout_s: float = 30.0) -> str:
    """Client side of the reload-watcher protocol, as the canary router uses it."""
    from repository_sync.routing.nginx_router import WatcherReload

    return WatcherReload(conf_dir, timeout_s=timeout_s)()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def local_gateway(tmp_path, services) -> Iterator[LocalGateway]:
    """The stack's gateway config with container paths and host names mapped into ``tmp_path``."""
    if not Path(NGINX_BINARY).exists():
        pytest.skip(f"NGINX not installed at {NGINX_BINARY} (scripts/setup.sh installs nginx-light)")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeTriton)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    gateway_dir = env_of(services["gateway"])["TRITONFLOW_GATEWAY_CONF_DIR"]
    conf_dir, state = tmp_path / "gateway-conf", tmp_path / "nginx"
    for d in (conf_dir / "http.d", conf_dir / "locations.d", state / "logs", state / "temp"):
        d.mkdir(parents=True)
    (state / "mime.types").write_text("types { application/json json; text/plain txt; }\n")
    port, status_port = free_port(), free_port()
    temp = "".join(f" {kind}_temp_path {state / 'temp' / kind};"
                   for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    mapping = {
        "user nginx;": "user root;" if os.geteuid() == 0 else "",
        "/var/run/nginx.pid": str(state / "nginx.pid"),
        "/var/log/nginx": str(state / "logs"),
        "/etc/nginx/mime.types": str(state / "mime.types"),
        gateway_dir: str(conf_dir),
        "server triton:8000;": f"server 127.0.0.1:{upstream.server_address[1]};",
        "listen 8080;": f"listen 127.0.0.1:{port};",
        "listen 8081;": f"listen 127.0.0.1:{status_port};",
        "client_max_body_size 64m;": "client_max_body_size 64m;" + temp,
    }
    conf = (ROOT / bind_mounts(services["gateway"])["/etc/nginx/nginx.conf"]).read_text()
    for old, new in mapping.items():
        assert old in conf, f"deploy/nginx/nginx.conf no longer contains {old!r}; update this fixture"
        conf = conf.replace(old, new)
    conf_path = state / "nginx.conf"
    conf_path.write_text(conf)
    nginx_argv = [NGINX_BINARY, "-p", str(state), "-c", str(conf_path), "-e", str(state / "logs" / "error.log")]
    nginx = subprocess.Popen(
        ["sh", str(ROOT / "deploy/nginx/gateway.sh")],
        env=dict(os.environ, TRITONFLOW_GATEWAY_CONF_DIR=str(conf_dir), TRITONFLOW_GATEWAY_RELOAD_POLL_S="0.1",
                 TRITONFLOW_GATEWAY_PROBE_URL=f"http://127.0.0.1:{port}/gateway/reload-token",
                 TRITONFLOW_GATEWAY_PID_FILE=str(state / "nginx.pid"), NGINX_CMD=shlex.join(nginx_argv)),
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    gw = LocalGateway(conf_dir, f"http://127.0.0.1:{port}", nginx, tmp_path / "gateway-logs")
    try:
        deadline = time.monotonic() + 30
        while not _get(gw.url + "/gateway/health")[0] == 200:
            if nginx.poll() is not None:
                pytest.fail(f"nginx exited: {nginx.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "gateway not healthy within 30 s"
            time.sleep(0.1)
        yield gw
    finally:
        _stop(nginx)  # its session: the master, its workers and the watcher
        upstream.shutdown()
        upstream.server_close()


def _get(url: str, data: bytes | None = None) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as resp:
            raw = resp.read()
            is_json = resp.headers.get("Content-Type", "").startswith("application/json")
            return resp.status, dict(resp.headers), json.loads(raw) if is_json else {"text": raw.decode()}
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), {}
    except (urllib.error.URLError, OSError):
        return 0, {}, {}


def test_workers_canary_plan_reaches_the_gateway_through_the_reload_watcher(local_gateway):
    from repository_sync.routing.nginx_router import NginxRouter
    from repository_sync.routing.traffic_plan import TrafficPlan

    gw = local_gateway
    router = NginxRouter(gw.conf_dir, reload=lambda: request_reload(gw.conf_dir), test=None)
    status, _, body = _get(gw.url + "/v2/models/churn/infer", data=b"{}")
    assert (status, body["path"]) == (200, "/v2/models/churn/infer"), "no route before any plan"

    router.apply(TrafficPlan.single("churn", 7))
    status, headers, body = _get(gw.url + "/v2/models/churn/infer", data=b"{}")
    assert status == 200 and body["path"] == "/v2/models/churn/versions/7/infer"
    assert headers.get("X-Tritonflow-Version") == "7"

    router.apply(TrafficPlan.canary("churn", champion=7, challenger=8, percent=50))
    served = {_get(gw.url + "/v2/models/churn/infer", data=b"{}")[2]["path"] for _ in range(40)}
    assert served == {"/v2/models/churn/versions/7/infer", "/v2/models/churn/versions/8/infer"}


def test_the_watcher_answers_once_the_requests_admitted_under_the_old_config_are_answered(local_gateway):
    """A rollback unloads the challenger as soon as the watcher answers: a request the old
    workers admitted must be answered by then, or it reaches a version that is gone."""
    from repository_sync.routing.nginx_router import NginxRouter
    from repository_sync.routing.traffic_plan import TrafficPlan

    gw = local_gateway
    router = NginxRouter(gw.conf_dir, reload=lambda: request_reload(gw.conf_dir), test=None)
    router.apply(TrafficPlan.single("churn", SLOW.version))
    SLOW.admitted.clear()
    answers: list = []
    client = threading.Thread(target=lambda: answers.append(_get(gw.url + "/v2/models/churn/infer", data=b"{}")))
    client.start()
    assert SLOW.admitted.wait(10), "the slow request never reached the upstream"
    router.apply(TrafficPlan.single("churn", 7))
    applied_at = time.monotonic()
    client.join(30)
    (status, headers, body), = answers
    assert (status, headers.get("X-Tritonflow-Version"), body["path"]) == (
        200, str(SLOW.version), f"/v2/models/churn/versions/{SLOW.version}/infer")
    assert SLOW.answered and SLOW.answered[-1] <= applied_at, "the watcher answered with a request in flight"
    # ... and it waited for the old workers only, not for itself (a child of the master too)
    assert "still running" not in (gw.conf_dir / "reload.result").read_text()
    assert _get(gw.url + "/v2/models/churn/infer", data=b"{}")[2]["path"] == "/v2/models/churn/versions/7/infer"


def test_the_watchers_default_pid_file_is_the_one_the_stack_nginx_writes(services):
    conf = (ROOT / bind_mounts(services["gateway"])["/etc/nginx/nginx.conf"]).read_text()
    watcher = (ROOT / "deploy/nginx/reload-watcher.sh").read_text()
    default = re.search(r"TRITONFLOW_GATEWAY_PID_FILE:-([^}]+)}", watcher).group(1)
    assert ((), f"pid {default}") in nginx_blocks(conf)


def test_reload_watcher_reports_a_refused_config_and_nginx_keeps_serving(local_gateway):
    from repository_sync.routing.nginx_router import NginxRouter
    from repository_sync.routing.traffic_plan import TrafficPlan

    gw = local_gateway
    from ground.exceptions import GatewayConfigError

    router = NginxRouter(gw.conf_dir, reload=lambda: request_reload(gw.conf_dir), test=None)
    router.apply(TrafficPlan.single("churn", 3))
    (gw.conf_dir / "http.d" / "broken.conf").write_text("this is not nginx;\n")
    with pytest.raises(GatewayConfigError, match="unknown directive"):
        request_reload(gw.conf_dir)
    status, _, body = _get(gw.url + "/v2/models/churn/infer", data=b"{}")
    assert status == 200 and body["path"] == "/v2/models/churn/versions/3/infer"
    (gw.conf_dir / "http.d" / "broken.conf").unlink()
    assert request_reload(gw.conf_dir) is not None


def test_the_canary_counts_per_version_failures_from_the_log_the_stack_gateway_writes(local_gateway, services):
    """The workers' TRITONFLOW_GATEWAY_ACCESS_LOG, written by the stack's NGINX, read by the canary."""
    from types import SimpleNamespace

    from ground.settings import Settings
    from repository_sync.routing.nginx_router import NginxRouter
    from repository_sync.routing.traffic_plan import TrafficPlan
    from tritonflow.pipelines.canary import CanaryEnvironment
    from tritonflow.pipelines.canary_promotion import gateway_statuses

    gw = local_gateway
    worker_env = env_of(services["airflow-worker"])
    settings = Settings.from_env(worker_env)
    path = CanaryEnvironment.from_settings(settings).gateway_status_log
    assert path, "the compose workers configure no gateway status log"
    volume, volume_path = next((v, p) for v, p in named_volumes(services["gateway"]).items()
                               if Path(path).is_relative_to(p))
    assert named_volumes(services["airflow-worker"]).get(volume) == volume_path
    local = gw.logs_dir / Path(path).relative_to(volume_path)  # the volume, as both containers see it
    local.parent.mkdir(parents=True)  # gateway.sh's mkdir (Docker creates the mount point itself)
    router = NginxRouter(gw.conf_dir, reload=lambda: request_reload(gw.conf_dir), test=None, status_log=local)
    router.apply(TrafficPlan.canary("churn", champion=7, challenger=FAILING_VERSION, percent=50))
    assert local.is_file(), "NGINX did not open the status log on reload"
    start = time.time()
    answers = [_get(gw.url + "/v2/models/churn/infer", data=b"{}")[0] for _ in range(60)]
    end = time.time() + 1.0
    assert set(answers) == {200, 500}, answers
    env = SimpleNamespace(gateway_status_log=str(local))
    read = gateway_statuses(env, "churn")
    deadline = time.monotonic() + 10
    # NGINX writes a request's line once the response has gone out: the last ones may lag
    counts = read(start - 1.0, end)
    while sum(c.requests for c in counts.values()) < len(answers):
        assert time.monotonic() < deadline, f"{counts} after 10 s for {len(answers)} requests"
        time.sleep(0.1)
        counts = read(start - 1.0, end)
    assert set(counts) == {7, FAILING_VERSION}
    assert counts[7].requests == answers.count(200) and counts[7].failures == 0
    assert counts[FAILING_VERSION].requests == counts[FAILING_VERSION].failures == answers.count(500)
