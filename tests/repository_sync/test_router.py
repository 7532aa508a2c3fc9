"""Traffic router: plan validation and the NGINX router on a real NGINX.

The gateway is the runtime's real NGINX (``gateway_factory`` from ``tests/conftest.py``). Behind
it, instead of Triton, runs a tiny loopback HTTP server that echoes the path it was asked for, so
the tests can see the rewrite to ``/v2/models/<name>/versions/<v>/...`` and count which version
each request was routed to.
"""

from __future__ import annotations

import collections
import json
import threading
import time
import types
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from ground.exceptions import (
    DataError,
    GatewayConfigError,
    GatewayReloadError,
    TrafficPlanError,
)
from repository_sync.routing.gateway_probe import PLAN_HEADER, served_by, wait_live
from repository_sync.routing.nginx_router import NginxRouter
from repository_sync.routing.traffic_plan import Route, TrafficPlan
from tests.slow_upstream import SlowVersion

pytestmark = pytest.mark.integration

HEADER = "X-Tritonflow-Version"

#: Traffic-split plans (shared/cases inputs, canary_plans.yaml), rebuilt here.
TRAFFIC_SPLIT_PLANS_YAML = """
plans:
  - id: sums_to_95
    model: churn_model
    routes: [ {version: 6, weight: 90}, {version: 7, weight: 5} ]
  - id: sums_to_110
    model: churn_model
    routes: [ {version: 6, weight: 100}, {version: 7, weight: 10} ]
  - id: missing_weight
    model: churn_model
    routes: [ {version: 6}, {version: 7, weight: 100} ]
  - id: negative_weight
    model: churn_model
    routes: [ {version: 6, weight: 120}, {version: 7, weight: -20} ]
  - id: fractional_percent
    model: churn_model
    routes: [ {version: 6, weight: 99.5}, {version: 7, weight: 0.5} ]
  - id: ok
    model: churn_model
    routes: [ {version: 6, weight: 95}, {version: 7, weight: 5} ]
"""

#: The problem each invalid plan must be refused for (a phrase of the message).
INVALID_PLAN_PROBLEMS = {
    "sums_to_95": "sum to 95",
    "sums_to_110": "sum to 110",
    "missing_weight": "weight is missing",
    "negative_weight": "weight=-20 is negative",
    "fractional_percent": "weight=99.5 is not an integer percent",
}


def traffic_split_plans() -> dict[str, dict]:
    return {p["id"]: p for p in yaml.safe_load(TRAFFIC_SPLIT_PLANS_YAML)["plans"]}


# ------------------------------------------------------------------------------ echo upstream
#: Inferences of this version are answered 3 s late (a request in flight across a reload).
SLOW = SlowVersion()


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        SLOW.hold(self.path)
        body = json.dumps({"path": self.path, "method": self.command}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _reply
    do_POST = _reply

    def log_message(self, *args) -> None:  # keep test output clean
        pass


@pytest.fixture(scope="module")
def echo_upstream():
    """A loopback HTTP server standing in for Triton: answers every path with that path."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def gateway(gateway_factory, echo_upstream):
    """The runtime's real NGINX gateway in front of the echo upstream."""
    return gateway_factory(types.SimpleNamespace(http_url=echo_upstream))


@pytest.fixture
def router(gateway) -> NginxRouter:
    return NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd(), response_header=HEADER)


