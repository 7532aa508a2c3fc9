"""The ``approval`` task of ``canary_promotion``: between the resolved versions and the canary,
a no-op under policy ``auto``, a wait for a person under ``approve``, the answer recorded."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from airflow.providers.standard.operators.hitl import ApprovalOperator

from tritonflow_plugin.approval import COMMENT_PARAM, CanaryApprovalOperator, approval_needed

DAGS = Path(__file__).resolve().parents[2] / "dags"
PLAN = {"model": "iris", "champion": 1, "challenger": 2, "noop": False, "dry_run": False}


class FakeTI:
    def __init__(self, plan: dict):
        self.plan, self.pushed, self.id = plan, {}, "ti-1"

    def xcom_pull(self, task_ids=None, key=None):
        return self.pushed.get(key) if key else self.plan

    def xcom_push(self, key, value):
        self.pushed[key] = value


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "canary_promotion.py"), safe_mode=False)
    assert not bag.import_errors, bag.import_errors
    return bag.dags["canary_promotion"]


def test_approval_task_sits_between_the_resolved_versions_and_the_canary(dag):
    approval = dag.get_task("approval")
    assert isinstance(approval, ApprovalOperator)
    assert approval.upstream_task_ids == {"resolve_versions"}
    assert "preflight" in approval.downstream_task_ids
    assert {"load_side_by_side", "canary"} <= {t.task_id for t in approval.get_flat_relatives(upstream=False)}
    assert approval.defaults == [ApprovalOperator.REJECT]  # the answer on timeout
    assert approval.response_timeout and approval.response_timeout > dt.timedelta(0)
    assert approval.ignore_downstream_trigger_rules  # a rejection skips every later task


def test_the_approval_form_has_an_optional_comment_field_and_none_of_the_dag_params(dag):
    form = dag.get_task("approval").serialized_params  # what the Required Actions form renders
    assert list(form) == [COMMENT_PARAM] and form[COMMENT_PARAM]["source"] == "task"
    assert "null" in form[COMMENT_PARAM]["schema"]["type"]  # may be left empty: not a required field


def test_approval_is_needed_only_under_an_approval_policy_and_never_for_a_no_op():
    assert not approval_needed(PLAN, "auto")
    assert approval_needed(PLAN, "approve")
    assert approval_needed(PLAN, "approve-steps")
    assert not approval_needed({**PLAN, "noop": True}, "approve")
    assert not approval_needed({**PLAN, "dry_run": True}, "approve")
    assert not approval_needed({**PLAN, "challenger": 1}, "approve")


def test_under_auto_the_approval_returns_at_once_without_asking_anyone(monkeypatch):
    import airflow.providers.standard.operators.hitl as hitl

    import tritonflow.pipelines.promotion_policy as pp

    monkeypatch.setattr(pp, "promotion_policy", lambda model, **kw: "auto")
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kw: pytest.fail("asked a person under auto"))
    op = CanaryApprovalOperator(task_id="approval")
    ti = FakeTI(PLAN)
    assert op.execute({"ti": ti, "task_instance": ti}) == {"policy": "auto", "approval": "not required"}
    assert ti.pushed["promotion_policy"] == "auto"


def test_under_approve_the_task_writes_its_request_and_waits(monkeypatch):
    import airflow.providers.standard.operators.hitl as hitl
    from airflow.sdk.exceptions import TaskAwaitingInput

    import tritonflow.pipelines.promotion_policy as pp
    import tritonflow_plugin.loop as loop

    asked = {}
    monkeypatch.setattr(pp, "promotion_policy", lambda model, **kw: "approve")
    monkeypatch.setattr(pp, "approvers", lambda model, **kw: ["alice"])
    monkeypatch.setattr(pp, "approval_request", lambda plan, **kw: {"subject": "S?", "body": "**figures**"})
    monkeypatch.setattr(loop, "loop_context", lambda context: None)
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kw: asked.update(kw))
    op = CanaryApprovalOperator(task_id="approval")
    ti = FakeTI(PLAN)
    with pytest.raises(TaskAwaitingInput):
        op.execute({"ti": ti, "task_instance": ti})
    assert asked["subject"] == "S?" and asked["body"] == "**figures**"
    assert asked["defaults"] == ["Reject"] and asked["assigned_users"] == [{"id": "alice", "name": "alice"}]


@pytest.mark.parametrize(("event", "approved", "by", "note"), [
    ({"chosen_options": ["Approve"], "params_input": {}, "responded_by_user": {"id": "1", "name": "alice"},
      "responded_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}, True, "alice", ""),
    ({"chosen_options": ["Reject"], "params_input": {}, "responded_by_user": None,
      "responded_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}, False, "", "timed out"),
])
def test_the_answer_is_recorded_on_the_challenger(monkeypatch, event, approved, by, note):
    import tritonflow.pipelines.promotion_policy as pp

    calls = []
    monkeypatch.setattr(pp, "record_answer", lambda *a, **kw: calls.append((a, kw)))
    op = CanaryApprovalOperator(task_id="approval")
    ti = FakeTI(PLAN)
    ti.pushed["promotion_policy"] = "approve"
    out = op.execute_complete({"ti": ti, "task": op}, event)
    assert out["chosen_options"] == event["chosen_options"]
    (args, kw), = calls
    assert args == ("iris", 2) and kw["approved"] is approved and kw["by"] == by and kw["policy"] == "approve"
    assert note in kw["note"] and kw["at"].startswith("2026-01-01")


# ------------------------------------------------------------------ decisions at canary pauses (approve-steps)
def test_one_step_decision_task_per_pause_runs_beside_the_canary_not_after_it(dag):
    from tritonflow_plugin.step_decisions import StepDecisionOperator

    decision = dag.get_task("step_decision")
    assert decision.operator_class is StepDecisionOperator or issubclass(decision.operator_class, StepDecisionOperator)
    assert decision.upstream_task_ids == {"pause_numbers"}
    assert dag.get_task("pause_numbers").upstream_task_ids == {"resolve_versions", "load_side_by_side"}
    assert "canary" not in {t.task_id for t in decision.get_flat_relatives(upstream=True)}
    assert "step_decision" not in {t.task_id for t in dag.get_task("canary").get_flat_relatives(upstream=False)}


def test_pauses_exist_only_for_a_real_canary_under_approve_steps():
    from tritonflow_plugin.step_decisions import pause_numbers

    assert pause_numbers(PLAN, "approve-steps", steps=2, max_extensions=1) == [1, 2, 3, 4]
    assert pause_numbers(PLAN, "approve", steps=2, max_extensions=1) == []
    assert pause_numbers(PLAN, "auto", steps=2, max_extensions=1) == []
    assert pause_numbers({**PLAN, "dry_run": True}, "approve-steps", steps=2, max_extensions=1) == []
    assert pause_numbers({**PLAN, "challenger": 1}, "approve-steps", steps=2, max_extensions=1) == []


class RunTI(FakeTI):
    dag_id, run_id, task_id, map_index = "canary_promotion", "manual__1", "step_decision", 0


@pytest.fixture
def board(tmp_path, monkeypatch):
    """A pause board on a real SQLite coordination database, which the tasks' settings name."""
    from ground.coordination import CoordinationStore
    from tritonflow.pipelines.canary_pauses import PauseBoard, pause_key

    url = f"sqlite:///{tmp_path / 'coordination.db'}"
    monkeypatch.setenv("TRITONFLOW_COORDINATION_DB_URL", url)
    monkeypatch.setenv("TRITONFLOW_HOME", str(tmp_path))
    store = CoordinationStore(url)
    b = PauseBoard(store, pause_key("canary_promotion", "manual__1"), slots=4, timeout_s=600)
    b.start(model="iris", challenger=2, champion=1, canary_id="c1")
    return b


