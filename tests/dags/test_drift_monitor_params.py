"""drift_monitor wiring: params read the settings when a run starts; models are checked in batches;
the data-quality gate runs after every stage and decides the run's state."""

from pathlib import Path

import pytest

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "drift_monitor.py"


@pytest.fixture(scope="module")
def drift_dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE), safe_mode=False)
    assert bag.import_errors == {}
    return bag.dags["drift_monitor"]


def test_reference_strategy_and_evidently_rows_default_to_the_settings_at_run_time(drift_dag):
    params = drift_dag.params
    assert params["reference_strategy"] is None and params["evidently_sample_rows"] is None
    spec = params.get_param("reference_strategy")
    for ok in (None, "training", "trailing", "seasonal", "training_seasonal"):  # an optional enum can be cleared
        spec.resolve(ok)
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError):
        spec.resolve("weekly")


def test_the_data_quality_gate_runs_after_every_stage_so_a_failure_fails_the_run(drift_dag):
    # the gate runs whatever happened upstream (all_done); the run's leaves are the follow-up
    # trigger after it (upstream_failed when the gate failed) and the drift events (retries=0): the
    # run fails when any model failed anywhere or an event was not emitted
    gate = drift_dag.get_task("data_quality_gate")
    assert gate.trigger_rule == "all_done" and gate.retries == 0
    assert gate.upstream_task_ids == {"models", "check", "record", "decide", "evidently", "profile"}
    assert {t.task_id for t in drift_dag.tasks if not t.downstream_task_ids} == {"trigger_followup_retrain",
                                                                                  "drift_event"}
    assert drift_dag.get_task("drift_event").retries == 0
    assert drift_dag.get_task("trigger_followup_retrain").upstream_task_ids == {"data_quality_gate"}
    assert drift_dag.get_task("trigger_followup_retrain").trigger_rule == "all_success"
    # the asset events go out after the hour was recorded and decided, one per alerting model
    event = drift_dag.get_task("drift_event")
    assert event.upstream_task_ids == {"record", "decide"}
    # decide does not wait for record and the gate does not wait for the events: the hour's
    # chain is models -> check -> record | decide -> data_quality_gate
    assert drift_dag.get_task("decide").upstream_task_ids == {"check"}
    assert drift_dag.get_task("record").upstream_task_ids == {"check", "evidently"}
    assert not {"alerts", "followups"} & set(drift_dag.task_ids)  # folded into decide, record and the gate


def test_models_are_batched_per_task_from_the_setting():
    from ground.settings import Settings
    from tritonflow.pipelines.drift_batches import batch_models

    targets = [{"model": f"m{i:02d}", "version": 1} for i in range(23)]
    batches = batch_models(targets, settings=Settings.from_env({"TRITONFLOW_DRIFT_MODELS_PER_TASK": "10"}))
    assert [len(b) for b in batches] == [10, 10, 3] and sum(batches, []) == targets
    assert batch_models([], per_task=10) == []
    from ground.exceptions import SettingsError

    with pytest.raises(SettingsError, match="TRITONFLOW_DRIFT_MODELS_PER_TASK=0"):
        batch_models(targets, per_task=0)
