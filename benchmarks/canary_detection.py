"""Canary detection time and the mirror's cost, against the real NGINX gateway and a real Triton.

Services: Triton 2.51 (``TritonServer``, explicit model control) serving
:mod:`tritonflow.runtime.fault_injection`'s model (version ``v`` answers ``x * v``; a version can be
switched at run time to raise errors or answer NaN), and NGINX (``NginxGateway``) in front of it,
routed by :class:`repository_sync.routing.nginx_router.NginxRouter`. A steady client (``--threads`` keep-alive
HTTP/1.1 connections, paced to ``--rps`` requests per second in total) sends requests through the
gateway and writes what it got to the inference log (flushed every ``--flush`` s, as a serving
client's logger does); the canary reads Triton's metrics, the gateway's status log and that log
(:func:`tritonflow.pipelines.canary_observe.observer`), exactly as ``canary_promotion`` does.

1. **Detection to switch.** For each failure mode (``error``: the challenger fails its requests;
   ``nan``: it answers NaN; ``returned``: it returns error responses, which Triton counts as
   successes and only the gateway's status log shows, :mod:`repository_sync.routing.gateway_status`) a
   canary starts with the default policy's bake and analysis interval (a 300 s bake, analyses
   every 5 s) on two steps, ``--percent`` % then 100 %, and the challenger breaks in the first step, ``--offsets``
   seconds after its second analysis (10 s into the step: early in an analysis interval is the
   worst case, the fault then waits almost a whole interval). Measured from the client's records:
   from the first bad response (a failure naming the challenger, or a NaN) to the send time of the
   last request the challenger served (after it, 100 % of the traffic is on the champion), and the
   failed requests that did not go to the challenger (failures not naming it, and connection errors
   after one resend on a fresh connection: what HTTP client pools do for a request a closing
   keep-alive connection never read).
2. **Mirror cost.** The client's p99 latency with the champion alone, and with a
   :class:`~repository_sync.routing.traffic_plan.Mirror` of ``settings.shadow_mirror_percent`` % (and of 100 %)
   of its requests to the challenger through a :class:`~repository_sync.routing.mirror.MirrorRecorder`,
   in alternating phases of ``--phase`` seconds (A B, B A, A B ...), so drift of the shared
   machine affects both sides alike; the figure is the median over the ``--reps`` adjacent pairs
   of (p99 with - p99 without), the pooled p99s are reported beside it.

Goals: detection to switch <= 5 s with a 300 s bake, judged per failure mode on its worst run
(the maximum over ``--offsets``); 0 failed requests that did not go to the failing challenger;
the mirror adds < 1 ms to the client p99 (the median over the phase pairs, reported with the
pairs' range). Reference: a comparable production setup switches back 4.7 s after detection.

Usage::

    .venv/bin/python benchmarks/canary_detection.py [--rps 120] [--threads 4] [--phase 15]

The last line printed is the standard JSON object (:mod:`benchmarks.report`) with the figures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from drift_checks.inference_log import InferenceLogWriter, LogSchema  # noqa: E402
from ground.settings import Settings  # noqa: E402
from repository_sync.canary.metrics import metrics_scraper  # noqa: E402
from repository_sync.canary.policy import CanaryPolicy  # noqa: E402
from repository_sync.canary.runner import run_canary  # noqa: E402
from repository_sync.routing.gateway_probe import wait_live  # noqa: E402
from repository_sync.routing.gateway_status import STATUS_LOG_NAME, GatewayStatusLog  # noqa: E402
from repository_sync.routing.mirror import MirrorRecorder  # noqa: E402
from repository_sync.routing.nginx_router import NginxRouter  # noqa: E402
from repository_sync.routing.traffic_plan import Mirror, TrafficPlan  # noqa: E402
from tritonflow.pipelines.canary_observe import observer  # noqa: E402
from tritonflow.runtime.fault_injection import set_mode, write_fault_model  # noqa: E402
from tritonflow.runtime.services import NginxGateway, TritonServer, free_port  # noqa: E402

MODEL = "detect_model"
CHAMPION, CHALLENGER = 1, 2
HEADER = "X-Tritonflow-Version"


class Client:
    """Paced keep-alive senders; each record: (t_send, t_done, ok, version, y, error)."""

    def __init__(self, host: str, port: int, threads: int, rps: float, log_root: str | None,
                 flush_s: float = 0.5):
        self.host, self.port, self.period = host, port, threads / rps
        self.records: list[tuple] = []
        self.resent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        self.writer = (InferenceLogWriter(log_root, MODEL, LogSchema({"x": "float"}, {"prediction": "float"}))
                       if log_root else None)
        self._pending: list[dict] = []
        self.flush_s = flush_s
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True) if self.writer else None

    def _send(self, conn, body, rid):
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=body,
                     headers={"Content-Type": "application/json", "X-Request-Id": rid})
        resp = conn.getresponse()
        return resp.status, resp.getheader(HEADER), resp.read()

    def _run(self, i: int) -> None:
        conn = None
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.5]}]})
        nxt = time.monotonic() + i * self.period / len(self._threads)
        while not self._stop.is_set():
            time.sleep(max(0.0, nxt - time.monotonic()))
            nxt += self.period
            rid = uuid.uuid4().hex
            t0 = time.time()
            status, version, data, error = 0, None, b"", ""
            for _attempt in range(2):
                fresh = conn is None
                try:
                    conn = conn or http.client.HTTPConnection(self.host, self.port, timeout=30)
                    status, version, data = self._send(conn, body, rid)
                    break
                except (OSError, http.client.HTTPException) as exc:
                    if conn is not None:
                        conn.close()
                    conn = None
                    error = f"{type(exc).__name__}: {exc}"
                    if fresh or isinstance(exc, TimeoutError):
                        break
                    self.resent += 1  # the gateway closed an idle kept-alive connection: resend once
            t1 = time.time()
            y = None
            if status == 200:
                y = json.loads(data)["outputs"][0]["data"][0]
                y = float("nan") if y is None else float(y)
                error = ""
            elif status:
                error = data[:200].decode("utf-8", "replace")
            rec = (t0, t1, status == 200, int(version) if version else None, y, error)
            with self._lock:
                self.records.append(rec)
                if self.writer is not None and status == 200:
                    self._pending.append({"request_id": rid, "timestamp": pd.Timestamp(t1, unit="s", tz="UTC"),
                                          "model_version": rec[3], "x": 1.5, "prediction": y})

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            time.sleep(self.flush_s)
            self.flush()

    def flush(self) -> None:
        with self._lock:
            rows, self._pending = self._pending, []
        if rows:
            self.writer.write(pd.DataFrame(rows))

    def start(self) -> "Client":
        for t in self._threads:
            t.start()
        if self._flusher:
            self._flusher.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        if self.writer:
            self.flush()

    def between(self, a: float, b: float) -> list[tuple]:
        with self._lock:
            return [r for r in self.records if a <= r[0] < b]


def p99(latencies_ms: list[float]) -> float:
    return float(np.percentile(latencies_ms, 99)) if latencies_ms else float("nan")


def detection_run(mode: str, args, router, gateway, triton, client_log: str, mode_dir, tc) -> dict:
    """One canary whose challenger breaks ``args.break_after`` s into its first step."""
    set_mode(mode_dir, CHALLENGER, "ok")
    tc.load_model(MODEL, config=json.dumps(_only((CHAMPION, CHALLENGER), mode_dir)))  # both loaded
    plan = TrafficPlan.single(MODEL, CHAMPION)
    router.apply(plan)
    wait_live(gateway.url, plan)
    host, port = gateway.url.split("://")[1].split(":")
    client = Client(host, int(port), args.threads, args.rps, client_log).start()
    policy = CanaryPolicy(steps=(args.percent, 100), min_requests=100)
    broke: list[float] = []

    def apply(p):
        router.apply(p)
        wait_live(gateway.url, p)

    def sleep(seconds):
        # the canary's own sleep; the challenger breaks once, mid-step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not broke and analyses and time.time() - analyses[0].window_start >= args.break_after:
                set_mode(mode_dir, CHALLENGER, mode)
                broke.append(time.time())
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    analyses: list = []
    statuses = GatewayStatusLog(router.status_log)
    started = time.time()
    try:
        result = run_canary(model=MODEL, champion=CHAMPION, challenger=CHALLENGER, policy=policy,
                            apply_plan=apply, scrape_metrics=metrics_scraper(triton.metrics_url),
                            unload_challenger=lambda: tc.load_model(
                                MODEL, config=json.dumps(_only((CHAMPION,), mode_dir))),
                            observe=observer(client_log, MODEL, prediction_columns=["prediction"]),
                            sleep=sleep, on_analysis=analyses.append,
                            gateway_statuses=lambda a, b: statuses.counts(MODEL, a, b))
        time.sleep(2.0)
    finally:
        client.stop()
    recs = client.between(started, time.time())

    def challengers(r):
        return r[3] == CHALLENGER or f"version {CHALLENGER} injected" in r[5]

    bad = [r for r in recs if challengers(r) and (not r[2] or (r[4] is not None and math.isnan(r[4])))]
    to_challenger = [r for r in recs if challengers(r)]
    first_bad = min(r[1] for r in bad) if bad else None
    last_challenger = max(r[0] for r in to_challenger) if to_challenger else None
    champion_failed = [r for r in recs if not r[2] and not challengers(r)]
    return {
        "outcome": result.outcome,
        "reason": result.reason[:200],
        "analyses": len(analyses),
        "broken_after_s": round(broke[0] - analyses[0].window_start, 2) if broke else None,
        "detection_to_switch_s": (round(last_challenger - first_bad, 3)
                                  if first_bad is not None and last_challenger is not None else None),
        "first_bad_to_rollback_decision_s": (round(result.rollback.decided_at - first_bad, 3)
                                             if result.rollback and first_bad else None),
        "requests": len(recs),
        "rps": round(len(recs) / max(1e-9, recs[-1][0] - recs[0][0]), 1) if recs else 0.0,
        "challenger_bad_responses": len(bad),
        "failed_champion_requests": len(champion_failed),
        "failed_champion_sample": [r[5] for r in champion_failed[:3]],
        "resent_on_stale_connection": client.resent,
    }


def _only(versions, mode_dir) -> dict:
    """The model's config with exactly ``versions`` loaded (a version-policy override)."""
    return {"name": MODEL, "backend": "python", "max_batch_size": 0,
            "version_policy": {"specific": {"versions": list(versions)}},
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}],
            "instance_group": [{"kind": "KIND_CPU", "count": 2}],
            "parameters": {"mode_dir": {"string_value": str(mode_dir)}}}


