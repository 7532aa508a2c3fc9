"""Settings are typed, read from TRITONFLOW_* variables only when asked, and fail clearly."""

from pathlib import Path

import pytest

from ground import settings as settings_module
from ground.exceptions import SettingsError
from ground.settings import DEFAULTS, Settings


def test_defaults_apply_when_no_variable_is_set():
    s = Settings.from_env({})
    assert s.triton_http_port == DEFAULTS.triton_http_port
    assert s.resolved_repository_uri == str(s.home / "model_repository")
    assert s.resolved_mlflow_backend_uri.startswith("sqlite:///")


def test_variables_are_converted_to_the_field_type():
    s = Settings.from_env({"TRITONFLOW_TRITON_HTTP_PORT": "9100", "TRITONFLOW_HOME": "/tmp/tf-home",
                           "TRITONFLOW_START_TIMEOUT_S": "2.5"})
    assert s.triton_http_port == 9100
    assert s.home == Path("/tmp/tf-home")
    assert s.start_timeout_s == 2.5


def test_a_malformed_variable_names_the_variable_the_value_and_the_type():
    with pytest.raises(SettingsError, match=r"TRITONFLOW_MLFLOW_PORT='fifty' is not a valid int"):
        Settings.from_env({"TRITONFLOW_MLFLOW_PORT": "fifty"})


def test_overrides_win_over_the_environment():
    s = Settings.from_env({"TRITONFLOW_GATEWAY_PORT": "9000"}, gateway_port=9001)
    assert s.gateway_port == 9001


def test_importing_the_module_reads_nothing_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRITONFLOW_TRITON_HTTP_PORT", "not-a-number")
    import importlib

    importlib.reload(settings_module)  # must not raise: nothing is read at import time
    with pytest.raises(SettingsError):
        settings_module.get_settings()


def test_every_field_is_documented_for_the_configuration_reference():
    rows = Settings.describe()
    assert rows and all(name.startswith("TRITONFLOW_") and doc for name, _, doc in rows)
    assert len({name for name, _, _ in rows}) == len(rows)


def test_the_defaults_object_is_the_settings_of_an_empty_environment():
    assert DEFAULTS == Settings.from_env({})


def test_no_module_writes_a_setting_default_a_second_time():
    """A setting's default is written once, on its field: no ``DEFAULT_<FIELD>`` constant elsewhere."""
    import ast

    root = Path(__file__).resolve().parents[2]
    fields = {f.upper() for f in Settings.__dataclass_fields__}
    twice = []
    for package in ("ground", "drift_checks", "repository_sync", "model_registry", "tritonflow", "plugins", "dags"):
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                for target in targets:
                    if isinstance(target, ast.Name) and target.id.startswith("DEFAULT_") \
                            and target.id[len("DEFAULT_"):] in fields:
                        twice.append(f"{path.relative_to(root)}:{node.lineno} {target.id}")
    assert twice == []


def test_each_checked_field_refuses_a_bad_value_and_names_it():
    from ground.settings_checks import settings_problems

    bad = Settings.from_env({"TRITONFLOW_CANARY_CONFIDENCE": "1.5", "TRITONFLOW_DRIFT_ENGINE": "sparc"})
    problems = settings_problems(bad)
    assert "TRITONFLOW_CANARY_CONFIDENCE=1.5: expected a fraction between 0 and 1" in problems
    assert "TRITONFLOW_DRIFT_ENGINE='sparc': expected one of local, spark" in problems
    assert len(problems) == 2


def test_an_approval_timeout_of_zero_is_refused_because_airflow_would_then_wait_forever():
    # Airflow's HITL operators read a zero response timeout as none: the approval would never
    # default to reject, against what the setting promises
    from ground.settings_checks import settings_problems

    problems = settings_problems(Settings.from_env({"TRITONFLOW_APPROVAL_TIMEOUT_H": "0"}))
    assert problems == ["TRITONFLOW_APPROVAL_TIMEOUT_H=0.0: expected a finite number > 0"], problems
    assert settings_problems(Settings.from_env({"TRITONFLOW_APPROVAL_TIMEOUT_H": "0.002"})) == []