def request(url: str, *, method: str = "GET", headers: dict | None = None):
    """One request; returns (status, version header, upstream path)."""
    data = b'{"inputs": []}' if method == "POST" else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get(HEADER), json.loads(resp.read())["path"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get(HEADER), None


def config_bytes(router: NginxRouter, model: str) -> tuple[bytes | None, bytes | None]:
    out = []
    for path in router.config_files(model):
        out.append(path.read_bytes() if path.exists() else None)
    return tuple(out)


# ------------------------------------------------------------------------------ plan validation
@pytest.mark.parametrize("plan_id", sorted(INVALID_PLAN_PROBLEMS))
def test_invalid_traffic_split_plan_is_refused_naming_plan_model_and_problem(plan_id):
    raw = traffic_split_plans()[plan_id]
    with pytest.raises(TrafficPlanError) as exc:
        TrafficPlan.from_mapping(raw)
    message = str(exc.value)
    assert repr(plan_id) in message
    assert "'churn_model'" in message
    assert INVALID_PLAN_PROBLEMS[plan_id] in message


@pytest.mark.parametrize(
    "weight, phrase",
    [(12.5, "weight=12.5 is not an integer percent"), ("12", "weight='12' is not an integer percent"),
     (12.0, "weight=12.0 is not an integer percent"), (True, "weight=True is not an integer percent"),
     (101, "weight=101 is above 100")],
)
def test_non_integer_or_out_of_range_percent_is_refused_never_rounded(weight, phrase):
    with pytest.raises(TrafficPlanError, match=phrase.replace("(", r"\(").replace(".", r"\.")):
        TrafficPlan.from_weights("m", {1: weight, 2: 88})


def test_plan_problems_are_all_reported_at_once():
    with pytest.raises(TrafficPlanError) as exc:
        TrafficPlan(model="bad name!", routes=(Route(0, 50), Route(0, 60)), sticky_header="a b")
    msg = str(exc.value)
    assert "not a valid model name" in msg
    assert "version=0 is not a positive integer" in msg
    assert "sticky_header='a b'" in msg


def test_duplicate_version_and_unknown_champion_are_refused():
    with pytest.raises(TrafficPlanError, match="appears twice"):
        TrafficPlan(model="m", routes=(Route(3, 50), Route(3, 50)))
    with pytest.raises(TrafficPlanError, match="champion=9 is not one of the plan's versions"):
        TrafficPlan(model="m", routes=(Route(3, 50), Route(4, 50)), champion=9)


def test_valid_plan_round_trips_through_its_mapping():
    plan = TrafficPlan.from_mapping(traffic_split_plans()["ok"])
    assert plan.weights == {6: 95, 7: 5}
    assert plan.champion == 6
    again = TrafficPlan.from_mapping(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and again.digest == plan.digest
    assert TrafficPlan.canary("churn_model", 6, 7, 5).weights == {6: 95, 7: 5}


def test_canary_plan_with_fractional_step_is_refused():
    with pytest.raises(TrafficPlanError, match="weight=12.5 is not an integer percent"):
        TrafficPlan.canary("churn_model", 6, 7, 12.5)


# ------------------------------------------------------------------------------ real NGINX
def test_invalid_plans_leave_live_routing_byte_for_byte_unchanged_and_ok_is_applied(gateway, router):
    plans = traffic_split_plans()
    router.apply(TrafficPlan.single("churn_model", 6))
    before = config_bytes(router, "churn_model")
    wait_live(gateway.url, router.current_plan("churn_model"))
    for plan_id in INVALID_PLAN_PROBLEMS:
        with pytest.raises(TrafficPlanError, match=repr(plan_id)):
            router.apply(plans[plan_id])
        assert config_bytes(router, "churn_model") == before
        assert router.current_plan("churn_model").weights == {6: 100}
    # live routing after the refusals: everything still on version 6
    seen = {request(f"{gateway.url}/v2/models/churn_model/infer", method="POST")[1] for _ in range(20)}
    assert seen == {"6"}

    applied = router.apply(plans["ok"])
    assert applied.weights == {6: 95, 7: 5}
    assert router.current_plan("churn_model") == applied
    assert router.previous_plan("churn_model").weights == {6: 100}
    wait_live(gateway.url, applied)


def test_rewrite_sends_unversioned_routes_to_the_chosen_version(gateway, router):
    plan = router.apply(TrafficPlan.from_weights("churn_model", {6: 100, 7: 0}))
    wait_live(gateway.url, plan)
    base = f"{gateway.url}/v2/models/churn_model"
    assert request(base + "/infer", method="POST") == (200, "6", "/v2/models/churn_model/versions/6/infer")
    assert request(base + "/ready") == (200, "6", "/v2/models/churn_model/versions/6/ready")
    assert request(base) == (200, "6", "/v2/models/churn_model/versions/6")
    # explicit versions and Triton's other routes are untouched (default location /)
    assert request(base + "/versions/7/infer", method="POST") == (
        200, None, "/v2/models/churn_model/versions/7/infer")
    assert request(f"{gateway.url}/v2/health/ready") == (200, None, "/v2/health/ready")
    assert request(f"{gateway.url}/v2/models/other_model/infer", method="POST") == (
        200, None, "/v2/models/other_model/infer")
    # a model whose name starts with the routed one is not captured
    assert request(f"{gateway.url}/v2/models/churn_model2/infer", method="POST")[1] is None


def test_split_95_5_lands_roughly_right_over_200_requests(gateway, router):
    plan = router.apply(TrafficPlan.canary("churn_model", champion=6, challenger=7, percent=5))
    wait_live(gateway.url, plan)
    counts = collections.Counter()
    for _ in range(200):
        status, version, path = request(f"{gateway.url}/v2/models/churn_model/infer", method="POST")
        assert status == 200
        assert path == f"/v2/models/churn_model/versions/{version}/infer"
        counts[version] += 1
    assert set(counts) <= {"6", "7"}
    # Binomial(200, 0.05): P(X = 0) = 3.5e-5, P(X > 30) < 1e-9
    assert 1 <= counts["7"] <= 30
    assert counts["6"] == 200 - counts["7"]


def test_sticky_header_sends_the_same_key_to_the_same_version(gateway, router):
    plan = router.apply(
        TrafficPlan.from_weights("churn_model", {6: 50, 7: 50}, sticky_header="X-User-Id")
    )
    wait_live(gateway.url, plan)
    url = f"{gateway.url}/v2/models/churn_model/infer"
    by_key = {}
    for key in range(40):
        versions = {request(url, method="POST", headers={"X-User-Id": f"user-{key}"})[1] for _ in range(5)}
        assert len(versions) == 1, f"user-{key} was served by {versions}"
        by_key[key] = versions.pop()
    # 40 keys at 50/50: both versions are used (P(all one side) = 2 * 0.5**40)
    assert set(by_key.values()) == {"6", "7"}


def test_rollback_sends_everything_to_the_champion_and_keeps_the_previous_plan(gateway, router):
    router.apply(TrafficPlan.canary("churn_model", champion=6, challenger=7, percent=50))
    rolled = router.rollback("churn_model")
    assert rolled.weights == {6: 100}
    wait_live(gateway.url, rolled)
    seen = {request(f"{gateway.url}/v2/models/churn_model/infer", method="POST")[1] for _ in range(30)}
    assert seen == {"6"}
    assert router.previous_plan("churn_model").weights == {6: 50, 7: 50}
    restored = router.restore_previous("churn_model")
    assert restored.weights == {6: 50, 7: 50}
    wait_live(gateway.url, restored)


def test_rollback_without_a_live_plan_or_champion_is_refused(router):
    with pytest.raises(DataError, match="'churn_model'.*champion=None"):
        router.rollback("churn_model")


def test_failed_nginx_test_restores_the_files_and_routing_stays_up(gateway, router):
    live = router.apply(TrafficPlan.canary("churn_model", champion=6, challenger=7, percent=5))
    wait_live(gateway.url, live)
    before = config_bytes(router, "churn_model")
    # someone drops a broken snippet beside ours: the whole config no longer passes nginx -t
    (gateway.conf_dir / "http.d" / "zz-broken.conf").write_text("this is not nginx;\n")
    with pytest.raises(GatewayConfigError, match="(?s)'churn_model'.*restored byte for byte") as exc:
        router.apply(TrafficPlan.canary("churn_model", champion=6, challenger=7, percent=50))
    assert "unknown directive" in str(exc.value)
    assert config_bytes(router, "churn_model") == before
    assert router.current_plan("churn_model") == live
    # the gateway still serves with the live plan
    version, digest, status = served_by(gateway.url, "churn_model", response_header=HEADER)
    assert status == 200 and digest == live.digest and version in {"6", "7"}


def test_generated_config_refused_by_nginx_restores_files(gateway):
    bad = NginxRouter.from_nginx_cmd(
        gateway.conf_dir, gateway.nginx_cmd(), upstream="no_such_upstream.invalid"
    )
    good = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd())
    live = good.apply(TrafficPlan.single("churn_model", 6))
    before = config_bytes(good, "churn_model")
    with pytest.raises(GatewayConfigError, match="host not found"):
        bad.apply(TrafficPlan.single("churn_model", 7))
    assert config_bytes(good, "churn_model") == before
    wait_live(gateway.url, live)


def test_failed_reload_restores_the_previous_files_byte_for_byte(gateway):
    good = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd())
    good.apply(TrafficPlan.single("churn_model", 6))
    before = config_bytes(good, "churn_model")

    def broken_reload():
        raise OSError("signal not delivered")

    flaky = NginxRouter(gateway.conf_dir, reload=broken_reload, test=gateway.nginx_cmd("-t"))
    with pytest.raises(GatewayReloadError, match="signal not delivered"):
        flaky.apply(TrafficPlan.single("churn_model", 7))
    assert config_bytes(good, "churn_model") == before
    # a first plan for a model that fails to reload leaves no file behind either
    with pytest.raises(GatewayReloadError):
        flaky.apply(TrafficPlan.single("fraud_model", 1))
    assert config_bytes(good, "fraud_model") == (None, None)


