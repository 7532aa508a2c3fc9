"""Task ``choose_version`` of ``canary_rollback``: at once when the form decided, else the model's
signed versions offered to a person (read from a real MLflow when the task runs), and the answer
turned back into a version."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pytest
from airflow.providers.standard.operators.hitl import HITLOperator

from tritonflow_plugin.rollback_choice import CHOICES_XCOM_KEY, RollbackChoiceOperator

DAGS = Path(__file__).resolve().parents[2] / "dags"


class FakeTI:
    def __init__(self):
        self.pushed, self.id, self.task_id = {}, "ti-1", "choose_version"

    def xcom_pull(self, task_ids=None, key=None):
        return self.pushed.get(key)

    def xcom_push(self, key, value):
        self.pushed[key] = value


def test_the_choice_comes_before_the_rollback_and_the_form_offers_a_version_and_the_box():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "canary_rollback.py"), safe_mode=False)
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["canary_rollback"]
    choice = dag.get_task("choose_version")
    assert isinstance(choice, HITLOperator) and choice.downstream_task_ids == {"rollback"}
    assert choice.response_timeout and choice.response_timeout > dt.timedelta(0)
    assert {"to_version", "choose_version", "reason"} <= set(dag.params)


@pytest.mark.parametrize(("params", "version"), [({"to_version": 3, "choose_version": True}, 3),
                                                   ({"to_version": None, "choose_version": False}, None)])
def test_the_form_decides_without_asking_anyone(monkeypatch, params, version):
    import airflow.providers.standard.operators.hitl as hitl

    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kw: pytest.fail("asked a person"))
    ti = FakeTI()
    out = RollbackChoiceOperator(task_id="choose_version").execute(
        {"ti": ti, "task_instance": ti, "params": {"model": "iris", **params}})
    assert out == {"version": version, "chosen_by": "form"}


def test_with_the_box_ticked_a_person_picks_among_the_signed_versions(mlflow_server, tmp_path, monkeypatch):
    import airflow.providers.standard.operators.hitl as hitl
    from airflow.sdk.exceptions import TaskAwaitingInput
    from mlflow import MlflowClient

    monkeypatch.setenv("TRITONFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("TRITONFLOW_MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    name = f"choose-{uuid.uuid4().hex[:6]}"
    client = MlflowClient(mlflow_server.tracking_uri)
    client.create_registered_model(name)
    for v in ("1", "2", "3"):
        client.create_model_version(name, source="s3://nowhere/model")
        client.set_model_version_tag(name, v, "tritonflow.signature_digest", "sha256:abc")
    client.set_registered_model_alias(name, "previous_champion", "2")
    client.set_registered_model_alias(name, "champion", "3")
    asked = {}
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kw: asked.update(kw))
    op = RollbackChoiceOperator(task_id="choose_version")
    ti = FakeTI()
    with pytest.raises(TaskAwaitingInput):
        op.execute({"ti": ti, "task_instance": ti, "params": {"model": name, "to_version": None,
                                                              "choose_version": True, "reason": "p99 doubled"}})
    assert asked["options"] == ["v2 (previous_champion)", "v1"] and asked["defaults"] == ["v2 (previous_champion)"]
    assert name in asked["subject"] and "p99 doubled" in asked["body"]
    assert ti.pushed[CHOICES_XCOM_KEY] == asked["options"]
    fresh = RollbackChoiceOperator(task_id="choose_version")  # after the wait: a new process, no options yet
    event = {"chosen_options": ["v1"], "params_input": {}, "responded_by_user": {"id": "1", "name": "alice"},
             "responded_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}
    assert fresh.execute_complete({"ti": ti, "task": fresh}, event) == {"version": 1, "chosen_by": "alice"}
