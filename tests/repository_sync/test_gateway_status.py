"""Per-version statuses counted at the gateway: the status-log reader, and the real NGINX in front
of a real Triton writing it, so a challenger whose model *returns* error responses (counted as
successes by Triton 2.51) is rolled back by the continuous canary analysis on its error rate.
"""

from __future__ import annotations

import http.client
import json
import os
import time

import pytest

from ground.exceptions import DataError, MetricsUnavailableError
from repository_sync.canary.analysis import analyse_step
from repository_sync.canary.metrics import metrics_scraper
from repository_sync.canary.policy import CanaryPolicy
from repository_sync.canary.runner import run_canary
from repository_sync.routing.gateway_probe import wait_live
from repository_sync.routing.gateway_status import GatewayStatusLog, StatusCounts, is_failure
from repository_sync.routing.nginx_router import NginxRouter
from repository_sync.routing.traffic_plan import TrafficPlan
from tests.repository_sync.test_canary import triton_metrics_text


def line(t, version, status=200, upstream="200", model="m", uri=None):
    uri = uri or f"/v2/models/{model}/versions/{version}/infer"
    return (json.dumps({"t": t, "model": model, "version": str(version), "status": status,
                        "upstream_status": upstream, "request_time": 0.001, "uri": uri}) + "\n").encode()


# ------------------------------------------------------------------------------- the failure rule
@pytest.mark.parametrize("status,upstream,failed", [
    (200, "200", False),
    (400, "400", True),       # Triton's answer to a returned model error / unknown version
    (404, "404", True),
    (500, "500", True),
    (502, "-", True),         # Triton unreachable
    (200, "500, 200", True),  # routed version failed, the fallback answered
    (499, "", False),         # the client went away before any answer
    (499, "400", True),
    ("", "200", True),
])
def test_failure_rule(status, upstream, failed):
    assert is_failure(status, upstream) is failed


# ------------------------------------------------------------------------------- the reader
def test_counts_per_version_in_the_window_only_inferences(tmp_path):
    path = tmp_path / "gw.jsonl"
    path.write_bytes(line(10.0, 1) + line(11.0, 2, 400, "400") + line(12.0, 2)
                     + line(12.5, 2, uri="/v2/models/m/versions/2/ready")   # a readiness call
                     + line(13.0, 1, model="other") + line(20.0, 2, 500, "500"))
    log = GatewayStatusLog(path)
    assert log.counts("m", 10.0, 20.0) == {1: StatusCounts(1, 0), 2: StatusCounts(2, 1)}
    assert log.counts("m", 11.0, 21.0) == {2: StatusCounts(3, 2)}
    assert log.counts("other", 0, 100) == {1: StatusCounts(1, 0)}


def test_unknown_version_is_counted_and_unrouted_lines_are_left_out(tmp_path):
    path = tmp_path / "gw.jsonl"
    path.write_bytes(line(1.0, 9, 400, "400") + line(1.5, "", 404, "-") + b"not json\n")
    log = GatewayStatusLog(path)
    assert log.counts("m", 0, 10) == {9: StatusCounts(1, 1)}
    assert log.bad_lines == 1


def test_partial_last_line_is_read_when_completed(tmp_path):
    path = tmp_path / "gw.jsonl"
    whole = line(2.0, 2, 500, "500")
    path.write_bytes(line(1.0, 2) + whole[:17])
    log = GatewayStatusLog(path)
    assert log.counts("m", 0, 10) == {2: StatusCounts(1, 0)}
    with open(path, "ab") as fh:
        fh.write(whole[17:])
    assert log.counts("m", 0, 10) == {2: StatusCounts(2, 1)}
    assert log.bad_lines == 0


def test_incremental_reads_do_not_count_a_line_twice(tmp_path):
    path = tmp_path / "gw.jsonl"
    path.write_bytes(line(1.0, 2))
    log = GatewayStatusLog(path)
    assert log.counts("m", 0, 10) == {2: StatusCounts(1, 0)}
    with open(path, "ab") as fh:
        fh.write(line(2.0, 2, 500, "500"))
    assert log.counts("m", 0, 10) == {2: StatusCounts(2, 1)}
    assert log.counts("m", 0, 10) == {2: StatusCounts(2, 1)}


def test_rotation_and_truncation_start_the_new_file_from_its_beginning(tmp_path):
    path = tmp_path / "gw.jsonl"
    path.write_bytes(line(1.0, 2) + line(2.0, 2))
    log = GatewayStatusLog(path)
    assert log.counts("m", 0, 100) == {2: StatusCounts(2, 0)}
    os.rename(path, tmp_path / "gw.jsonl.1")  # logrotate: a new file under the same name
    path.write_bytes(line(3.0, 2, 500, "500"))
    assert log.counts("m", 0, 100) == {2: StatusCounts(3, 1)}
    path.write_bytes(b"")  # copytruncate: same inode, shorter than the offset
    with open(path, "ab") as fh:
        fh.write(line(4.0, 2, 503, "503"))
    assert log.counts("m", 0, 100) == {2: StatusCounts(4, 2)}


