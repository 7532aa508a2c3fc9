"""Health sentinel: judging answers (pure) and probing a real Triton through a real NGINX gateway.

The real-service tests serve :mod:`tritonflow.runtime.fault_injection`'s model (version ``v``
answers ``x * v``; a version can be switched at run time to answer NaN or to fail) on a real
Triton, behind the real NGINX gateway, and run the Airflow trigger's ``run()`` (the coroutine the
triggerer runs) and :func:`repository_sync.sentinel.watch` against them.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from ground.exceptions import DataError
from repository_sync.sentinel import GoldenSet, SentinelPolicy, judge, probe, watch
from tests.plugins import airflow_env  # noqa: F401  (plugins/ on sys.path for the trigger)

MODEL = "sentinel_fault"
X = np.arange(1, 9, dtype=np.float32)


def golden(version: int = 1, ranges=None, samples=X) -> GoldenSet:
    return GoldenSet.from_arrays(MODEL, MODEL, version, {"X": samples},
                                 {"Y": [1.0 * version, 8.0 * version]} if ranges is None else ranges)


# ----------------------------------------------------------------------------------- judging (pure)
def test_healthy_answer_has_no_reasons():
    assert judge({"Y": X * 1.0}, 0.01, golden(), SentinelPolicy()) == ()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_output_is_unhealthy(bad):
    y = X.astype(np.float64)
    y[3] = bad
    (reason,) = judge({"Y": y}, 0.01, golden(), SentinelPolicy())
    assert "'Y'" in reason and "1 of 8 values are not finite" in reason


def test_constant_output_across_samples_is_unhealthy():
    (reason,) = judge({"Y": np.full(8, 4.0)}, 0.01, golden(), SentinelPolicy())
    assert "constant across the 8 golden samples" in reason


def test_single_sample_is_never_called_constant():
    g = golden(samples=np.array([[1.0, 2.0]], dtype=np.float32), ranges={})
    assert judge({"Y": np.array([[3.0, 3.0]])}, 0.01, g, SentinelPolicy()) == ()


def test_output_outside_the_validation_range_is_unhealthy_margin_included():
    policy = SentinelPolicy(range_margin=0.1)  # range [1, 8], span 7: allowed [0.3, 8.7]
    assert judge({"Y": np.linspace(0.3, 8.7, 8)}, 0.01, golden(), policy) == ()
    (reason,) = judge({"Y": np.linspace(1, 9, 8)}, 0.01, golden(), policy)
    assert "outside the validation range [1, 8]" in reason and "9" in reason


def test_slow_answer_is_unhealthy():
    (reason,) = judge({"Y": X * 1.0}, 2.5, golden(), SentinelPolicy(latency_limit_s=2.0))
    assert "2.500 s, over the 2 s limit" in reason


def test_missing_output_is_unhealthy():
    (reason,) = judge({"Z": X * 1.0}, 0.01, golden(), SentinelPolicy())
    assert "output 'Y' is missing" in reason


@pytest.mark.parametrize("field,value", [("interval_s", 0), ("failures", 0), ("failures", 2.5),
                                         ("latency_limit_s", float("nan")), ("range_margin", -1)])
def test_bad_policy_is_refused_naming_field_and_value(field, value):
    with pytest.raises(DataError, match=f"sentinel {field}={value!r}"):
        SentinelPolicy(**{field: value})


def test_golden_set_round_trips_through_json():
    g = golden(3)
    again = GoldenSet.from_dict(json.loads(json.dumps(g.to_dict())))
    assert again == GoldenSet.from_dict(g.to_dict()) and again.version == 3 and again.samples == 8
    assert json.loads(again.request_body())["inputs"][0] == {"name": "X", "datatype": "FP32", "shape": [8],
                                                             "data": X.tolist()}


def test_inverted_validation_range_is_refused():
    with pytest.raises(DataError, match="expected finite low <= high"):
        golden(ranges={"Y": [2.0, 1.0]})


def test_unreachable_gateway_is_not_a_verdict_on_the_model():
    from tritonflow.runtime.services import free_port

    result = probe(f"http://127.0.0.1:{free_port()}", golden(), SentinelPolicy(latency_limit_s=1.0))
    assert result.status == "unreachable"
    outcome = asyncio.run(watch(f"http://127.0.0.1:{free_port()}", golden(),
                                SentinelPolicy(interval_s=0.01, failures=2), max_probes=4))
    assert outcome.status == "stopped" and outcome.unreachable == 4 and outcome.failed == ()


# ----------------------------------------------------------------------------------- real services
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Real Triton serving the fault model's versions 1 and 2, real NGINX routing 100 % to 1."""
    import tritonclient.http as httpclient

    from repository_sync.routing.gateway_probe import wait_live
    from repository_sync.routing.nginx_router import NginxRouter
    from repository_sync.routing.traffic_plan import TrafficPlan
    from tests.conftest import make_settings
    from tritonflow.runtime.fault_injection import write_fault_model
    from tritonflow.runtime.services import NginxGateway, TritonServer

    home = tmp_path_factory.mktemp("sentinel")
    settings = make_settings(home)
    mode_dir = write_fault_model(home / "repo", MODEL, (1, 2))
    triton = TritonServer(settings, repository=str(home / "repo")).start()
    gateway = None
    try:
        httpclient.InferenceServerClient(triton.http_url).load_model(MODEL)
        gateway = NginxGateway(settings, triton_http=triton.http_url).start()
        router = NginxRouter.from_nginx_cmd(gateway.conf_dir, gateway.nginx_cmd())
        plan = TrafficPlan.single(MODEL, 1)
        router.apply(plan)
        wait_live(gateway.url, plan)
        yield {"gateway": gateway, "mode_dir": mode_dir, "router": router, "triton": triton}
    finally:
        if gateway is not None:
            gateway.stop()
        triton.stop()


