"""The main job end to end: ``python -m tritonflow.demo --quick`` on the real NOAA data.

One run of the quick sweep on the real local deployment (MLflow, Triton, the NGINX gateway and
an Airflow 3 scheduler, dag-processor, triggerer and api-server with the LocalExecutor on
SQLite, in a temporary demo home on free ports; tests/demo_run.py), then its summary, report and
last line are checked: the driver created only ``drift_monitor`` runs and the scheduler ran the
rest, drift was first alerted within the window of a real shift point of the series and never in
the quiet hours before it, a retrained challenger was promoted through the canary, every alert
carries the DAGs' decision, a label-flipped challenger requested through the registry (alias,
registry_events, model_publish, canary_promotion) was rolled back by the canary under the
default thresholds, and the report holds its plots.
Slow (many minutes on two cores): marked ``integration`` and ``slow``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from model_registry.datasets import KNOWN_SHIFTS, LABEL_COLUMN
from repository_sync.canary.policy import CanaryPolicy
from tests.demo_run import get_quick_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: Logical hours after the hour of a documented shift's last day within which its first alert may come
#: (the alert policy needs up to 5 drifted windows with 4 of evidence, or one strong window).
SHIFT_TOLERANCE_HOURS = 4
#: The DAGs of the loop; each must have run at least once in a quick run.
LOOP_DAGS = ("drift_monitor", "shadow_evaluation", "retrain", "model_publish", "canary_promotion")


@pytest.fixture(scope="module")
def quick_run(request, tmp_path_factory) -> dict:
    return get_quick_run(request, tmp_path_factory)


def _runs(summary: dict, dag_id: str) -> list[dict]:
    return [r for r in summary["dag_runs"] if r["dag_id"] == dag_id]


def test_the_driver_creates_only_drift_monitor_runs_and_the_scheduler_runs_the_rest(quick_run):
    runs = quick_run["dag_runs"]
    for r in runs:
        assert {"dag_id", "run_id", "run_type", "triggered_by", "state", "start", "end"} <= set(r)
    by_driver = [r for r in runs if r["triggered_by"] == "driver"]
    assert by_driver and {r["dag_id"] for r in by_driver} == {"drift_monitor"}
    # one driver-made drift_monitor run per replayed logical hour, each one successful
    assert len(by_driver) == len(quick_run["hours"])
    assert all(r["state"] == "success" for r in by_driver), [r for r in by_driver if r["state"] != "success"]
    for dag_id in LOOP_DAGS:
        assert _runs(quick_run, dag_id), f"no {dag_id} run:\n{quick_run['_progress'][-4000:]}"
    shadow = _runs(quick_run, "shadow_evaluation")
    assert any(r["triggered_by"] == "asset:tritonflow_drift_alerts" and r["run_type"] == "asset_triggered"
               for r in shadow)
    # retrain, model_publish and canary_promotion were started by another DAG's run, never by the driver
    for dag_id in ("retrain", "model_publish", "canary_promotion"):
        for r in _runs(quick_run, dag_id):
            parent = r["triggered_by"]
            assert parent.startswith("dag:"), r
            assert any(f"dag:{p['dag_id']}/{p['run_id']}" == parent for p in runs), parent


def test_runs_of_different_dags_overlap(quick_run):
    def span(r):
        return (dt.datetime.fromisoformat(r["start"].replace("Z", "+00:00")),
                dt.datetime.fromisoformat(r["end"].replace("Z", "+00:00")))

    others = [span(r) for r in quick_run["dag_runs"] if r["dag_id"] != "drift_monitor" and r["start"] and r["end"]]
    drifts = [span(r) for r in _runs(quick_run, "drift_monitor") if r["triggered_by"] == "driver"]
    assert any(a0 < b1 and b0 < a1 for a0, a1 in others for b0, b1 in drifts)


def shift_alert_problems(summary: dict) -> list[str]:
    """What is wrong with the alerts of a demo summary against the documented shifts; [] when right.

    A shift is new to the champion when it starts on or after the champion's last training day
    (``config.champion_days``); its window is the logical hours from the one holding its first
    day to SHIFT_TOLERANCE_HOURS after the one holding its last day. The hours replayed entirely
    before the first new shift are quiet: each was checked and none alerted (neither the hour's
    drift event nor an alert decision). The first alert lies in the window of a new shift and
    names one of the inputs that shift moves.
    """
    mapping = summary["config"]["mapping"]
    days_per_hour, first_day = mapping["days_per_hour"], mapping["first_day"]
    trained_until = summary["config"]["champion_days"][1]

    def hour_of(day: int) -> int:
        return (day - first_day) // days_per_hour

    new = [s for s in KNOWN_SHIFTS if s.start_day >= trained_until and hour_of(s.start_day) < len(summary["hours"])]
    if not new:
        return [f"no documented shift {KNOWN_SHIFTS} starts inside the replay (from day {first_day})"]
    problems = []
    quiet = [h for h in summary["hours"] if h["last_day"] < min(s.start_day for s in new)]
    quiet_hours = {h["hour"] for h in quiet}
    unchecked = [h["hour"] for h in quiet if h["drift"] is not False]
    if unchecked:
        problems.append(f"quiet hours {unchecked} (before day {min(s.start_day for s in new)}) alerted or "
                        f"were not checked: {[(h['hour'], h['drift'], h['drift_features']) for h in quiet]}")
    decided = sorted({a["hour"] for a in summary["alerts"]} & quiet_hours)
    if decided:
        problems.append(f"alert decisions recorded for quiet hours {decided}")
    alerted = sorted((h for h in summary["hours"] if h["drift"]), key=lambda h: h["hour"])
    if not alerted:
        return [*problems, "no drift alert"]
    first = alerted[0]
    windows = {s.description: (hour_of(s.start_day), hour_of(s.end_day) + SHIFT_TOLERANCE_HOURS) for s in new}
    hits = [s for s in new if windows[s.description][0] <= first["hour"] <= windows[s.description][1]
            and (set(s.features) - {LABEL_COLUMN}) & set(first["drift_features"])]
    if not hits:
        problems.append(f"the first alert (hour {first['hour']}, days {first['first_day']}-{first['last_day']}, "
                        f"features {first['drift_features']}) is in no window of a new documented shift "
                        f"(logical hours, inclusive: {windows}) naming one of its inputs")
    return problems


def test_drift_is_alerted_at_a_documented_shift_of_the_noaa_series_and_not_before(quick_run):
    problems = shift_alert_problems(quick_run)
    assert not problems, "\n".join(problems) + f"\n{quick_run['_progress'][-4000:]}"


def test_every_alert_is_recorded_with_the_dags_decision(quick_run):
    alerts = quick_run["alerts"]
    alerted_hours = {h["hour"] for h in quick_run["hours"] if h["drift"]}
    assert alerts and {a["hour"] for a in alerts} >= alerted_hours
    for a in alerts:
        assert {"hour", "features", "decision", "reason"} <= set(a)
        assert a["decision"] and a["reason"]
    last = quick_run["_last_line"]
    assert last["alerts"] == len(alerts)
    assert 1 <= last["acted"] <= last["alerts"]


def test_a_retrained_challenger_is_promoted_and_serves_afterwards(quick_run):
    loops = quick_run["closed_loops"]
    assert loops, f"no challenger was promoted:\n{quick_run['_progress'][-4000:]}"
    first = loops[0]
    assert first["to"] != first["from"] and first["seconds"] > 0
    assert any(r["state"] == "success" for r in _runs(quick_run, "retrain"))
    assert first["canary_run"] in {r["run_id"] for r in _runs(quick_run, "canary_promotion")}
    assert first["alert_run"] in {r["run_id"] for r in _runs(quick_run, "drift_monitor")}
    # traffic after the promotion (the following logical hours, or the serving check once every
    # loop run has finished) was answered by the promoted version
    assert (any(str(first["to"]) in h["versions"] for h in quick_run["hours"])
            or str(first["to"]) in quick_run["served_after_loop"])


def test_a_flipped_label_challenger_requested_through_the_registry_is_rolled_back(quick_run):
    bad = quick_run["bad_challenger"]
    assert bad, "no bad challenger was offered"
    progress = quick_run["_progress"][-4000:]
    runs = {(r["dag_id"], r["run_id"]): r for r in quick_run["dag_runs"]}
    # the driver only set an alias: registry_events (from the registry watcher's asset event)
    # started model_publish, which started the canary
    publish = runs.get(("model_publish", bad["publish_run"]))
    canary = runs.get(("canary_promotion", bad["canary_run"]))
    assert publish and canary, (bad, progress)
    assert publish["triggered_by"].startswith("dag:registry_events/"), publish
    parent = runs[("registry_events", publish["triggered_by"].split("/", 1)[1])]
    assert parent["triggered_by"].startswith("asset:"), parent
    assert canary["triggered_by"] == f"dag:model_publish/{bad['publish_run']}", canary
    assert publish["state"] == "success" and canary["state"] == "failed", (publish, canary)
    # what the canary run recorded: rolled back on the quality check with the labels that arrived
    assert bad["outcome"] == "rolled_back" and bad["rolled_back"] is True, bad
    assert bad["source"].startswith("xcom:"), bad
    assert "quality" in bad["reason"], bad["reason"]
    failed = [s for s in bad["steps"] if s["verdict"] == "fail"]
    assert failed and failed[0]["percent"] < 100 and "quality" in failed[0]["reason"], bad["steps"]
    assert bad["champion_after"] == bad["champion_before"] != bad["version"]
    # the canary ran with the default thresholds, as it recorded them on the version
    defaults = CanaryPolicy().thresholds()
    judged = ("max_prediction_ks", "max_prediction_psi", "max_quality_drop", "min_labels", "confidence",
              "quality_metric", "max_error_rate", "max_latency_ratio")
    assert {k: bad["thresholds"][k] for k in judged} == {k: defaults[k] for k in judged}, bad["thresholds"]
    html = (Path(quick_run["_home"]) / "report" / "index.html").read_text()
    assert "Deliberately bad challenger" in html and "rolled back" in html


def test_each_promotion_arms_the_health_sentinel_in_the_triggerer(quick_run):
    loops = quick_run["closed_loops"]
    assert loops, f"no challenger was promoted:\n{quick_run['_progress'][-4000:]}"
    sentinels = quick_run["sentinels"]
    for i, loop in enumerate(loops):
        started = [s for s in sentinels if f"dag:canary_promotion/{loop['canary_run']}" in s["promoted_by"]]
        assert started, (loop, sentinels)
        assert all(s["triggered_by"].startswith("asset:") for s in started)
        states = {w["state"] for s in started for w in s["watch"]}
        if i == len(loops) - 1:
            # the last promoted champion is being watched: its sentinel is deferred in the triggerer
            assert any(s["armed"] for s in started), started
        else:
            # an earlier champion's sentinel ended by itself once its version stopped being champion
            assert states <= {"deferred", "success"}, started
    assert "sentinel: champion_sentinel" in quick_run["_progress"]


def test_the_last_line_is_the_benchmark_json(quick_run):
    last = quick_run["_last_line"]
    assert set(last) == {"closed_loop_s", "scheduling_latency_s", "wall_s", "alerts", "acted"}
    assert last["closed_loop_s"] == [lp["seconds"] for lp in quick_run["closed_loops"]]
    assert last["scheduling_latency_s"] is not None and last["scheduling_latency_s"] >= 0
    assert last["wall_s"] > 0


def test_the_report_holds_the_drift_serving_quality_and_timing_plots(quick_run):
    report = Path(quick_run["_home"]) / "report"
    html = (report / "index.html").read_text()
    pngs = sorted(report.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"served.png", "performance.png", "timings.png"} <= names
    assert len([n for n in names if n.startswith("drift_")]) == 8  # one per NOAA feature
    for p in pngs:
        assert p.read_bytes()[:8] == PNG_MAGIC
    assert "Closed loop" in html
