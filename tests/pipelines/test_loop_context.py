"""The typed loop context that crosses between the DAGs: validation on arrival and the hand-offs.

Plain Python (no services): :mod:`tritonflow.pipelines.loop_context`.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ground.exceptions import SettingsError
from tritonflow.pipelines.loop_context import (
    LOOP_CONF_KEY,
    OVERRIDE_HINT,
    LoopContext,
    check_conf_keys,
    lasting_rejection,
    lift_hint,
    parse_loop_context,
    publish_handoff,
    rejection,
    retrain_handoff,
    shadow_handoffs,
)

EVENT = {"model": "churn", "version": 3, "features": ["tenure"], "scores": {"tenure": {"psi": 0.4}},
         "window_start": "2025-03-01T10:00:00+00:00", "window_end": "2025-03-01T11:00:00+00:00",
         "severity": "drift"}


def test_the_window_defaults_to_the_drift_event_never_to_the_wall_clock():
    ctx = parse_loop_context({"model": "churn", "version": 4, "triggered_by": "retrain",
                              "drift_event": json.dumps(EVENT)})
    assert ctx.version == "4" and ctx.drift_event == EVENT
    assert (ctx.window_start, ctx.window_end) == (EVENT["window_start"], EVENT["window_end"])
    assert parse_loop_context(ctx.conf()[LOOP_CONF_KEY]) == ctx  # round trip through a conf


@pytest.mark.parametrize("value, message", [
    ({"model": "churn", "triggered_by": "retrain", "versoin": "3"}, r"conf\.loop\.versoin .*did you mean 'version'"),
    ({"model": "churn", "triggered_by": "retrain", "window": "x"}, r"conf\.loop\.window .*did you mean 'window_end'"),
    ({"model": "churn", "triggered_by": "retrain", "version": "three"}, r"conf\.loop\.version='three'"),
    ({"model": "", "triggered_by": "retrain"}, r"conf\.loop\.model=''"),
    ({"model": "churn"}, r"conf\.loop\.triggered_by"),
    ({"model": "churn", "triggered_by": "x", "drift_event": {**EVENT, "model": "fraud"}}, "differs from model"),
    ("{not json", "is not JSON"),
    (["churn"], "expected an object"),
])
def test_a_bad_context_is_refused_naming_the_field_the_value_and_the_closest_key(value, message):
    with pytest.raises(SettingsError, match=message):
        parse_loop_context(value)


def test_unknown_top_level_conf_keys_are_refused_naming_the_closest_param():
    params = ["model", "version_or_alias", "profile", "perf_gate", "dataset_uri", "loop"]
    check_conf_keys({"model": "churn", "loop": None, "registry_event": {}, "then": []}, params, "model_publish")
    with pytest.raises(SettingsError, match=r"'profiles' is not a parameter of DAG 'model_publish' "
                                            r"\(did you mean 'profile'\?\)"):
        check_conf_keys({"model": "churn", "profiles": False}, params, "model_publish")
    with pytest.raises(SettingsError, match="'challenger'"):  # the keys the old confs carried
        check_conf_keys({"challenger": "2"}, params, "model_publish")


def test_retrain_hands_model_publish_the_version_its_training_window_and_the_drift_event():
    conf = retrain_handoff("churn", 7, reason="champion_degraded", drift_event=EVENT,
                           window_start="2025-03-01T00:00:00+00:00", dataset_uri="/w/train.parquet", run_id="r1")
    assert list(conf) == [LOOP_CONF_KEY]
    ctx = parse_loop_context(conf[LOOP_CONF_KEY])
    assert (ctx.model, ctx.version, ctx.dataset_uri, ctx.then) == ("churn", "7", "/w/train.parquet",
                                                                   ("shadow_evaluation",))
    assert ctx.window_end == EVENT["window_end"] and ctx.window_start == "2025-03-01T00:00:00+00:00"


def test_model_publish_hands_on_the_context_it_arrived_with():
    arrived = retrain_handoff("churn", 7, reason="drift", drift_event=EVENT, dataset_uri="/w/t.parquet")
    conf = publish_handoff({"model": "churn", "version": 7, "loop": arrived[LOOP_CONF_KEY]}, run_id="p1")
    ctx = parse_loop_context(conf[LOOP_CONF_KEY])
    assert (ctx.triggered_by, ctx.triggered_by_run, ctx.version, ctx.then) == ("model_publish", "p1", "7", ())
    assert ctx.drift_event == EVENT and ctx.window_end == EVENT["window_end"] and ctx.reason == "drift"
    bare = parse_loop_context(publish_handoff({"model": "churn", "version": 2, "loop": None})[LOOP_CONF_KEY])
    assert bare.drift_event is None and bare.window_end is None and bare.reason == "published"


def test_shadow_hands_the_canary_its_expectations_and_the_retrain_its_window():
    request = {"model": "churn", "window_start": "2025-02-27T09:00:00+00:00", "window_end": EVENT["window_end"],
               "drift_event": json.dumps(EVENT), "loop": None}
    decision = {"model": "churn", "challenger": 5, "canary_conf": {"expected_predictions": "/x/expected.parquet"},
                "retrain_conf": {"reason": "champion_degraded"}}
    canary, retrain = shadow_handoffs(request, decision, run_id="s1")
    c, r = parse_loop_context(canary[LOOP_CONF_KEY]), parse_loop_context(retrain[LOOP_CONF_KEY])
    assert (c.version, c.expected_predictions, c.drift_event) == ("5", "/x/expected.parquet", EVENT)
    assert (r.version, r.reason, r.window_start, r.window_end) == (
        None, "champion_degraded", request["window_start"], EVENT["window_end"])
    no_challenger, _ = shadow_handoffs(request, {**decision, "challenger": None})
    assert no_challenger == {}


def test_rejection_names_the_stage_and_the_reason_and_ignores_other_outcomes():
    assert rejection({"tritonflow.status": "published"}) == "" and rejection(None) == ""
    text = rejection({"tritonflow.status": "rejected", "tritonflow.rejected_stage": "profile",
                      "tritonflow.rejection_reason": "ProfilingError: no stable config"})
    assert "stage profile" in text and "no stable config" in text


def test_the_context_is_immutable():
    ctx = LoopContext(model="churn", triggered_by="retrain")
    with pytest.raises(ValidationError):
        ctx.model = "other"  # type: ignore[misc]


@pytest.mark.parametrize("stage, lasting", [("convert_and_validate", False), ("perf_gate", False),
                                            ("sentinel", True), ("canary", True), ("manual", True)])
def test_only_a_publish_stage_rejection_is_lifted_by_a_new_publish(stage, lasting):
    tags = {"tritonflow.status": "rejected", "tritonflow.rejected_stage": stage,
            "tritonflow.rejection_reason": "why", "tritonflow.rejected_at": "2025-03-01T10:00:00+00:00"}
    assert rejection(tags).startswith(f"rejected at stage {stage}")
    assert bool(lasting_rejection(tags)) is lasting
    assert (lift_hint(tags) == OVERRIDE_HINT) is lasting and "tritonflow.status" in OVERRIDE_HINT
    # the override: without tritonflow.status = rejected nothing is rejected, whatever tags remain
    tags.pop("tritonflow.status")
    assert rejection(tags) == "" and lasting_rejection(tags) == ""