def _run_trigger(trigger) -> dict:
    async def first_event():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(first_event(), timeout=60))


@pytest.mark.integration
def test_trigger_keeps_a_healthy_champion(served):
    from tritonflow_plugin.sentinel import ChampionSentinelTrigger

    policy = SentinelPolicy(interval_s=0.1, failures=3, latency_limit_s=5.0)
    trigger = ChampionSentinelTrigger(golden(1).to_dict(), policy.to_dict(), served["gateway"].url, max_probes=5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "tritonflow_plugin.sentinel.ChampionSentinelTrigger"
    event = _run_trigger(ChampionSentinelTrigger(**json.loads(json.dumps(kwargs))))
    assert event["status"] == "stopped" and event["probes"] == 5 and event["failed"] == []
    assert event["unreachable"] == 0


@pytest.mark.integration
@pytest.mark.parametrize("mode,reason", [("nan", "not finite"), ("error", "HTTP 500")])
def test_trigger_fires_unhealthy_after_consecutive_failures_of_a_real_champion(served, mode, reason):
    from tritonflow.runtime.fault_injection import set_mode
    from tritonflow_plugin.sentinel import ChampionSentinelTrigger

    policy = SentinelPolicy(interval_s=0.1, failures=3, latency_limit_s=5.0)
    set_mode(served["mode_dir"], 1, mode)
    try:
        event = _run_trigger(ChampionSentinelTrigger(golden(1).to_dict(), policy.to_dict(),
                                                     served["gateway"].url, max_probes=20))
    finally:
        set_mode(served["mode_dir"], 1, "ok")
    assert event["status"] == "unhealthy" and event["probes"] == 3 and len(event["failed"]) == 3
    assert reason in event["reason"] and f"{MODEL} v1" in event["reason"]


@pytest.mark.integration
def test_one_bad_probe_between_good_ones_does_not_roll_back(served):
    from tritonflow.runtime.fault_injection import set_mode

    policy = SentinelPolicy(interval_s=0.1, failures=2, latency_limit_s=5.0)
    seen = []

    def on_probe(result):
        seen.append(result.status)
        set_mode(served["mode_dir"], 1, "nan" if len(seen) % 2 == 0 else "ok")  # bad, good, bad...

    try:
        outcome = asyncio.run(watch(served["gateway"].url, golden(1), policy, max_probes=6, on_probe=on_probe))
    finally:
        set_mode(served["mode_dir"], 1, "ok")
    assert outcome.status == "stopped" and "failed" in seen and "ok" in seen[1:]


@pytest.mark.integration
def test_answers_outside_the_validation_range_fail_the_probe(served):
    result = probe(served["gateway"].url, golden(2, ranges={"Y": [1.0, 8.0]}), SentinelPolicy(latency_limit_s=5.0))
    assert result.status == "failed" and "outside the validation range [1, 8]" in result.reasons[0]


@pytest.mark.integration
def test_superseded_champion_ends_the_sentinel(served):
    async def not_champion() -> bool:
        return False

    outcome = asyncio.run(watch(served["gateway"].url, golden(1), SentinelPolicy(interval_s=0.05),
                                still_champion=not_champion, champion_check_s=0.0, max_probes=50))
    assert outcome.status == "superseded" and outcome.probes == 1


def test_a_class_label_output_constant_on_the_golden_samples_is_not_a_stuck_model():
    """8 golden samples may all be one class (seen: a full replay's champion rolled back 3 times on
    ``label`` = 0 for every sample); a stuck classifier still shows in its probabilities."""
    from repository_sync.sentinel import _outputs_of

    answer = {"outputs": [{"name": "label", "datatype": "INT64", "shape": [8], "data": [0] * 8},
                          {"name": "probabilities", "datatype": "FP32", "shape": [8, 2],
                           "data": [v for p in np.linspace(0.1, 0.4, 8) for v in (1 - p, p)]}]}
    g = golden(ranges={"label": [0, 1], "probabilities": [0.0, 1.0]})
    outputs = _outputs_of(answer)
    assert judge(outputs, 0.01, g, SentinelPolicy()) == ()
    stuck = dict(answer, outputs=[answer["outputs"][0], dict(answer["outputs"][1], data=[0.7, 0.3] * 8)])
    (reason,) = judge(_outputs_of(stuck), 0.01, g, SentinelPolicy())
    assert "'probabilities' is constant across the 8 golden samples" in reason


@pytest.mark.integration
def test_a_version_triton_does_not_hold_is_unloaded_not_a_verdict(served):
    """Triton answering but not holding the champion (a restarted Triton comes back empty in
    ``explicit`` mode): every probe is ``unloaded``, the failing streak never grows, and the
    trigger fires ``unloaded`` with the kwargs to resume, never ``unhealthy``."""
    import tritonclient.http as httpclient

    from tritonflow_plugin.sentinel import ChampionSentinelTrigger

    client = httpclient.InferenceServerClient(served["triton"].http_url)
    client.unload_model(MODEL)
    try:
        result = probe(served["gateway"].url, golden(1), SentinelPolicy(latency_limit_s=5.0))
        assert result.status == "unloaded" and "not loaded" in result.reasons[0]
        policy = SentinelPolicy(interval_s=0.05, failures=3, latency_limit_s=5.0)
        trigger = ChampionSentinelTrigger(golden(1).to_dict(), policy.to_dict(), served["gateway"].url,
                                          max_probes=20, reloads=1)
        event = _run_trigger(trigger)
    finally:
        client.load_model(MODEL)
    assert event["status"] == "unloaded" and event["probes"] == 3 and len(event["failed"]) == 3
    assert f"{MODEL} v1 not loaded in Triton" in event["reason"]
    assert event["resume"] == trigger.serialize()[1] and event["resume"]["reloads"] == 1
    assert probe(served["gateway"].url, golden(1), SentinelPolicy(latency_limit_s=5.0)).status == "ok"


@pytest.mark.integration
def test_a_version_unloaded_by_the_rollback_that_superseded_it_ends_superseded_not_unloaded(served):
    """A rollback moves ``champion`` and unloads the version it replaces: a sentinel whose periodic
    champion check is not due yet must still end ``superseded`` (seen: the sentinel loaded the
    model back, deferred again and reached its reload limit), never ``unloaded``."""
    import tritonclient.http as httpclient

    async def not_champion() -> bool:
        return False

    client = httpclient.InferenceServerClient(served["triton"].http_url)
    client.unload_model(MODEL)
    try:
        outcome = asyncio.run(watch(served["gateway"].url, golden(1),
                                    SentinelPolicy(interval_s=0.05, failures=3, latency_limit_s=5.0),
                                    still_champion=not_champion, champion_check_s=3600.0, max_probes=20))
    finally:
        client.load_model(MODEL)
    assert outcome.status == "superseded" and outcome.probes == 3, outcome


@pytest.mark.integration
def test_a_failing_version_no_longer_champion_ends_superseded_not_unhealthy(served):
    """Failing probes of a version that lost ``champion`` meanwhile are no verdict: nothing to roll back."""
    from tritonflow.runtime.fault_injection import set_mode

    async def not_champion() -> bool:
        return False

    set_mode(served["mode_dir"], 1, "error")
    try:
        outcome = asyncio.run(watch(served["gateway"].url, golden(1),
                                    SentinelPolicy(interval_s=0.05, failures=3, latency_limit_s=5.0),
                                    still_champion=not_champion, champion_check_s=3600.0, max_probes=20))
    finally:
        set_mode(served["mode_dir"], 1, "ok")
    assert outcome.status == "superseded" and outcome.probes == 3, outcome


@pytest.mark.integration
def test_a_failing_version_triton_holds_is_still_a_failed_probe(served):
    """The ready check only excuses a version Triton does not hold: a loaded version that fails is judged."""
    from tritonflow.runtime.fault_injection import set_mode

    set_mode(served["mode_dir"], 1, "error")
    try:
        result = probe(served["gateway"].url, golden(1), SentinelPolicy(latency_limit_s=5.0))
    finally:
        set_mode(served["mode_dir"], 1, "ok")
    assert result.status == "failed" and "HTTP 500" in result.reasons[0]


def test_a_sentinel_run_stops_reloading_a_triton_that_keeps_forgetting():
    """After ``MAX_RELOADS`` reloads in one sentinel run, ``unloaded`` fails the task as an
    infrastructure error naming the count, instead of reloading forever (nothing is rolled back)."""
    from ground.exceptions import ServiceUnavailableError
    from tritonflow_plugin.sentinel import MAX_RELOADS, ChampionSentinelOperator, ChampionSentinelTrigger

    trigger = ChampionSentinelTrigger(golden(1).to_dict(), SentinelPolicy().to_dict(), "http://gateway:1",
                                      reloads=MAX_RELOADS)
    event = {"status": "unloaded", "model": MODEL, "triton_model": MODEL, "version": 1,
             "reason": "health sentinel: 3 consecutive probes found it not loaded", "resume": trigger.serialize()[1]}
    op = ChampionSentinelOperator(task_id="watch_champion", model=MODEL, renew_period_s=3600)
    with pytest.raises(ServiceUnavailableError, match=f"loaded back {MAX_RELOADS} times"):
        op.execute_complete({"ti": None}, event)
