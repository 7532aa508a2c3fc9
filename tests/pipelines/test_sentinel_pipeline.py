"""Health sentinel end to end on real services: golden sets from MLflow, Triton and the drift
reference; the trigger's ``run()`` against the real gateway; rollback through the
``canary_rollback`` path with the reason recorded in MLflow.

Reuses the canary pipeline's module services (real Triton, real NGINX gateway, the session's MLflow
server) and its iris ONNX models. A champion is made unhealthy by recording a validation range its
answers fall outside (``tritonflow.output_range``): the probes, the trigger and the rollback are
all real.
"""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import pytest

from repository_sync.routing.gateway_probe import served_by, wait_live
from repository_sync.routing.traffic_plan import TrafficPlan
from repository_sync.sentinel import SentinelPolicy
from tests.pipelines.test_canary_pipeline import FEATURES, deploy, models, registry, stack  # noqa: F401
from tests.plugins import airflow_env  # noqa: F401  (plugins/ on sys.path for the trigger)
from tritonflow.pipelines.canary_loading import ensure_loaded
from tritonflow.pipelines.sentinel import OUTPUT_RANGE_TAG, golden_set, sentinel_rollback

pytestmark = pytest.mark.integration


def champion_with_previous(stack, models, name: str, ranges: dict | None) -> None:
    """``name`` v1 (good) and v2 (good2); champion 2, previous_champion 1, both loaded, 100 % on 2;
    v2's drift reference stored and, when given, its validation ranges tagged."""
    from drift_checks.reference import save_reference
    from tritonflow.pipelines.publish_record import reference_root

    deploy(stack, models, name, {1: "good", 2: "good2"}, champion=1)
    reg = registry(stack)
    reg.promote(name, 2, reason="test: champion 2 over 1")
    ensure_loaded(name, [1, 2], env=stack.env)
    plan = TrafficPlan.single(name, 2)
    stack.env.router().apply(plan)
    wait_live(stack.gateway.url, plan)
    save_reference(reference_root(stack.settings), name, 2, pd.DataFrame(models["X"], columns=FEATURES))
    if ranges is not None:
        reg.set_version_tags(reg.get_version(name, 2), {OUTPUT_RANGE_TAG: json.dumps(ranges)})


def run_trigger(golden: dict, gateway_url: str, tracking_uri: str, **kw) -> dict:
    from tritonflow_plugin.sentinel import ChampionSentinelTrigger

    policy = SentinelPolicy(interval_s=0.2, failures=3, latency_limit_s=5.0)
    trigger = ChampionSentinelTrigger(golden, policy.to_dict(), gateway_url, tracking_uri=tracking_uri, **kw)

    async def first():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(first(), timeout=120))


def test_golden_set_takes_reference_rows_and_the_validation_range(stack, models):
    champion_with_previous(stack, models, "sentinel_golden", {"probabilities": [0.0, 1.0]})
    golden = golden_set("sentinel_golden", env=stack.env, samples=8)
    assert golden["version"] == 2 and golden["samples"] == 8
    assert golden["output_ranges"] == {"probabilities": [0.0, 1.0]}
    assert OUTPUT_RANGE_TAG in golden["source"] and "rows of reference" in golden["source"]
    (tensor,) = golden["inputs"].values()
    assert tensor["shape"] == [8, 4] and tensor["datatype"] == "FP32"
    # the healthy champion passes: the trigger runs its probes and stops without a failure
    event = run_trigger(golden, stack.gateway.url, stack.tracking_uri, max_probes=3)
    assert event["status"] == "stopped" and event["failed"] == [] and event["unreachable"] == 0


def test_without_a_recorded_range_the_champions_own_answers_give_it(stack, models):
    champion_with_previous(stack, models, "sentinel_norange", None)
    golden = golden_set("sentinel_norange", env=stack.env, samples=8)
    lo, hi = golden["output_ranges"]["probabilities"]
    assert 0.0 <= lo < hi <= 1.0 and "no validation range recorded" in golden["source"]


def test_unhealthy_champion_is_rolled_back_gateway_first_and_the_reason_recorded(stack, models):
    name = "sentinel_rollback"
    champion_with_previous(stack, models, name, {"probabilities": [0.0, 0.001]})  # answers fall outside
    golden = golden_set(name, env=stack.env, samples=8)
    event = run_trigger(golden, stack.gateway.url, stack.tracking_uri)
    assert event["status"] == "unhealthy" and len(event["failed"]) == 3
    assert "outside the validation range" in event["reason"]

    result = sentinel_rollback(event, holder="test", env=stack.env)
    assert result["rolled_back_from"] == 2 and result["rolled_back_to"] == 1
    assert {served_by(stack.gateway.url, name)[0] for _ in range(10)} == {"1"}
    reg = registry(stack)
    assert reg.aliases(name)["champion"] == 1
    for v in (1, 2):
        tags = reg.get_version(name, v).tags
        assert "outside the validation range" in tags["tritonflow.sentinel.reason"]
        assert len(json.loads(tags["tritonflow.sentinel.failed_probes"])) == 3
    # a second (stale) sentinel for version 2 changes nothing
    again = sentinel_rollback(event, holder="test", env=stack.env)
    assert again.get("skipped") and reg.aliases(name)["champion"] == 1
    # only the rolled-back version is rejected, at stage sentinel, with the sentinel's reason
    assert "outside the validation range" in result["rejected"]
    tags = reg.get_version(name, 2).tags
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "sentinel"
    assert "outside the validation range" in tags["tritonflow.rejection_reason"]
    assert reg.get_version(name, 1).tags.get("tritonflow.status") != "rejected"