def test_router_works_with_the_gateway_handle_reload(gateway):
    r = NginxRouter(gateway.conf_dir, reload=gateway.reload)
    plan = r.apply(TrafficPlan.single("churn_model", 3))
    wait_live(gateway.url, plan)
    assert request(f"{gateway.url}/v2/models/churn_model/ready")[1:] == (
        "3", "/v2/models/churn_model/versions/3/ready")
    r.remove("churn_model")
    assert r.current_plan("churn_model") is None
    assert r.models() == []


def test_the_gateway_reload_returns_once_the_requests_admitted_under_the_old_plan_are_answered(gateway):
    """A rollback unloads the challenger as soon as the reload returns: a request the old workers
    admitted must be answered by then, or it reaches a version that is gone."""
    r = NginxRouter(gateway.conf_dir, reload=gateway.reload)
    wait_live(gateway.url, r.apply(TrafficPlan.single("churn_model", SLOW.version)))
    SLOW.admitted.clear()
    answers: list = []
    client = threading.Thread(target=lambda: answers.append(
        request(f"{gateway.url}/v2/models/churn_model/infer", method="POST")))
    client.start()
    assert SLOW.admitted.wait(10), "the slow request never reached the upstream"
    r.apply(TrafficPlan.single("churn_model", 3))
    applied_at = time.monotonic()
    client.join(30)
    assert answers == [(200, str(SLOW.version), f"/v2/models/churn_model/versions/{SLOW.version}/infer")]
    assert SLOW.answered and SLOW.answered[-1] <= applied_at, "the reload returned with a request in flight"
    assert request(f"{gateway.url}/v2/models/churn_model/infer", method="POST")[1] == "3"


def test_router_chosen_by_the_setting_routes_through_the_real_gateway(gateway):
    from ground.settings import Settings
    from repository_sync.routing.router import make_router

    r = make_router(Settings.from_env({}).traffic_router, conf_dir=gateway.conf_dir, reload=gateway.reload)
    plan = r.apply(TrafficPlan.single("churn_model", 4))
    wait_live(gateway.url, plan)
    assert request(f"{gateway.url}/v2/models/churn_model/ready")[1:] == (
        "4", "/v2/models/churn_model/versions/4/ready")
    r.remove("churn_model")


def test_reapplying_the_live_plan_does_not_reload(router):
    plan = TrafficPlan.single("churn_model", 6)
    router.apply(plan)
    assert router.last_apply.changed
    router.apply(plan)
    assert not router.last_apply.changed


def test_plan_header_names_the_live_plan(gateway, router):
    plan = router.apply(TrafficPlan.from_weights("churn_model", {6: 100}))
    wait_live(gateway.url, plan)
    with urllib.request.urlopen(f"{gateway.url}/v2/models/churn_model/ready", timeout=5) as resp:
        assert resp.headers[PLAN_HEADER] == plan.digest
