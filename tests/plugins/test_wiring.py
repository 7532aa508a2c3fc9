"""The wiring every DAG file shares (``tritonflow_plugin.wiring``): the DAG header and data tasks."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from ground.exceptions import ConcurrencyError, ModelConfigError, ServiceUnavailableError
from tritonflow_plugin.dag_defaults import DEFAULT_ARGS, START_DATE, TAG
from tritonflow_plugin.links import LinkedPythonOperator
from tritonflow_plugin.wiring import data_task, tritonflow_dag
from tritonflow_plugin.xcom import XCOM_LIMITED_ATTR, XComTooLargeError


def _build(**task_kwargs):
    """A one-task DAG built with the shared header; returns (dag, the task's operator)."""

    @tritonflow_dag("wiring_probe", schedule=None, topics=["probe"], description="probe",
                    doc_md="probe", params={}, max_active_tasks=3)
    def wiring_probe():
        @data_task(**task_kwargs)
        def work(kind: str) -> dict:
            if kind == "bad":
                raise ModelConfigError("model 'm': dims [1, 12] expected [12]")
            if kind == "flaky":
                raise ServiceUnavailableError("triton at 127.0.0.1:8000 did not answer")
            if kind == "locked":
                raise ConcurrencyError("promotion lock of 'm' held by run r1")
            if kind == "huge":
                return {"blob": "x" * 2_000_000}
            return {"kind": kind}

        work("ok")

    built = wiring_probe()
    return built, built.get_task("work")


def test_every_dag_gets_the_shared_start_date_tag_defaults_and_no_catchup():
    built, _ = _build()
    assert built.start_date == START_DATE
    assert built.catchup is False
    assert sorted(built.tags) == sorted([TAG, "probe"])
    assert built.default_args["on_execute_callback"] is DEFAULT_ARGS["on_execute_callback"]
    assert built.max_active_runs == 1 and built.max_active_tasks == 3


def test_data_task_fails_bad_data_at_once_and_leaves_flakes_to_retries():
    _, op = _build()
    call = op.python_callable
    assert getattr(call, XCOM_LIMITED_ATTR, False)
    assert call("ok") == {"kind": "ok"}
    with pytest.raises(AirflowFailException, match="ModelConfigError"):
        call("bad")
    with pytest.raises(ServiceUnavailableError):
        call("flaky")
    with pytest.raises(AirflowFailException, match="XComTooLargeError") as too_large:
        call("huge")  # an oversized return is the task's bug: retrying would return it again
    assert isinstance(too_large.value.__cause__, XComTooLargeError)


@pytest.mark.parametrize(("policy", "raised"), [("fail", AirflowFailException), ("skip", AirflowSkipException),
                                                 (None, ConcurrencyError)])
def test_lock_held_by_another_run_follows_the_declared_policy(policy, raised):
    _, op = _build(when_locked=policy)
    with pytest.raises(raised, match="held by run r1"):
        op.python_callable("locked")


def test_links_declare_the_link_buttons_and_task_arguments_pass_through():
    _, op = _build(links=True, retries=0)
    assert isinstance(op, LinkedPythonOperator)
    assert op.retries == 0


def test_an_unknown_lock_policy_is_refused_when_the_dag_file_is_parsed():
    with pytest.raises(ValueError, match="expected 'fail' or 'skip'"):
        data_task(when_locked="wait")
