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
