"""The deadline alerts of the canary, rollback and publish runs: computed from the settings, on the
three DAGs, and reported by the failure notifier with the run, its state and how the time was computed."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from airflow.sdk.definitions.callback import AsyncCallback
from airflow.sdk.definitions.deadline import DeadlineReference

from ground.settings import Settings
from tritonflow.pipelines.run_deadlines import expected_run
from tritonflow_plugin.deadlines import run_deadline
from tritonflow_plugin.notifications import TritonflowFailureNotifier, deadline_message

DAGS = Path(__file__).resolve().parents[2] / "dags"


def test_the_expected_times_follow_the_settings(tmp_path):
    s = Settings.from_env({"TRITONFLOW_CANARY_STEPS": "25,100", "TRITONFLOW_CANARY_BAKE_S": "60",
                           "TRITONFLOW_CANARY_MAX_EXTENSIONS": "1", "TRITONFLOW_DEADLINE_MARGIN_S": "100",
                           "TRITONFLOW_LOAD_TIMEOUT_S": "30", "TRITONFLOW_ANALYZER_TIMEOUT_S": "200"}, home=tmp_path)
    seconds, why = expected_run("canary", s)
    assert seconds == 2 * 60 * 2 + 600 + 100 and why.startswith("2 steps x 60 s bake x 2") and "= 940 s" in why
    assert expected_run("rollback", s)[0] == 2 * 30 + 100
    assert expected_run("publish", s)[0] == 200 + 2 * 30 + 100
    approve = Settings.from_env({"TRITONFLOW_PROMOTION_POLICY": "approve", "TRITONFLOW_APPROVAL_TIMEOUT_H": "2",
                                 "TRITONFLOW_CANARY_STEPS": "25,100", "TRITONFLOW_CANARY_BAKE_S": "60",
                                 "TRITONFLOW_CANARY_MAX_EXTENSIONS": "1", "TRITONFLOW_DEADLINE_MARGIN_S": "100"},
                                home=tmp_path)
    assert expected_run("canary", approve)[0] == 940 + 7200  # the approval's wait counts
    steps = Settings.from_env({"TRITONFLOW_PROMOTION_POLICY": "approve-steps", "TRITONFLOW_APPROVAL_TIMEOUT_H": "2",
                               "TRITONFLOW_CANARY_PAUSE_TIMEOUT_S": "30", "TRITONFLOW_CANARY_STEPS": "25,100",
                               "TRITONFLOW_CANARY_BAKE_S": "60", "TRITONFLOW_CANARY_MAX_EXTENSIONS": "1",
                               "TRITONFLOW_DEADLINE_MARGIN_S": "100"}, home=tmp_path)
    seconds, why = expected_run("canary", steps)  # and a pause may follow each of the 4 bakes
    assert seconds == 940 + 7200 + 4 * 30 and why.startswith("2 steps x (60 s bake + 30 s pause) x 2")
    with pytest.raises(ValueError, match="run kind 'train': expected one of"):
        expected_run("train", s)


@pytest.mark.parametrize(("file", "dag_id", "kind"), [("canary_promotion.py", "canary_promotion", "canary"),
                                                      ("canary_rollback.py", "canary_rollback", "rollback"),
                                                      ("model_publish.py", "model_publish", "publish")])
def test_the_canary_rollback_and_publish_dags_carry_their_deadline(file, dag_id, kind):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / file), safe_mode=False)
    assert not bag.import_errors, bag.import_errors
    (alert,) = bag.dags[dag_id].deadline
    assert alert.reference == DeadlineReference.DAGRUN_QUEUED_AT
    assert alert.interval == dt.timedelta(seconds=expected_run(kind, Settings.from_env())[0])
    assert isinstance(alert.callback, AsyncCallback)
    assert alert.callback.path == "tritonflow_plugin.notifications.TritonflowFailureNotifier"
    assert "margin" in alert.callback.kwargs["expected"]


def test_a_missed_deadline_is_logged_with_the_run_its_state_and_the_expected_time(caplog):
    import asyncio

    context = {"dag_run": {"dag_id": "canary_rollback", "dag_run_id": "manual__1", "state": "running"},
               "deadline": {"id": "d1", "deadline_time": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}}
    message = deadline_message(context, "2 x 120 s READY wait + 900 s margin = 1140 s")
    assert message["text"] == ("tritonflow: run manual__1 of canary_rollback overran its deadline "
                               "2026-01-01T00:00:00+00:00 (state running; expected 2 x 120 s READY wait + 900 s "
                               "margin = 1140 s)")
    notifier = TritonflowFailureNotifier(webhook_url="", expected="1 s", context=context)
    asyncio.run(_await(notifier))
    assert notifier.last_message["run_id"] == "manual__1" and "overran its deadline" in caplog.text
    assert run_deadline("rollback", seconds=3).interval == dt.timedelta(seconds=3)
    failed = {**context, "dag_run": {**context["dag_run"], "state": "failed"}}
    quiet = TritonflowFailureNotifier(webhook_url="http://127.0.0.1:9/never", expected="1 s", context=failed)
    asyncio.run(_await(quiet))
    assert quiet.last_message is None  # its failure was reported when it failed


async def _await(notifier):
    await notifier


def test_the_alerts_can_be_turned_off_but_a_bad_kind_still_fails(monkeypatch):
    monkeypatch.setenv("TRITONFLOW_DEADLINE_ALERTS", "false")
    assert run_deadline("canary") is None
    with pytest.raises(ValueError, match="run kind 'nightly'"):
        run_deadline("nightly")


def test_a_dag_parsed_by_airflow_dags_test_carries_no_deadline(monkeypatch):
    from tritonflow_plugin.deadlines import under_dags_test

    assert under_dags_test(["/opt/venv/bin/airflow", "dags", "test", "model_publish", "-c", "{}"])
    assert not under_dags_test(["/opt/venv/bin/airflow", "dag-processor"])
    assert not under_dags_test(["/usr/bin/python3", "-m", "pytest"])
    monkeypatch.setattr("sys.argv", ["/opt/venv/bin/airflow", "dags", "test", "canary_promotion"])
    assert run_deadline("canary") is None  # Airflow 3.3.2 would leave that run 'running'
