"""The demo's read-back of the scheduler's runs (pure functions over REST API rows)."""

from tritonflow.demo.runs import closed_loops


def _run(dag_id, run_id, start, end, triggered_by="driver", state="success"):
    return {"dag_id": dag_id, "run_id": run_id, "start": start, "end": end, "state": state,
            "triggered_by": triggered_by, "source": None}


def test_a_promotion_seen_before_its_canary_run_ended_is_matched_to_that_canary():
    runs = [
        _run("drift_monitor", "hour_15", "2026-11-30T17:23:00Z", "2026-11-30T17:23:40Z"),
        {**_run("shadow_evaluation", "shadow_1", "2026-11-30T17:23:41Z", "2026-11-30T17:25:16Z",
                triggered_by="asset:tritonflow_drift_alerts"),
         "source": {"events": ["dag:drift_monitor/hour_15"], "timestamps": ["2026-11-30T17:23:40Z"]}},
        _run("canary_promotion", "canary_1", "2026-11-30T17:31:50Z", "2026-11-30T17:33:25Z",
             triggered_by="dag:shadow_evaluation/shadow_1"),
    ]
    # the canary moves the alias (seen 17:33:18) a few seconds before its run ends (17:33:25)
    loops = closed_loops(runs, [{"from": 1, "to": 2, "seen_at": "2026-11-30T17:33:18+00:00"}])
    assert loops[0]["canary_run"] == "canary_1" and loops[0]["alert_run"] == "hour_15"
    assert loops[0]["seconds"] == 585.0


def test_a_promotion_with_no_canary_started_before_it_is_reported_unmatched():
    runs = [_run("canary_promotion", "canary_1", "2026-11-30T18:00:00Z", "2026-11-30T18:01:00Z")]
    loops = closed_loops(runs, [{"from": 1, "to": 2, "seen_at": "2026-11-30T17:00:00+00:00"}])
    assert loops[0]["seconds"] is None and "no canary run" in loops[0]["why"]
