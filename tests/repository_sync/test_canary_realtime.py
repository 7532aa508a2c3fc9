"""Continuous analysis against a real Triton and the real NGINX gateway: a challenger that starts
failing in the middle of a long bake is rolled back at the next analysis, not at the bake's end.

The challenger is :mod:`tritonflow.runtime.fault_injection`'s Python-backend model, switched to
errors (Triton counts failures) or NaN answers (Triton counts successes; the client's log shows
them) while a keep-alive client sends requests through the gateway and logs what it got.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import types

import pandas as pd
import pytest

from repository_sync.canary.checks import Observations
from repository_sync.canary.metrics import metrics_scraper
from repository_sync.canary.policy import CanaryPolicy
from repository_sync.canary.runner import run_canary
from repository_sync.routing.gateway_probe import wait_live
from repository_sync.routing.nginx_router import NginxRouter
from repository_sync.routing.traffic_plan import TrafficPlan
from tritonflow.runtime.fault_injection import set_mode, write_fault_model

pytestmark = pytest.mark.integration

MODEL = "faulty_model"


@pytest.fixture
def faulty(tmp_path, triton_factory, gateway_factory):
    import tritonclient.http as httpclient

    repo = tmp_path / "repo"
    mode_dir = write_fault_model(repo, MODEL)
    triton = triton_factory(str(repo))
    client = httpclient.InferenceServerClient(triton.http_url)
    client.load_model(MODEL)
    gateway = gateway_factory(triton)
    router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd())
    plan = router.apply(TrafficPlan.single(MODEL, 1))
    wait_live(gateway.url, plan)
    yield types.SimpleNamespace(triton=triton, client=client, gateway=gateway, router=router,
                                mode_dir=mode_dir)
    client.close()


class LoggingClient:
    """Keep-alive client through the gateway; keeps (time, version, status, Y) per request."""

    def __init__(self, gateway_url: str, pause_s: float = 0.01):
        host, port = gateway_url.split("://")[1].split(":")
        self.host, self.port, self.pause_s = host, int(port), pause_s
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)

    def _send(self, conn, body):
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("X-Tritonflow-Version"), resp.read()

    def _run(self):
        conn = None
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.5]}]})
        while not self._stop.is_set():
            for _attempt in range(2):  # a reload closes idle kept-alive connections: resend once
                try:
                    conn = conn or http.client.HTTPConnection(self.host, self.port, timeout=30)
                    status, version, data = self._send(conn, body)
                    break
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = None
                    status, version, data = 0, None, b""
            y = json.loads(data)["outputs"][0]["data"][0] if status == 200 else None
            self.rows.append({"t": time.time(), "model_version": int(version or 0), "status": status,
                              "prediction": float("nan") if y is None else float(y)})
            time.sleep(self.pause_s)

    def observe(self, start, end):
        frame = pd.DataFrame([r for r in list(self.rows) if start <= r["t"] < end and r["status"] == 200])
        if frame.empty:
            frame = pd.DataFrame({"model_version": [], "prediction": []})
        return Observations(frame[["model_version", "prediction"]], ("prediction",))


@pytest.mark.parametrize("mode,reason", [("error", "error rate"), ("nan", "non-finite")])
def test_challenger_failing_mid_bake_is_rolled_back_at_the_next_analysis(faulty, mode, reason):
    policy = CanaryPolicy(steps=(50, 100), bake_s=60, min_requests=10, hard_min_requests=10,
                          analysis_interval_s=1.0, max_mean_latency_ms=5000, max_latency_ratio=100)
    analyses = []
    broken_at: list[float] = []

    def on_analysis(a):
        analyses.append(a)
        if a.index == 3:  # healthy for a while, then the challenger breaks
            set_mode(faulty.mode_dir, 2, mode)
            broken_at.append(time.time())

    def apply(plan):
        faulty.router.apply(plan)
        wait_live(faulty.gateway.url, plan)

    def unload():
        faulty.client.load_model(MODEL, config=json.dumps({
            "name": MODEL, "backend": "python", "max_batch_size": 0,
            "version_policy": {"specific": {"versions": [1]}},
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}],
            "parameters": {"mode_dir": {"string_value": str(faulty.mode_dir)}}}))

    with LoggingClient(faulty.gateway.url) as traffic:
        result = run_canary(model=MODEL, champion=1, challenger=2, policy=policy, apply_plan=apply,
                            scrape_metrics=metrics_scraper(faulty.triton.metrics_url),
                            unload_challenger=unload, observe=traffic.observe, on_analysis=on_analysis)
        time.sleep(0.5)
    assert result.outcome == "rolled_back", result.reason
    last = analyses[-1]
    assert last.verdict == "fail" and last.hard and not last.final and reason in result.reason
    # rolled back a few analyses after the fault, far before the 60 s bake was over
    assert 3 < last.index <= 3 + 10 and last.step == 1
    after = [r for r in traffic.rows if r["t"] > result.rollback.actions[0][1] + 0.5]
    assert after and {r["model_version"] for r in after} == {1}
    assert all(r["status"] == 200 for r in traffic.rows if r["model_version"] == 1)
    assert faulty.client.is_model_ready(MODEL, "1") and not faulty.client.is_model_ready(MODEL, "2")
