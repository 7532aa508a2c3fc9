"""DAG integrity: every DAG in dags/ imports fast with no network, and follows the house rules.

Guards: a DAG file over the import timeout disappears; a fire-and-forget trigger stuck in
DEFERRED; every task has an execution_timeout. The import budget is Airflow's own
``dagbag_import_timeout`` (set to :data:`IMPORT_BUDGET_S`), so a slow file becomes an import error
the way it would in the DAG processor, not a timing assertion.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.plugins import airflow_env
from tritonflow_plugin.dag_integrity import (
    check_docs_and_tags,
    check_execution_timeouts,
    check_param_descriptions,
    check_trigger_deferrable,
    missing_dag_ids,
)

DAGS = airflow_env.REPO / "dags"
#: Seconds a DAG file may take to import (Airflow's default import timeout is 30 s).
IMPORT_BUDGET_S = 2
DAG_FILES = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))
PRODUCT_FILES = [p for p in DAG_FILES if p.name != "example_integrity.py"]

HEAVY_TOP_LEVEL_DAG_SOURCE = textwrap.dedent('''\
    from __future__ import annotations
    import time
    import pendulum
    from airflow.sdk import dag, task

    time.sleep(45)   # stands in for: import torch, evidently, whylogs; MlflowClient().search_model_versions(...)

    @dag(schedule="@hourly", start_date=pendulum.datetime(2025, 1, 1, tz="UTC"), catchup=False, tags=["heldout"])
    def drift_monitor_heavy():
        @task
        def noop():
            return "ok"
        noop()

    drift_monitor_heavy()
''')

FIRE_AND_FORGET_TRIGGER_DAG_SOURCE = textwrap.dedent('''\
    from __future__ import annotations
    import pendulum
    from airflow.sdk import DAG
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

    with DAG(dag_id="drift_monitor_hourly_trigger", start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
             schedule=None, catchup=False, max_active_runs=1, default_args={"deferrable": True}):
        detect = EmptyOperator(task_id="detect_drift")
        kick = TriggerDagRunOperator(
            task_id="trigger_retrain", trigger_dag_id="retrain_pipeline",
            conf={"reason": "psi_above_p95", "window": "{{ data_interval_start }}"},
            wait_for_completion=False,
        )
        detect >> kick

    with DAG(dag_id="retrain_pipeline", start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
             schedule=None, catchup=False):
        EmptyOperator(task_id="train")
''')

BULKY_XCOM_DAG_SOURCE = textwrap.dedent('''\
    from __future__ import annotations
    import pendulum
    from airflow.sdk import dag, task

    @dag(schedule=None, start_date=pendulum.datetime(2025, 1, 1, tz="UTC"), catchup=False, tags=["heldout"])
    def hourly_histograms_xcom():
        @task
        def compute_histograms() -> list[list[int]]:
            return [[(f * 31 + b * 7) % 997 for b in range(80)] for f in range(1200)]

        @task(execution_timeout=pendulum.duration(minutes=5))
        def compare(hist: list[list[int]]) -> int:
            return sum(map(sum, hist))

        compare(compute_histograms())

    hourly_histograms_xcom()
''')


@pytest.fixture()
def no_network(monkeypatch):
    """Any outbound connection at parse time raises (no registry calls, no S3, no Triton)."""

    def refuse(self, address, *args, **kwargs):
        raise OSError(f"network access at DAG parse time: connect({address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", str(IMPORT_BUDGET_S))


def parse(path: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(path), safe_mode=False)


@pytest.fixture(scope="module")
def product_bag():
    if not DAG_FILES:
        pytest.skip("dags/ holds no DAG file yet")
    return parse(DAGS)


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_dag_file_imports_without_network_within_budget(path, no_network):
    bag = parse(path)
    assert bag.import_errors == {}, f"{path.name}: {bag.import_errors}"
    assert bag.dags, f"{path.name} defines no DAG"


def test_heavy_top_level_code_fails_the_import_check(tmp_path, no_network):
    path = tmp_path / "dag_heavy_toplevel.py"
    path.write_text(HEAVY_TOP_LEVEL_DAG_SOURCE)
    bag = parse(path)
    (error,) = bag.import_errors.values()
    assert "DagBag import timeout" in error and f"{IMPORT_BUDGET_S}" in error
    assert missing_dag_ids(bag.dag_ids, ["drift_monitor_heavy"]) == ["drift_monitor_heavy"]


def test_top_level_network_call_fails_the_import_check(tmp_path, no_network):
    path = tmp_path / "dag_registry_at_parse.py"
    path.write_text(FIRE_AND_FORGET_TRIGGER_DAG_SOURCE + "\nimport urllib.request\nurllib.request.urlopen('http://127.0.0.1:5000/health')\n")
    bag = parse(path)
    (error,) = bag.import_errors.values()
    assert "network access at DAG parse time" in error


def test_expected_dag_ids_are_all_parsed(product_bag):
    if not PRODUCT_FILES:
        pytest.skip("dags/ holds no product DAG file yet")
    assert product_bag.import_errors == {}
    assert missing_dag_ids(product_bag.dag_ids) == [], f"parsed: {sorted(product_bag.dag_ids)}"


def test_every_task_has_an_execution_timeout(product_bag):
    assert check_execution_timeouts(product_bag.dags.values()) == []


def test_every_task_that_returns_data_is_checked_against_the_xcom_size_limit(product_bag):
    from tritonflow_plugin.dag_integrity import check_xcom_limits

    assert check_xcom_limits(product_bag.dags.values()) == []


def test_a_task_returning_data_without_the_size_guard_is_reported(tmp_path):
    from tritonflow_plugin.dag_integrity import check_xcom_limits

    path = tmp_path / "dag_hourly_histograms.py"
    path.write_text(BULKY_XCOM_DAG_SOURCE)
    problems = check_xcom_limits(parse(path).dags.values())
    assert problems and all("XCom size limit" in p for p in problems)
    assert any(p.startswith("hourly_histograms_xcom.compute_histograms") for p in problems)


def test_lock_held_policy_fails_a_requested_change_and_skips_redundant_work():
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from ground.exceptions import ConcurrencyError
    from tritonflow_plugin.errors import when_lock_held

    def held():
        raise ConcurrencyError("promotion of 'churn' is held by canary_promotion/run-1")

    with pytest.raises(AirflowFailException, match="ConcurrencyError: .*canary_promotion/run-1"):
        when_lock_held("fail")(held)()
    with pytest.raises(AirflowSkipException, match="held by canary_promotion/run-1"):
        when_lock_held("skip")(held)()
    assert when_lock_held("skip")(lambda: 3)() == 3
    with pytest.raises(ValueError, match="'fail' or 'skip'"):
        when_lock_held("retry")


def test_fire_and_forget_triggers_never_defer_and_have_the_short_timeout():
    from tritonflow_plugin.dag_defaults import TIMEOUTS
    from tritonflow_plugin.wiring import fire_and_forget

    op = fire_and_forget("trigger_x", trigger_dag_id="retrain")
    assert op.wait_for_completion is False and op.deferrable is False
    assert op.execution_timeout == TIMEOUTS.short


def test_every_task_applies_the_airflow_connections_when_it_starts(product_bag):
    from tritonflow_plugin.connections import apply_connections

    missing = []
    for dag in product_bag.dags.values():
        for task in dag.tasks:
            callbacks = task.on_execute_callback
            callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
            if apply_connections not in callbacks:
                missing.append(f"{dag.dag_id}.{task.task_id}")
    assert missing == []


def test_task_without_execution_timeout_is_reported(tmp_path):
    path = tmp_path / "dag_hourly_histograms.py"
    path.write_text(BULKY_XCOM_DAG_SOURCE)
    problems = check_execution_timeouts(parse(path).dags.values())
    assert problems == [
        "hourly_histograms_xcom.compute_histograms: execution_timeout is None: expected a timedelta"
    ]


def test_trigger_tasks_defer_only_when_waiting_for_completion(product_bag):
    assert check_trigger_deferrable(product_bag.dags.values()) == []


def test_inherited_deferrable_on_fire_and_forget_trigger_is_reported(tmp_path):
    path = tmp_path / "dag_drift_trigger.py"
    path.write_text(FIRE_AND_FORGET_TRIGGER_DAG_SOURCE)
    (problem,) = check_trigger_deferrable(parse(path).dags.values())
    assert problem.startswith("drift_monitor_hourly_trigger.trigger_retrain: deferrable=True")


def test_every_dag_has_doc_md_tags_and_described_params(product_bag):
    dags = product_bag.dags.values()
    assert check_docs_and_tags(dags) + check_param_descriptions(dags) == []


def test_fire_and_forget_trigger_completes_and_next_run_is_not_blocked(tmp_path, airflow_home):
    """``airflow dags test`` equivalent (``dag.test()``) in a subprocess on the session's SQLite DB.

    The DAG is the case's input (``deferrable=True`` inherited from default_args, wait off),
    target renamed ``retrain_pipeline``. Two consecutive runs of the trigger DAG
    (``max_active_runs=1``) both succeed, each creating exactly one ``retrain_pipeline`` run with
    ``conf.reason == "psi_above_p95"``.
    """
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "dag_drift_trigger.py").write_text(FIRE_AND_FORGET_TRIGGER_DAG_SOURCE)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("fire_and_forget_run.py")), str(dags)],
        env=airflow_env.subprocess_env(AIRFLOW__CORE__DAGS_FOLDER=str(dags)),
        capture_output=True, text=True, timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["states"] == ["success", "success"]
    assert len(result["runs"]) == 2
    assert all(r["conf"]["reason"] == "psi_above_p95" for r in result["runs"])
    trigger_states = [s for _run, task, s in result["tis"] if task == "trigger_retrain"]
    assert trigger_states == ["success", "success"]