def mirror_run(args, router, gateway, triton, settings, tc, mode_dir) -> dict:
    """Client p99 without and with the mirror, alternating phases."""
    set_mode(mode_dir, CHALLENGER, "ok")
    tc.load_model(MODEL, config=json.dumps(_only((CHAMPION, CHALLENGER), mode_dir)))
    host, port = gateway.url.split("://")[1].split(":")
    out: dict = {}
    for percent in (settings.shadow_mirror_percent, 100):
        lat = {"off": [], "on": []}
        pairs: list[float] = []
        with MirrorRecorder(triton.http_url, MODEL, CHALLENGER) as rec:
            plans = {"off": TrafficPlan.single(MODEL, CHAMPION),
                     "on": TrafficPlan.single(MODEL, CHAMPION, mirror=Mirror(CHALLENGER, percent, rec.address))}
            for rep in range(args.reps):
                phase = {}
                for side in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                    router.apply(plans[side])
                    wait_live(gateway.url, plans[side])
                    time.sleep(1.0)  # let the reload's old worker go
                    client = Client(host, int(port), args.threads, args.rps, None).start()
                    time.sleep(args.phase)
                    client.stop()
                    phase[side] = [(r[1] - r[0]) * 1000.0 for r in client.records if r[2]]
                    lat[side] += phase[side]
                pairs.append(p99(phase["on"]) - p99(phase["off"]))
            counters = rec.counters()
        out[str(percent)] = {
            "p99_ms_without": round(p99(lat["off"]), 3), "p99_ms_with": round(p99(lat["on"]), 3),
            "p50_ms_without": round(statistics.median(lat["off"]), 3),
            "p50_ms_with": round(statistics.median(lat["on"]), 3),
            "p99_added_ms": round(statistics.median(pairs), 3),
            "p99_added_ms_pooled": round(p99(lat["on"]) - p99(lat["off"]), 3),
            "p99_added_ms_per_pair": [round(x, 3) for x in pairs],
            "requests": {"without": len(lat["off"]), "with": len(lat["on"])},
            "mirrored": counters,
        }
    router.apply(TrafficPlan.single(MODEL, CHAMPION))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rps", type=float, default=120.0, help="requests per second, all threads")
    ap.add_argument("--threads", type=int, default=4, help="keep-alive client connections")
    ap.add_argument("--percent", type=int, default=25, help="challenger percent of the first step")
    ap.add_argument("--offsets", default="0.3,2.5,4.7",
                    help="seconds after the step's 10 s mark the challenger breaks (one canary each)")
    ap.add_argument("--phase", type=float, default=10.0, help="seconds per mirror on/off phase")
    ap.add_argument("--reps", type=int, default=8, help="mirror on/off phase pairs")
    ap.add_argument("--skip-mirror", action="store_true", help="only the detection runs")
    ap.add_argument("--skip-detection", action="store_true", help="only the mirror cost")
    ap.add_argument("--modes", default="error,nan,returned", help="failure modes of the detection runs")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="tritonflow-canary-bench-") as tmp:
        home = Path(tmp)
        settings = Settings.from_env({}, home=home, triton_http_port=free_port(), triton_grpc_port=free_port(),
                                     triton_metrics_port=free_port(), gateway_port=free_port())
        mode_dir = write_fault_model(home / "repo", MODEL, (CHAMPION, CHALLENGER), instances=2)
        triton = TritonServer(settings, repository=str(home / "repo")).start()
        gateway = None
        try:
            import tritonclient.http as httpclient

            tc = httpclient.InferenceServerClient(triton.http_url)
            tc.load_model(MODEL)
            gateway = NginxGateway(settings, triton_http=triton.http_url).start()
            router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd(), response_header=HEADER,
                                                status_log=home / STATUS_LOG_NAME)
            detection: dict[str, list[dict]] = {}
            for mode in () if args.skip_detection else args.modes.split(","):
                for k, offset in enumerate(float(x) for x in args.offsets.split(",")):
                    args.break_after = 10.0 + offset
                    run = detection_run(mode, args, router, gateway, triton,
                                        str(home / f"log-{mode}-{k}"), mode_dir, tc)
                    detection.setdefault(mode, []).append(run)
                    print(f"{mode} +{offset:g} s: {json.dumps(run)}", flush=True)
            mirror = {} if args.skip_mirror else mirror_run(args, router, gateway, triton, settings, tc, mode_dir)
            if mirror:
                print(f"mirror: {json.dumps(mirror)}", flush=True)
        finally:
            if gateway is not None:
                gateway.stop()
            triton.stop()

    default_pct = str(settings.shadow_mirror_percent)
    def stat(mode, key, fn):  # noqa: ANN001
        values = [r[key] for r in detection[mode] if r[key] is not None]
        return round(fn(values), 3) if values else None

    figures = {
        "detection_to_switch_s": {m: stat(m, "detection_to_switch_s", statistics.median) for m in detection},
        "detection_to_switch_s_max": {m: stat(m, "detection_to_switch_s", max) for m in detection},
        "first_bad_to_rollback_decision_s": {m: stat(m, "first_bad_to_rollback_decision_s", statistics.median)
                                             for m in detection},
        "runs_per_mode": len(args.offsets.split(",")),
        "failed_champion_requests": sum(r["failed_champion_requests"] for runs in detection.values() for r in runs),
        "mirror_p99_added_ms": mirror.get(default_pct, {}).get("p99_added_ms"),
        "mirror_percent": int(default_pct),
        "mirror_p99_added_ms_at_100_percent": mirror.get("100", {}).get("p99_added_ms"),
        "outcomes": {m: sorted({r["outcome"] for r in runs}) for m, runs in detection.items()},
        "client": {"rps": args.rps, "threads": args.threads, "keepalive": True,
                   "measured_rps": {m: min(r["rps"] for r in runs) for m, runs in detection.items()}},
        "policy": {"bake_s": CanaryPolicy().bake_s, "analysis_interval_s": CanaryPolicy().analysis_interval_s,
                   "first_step_percent": args.percent},
        "mirror": mirror,
    }
    _finish(args, detection, figures)
    return 0


