"""Live shadow through the gateway: NGINX ``mirror`` to the recorder, which forwards to the
challenger on a real Triton; clients only ever get the champion's answers.

Real services: Triton (``triton_factory``), NGINX (``gateway_factory``) and the aiohttp recorder
(:class:`repository_sync.routing.mirror.MirrorRecorder`). The model is the Python-backend model of
``test_canary.py`` (version ``v`` answers ``x * v``), so whose answer is whose is visible.
"""

from __future__ import annotations

import http.client
import json
import time
import uuid

import numpy as np
import pytest

from ground.exceptions import TrafficPlanError
from repository_sync.routing.gateway_probe import wait_live
from repository_sync.routing.mirror import MirrorRecorder, output_columns
from repository_sync.routing.nginx_router import NginxRouter
from repository_sync.routing.traffic_plan import Mirror, TrafficPlan
from tests.repository_sync.test_canary import served  # noqa: F401 -- the fixture


def post(conn: http.client.HTTPConnection, value: float, rid: str | None):
    body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [value]}]})
    headers = {"Content-Type": "application/json"}
    if rid:
        headers["X-Request-Id"] = rid
    conn.request("POST", "/v2/models/canary_model/infer", body=body, headers=headers)
    resp = conn.getresponse()
    data = json.loads(resp.read())
    return resp.status, resp.getheader("X-Tritonflow-Version"), resp.getheader("X-Request-Id"), data


def wait_for(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# ------------------------------------------------------------------------------ plan validation
def test_mirror_plans_are_validated_before_anything_is_written():
    ok = TrafficPlan.single("m", 6, mirror=Mirror(7, 10, "127.0.0.1:9000"))
    assert ok.to_dict()["mirror"] == {"version": 7, "percent": 10, "target": "127.0.0.1:9000"}
    assert TrafficPlan.from_mapping(ok.to_dict()) == ok
    assert ok.digest != TrafficPlan.single("m", 6).digest  # wait_live waits for the mirror too
    for mirror, phrase in [(Mirror(7, 0, "h:1"), "percent"), (Mirror(7, 101, "h:1"), "percent"),
                           (Mirror(6, 10, "h:1"), "is the champion itself"),
                           (Mirror(7, 10, "h; evil"), "host:port"), (Mirror(7, 2.5, "h:1"), "percent")]:
        with pytest.raises(TrafficPlanError, match=phrase):
            TrafficPlan.single("m", 6, mirror=mirror)


def test_plans_without_a_mirror_render_as_before(tmp_path):
    router = NginxRouter(tmp_path, reload=lambda: None)
    _, loc = router.render(TrafficPlan.canary("m", 6, 7, 25))
    assert b"mirror" not in loc and loc.count(b"location") == 1


def test_outputs_become_one_column_per_value():
    rows = output_columns({"probabilities": np.array([[0.2, 0.8], [0.6, 0.4]], dtype=np.float32),
                           "label": np.array([1, 0])})
    assert rows == [{"probabilities_0": pytest.approx(0.2), "probabilities_1": pytest.approx(0.8), "label": 1.0},
                    {"probabilities_0": pytest.approx(0.6), "probabilities_1": pytest.approx(0.4), "label": 0.0}]


# ------------------------------------------------------------------------------ real gateway and Triton
@pytest.mark.integration
def test_mirrored_answers_never_reach_clients_and_are_recorded_with_the_request_id(served):  # noqa: F811
    with MirrorRecorder(served.triton.http_url, "canary_model", 2) as recorder:
        plan = TrafficPlan.single("canary_model", 1, mirror=Mirror(2, 100, recorder.address))
        served.router.apply(plan)
        wait_live(served.gateway.url, plan)
        host, port = served.gateway.url.split("://")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        sent = {}
        for i in range(30):
            rid = None if i % 10 == 0 else uuid.uuid4().hex  # some clients send no request id
            status, version, echoed, data = post(conn, float(i + 1), rid)
            assert status == 200 and version == "1"
            assert data["outputs"][0]["data"] == [float(i + 1)]  # the champion's answer (x * 1)
            assert echoed and (rid is None or echoed == rid)  # the id the recorder sees
            sent[echoed] = float(i + 1)
        assert wait_for(lambda: recorder.counters()["forwarded"] >= 30)
        # back to a plan without mirror: nothing more is mirrored
        plain = TrafficPlan.single("canary_model", 1)
        served.router.apply(plain)
        wait_live(served.gateway.url, plain)
        conn.close()  # a reload closes idle kept-alive connections
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        for _ in range(5):
            post(conn, 1.0, uuid.uuid4().hex)
        conn.close()
        time.sleep(0.5)
    frame = recorder.records()
    assert recorder.counters() == {"received": 30, "forwarded": 30, "failed": 0, "dropped": 0}
    assert set(frame["request_id"]) == set(sent)
    for rid, value in sent.items():
        row = frame[frame["request_id"] == rid].iloc[0]
        assert row["Y"] == pytest.approx(2 * value)  # the challenger's answer, recorded only here
        assert row["served_version"] == "1" and row["status"] == 200


@pytest.mark.integration
def test_only_the_mirrored_share_of_champion_requests_is_copied(served):  # noqa: F811
    with MirrorRecorder(served.triton.http_url, "canary_model", 2) as recorder:
        plan = TrafficPlan.single("canary_model", 1, mirror=Mirror(2, 20, recorder.address))
        served.router.apply(plan)
        wait_live(served.gateway.url, plan)
        host, port = served.gateway.url.split("://")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        for _ in range(300):
            assert post(conn, 1.0, uuid.uuid4().hex)[1] == "1"
        conn.close()
        wait_for(lambda: recorder.counters()["forwarded"] == recorder.counters()["received"], 10)
    n = recorder.counters()["received"]
    assert 30 <= n <= 95, n  # 20 % of 300: binomial 60 +- 7, bounds at about 4 standard deviations
