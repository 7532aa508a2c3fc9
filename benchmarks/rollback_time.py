"""Rollback time and failed requests through the NGINX gateway (canary benchmark).

While a bounded loopback client sends requests through the real NGINX gateway
(:class:`tritonflow.runtime.services.NginxGateway`) to a loopback upstream, this script

1. runs a full promotion (5 -> 25 -> 50 -> 100 % via :class:`NginxRouter`) and counts failed
   requests;
2. repeatedly puts the model at 50/50, decides a rollback, calls ``router.rollback`` and measures
   the time from the decision to the moment every request lands on the champion (the send time of
   the last request still answered by the challenger, minus the decision time), and counts failed
   requests.

By default the upstream is a small Python HTTP server that stands in for Triton (it answers every
``/v2/models/<m>/versions/<v>/infer`` with 200), so the figures measure the gateway and the
router, not model inference. With ``--triton`` the upstream is a real Triton 2.51
(``TritonServer``) serving versions 6 and 7 of :mod:`tritonflow.runtime.fault_injection`'s model,
so every request is a real inference. Goal: switch under 1 s (every rollback: judged on the
maximum), zero failed requests (promotion and rollbacks). The last line is the standard JSON
object (:mod:`benchmarks.report`); its summary names the upstream. ``python -m benchmarks`` runs
``--triton --keepalive --retry-stale``, the real-Triton run.
Reference: a comparable production setup reports about 4.7 s from detection to switch.

Usage::

    .venv/bin/python benchmarks/rollback_time.py [--threads 4] [--rollbacks 5] [--keepalive] [--triton]

``--keepalive`` makes every client thread reuse one HTTP/1.1 connection (as tritonclient does);
the default opens a connection per request. On a graceful reload NGINX's old workers finish the
requests in flight but close idle kept-alive connections, so a client that writes on such a
connection at that instant sees a broken pipe although its request never reached NGINX;
``--retry-stale`` resends once on a fresh connection in that case (what HTTP client pools do for
requests that were not sent), which is how zero failed requests is reached with keep-alive.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ground.settings import Settings  # noqa: E402
from repository_sync.routing.gateway_probe import wait_live  # noqa: E402
from repository_sync.routing.nginx_router import NginxRouter  # noqa: E402
from repository_sync.routing.traffic_plan import TrafficPlan  # noqa: E402
from tritonflow.runtime.fault_injection import write_fault_model  # noqa: E402
from tritonflow.runtime.services import NginxGateway, TritonServer, free_port  # noqa: E402

MODEL = "bench_model"
CHAMPION, CHALLENGER = 6, 7
HEADER = "X-Tritonflow-Version"


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b'{"outputs": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args) -> None:
        pass


class Client:
    """``threads`` closed-loop senders; each record is (t_send, t_done, ok, version)."""

    def __init__(self, host: str, port: int, threads: int, keepalive: bool, retry_stale: bool = False) -> None:
        self.host, self.port, self.keepalive, self.retry_stale = host, port, keepalive, retry_stale
        self.retried = 0
        self.records: list[tuple[float, float, bool, str | None]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        conn = None
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
        while not self._stop.is_set():
            t0 = time.monotonic()
            ok, version = False, None
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                conn.request("POST", f"/v2/models/{MODEL}/infer", body=body,
                             headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                ok, version = resp.status == 200, resp.getheader(HEADER)
                if not ok:
                    self.errors.append(f"HTTP {resp.status}")
                if not self.keepalive:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                reused = conn is not None and self.keepalive
                if conn is not None:
                    conn.close()
                conn = None
                if reused and self.retry_stale and not isinstance(exc, TimeoutError):
                    # the gateway closed an idle kept-alive connection (old worker shutting down
                    # on reload) before reading our request: resend once on a fresh connection
                    self.retried += 1
                    try:
                        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                        conn.request("POST", f"/v2/models/{MODEL}/infer", body=body,
                                     headers={"Content-Type": "application/json"})
                        resp = conn.getresponse()
                        resp.read()
                        ok, version = resp.status == 200, resp.getheader(HEADER)
                    except (OSError, http.client.HTTPException) as exc2:
                        self.errors.append(f"{type(exc2).__name__}: {exc2} (after retry)")
                        conn.close()
                        conn = None
                else:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            with self._lock:
                self.records.append((t0, time.monotonic(), ok, version))

    def start(self) -> "Client":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def since(self, t: float) -> list[tuple[float, float, bool, str | None]]:
        with self._lock:
            return [r for r in self.records if r[0] >= t]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=4, help="client threads (closed loop)")
    ap.add_argument("--rollbacks", type=int, default=5, help="rollbacks to time")
    ap.add_argument("--bake", type=float, default=0.5, help="seconds per promotion step")
    ap.add_argument("--keepalive", action="store_true", help="reuse one connection per client thread")
    ap.add_argument("--retry-stale", action="store_true",
                    help="with --keepalive: resend once when a reused connection was closed by the gateway")
    ap.add_argument("--triton", action="store_true", help="a real Triton upstream instead of the stand-in")
    args = ap.parse_args()

    upstream = triton = None
    with tempfile.TemporaryDirectory(prefix="tritonflow-bench-") as tmp:
        settings = Settings.from_env({}, home=Path(tmp), gateway_port=free_port(), triton_http_port=free_port(),
                                     triton_grpc_port=free_port(), triton_metrics_port=free_port())
        if args.triton:
            write_fault_model(Path(tmp) / "repo", MODEL, (CHAMPION, CHALLENGER), instances=2)
            triton = TritonServer(settings, repository=str(Path(tmp) / "repo")).start()
            import tritonclient.http as httpclient

            httpclient.InferenceServerClient(triton.http_url).load_model(MODEL)
            upstream_addr = triton.http_url
        else:
            upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
            upstream.daemon_threads = True
            threading.Thread(target=upstream.serve_forever, daemon=True).start()
            upstream_addr = f"127.0.0.1:{upstream.server_address[1]}"
        gateway = NginxGateway(settings, triton_http=upstream_addr).start()
        try:
            router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd(), response_header=HEADER)
            wait_live(gateway.url, router.apply(TrafficPlan.single(MODEL, CHAMPION)))
            client = Client(settings.host, settings.gateway_port, args.threads, args.keepalive,
                            args.retry_stale).start()
            try:
                # ---- full promotion
                t_start = time.monotonic()
                for percent in (5, 25, 50, 100):
                    router.apply(TrafficPlan.canary(MODEL, CHAMPION, CHALLENGER, percent))
                    time.sleep(args.bake)
                promo = client.since(t_start)
                promo_failed = sum(1 for r in promo if not r[2])

                # ---- rollbacks
                switch_s, apply_s, rb_failed, rb_total = [], [], 0, 0
                for _ in range(args.rollbacks):
                    wait_live(gateway.url, router.apply(TrafficPlan.canary(MODEL, CHAMPION, CHALLENGER, 50)))
                    time.sleep(0.3)
                    decided = time.monotonic()
                    router.rollback(MODEL, CHAMPION)
                    applied = time.monotonic()
                    time.sleep(1.5)
                    recs = client.since(decided)
                    stale = [r[0] for r in recs if r[2] and r[3] != str(CHAMPION)]
                    switch_s.append((max(stale) - decided) if stale else 0.0)
                    apply_s.append(applied - decided)
                    rb_failed += sum(1 for r in recs if not r[2])
                    rb_total += len(recs)
            finally:
                client.stop()
        finally:
            gateway.stop()
            if upstream is not None:
                upstream.shutdown()
            if triton is not None:
                triton.stop()

    figures = {
        "upstream": "triton" if args.triton else "stand-in",
        "client": {"threads": args.threads, "keepalive": args.keepalive,
                   "retry_stale": args.retry_stale, "retried": client.retried},
        "promotion": {"requests": len(promo), "failed": promo_failed},
        "rollback": {
            "runs": args.rollbacks,
            "switch_s_median": statistics.median(switch_s),
            "switch_s_max": max(switch_s),
            "router_apply_s_median": statistics.median(apply_s),
            "requests": rb_total,
            "failed": rb_failed,
        },
        "errors_sample": client.errors[:5],
    }
    print(f"promotion 5->25->50->100 %: {len(promo)} requests, {promo_failed} failed")
    print(f"rollback x{args.rollbacks}: decision -> all on champion median "
          f"{figures['rollback']['switch_s_median'] * 1000:.0f} ms, "
          f"max {figures['rollback']['switch_s_max'] * 1000:.0f} ms (router apply median "
          f"{figures['rollback']['router_apply_s_median'] * 1000:.0f} ms); {rb_total} requests, {rb_failed} failed")
    _finish(args, figures)
    return 0


def _finish(args, figures: dict) -> None:
    """The standard last line: the slowest rollback and the failed requests against the goals."""
    from report import at_most, equals, finish

    rb = figures["rollback"]
    upstream = ("a real Triton 2.51 upstream (every request a real inference)" if args.triton
                else "a Python stand-in upstream that answers 200 (gateway and router only, no inference)")
    finish("rollback_time",
           f"Decision to every request on the champion through real NGINX with {upstream}, {args.threads} "
           f"{'keep-alive' if args.keepalive else 'connection-per-request'} clients, a promotion and "
           f"{args.rollbacks} rollbacks, against 4.7 s detection-to-switch in a comparable production setup.",
           {"switch_s": at_most(rb["switch_s_max"], 1, "s (every rollback)", inclusive=False,
                                measured_as={"max": round(rb["switch_s_max"], 3),
                                             "median": round(rb["switch_s_median"], 3)}),
            "failed_requests": equals(figures["promotion"]["failed"] + rb["failed"], 0)},
           **figures)


if __name__ == "__main__":
    raise SystemExit(main())