def test_a_version_the_sentinel_rolled_back_is_never_put_back_until_a_person_lifts_it(stack, models):
    """The next shadow evaluation, its publish, a canary and model_publish all refuse version 2 and
    name the sentinel's rejection (no ping-pong); deleting ``tritonflow.status`` lifts it."""
    from mlflow import MlflowClient

    from ground.exceptions import DataError, RegistryError
    from tritonflow.pipelines import publish as publish_pipeline
    from tritonflow.pipelines import shadow
    from tritonflow.pipelines.canary import resolve as canary_resolve

    name = "sentinel_pingpong"
    champion_with_previous(stack, models, name, {"probabilities": [0.0, 0.001]})
    event = run_trigger(golden_set(name, env=stack.env, samples=8), stack.gateway.url, stack.tracking_uri)
    assert sentinel_rollback(event, holder="test", env=stack.env)["rolled_back_to"] == 1
    client = MlflowClient(stack.tracking_uri)
    client.set_registered_model_alias(name, "challenger", "2")  # what a registry-driven trigger sees

    with pytest.raises(RegistryError, match="rejected at stage sentinel.*outside the validation range"):
        shadow.resolve_versions(name, "2", settings=stack.settings)
    stale = {"model": name, "champion": {"version": 1},
             "challenger": {"version": 2, "triton_model_name": name, "triton_model_version": 2}}
    with pytest.raises(RegistryError, match="rejected at stage sentinel"):
        shadow.ensure_challenger_published(stale, settings=stack.settings, publish=lambda *a, **k: None)
    with pytest.raises(DataError, match="rejected at stage sentinel.*tritonflow.status"):
        canary_resolve(name, "challenger", env=stack.env)
    # model_publish (by hand or from the alias event) refuses it, and the rejection stays
    with pytest.raises(RegistryError, match="rejected at stage sentinel.*never lifts"):
        publish_pipeline.publish(f"{name}@challenger", triton_url=stack.triton.http_url, settings=stack.settings)
    tags = client.get_model_version(name, "2").tags
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "sentinel"

    # the override: a person deletes tritonflow.status; the canary resolves version 2 again
    client.delete_model_version_tag(name, "2", "tritonflow.status")
    assert canary_resolve(name, "2", env=stack.env)["challenger"] == 2


def test_sentinel_of_a_version_no_longer_champion_ends_superseded(stack, models):
    name = "sentinel_superseded"
    champion_with_previous(stack, models, name, {"probabilities": [0.0, 1.0]})
    golden = golden_set(name, env=stack.env, samples=4)
    registry(stack).promote(name, 1, reason="test: champion moved by someone else")
    event = run_trigger(golden, stack.gateway.url, stack.tracking_uri, champion_check_s=0.0)
    assert event["status"] == "superseded" and event["probes"] == 1


def test_a_champion_triton_forgot_is_loaded_back_not_rolled_back(stack, models):
    """Triton loses the model's versions (as a restart in ``explicit`` mode does) while the
    champion serves: the sentinel fires ``unloaded``, and :func:`reload_serving` loads back the
    recorded desired set (champion and previous champion), verified, with no alias moved."""
    import tritonclient.http as httpclient

    from ground.exceptions import DataError
    from repository_sync.sentinel import probe
    from tritonflow.pipelines.sentinel import reload_serving

    name = "sentinel_forgotten"
    champion_with_previous(stack, models, name, {"probabilities": [0.0, 1.0]})
    golden = golden_set(name, env=stack.env, samples=4)
    httpclient.InferenceServerClient(stack.triton.http_url).unload_model(name)
    event = run_trigger(golden, stack.gateway.url, stack.tracking_uri, max_probes=20)
    assert event["status"] == "unloaded", event
    with pytest.raises(DataError, match="expected 'unloaded'"):
        reload_serving({**event, "status": "unhealthy"}, env=stack.env)
    done = reload_serving(event, holder="test/sentinel", env=stack.env)
    assert done["versions"] == [1, 2] and done["triton_model"] == golden["triton_model"]
    from repository_sync.sentinel import GoldenSet

    policy = SentinelPolicy(latency_limit_s=5.0)
    assert probe(stack.gateway.url, GoldenSet.from_dict(golden), policy).status == "ok"
    version, _, status = served_by(stack.gateway.url, name)
    assert (version, status) == ("2", 200)
    assert registry(stack).aliases(name) == {"champion": 2, "previous_champion": 1}
