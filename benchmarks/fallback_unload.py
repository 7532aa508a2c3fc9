"""Unload the champion while traffic flows: how many client requests fail with the fallback replica.

Real Triton 2.51 (explicit model control) behind the runtime's real NGINX gateway
(:class:`tritonflow.runtime.services.NginxGateway`), routed by :class:`NginxRouter` with
``fallback=True``. The served model is a scikit-learn MLP classifier converted with skl2onnx; its
fallback is the same model dynamically quantized to INT8 (:func:`tritonflow.pipelines.publish_fallback.quantize`),
gated with the fallback tolerances (:func:`tritonflow.pipelines.publish_fallback.gate`), both signed and pushed
with :func:`repository_sync.publish.publish_version` and loaded through
:class:`repository_sync.triton_client.TritonModelControl` (signature verified before each load).

A paced client (``--rps`` requests per second over ``--threads`` kept-alive connections, real
inference requests of one row) runs for ``--warm`` seconds on the champion, then the champion is
unloaded from Triton while traffic flows and the client runs ``--after`` more seconds; then the
champion is loaded again and the client runs ``--recover`` seconds. Goal: >= 100 rps,
0 failed client requests. Baseline: the same run with ``--no-fallback`` (the gateway without
the fallback route), where every request after the unload fails.

Usage::

    .venv/bin/python benchmarks/fallback_unload.py [--rps 150] [--threads 8] [--no-fallback]

Last line: the standard JSON object (:mod:`benchmarks.report`) with both goals and the figures
(``failed_requests``, ``fallback_share``, ``fallback_p99_ms``, ``champion_p99_ms``, ``achieved_rps``, ...).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ground.settings import Settings  # noqa: E402
from repository_sync.routing.gateway_probe import FALLBACK_HEADER, fallback_model_name, wait_live  # noqa: E402
from repository_sync.routing.nginx_router import NginxRouter  # noqa: E402
from repository_sync.routing.traffic_plan import TrafficPlan  # noqa: E402
from tritonflow.runtime.services import NginxGateway, TritonServer, free_port  # noqa: E402

MODEL, VERSION, FEATURES = "bench_fallback", 1, 16


def build_models(tmp: Path, settings: Settings) -> dict:
    """Train, convert, quantize, gate, sign and push the champion and its fallback."""
    from google.protobuf import text_format
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.neural_network import MLPClassifier
    from tritonclient.grpc import model_config_pb2 as pb

    from repository_sync.publish import publish_version
    from repository_sync.signing import generate_key_pair
    from tritonflow.pipelines.publish_fallback import fallback_config, gate, quantize

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, FEATURES)).astype(np.float32)
    y = (X[:, :4].sum(axis=1) + 0.5 * X[:, 4] * X[:, 5] > 0).astype(np.int64)
    clf = MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=300, random_state=0).fit(X, y)
    onx = convert_sklearn(clf, initial_types=[("float_input", FloatTensorType([None, FEATURES]))],
                          options={id(clf): {"zipmap": False}}, target_opset=17)
    fp32 = tmp / "model.onnx"
    fp32.write_bytes(onx.SerializeToString())
    int8 = tmp / "model.int8.onnx"
    ops = quantize(fp32, int8)
    sample = X[:256]
    expected = {"label": clf.predict(sample), "probabilities": clf.predict_proba(sample).astype(np.float32)}
    parity = gate(int8, {"float_input": sample}, expected, atol=settings.fallback_atol, rtol=settings.fallback_rtol,
                  min_label_agreement=settings.fallback_min_label_agreement, model_name=fallback_model_name(MODEL))

    cfg = pb.ModelConfig(name=MODEL, backend="onnxruntime", max_batch_size=16)
    cfg.input.add(name="float_input", data_type=pb.TYPE_FP32, dims=[FEATURES])
    cfg.output.add(name="label", data_type=pb.TYPE_INT64, dims=[1]).reshape.SetInParent()
    cfg.output.add(name="probabilities", data_type=pb.TYPE_FP32, dims=[2])
    cfg.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=1)
    config = text_format.MessageToString(cfg)

    keys = tmp / "keys"
    generate_key_pair(keys / "signing.pem", keys / "trusted" / "bench.pub")
    repo = tmp / "repo"
    for name, path, text in ((MODEL, fp32, config),
                             (fallback_model_name(MODEL), int8, fallback_config(config, fallback_model_name(MODEL)))):
        publish_version(repository=str(repo), model_name=name, version=VERSION, model_file=path, config=text,
                        private_key=keys / "signing.pem", trusted_keys=str(keys / "trusted"))
    return {"repo": repo, "trusted": str(keys / "trusted"), "row": X[1000].tolist(), "quantized_ops": ops,
            "bytes": {"fp32": fp32.stat().st_size, "int8": int8.stat().st_size},
            "parity": {k: {"max_abs_error": round(o["max_abs_error"], 5), "agreement": o["agreement"],
                           "passed": o["passed"]} for k, o in parity.outputs.items()}}


class PacedClient:
    """``threads`` senders on kept-alive connections sharing a global pace of ``rps`` requests/s.

    Each record: ``(t_send, latency_s, status or None, answered by)``. A connection the gateway
    closed while idle (old worker after a reload) is retried once on a fresh connection, as HTTP
    client pools do for requests that were never sent.
    """

    def __init__(self, host: str, port: int, rps: float, threads: int, row: list[float]) -> None:
        self.host, self.port, self.interval = host, port, 1.0 / rps
        self.body = json.dumps({"inputs": [{"name": "float_input", "shape": [1, FEATURES], "datatype": "FP32",
                                            "data": row}]})
        self.records: list[tuple[float, float, int | None, str]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._next = time.monotonic()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _slot(self) -> float:
        with self._lock:
            t = max(self._next, time.monotonic() - 0.05)
            self._next = t + self.interval
            return t

    def _send(self, conn: http.client.HTTPConnection) -> tuple[int, str]:
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=self.body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader(FALLBACK_HEADER) or MODEL

    def _run(self) -> None:
        conn = None
        while not self._stop.is_set():
            slot = self._slot()
            delay = slot - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t0 = time.monotonic()
            status, who = None, ""
            for attempt in (0, 1):
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                    status, who = self._send(conn)
                    break
                except (OSError, http.client.HTTPException) as exc:
                    if conn is not None:
                        conn.close()
                    conn = None
                    if attempt or isinstance(exc, TimeoutError):
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                        break
            with self._lock:
                self.records.append((t0, time.monotonic() - t0, status, who))

    def start(self) -> "PacedClient":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def _p(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rps", type=float, default=150.0, help="target request rate (>= 100 for the goal)")
    ap.add_argument("--threads", type=int, default=8, help="client connections")
    ap.add_argument("--warm", type=float, default=5.0, help="seconds on the champion before the unload")
    ap.add_argument("--after", type=float, default=10.0, help="seconds of traffic after the unload")
    ap.add_argument("--recover", type=float, default=5.0, help="seconds after the champion is loaded again")
    ap.add_argument("--no-fallback", action="store_true", help="baseline: the gateway without the fallback route")
    args = ap.parse_args()

    from repository_sync.triton_client import TritonModelControl

    with tempfile.TemporaryDirectory(prefix="tritonflow-bench-fallback-") as tmp_name:
        tmp = Path(tmp_name)
        settings = Settings.from_env({}, home=tmp, gateway_port=free_port(), triton_http_port=free_port(),
                                     triton_grpc_port=free_port(), triton_metrics_port=free_port())
        built = build_models(tmp, settings)
        triton = TritonServer(settings, repository=str(built["repo"])).start()
        gateway = None
        try:
            ctl = TritonModelControl(triton.http_url, repository=str(built["repo"]), trusted_keys=built["trusted"])
            ctl.load(MODEL, VERSION)
            ctl.load(fallback_model_name(MODEL), VERSION)
            gateway = NginxGateway(settings, triton_http=triton.http_url).start()
            router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd(), fallback=not args.no_fallback,
                                                fallback_timeout_s=settings.fallback_timeout_s)
            wait_live(gateway.url, router.apply(TrafficPlan.single(MODEL, VERSION)))
            host, port = gateway.url.split("://")[1].rsplit(":", 1)
            client = PacedClient(host, int(port), args.rps, args.threads, built["row"]).start()
            time.sleep(args.warm)
            t_unload = time.monotonic()
            ctl.unload(MODEL)
            unload_s = time.monotonic() - t_unload
            time.sleep(args.after)
            t_reload = time.monotonic()
            ctl.load(MODEL, VERSION)
            reload_s = time.monotonic() - t_reload
            time.sleep(args.recover)
            client.stop()
            t_end = time.monotonic()
            ctl.close()
        finally:
            if gateway is not None:
                gateway.stop()
            triton.stop()

    recs = client.records
    start = min(r[0] for r in recs)
    failed = [r for r in recs if r[2] != 200]
    fb = [r for r in recs if r[2] == 200 and r[3] != MODEL]
    during = [r for r in recs if t_unload <= r[0] < t_reload]
    champion_lat = [r[1] for r in recs if r[2] == 200 and r[3] == MODEL]
    result = {
        "fallback_enabled": not args.no_fallback,
        "target_rps": args.rps,
        "achieved_rps": round(len(recs) / (t_end - start), 1),
        "requests": len(recs),
        "failed_requests": len(failed),
        "failed_statuses": sorted({str(r[2]) for r in failed}),
        "client_errors": client.errors[:5],
        "requests_while_champion_unloaded": len(during),
        "fallback_answers": len(fb),
        "fallback_share": round(len(fb) / len(recs), 4) if recs else 0.0,
        "fallback_share_while_unloaded": round(sum(1 for r in during if r[2] == 200 and r[3] != MODEL)
                                               / len(during), 4) if during else 0.0,
        "fallback_p50_ms": _p([r[1] for r in fb], 50),
        "fallback_p99_ms": _p([r[1] for r in fb], 99),
        "champion_p50_ms": _p(champion_lat, 50),
        "champion_p99_ms": _p(champion_lat, 99),
        "unload_call_s": round(unload_s, 3),
        "reload_call_s": round(reload_s, 3),
        "quantized_ops": built["quantized_ops"],
        "model_bytes": built["bytes"],
        "fallback_parity": built["parity"],
        "fallback_tolerance": {"atol": settings.fallback_atol, "rtol": settings.fallback_rtol,
                               "min_label_agreement": settings.fallback_min_label_agreement},
        "threads": args.threads,
        "phases_s": {"warm": args.warm, "after_unload": args.after, "after_reload": args.recover},
    }
    _finish(args, result)
    return 0


def _finish(args, result: dict) -> None:
    """The standard last line: achieved rate and failed requests against the goals."""
    from report import at_least, equals, finish

    baseline = ("baseline: --no-fallback, a separate run" if result["fallback_enabled"]
                else "this run is the --no-fallback baseline")
    finish("fallback_unload",
           f"Client requests through real NGINX + Triton at {args.rps:g} rps paced keep-alive while the champion "
           f"is unloaded for {args.after:g} s and loaded again, with the INT8 fallback route ({baseline}, where "
           f"every request after the unload fails).",
           {"achieved_rps": at_least(result["achieved_rps"], 100, "rps"),
            "failed_requests": equals(result["failed_requests"], 0)},
           **result)


if __name__ == "__main__":
    sys.exit(main())
