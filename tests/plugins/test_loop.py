"""Run-time wiring shared by the loop DAGs (``tritonflow_plugin.loop``): the conf validated on
arrival, params that default to the settings in effect when the run starts, quiet third-party output.

The DAG files are parsed by Airflow's real DagBag; the run context handed to the helpers is the
part of Airflow's task context they read (``dag``, ``dag_run.conf``, ``params``).
"""

from __future__ import annotations

import logging
import os
import types
import warnings

import pytest

from ground.exceptions import SettingsError
from tests.plugins import airflow_env

DAGS = airflow_env.REPO / "dags"
LOOP_DAGS = ("model_publish", "shadow_evaluation", "retrain", "canary_promotion")


@pytest.fixture(scope="module")
def bag():
    from airflow.dag_processing.dagbag import DagBag

    dagbag = DagBag(dag_folder=str(DAGS), safe_mode=False)
    assert dagbag.import_errors == {}
    return dagbag


def _context(dag, conf, params=None):
    return {"dag": dag, "dag_run": types.SimpleNamespace(conf=conf, dag_id=dag.dag_id),
            "params": params if params is not None else {k: dag.params[k] for k in dag.params}}


@pytest.mark.parametrize("dag_id", LOOP_DAGS)
def test_every_triggered_dag_accepts_the_loop_context_and_refuses_unknown_keys(bag, dag_id):
    from tritonflow_plugin.loop import loop_context

    dag = bag.dags[dag_id]
    assert "loop" in dag.params
    ctx = loop_context(_context(dag, {"loop": {"model": "churn", "version": "7", "triggered_by": "retrain"}}))
    assert (ctx.model, ctx.version) == ("churn", "7")
    assert loop_context(_context(dag, {})) is None
    with pytest.raises(SettingsError, match=r"'lopo' is not a parameter .*did you mean 'loop'"):
        loop_context(_context(dag, {"lopo": {"model": "churn"}}))
    with pytest.raises(SettingsError, match=r"conf\.loop\.versoin .*did you mean 'version'"):
        loop_context(_context(dag, {"loop": {"model": "churn", "versoin": "7", "triggered_by": "retrain"}}))


@pytest.mark.parametrize("dag_id, params", [
    ("canary_promotion", ("steps", "bake_s", "min_requests")),
    ("model_publish", ("atol", "rtol")),
    ("retrain", ("model",)),
])
def test_params_backed_by_a_setting_default_to_empty_not_to_a_constant(bag, dag_id, params):
    dag = bag.dags[dag_id]
    for name in params:
        assert dag.params[name] is None, f"{dag_id}.{name} default shadows its setting"


def test_the_canary_uses_the_settings_in_effect_when_the_run_starts(bag, monkeypatch, caplog):
    import importlib.util

    spec = importlib.util.spec_from_file_location("canary_promotion_dag", DAGS / "canary_promotion.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # parsed before the settings change: nothing read at parse time
    monkeypatch.setenv("TRITONFLOW_CANARY_STEPS", "10,100")
    monkeypatch.setenv("TRITONFLOW_CANARY_BAKE_S", "42")
    monkeypatch.setenv("TRITONFLOW_CANARY_MIN_REQUESTS", "7")
    dag = bag.dags["canary_promotion"]
    conf = {"loop": {"model": "churn", "version": "5", "triggered_by": "shadow_evaluation",
                     "expected_predictions": "/x/expected.parquet"}}
    params = {k: dag.params[k] for k in dag.params}
    with caplog.at_level(logging.INFO, logger="tritonflow_plugin.loop"):
        req = module._request(params, _context(dag, conf, params))
    assert (req["model"], req["challenger"], req["expected_predictions"]) == ("churn", "5", "/x/expected.parquet")
    assert (req["steps"], req["bake_s"], req["min_requests"]) == ("10,100", 42.0, 7)
    assert "setting in effect TRITONFLOW_CANARY_STEPS='10,100'" in caplog.text
    given = module._request({**params, "bake_s": 5}, _context(dag, {}, {**params, "bake_s": 5}))
    assert given["bake_s"] == 5.0  # a value given in the run wins


def test_third_party_deprecation_warnings_and_progress_bars_are_quieted_once(monkeypatch):
    from airflow.utils.deprecation_tools import DeprecatedImportWarning  # imported first: airflow sets filters

    from tritonflow_plugin.loop import quiet_third_party

    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    quiet_third_party()  # an earlier call in the same process must not make the next one a no-op
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()
        warnings.warn_explicit("old onnx API", DeprecationWarning, "helper.py", 1, module="onnx.helper")
        warnings.warn_explicit("old sklearn API", FutureWarning, "base.py", 1, module="sklearn.base")
        # what skops' module probing fired 1,160 times per conversion
        warnings.warn_explicit("The `airflow.utils.timezone.x` attribute is deprecated", DeprecatedImportWarning,
                               "_utils.py", 70, module="skops.io._utils")
        warnings.warn_explicit("our own", DeprecationWarning, "publish.py", 1, module="tritonflow.pipelines.publish")
    assert [str(w.message) for w in caught] == ["our own"]  # ours still show
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")
    quiet_third_party()
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "true"  # an operator's choice stands
