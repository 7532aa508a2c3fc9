"""The ``tritonflow`` command without services: the runtime's service set, its ports and help, and
``tritonflow settings`` (sources and validation)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ground.exceptions import SettingsError
from ground.settings import Settings
from ground.settings_checks import settings_problems
from tritonflow import cli


def _tritonflow(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "tritonflow.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_the_default_service_set_includes_airflow():
    assert cli.ALL_SERVICES == ("s3", "mlflow", "triton", "gateway", "airflow")
    assert cli._parse_services(",".join(cli.ALL_SERVICES)) == list(cli.ALL_SERVICES)


def test_the_default_ports_of_all_services_do_not_clash(tmp_path):
    settings = Settings.from_env({}, home=tmp_path)
    ports: list[tuple[str, int]] = []
    for name, service in cli._services(settings, list(cli.ALL_SERVICES), str(tmp_path / "repo")):
        parts = service.services if name == "airflow" else [service]
        ports += [(f"{name}/{part.name}", port) for part in parts for port in part.ports()]
    by_port: dict[int, list[str]] = {}
    for owner, port in ports:
        by_port.setdefault(port, []).append(owner)
    assert {p: o for p, o in by_port.items() if len(o) > 1} == {}
    assert {port for _, port in ports} >= {5555, 5000, 8000, 8001, 8002, 8080, 8280, 8793, 8794}


def test_an_unknown_service_is_refused_naming_the_valid_ones():
    with pytest.raises(SystemExit, match=r"unknown service\(s\) \['airflwo'\]; expected a subset of "
                                         r"\['s3', 'mlflow', 'triton', 'gateway', 'airflow'\]"):
        cli._parse_services("s3,airflwo")


def test_runtime_help_lists_every_service_with_its_port_setting():
    out = _tritonflow("runtime", "--help").stdout
    for name in cli.KNOWN_SERVICES:
        assert f"\n  {name} " in out, name
    assert "TRITONFLOW_AIRFLOW_API_PORT (8280)" in out and "TRITONFLOW_GATEWAY_PORT (8080)" in out
    assert "s3, mlflow, triton, gateway, airflow" in " ".join(_tritonflow("--help").stdout.split())


def test_started_services_are_announced_with_their_urls(tmp_path):
    settings = Settings.from_env({}, home=tmp_path, mlflow_port=5123, airflow_api_port=8299)
    services = dict(cli._services(settings, list(cli.ALL_SERVICES), str(tmp_path / "repo")))
    urls = {name: " ".join(cli.service_urls(name, service)) for name, service in services.items()}
    assert "http://127.0.0.1:5555" in urls["s3"]
    assert "MLflow UI" in urls["mlflow"] and "http://127.0.0.1:5123" in urls["mlflow"]
    assert "http://127.0.0.1:8000" in urls["triton"] and "127.0.0.1:8001" in urls["triton"]
    assert "http://127.0.0.1:8002/metrics" in urls["triton"]
    assert "http://127.0.0.1:8080" in urls["gateway"]
    assert "Airflow UI" in urls["airflow"] and "http://127.0.0.1:8299" in urls["airflow"]
    assert "no login" in urls["airflow"]


def test_settings_name_their_source():
    out = cli.effective_settings({"TRITONFLOW_MLFLOW_PORT": "5001"})
    assert "TRITONFLOW_MLFLOW_PORT" in out
    line = next(row for row in out.splitlines() if row.startswith("TRITONFLOW_MLFLOW_PORT "))
    assert line.split("=", 1)[1].split() == ["5001", "(environment)"]
    line = next(row for row in out.splitlines() if row.startswith("TRITONFLOW_GATEWAY_PORT "))
    assert line.split("=", 1)[1].split() == ["8080", "(default)"]


@pytest.mark.parametrize("variable, value, expected", [
    ("TRITONFLOW_DRIFT_ENGINE", "sparc", "expected one of local, spark"),
    ("TRITONFLOW_GATEWAY_RELOAD", "signal", "expected one of local, watcher"),
    ("TRITONFLOW_CANARY_STEPS", "5,50", "the last step must be 100"),
    ("TRITONFLOW_DRIFT_QUANTILE", "95.0", "expected a fraction between 0 and 1"),
    ("TRITONFLOW_ANALYZER_MAX_BATCH_SIZES", "8,x", "expected comma-separated whole numbers >= 1"),
    ("TRITONFLOW_RETRAIN_ENTRY_POINTS", "model_registry.training:train_noaa", "expected a JSON object"),
    ("TRITONFLOW_AIRFLOW_PARALLELISM", "2", "expected >= 4"),
    ("TRITONFLOW_SHADOW_MIRROR_PERCENT", "150", "expected a percent between 0 and 100"),
    ("TRITONFLOW_DRIFT_MODELS_PER_TASK", "0", "expected a whole number >= 1"),
    ("TRITONFLOW_DRIFT_SUSTAINED_WINDOWS", "1", "expected 0 \\(run rule off\\) or a span >= 2"),
    ("TRITONFLOW_DRIFT_SUSTAINED_EVIDENCE", "1", "expected a whole number >= 2"),
])
def test_a_value_the_code_would_refuse_fails_the_settings_command(variable, value, expected):
    with pytest.raises(SettingsError, match=rf"{variable}='?{re.escape(value)}'?: .*{expected}"):
        cli.effective_settings({variable: value})


def test_the_defaults_are_valid():
    assert settings_problems(Settings.from_env({})) == []


def test_the_settings_command_exits_1_on_a_bad_value_and_0_otherwise():
    bad = _tritonflow("settings", env={"TRITONFLOW_DRIFT_WEIGHTING": "equal"})
    assert bad.returncode == 1
    assert "TRITONFLOW_DRIFT_WEIGHTING='equal': expected one of importance, uniform" in bad.stderr
    assert _tritonflow("settings", env={"TRITONFLOW_DRIFT_WEIGHTING": "uniform"}).returncode == 0


@pytest.mark.parametrize("args, message", [
    (["--url", "ftp://airflow/tritonflow/webhooks/mlflow", "--secret", "s"], "receiver url='ftp://airflow"),
    (["--url", "http://airflow:8080/tritonflow/webhooks/mlflow", "--secret", ""], "TRITONFLOW_WEBHOOK_SECRET"),
])
def test_register_refuses_bad_input_before_asking_mlflow(args, message, monkeypatch, capsys):
    monkeypatch.setenv("TRITONFLOW_WEBHOOK_SECRET", "")
    assert cli.main(["registry", "webhook", "register", "--tracking-uri", "http://127.0.0.1:9", *args]) == 1
    assert message in capsys.readouterr().err


def test_status_shows_aliases_policy_running_canary_and_last_decision(mlflow_server, tmp_path, monkeypatch, capsys):
    import json as _json
    import uuid

    from mlflow import MlflowClient

    name = f"status-{uuid.uuid4().hex[:6]}"
    client = MlflowClient(mlflow_server.tracking_uri)
    client.create_registered_model(name)
    for _ in range(2):
        client.create_model_version(name, source="s3://nowhere/model")
    client.set_registered_model_alias(name, "champion", "1")
    client.set_registered_model_tag(name, "tritonflow.promotion_policy", "approve")
    client.set_model_version_tag(name, "2", "tritonflow.shadow.outcome", "promote")
    client.set_model_version_tag(name, "2", "tritonflow.shadow.evaluated_at", "2026-01-01T00:00:00Z")
    client.set_model_version_tag(name, "2", "tritonflow.approval.answer", "approved")
    client.set_model_version_tag(name, "2", "tritonflow.approval.by", "alice")
    client.set_model_version_tag(name, "2", "tritonflow.approval.at", "2026-01-01T01:00:00Z")
    client.set_model_version_tag(name, "2", "tritonflow.canary.c1.started", '{"started_at": "2026-01-01T01:01:00Z"}')
    client.set_model_version_tag(name, "2", "tritonflow.canary.c1.step.01.0", '{"percent": 25}')
    client.set_model_version_tag(name, "2", "tritonflow.canary.latest", "c1")
    client.set_model_version_tag(name, "2", "tritonflow.canary.c1.pause.01", _json.dumps(
        {"number": 1, "percent": 25, "verdict": "pass", "decision": None, "policy": "approve-steps"}))
    monkeypatch.setenv("TRITONFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("TRITONFLOW_MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    assert cli.main(["status", name]) == 0
    out = capsys.readouterr().out
    assert "promotion policy approve" in out and "aliases: champion=v1" in out
    assert "no traffic plan on the gateway" in out
    assert "canary: v2 running (c1), step 01.0 at 25 %, waiting for a decision at pause 1 (pass;" in out
    assert "last decision: approval approved on v2 at 2026-01-01T01:00:00Z by alice" in out
    client.set_model_version_tag(name, "2", "tritonflow.canary.c1.pause.01", _json.dumps(
        {"number": 1, "percent": 25, "verdict": "pass", "decision": "hold", "by": "bob", "at": "2026-01-01T01:05:00Z",
         "policy": "approve-steps", "source": "person"}))
    assert cli.main(["status", name]) == 0
    out = capsys.readouterr().out
    assert "waiting for a decision" not in out
    assert ("last decision: step decision hold at 25 % on v2 at 2026-01-01T01:05:00Z by bob "
            "(policy approve-steps)") in out
    assert cli.main(["status", name, "--json"]) == 0
    status = _json.loads(capsys.readouterr().out)
    assert status["aliases"] == {"champion": 1} and status["canary"]["percent"] == 25


def test_status_names_what_could_not_be_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRITONFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("TRITONFLOW_MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert cli.main(["status", "nobody"]) == 1
    err = capsys.readouterr().err
    assert "error: could not read MLflow registry at http://127.0.0.1:9" in err and "'nobody'" in err


def test_rollback_requires_a_reason_and_the_operating_commands_document_their_exit_status(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["rollback", "iris"])
    assert exc.value.code == 2 and "--reason" in capsys.readouterr().err
    for command in ("promote", "rollback", "approve", "reject"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "exit status: 0" in text and "2 Airflow unreachable" in text and "3 --wait ran out of time" in text


def test_the_airflow_the_cli_operates_is_the_local_one_unless_configured(tmp_path):
    local = Settings.from_env({}, home=tmp_path)
    assert cli.airflow_client(local).base_url == f"http://127.0.0.1:{local.airflow_api_port}"
    remote = Settings.from_env({"TRITONFLOW_AIRFLOW_URL": "https://airflow.example/",
                                "TRITONFLOW_AIRFLOW_USERNAME": "ops", "TRITONFLOW_AIRFLOW_PASSWORD": "pw"},
                               home=tmp_path)
    api = cli.airflow_client(remote)
    assert (api.base_url, api.username, api.password) == ("https://airflow.example", "ops", "pw")


def test_an_approval_request_s_age_is_read_from_the_api_timestamp():
    import datetime as dt

    two_s_ago = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=2)).isoformat()
    assert 1.5 < cli.seconds_since(two_s_ago) < 10
    assert 1.5 < cli.seconds_since(two_s_ago.replace("+00:00", "Z")) < 10  # the API's form
    assert cli.seconds_since(None) == 0.0 and cli.seconds_since("not a time") == 0.0