def test_missing_file_says_where_it_looked(tmp_path):
    log = GatewayStatusLog(tmp_path / "absent.jsonl")
    assert not log.readable()
    with pytest.raises(MetricsUnavailableError, match="absent.jsonl"):
        log.counts("m", 0, 1)


# ------------------------------------------------------------------------------- the analysis
def test_gateway_failures_count_when_triton_saw_successes():
    policy = CanaryPolicy(steps=(50, 100), bake_s=60, min_requests=20, hard_min_requests=10)
    kw = dict(policy=policy, model="m", champion=1, challenger=2, step=1, percent=50, attempt=1,
              window_start=0.0, window_end=10.0, final=False,
              before_text=triton_metrics_text({"1": {"success": 0}, "2": {"success": 0}}, model="m"),
              after_text=triton_metrics_text({"1": {"success": 50}, "2": {"success": 50}}, model="m"))
    blind = analyse_step(**kw)
    assert blind.verdict == "continue" and blind.error_counts_source == "triton only"
    seen = analyse_step(**kw, gateway_counts={1: StatusCounts(50, 0), 2: StatusCounts(50, 40)})
    assert seen.verdict == "fail" and seen.hard and "error rate" in seen.reasons[0]
    assert (seen.triton_failures, seen.gateway_failures, seen.canary_failures) == (0, 40, 40)
    assert seen.error_counts_source == "max(triton, gateway)"
    missing = analyse_step(**kw, gateway_error="gateway status log unavailable: no such file")
    assert missing.verdict == "continue" and "no such file" in missing.error_counts_source


def test_router_refuses_a_status_log_path_nginx_would_misread(tmp_path):
    with pytest.raises(DataError, match="status_log"):
        NginxRouter(tmp_path, reload=["true"], status_log=str(tmp_path / "a b;.jsonl"))


# ------------------------------------------------------------------------------- real NGINX + Triton
MODEL = "faulty_model"


def _post(url, path, version_header=True):
    host, port = url.split("://")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.5]}]})
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("X-Tritonflow-Version"), data


@pytest.fixture
def served(tmp_path, triton_factory, gateway_factory):
    import tritonclient.http as httpclient

    from tritonflow.runtime.fault_injection import write_fault_model

    repo = tmp_path / "repo"
    mode_dir = write_fault_model(repo, MODEL)
    triton = triton_factory(str(repo))
    client = httpclient.InferenceServerClient(triton.http_url)
    client.load_model(MODEL)
    gateway = gateway_factory(triton)
    status_log = tmp_path / "gateway_access.jsonl"
    router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd(), status_log=status_log)
    yield dict(triton=triton, client=client, gateway=gateway, router=router, mode_dir=mode_dir,
               status_log=status_log)
    client.close()


@pytest.mark.integration
def test_returned_errors_and_unknown_versions_are_counted_at_the_gateway(served):
    from tritonflow.runtime.fault_injection import set_mode

    router, url = served["router"], served["gateway"].url
    set_mode(served["mode_dir"], 2, "returned")
    plan = router.apply(TrafficPlan.canary(MODEL, 1, 2, 50))
    wait_live(url, plan)
    scrape = metrics_scraper(served["triton"].metrics_url)
    start = time.time() - 0.05  # NGINX's $msec is its cached clock, at ms resolution
    got = [_post(url, f"/v2/models/{MODEL}/infer") for _ in range(40)]
    assert {v for _s, v, _d in got} == {"1", "2"}
    assert all(s == 200 for s, v, _d in got if v == "1")
    returned = {s for s, v, _d in got if v == "2"}
    assert returned == {500}  # Triton's answer to an error response a Python backend returned
    time.sleep(0.2)  # NGINX logs a request just after the client got its answer
    counts = GatewayStatusLog(served["status_log"]).counts(MODEL, start, time.time() + 1)
    n2 = sum(1 for _s, v, _d in got if v == "2")
    assert counts[1] == StatusCounts(40 - n2, 0) and counts[2] == StatusCounts(n2, n2)
    from repository_sync.canary.metrics import parse_triton_metrics

    triton_v2 = parse_triton_metrics(scrape())[(MODEL, "2")]
    assert triton_v2.failure == 0  # Triton 2.51 counts the returned errors as successes

    # a plan routing to a version Triton does not serve: the gateway counts its failures
    wait_live(url, router.apply(TrafficPlan.single(MODEL, 7)))
    start = time.time() - 0.05  # NGINX's $msec is its cached clock, at ms resolution
    statuses = [_post(url, f"/v2/models/{MODEL}/infer")[0] for _ in range(5)]
    assert statuses == [404] * 5  # Triton: unknown version
    time.sleep(0.2)  # NGINX logs a request just after the client got its answer
    counts = GatewayStatusLog(served["status_log"]).counts(MODEL, start, time.time() + 1)
    assert counts == {7: StatusCounts(5, 5)}