def _finish(args, detection: dict[str, list[dict]], figures: dict) -> None:
    """The standard last line: a verdict per failure mode on its worst run, failed requests, mirror cost."""
    from report import at_most, equals, finish, not_measured

    goals: dict = {}
    for mode in args.modes.split(",") if not args.skip_detection else ():
        runs = detection.get(mode, [])
        values = [r["detection_to_switch_s"] for r in runs]
        worst = max(values) if values and None not in values else None  # a run without a switch misses it
        goals[f"detection_to_switch_s_{mode}"] = at_most(
            worst, 5, "s (worst run)",
            measured_as={"max": worst, "median": figures["detection_to_switch_s"].get(mode), "runs": values})
    goals["failed_champion_requests"] = (not_measured("== 0") if args.skip_detection
                                         else equals(figures["failed_champion_requests"], 0))
    pairs = (figures["mirror"].get(str(figures["mirror_percent"])) or {}).get("p99_added_ms_per_pair") or []
    added = figures["mirror_p99_added_ms"]
    goals["mirror_p99_added_ms"] = not_measured("< 1 ms") if args.skip_mirror else at_most(
        added, 1, "ms", inclusive=False,
        measured_as={"median": added, "pairs_min": min(pairs, default=None), "pairs_max": max(pairs, default=None)})
    figures["mirror_pairs_spread_exceeds_goal"] = bool(pairs) and (max(pairs) - min(pairs)) / 2 >= 1.0
    finish("canary_detection",
           f"Canary on real Triton + NGINX at {args.rps:g} rps keep-alive, the challenger broken mid-step "
           f"({', '.join(args.modes.split(','))}; {len(args.offsets.split(','))} fault times each): first bad "
           f"response to 100 % on the champion, against 4.7 s after detection in a comparable production setup; "
           f"and the client p99 with the {figures['mirror_percent']} % live-shadow mirror against none, "
           f"{args.reps} alternating phase pairs.",
           goals, **figures)


if __name__ == "__main__":
    raise SystemExit(main())
