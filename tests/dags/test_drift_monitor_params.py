"""drift_monitor wiring: params read the settings when a run starts; the drift event waits for
the data-quality gate."""

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
    for ok in (None, "training", "trailing", "seasonal"):  # an optional enum can be cleared
        spec.resolve(ok)
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError):
        spec.resolve("weekly")


def test_the_drift_event_is_emitted_only_after_the_data_quality_gate(drift_dag):
    event = drift_dag.get_task("drift_event")
    assert "data_quality_gate" in event.upstream_task_ids and event.trigger_rule == "all_done"