@pytest.mark.integration
def test_challenger_returning_errors_is_rolled_back_on_its_gateway_error_rate(served):
    from tritonflow.runtime.fault_injection import set_mode

    router, url = served["router"], served["gateway"].url
    policy = CanaryPolicy(steps=(50, 100), bake_s=60, min_requests=10, hard_min_requests=10,
                          analysis_interval_s=1.0, max_mean_latency_ms=5000, max_latency_ratio=100)
    statuses = GatewayStatusLog(served["status_log"])
    analyses = []

    def on_analysis(a):
        analyses.append(a)
        if a.index == 2:
            set_mode(served["mode_dir"], 2, "returned")

    def apply(plan):
        router.apply(plan)
        wait_live(url, plan)

    unloaded = []
    from tests.repository_sync.test_canary_realtime import LoggingClient

    with LoggingClient(url) as traffic:
        result = run_canary(model=MODEL, champion=1, challenger=2, policy=policy, apply_plan=apply,
                            scrape_metrics=metrics_scraper(served["triton"].metrics_url),
                            unload_challenger=lambda: unloaded.append(True), on_analysis=on_analysis,
                            gateway_statuses=lambda s, e: statuses.counts(MODEL, s, e))
    assert result.outcome == "rolled_back", result.reason
    last = analyses[-1]
    assert last.verdict == "fail" and last.hard and "error rate" in result.reason
    assert 2 < last.index <= 2 + 10 and last.step == 1
    assert last.triton_failures == 0 and last.gateway_failures and last.gateway_failures > 0
    assert last.error_counts_source == "max(triton, gateway)"
    assert unloaded and any(r["status"] >= 400 for r in traffic.rows if r["model_version"] == 2)


@pytest.mark.integration
def test_fallback_and_mirror_locations_log_too_and_formats_do_not_clash(served, tmp_path):
    from repository_sync.routing.traffic_plan import Mirror
    from tritonflow.runtime.fault_injection import set_mode

    gateway, url = served["gateway"], served["gateway"].url
    router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd(), fallback=True,
                                        status_log=served["status_log"])
    # a second routed model with a mirror: its own log_format, accepted by nginx -t
    router.apply(TrafficPlan.single("other_model", 1, mirror=Mirror(2, 100, "127.0.0.1:9")))
    set_mode(served["mode_dir"], 2, "error")  # raises: 500, retried on faulty_model__fallback
    wait_live(url, router.apply(TrafficPlan.single(MODEL, 2)))
    start = time.time() - 0.05
    got = [_post(url, f"/v2/models/{MODEL}/infer")[0] for _ in range(3)]
    assert all(s >= 400 for s in got)  # no fallback model is served: the retry fails too
    time.sleep(0.2)
    lines = [json.loads(x) for x in served["status_log"].read_text().splitlines()]
    infer = [x for x in lines if x["uri"].endswith("/infer") and x["t"] >= start]
    assert infer and all(x["upstream_status"].startswith("500") for x in infer)
    time.sleep(0.2)  # NGINX logs a request just after the client got its answer
    counts = GatewayStatusLog(served["status_log"]).counts(MODEL, start, time.time() + 1)
    assert counts == {2: StatusCounts(3, 3)}


# ------------------------------------------------------------------------------- where the canary reads it
@pytest.mark.parametrize("env,expected", [
    ({}, "conf/tritonflow-router/gateway_access.jsonl"),
    ({"TRITONFLOW_GATEWAY_ACCESS_LOG": "off"}, None),
    ({"TRITONFLOW_GATEWAY_RELOAD": "watcher"}, None),
    ({"TRITONFLOW_GATEWAY_RELOAD": "watcher", "TRITONFLOW_GATEWAY_ACCESS_LOG": "/shared/gw.jsonl"},
     "/shared/gw.jsonl"),
])
def test_canary_environment_status_log_follows_the_settings(tmp_path, env, expected):
    from ground.settings import Settings
    from tritonflow.pipelines.canary import _status_log
    from tritonflow.pipelines.canary_promotion import gateway_statuses

    settings = Settings.from_env(env, home=tmp_path)
    path, note = _status_log(settings, tmp_path / "conf")
    assert path == (None if expected is None else
                    str(tmp_path / expected) if not expected.startswith("/") else expected)
    if path is None:
        assert note
        statuses = gateway_statuses(type("Env", (), {"gateway_status_log": None, "gateway_status_note": note}), "m")
        with pytest.raises(MetricsUnavailableError, match="not counted at the gateway"):
            statuses(0.0, 1.0)
