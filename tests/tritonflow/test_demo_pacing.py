"""The full replay waits for the loop: a logical hour is long enough for a whole closed loop."""

import threading

from tritonflow.demo.config import DemoConfig, quick_config
from tritonflow.demo.driver import Demo


def _demo(tmp_path, **overrides) -> Demo:
    return Demo(DemoConfig(home=tmp_path, **overrides))


def test_a_loop_run_first_seen_in_one_hour_holds_the_next_hour_and_its_end_releases_it(tmp_path):
    demo = _demo(tmp_path)
    demo._current_hour = 5
    demo.note_loop_run("shadow_evaluation", "shadow_1", "queued")
    demo.note_loop_run("drift_monitor", "hour_5", "running")  # the driver's own runs never hold it
    demo.note_loop_run("champion_sentinel", "watch_1", "running")
    assert demo.loop_behind(5) == []
    assert demo.loop_behind(6) == ["shadow_evaluation/shadow_1"]
    demo._current_hour = 6
    demo.note_loop_run("shadow_evaluation", "shadow_1", "running")  # still first seen in hour 5
    assert demo.loop_behind(6) == ["shadow_evaluation/shadow_1"]
    demo.note_loop_run("shadow_evaluation", "shadow_1", "success")
    assert demo.loop_behind(6) == []


def test_the_lag_lets_the_replay_run_that_many_hours_ahead(tmp_path):
    demo = _demo(tmp_path, loop_lag_hours=2)
    demo._current_hour = 10
    demo.note_loop_run("model_publish", "publish_2", "running")
    assert demo.loop_behind(12) == []
    assert demo.loop_behind(13) == ["model_publish/publish_2"]


def test_the_quick_sweep_never_waits(tmp_path):
    demo = Demo(quick_config(tmp_path))
    demo.note_loop_run("retrain", "retrain_1", "running")
    assert demo.cfg.loop_lag_hours is None and demo.loop_behind(100) == []


def test_the_wait_ends_when_the_run_ends_and_is_reported(tmp_path):
    demo = _demo(tmp_path)
    demo.note_loop_run("canary_promotion", "canary_1", "running")
    timer = threading.Timer(0.2, demo.note_loop_run, ("canary_promotion", "canary_1", "success"))
    timer.start()
    demo.wait_for_loop(1)
    timer.join()
    (wait,) = [e for e in demo.events if e["kind"] == "loop_wait"]
    assert wait["hour"] == 1 and wait["gave_up"] is False


def test_a_run_that_never_ends_is_given_up_on_after_the_settle_timeout(tmp_path):
    demo = _demo(tmp_path, settle_timeout_s=0.1)
    demo.note_loop_run("retrain", "retrain_1", "running")
    demo.wait_for_loop(1)
    (wait,) = [e for e in demo.events if e["kind"] == "loop_wait"]
    assert wait["gave_up"] is True


def test_the_command_line_sets_the_lag_or_turns_the_wait_off_and_names_a_bad_value():
    import pytest

    from tritonflow.demo.config import config_from_args

    assert config_from_args([]).loop_lag_hours == 0
    assert config_from_args(["--quick"]).loop_lag_hours is None
    assert config_from_args(["--loop-lag-hours", "3"]).loop_lag_hours == 3
    assert config_from_args(["--loop-lag-hours", "none"]).loop_lag_hours is None
    with pytest.raises(SystemExit, match="--loop-lag-hours: '-1' is not a whole number"):
        config_from_args(["--loop-lag-hours", "-1"])


def test_a_queued_asset_event_holds_the_replay_until_the_scheduler_makes_its_run(tmp_path):
    """A drift alert's event waiting in Airflow's asset queue is the loop in flight: the replay waits."""
    demo = _demo(tmp_path)
    demo._current_hour = 84
    assert demo.note_queued_events("shadow_evaluation", 1, active=False, now=100.0) is None
    assert demo.loop_behind(85) == ["shadow_evaluation/queued asset events"]
    demo.note_loop_run("shadow_evaluation", "asset_triggered_1", "queued")  # the run is made
    assert demo.note_queued_events("shadow_evaluation", 0, active=True, now=101.0) is None
    assert demo.loop_behind(85) == ["shadow_evaluation/asset_triggered_1"]


def test_an_event_queued_with_no_run_active_is_reported_stalled_once_per_period(tmp_path):
    """Airflow's stale max_active_runs flag hides the queued event: the driver is told to have the
    file parsed again after STALE_QUEUE_S, and again one period later, never while a run is active."""
    from tritonflow.demo.driver import STALE_QUEUE_S

    demo = _demo(tmp_path)
    assert demo.note_queued_events("shadow_evaluation", 1, active=True, now=0.0) is None
    assert demo.note_queued_events("shadow_evaluation", 1, active=True, now=100.0) is None  # waits for the run
    assert demo.note_queued_events("shadow_evaluation", 1, active=False, now=101.0) is None
    assert demo.note_queued_events("shadow_evaluation", 1, active=False, now=101.0 + STALE_QUEUE_S / 2) is None
    assert demo.note_queued_events("shadow_evaluation", 1, active=False, now=101.0 + STALE_QUEUE_S) == STALE_QUEUE_S
    assert demo.note_queued_events("shadow_evaluation", 1, active=False, now=102.0 + STALE_QUEUE_S) is None
    assert demo.note_queued_events("shadow_evaluation", 1, active=False,
                                   now=101.0 + 2 * STALE_QUEUE_S) == STALE_QUEUE_S
    assert demo.note_queued_events("shadow_evaluation", 0, active=False, now=200.0) is None
    assert demo.loop_behind(1000) == []