class Analysis:
    def __init__(self, verdict="pass", attempt=1):
        self.verdict, self.attempt = verdict, attempt

    def to_dict(self):
        return {"step": 1, "percent": 25, "attempt": self.attempt, "verdict": self.verdict, "reasons": ["ok"],
                "canary_requests": 300.0, "thresholds": {"min_requests": 100}}


def test_a_pause_task_waits_in_the_triggerer_until_its_pause_opens(board, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    from tritonflow_plugin.step_decisions import PauseTrigger, StepDecisionOperator

    op = StepDecisionOperator(task_id="step_decision", number=1, wait_until_s=3600)
    ti = RunTI(PLAN)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti, "task_instance": ti})
    trigger = deferred.value.trigger
    assert isinstance(trigger, PauseTrigger) and trigger.key == "canary_promotion/manual__1"
    assert trigger.number == 1 and trigger.wait_for == "opened" and deferred.value.method_name == "pause_opened"


def test_an_open_pause_is_asked_with_its_verdict_checks_options_and_default(board, monkeypatch):
    import airflow.providers.standard.operators.hitl as hitl
    from airflow.sdk.exceptions import TaskDeferred

    import tritonflow.pipelines.promotion_policy as pp
    from tritonflow_plugin.step_decisions import StepDecisionOperator

    asked = {}
    monkeypatch.setattr(pp, "approvers", lambda model, **kw: ["alice"])
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kw: asked.update(kw))
    board.open(Analysis(attempt=2), ("continue", "rollback"), "continue")
    op = StepDecisionOperator(task_id="step_decision", number=1, wait_until_s=3600)
    ti = RunTI(PLAN)
    with pytest.raises(TaskDeferred) as waiting:
        op.execute({"ti": ti, "task_instance": ti})
    assert asked["subject"] == "Canary of iris v2 at 25 %: pass (Continue / Roll back)?"
    assert asked["options"] == ["Continue", "Roll back"] and asked["defaults"] == ["Continue"]
    assert "| challenger requests | 300 | >= 100 |" in asked["body"]
    assert asked["assigned_users"] == [{"id": "alice", "name": "alice"}] and asked["ti_id"] == "ti-1"
    # deferred (the UI enables the buttons) until answered, or until the canary decides without it
    trigger = waiting.value.trigger
    assert (trigger.wait_for, trigger.ti_id, waiting.value.method_name) == ("decided", "ti-1", "execute_complete")
    assert board.clock() + 600 < trigger.until <= board.clock() + 600 + 60  # the pause's deadline, then a minute


def test_a_pause_the_canary_decided_first_ends_its_task_and_one_never_reached_is_skipped(board):
    from airflow.sdk.exceptions import AirflowSkipException

    from tritonflow_plugin.step_decisions import StepDecisionOperator

    op = StepDecisionOperator(task_id="step_decision", number=1, wait_until_s=3600)
    ti = RunTI(PLAN)
    decided = {"decision": "rollback", "source": "check", "note": "error rate 0.2 > 0.01", "by": ""}
    out = op.execute_complete({"ti": ti, "task": op}, {"pause_state": "closed", "decision": decided})
    assert out["decision"] == "rollback" and not out["taken"] and "check: error rate" in out["why"]
    with pytest.raises(AirflowSkipException, match="ended before it was decided"):
        op.execute_complete({"ti": ti, "task": op}, {"pause_state": "ended"})


def test_the_trigger_fires_when_its_pause_opens_or_the_canary_ends(board):
    import asyncio

    from tritonflow_plugin.step_decisions import PauseTrigger

    url = str(board.store.engine.url)
    first = PauseTrigger(url, board.key, 1, poll_s=0.01)
    board.open(Analysis(), ("continue", "hold", "rollback"), "continue")
    assert asyncio.run(anext(first.run())).payload == {"state": "open"}
    board.end("promoted")
    assert asyncio.run(anext(PauseTrigger(url, board.key, 2, poll_s=0.01).run())).payload == {"state": "ended"}
    classpath, kwargs = first.serialize()
    assert classpath == "tritonflow_plugin.step_decisions.PauseTrigger" and PauseTrigger(**kwargs).number == 1


def test_the_answer_goes_to_the_pause_and_a_late_one_is_not_applied(board):
    import datetime as _dt

    from tritonflow.pipelines.canary_pauses import pause_status
    from tritonflow_plugin.step_decisions import StepDecisionOperator

    board.open(Analysis(), ("continue", "hold", "rollback"), "continue")
    op = StepDecisionOperator(task_id="step_decision", number=1, wait_until_s=3600)
    ti = RunTI(PLAN)
    event = {"chosen_options": ["Hold"], "params_input": {"comment": "more traffic first"},
             "responded_by_user": {"id": "1", "name": "alice"},
             "responded_at": _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)}
    out = op.execute_complete({"ti": ti, "task": op}, event)
    assert out["taken"] and out["decision"] == "hold" and out["by"] == "alice"
    answer = board.answer(1)
    assert (answer.decision, answer.by, answer.note, answer.source) == ("hold", "alice", "more traffic first",
                                                                      "person")
    assert answer.at.startswith("2026-01-01")
    assert pause_status(board.store, board.key, 1)["state"] == "open"  # until the canary applies it
    late = op.execute_complete({"ti": ti, "task": op}, {**event, "chosen_options": ["Roll back"]})
    assert not late["taken"] and "already decided: hold" in late["why"]
