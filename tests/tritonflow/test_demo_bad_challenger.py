"""The demo's bad challenger request, service-free: the event mapping it relies on, the settings
the demo exports for it, and how its record is read and shown (the run itself: tests/test_demo.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.settings import Settings
from repository_sync.canary.policy import CanaryPolicy
from tritonflow.demo import bad_challenger as bc
from tritonflow.demo.config import LOOP_DAGS, config_from_args, environment
from tritonflow.report import _bad_challenger_html
from tritonflow_plugin.event_mapping import RegistryChange, actions_for, load_mapping

PORTS = dict.fromkeys(("triton_http", "triton_grpc", "triton_metrics", "mlflow", "gateway", "airflow",
                       "airflow_execution_api"), 1)


def _change(kind: str, **kw) -> RegistryChange:
    return RegistryChange(kind=kind, model="noaa_rain", version="3", source="watcher", **kw)


def test_the_demo_mapping_turns_only_the_canary_alias_into_publish_then_canary():
    rules = load_mapping(bc.MAPPING_PATH)
    [action] = actions_for(_change("alias_set", alias=bc.CANARY_ALIAS), rules)
    assert action.dag_id == "model_publish" and action.then == ("canary_promotion",)
    assert action.conf["model_version"] == "3" and action.conf["then"] == ["canary_promotion"]
    # the loop's own registry changes start nothing: retrain's versions, the canary's alias moves,
    # the driver's initial champion
    for change in (_change("version_created"), _change("alias_set", alias="champion"),
                   _change("alias_set", alias="challenger"), _change("alias_set", alias="previous_champion"),
                   _change("alias_deleted", alias=bc.CANARY_ALIAS), _change("stage_changed", stage="Production")):
        assert actions_for(change, rules) == [], change


def test_the_demo_exports_its_mapping_and_keeps_the_canary_thresholds_at_their_defaults(tmp_path):
    cfg = config_from_args(["--quick", "--home", str(tmp_path)])
    env = environment(cfg, PORTS)
    assert Path(env["TRITONFLOW_EVENT_MAPPING_PATH"]) == bc.MAPPING_PATH and bc.MAPPING_PATH.is_file()
    assert "registry_events" in LOOP_DAGS and cfg.bad_challenger
    settings = Settings.from_env(env)
    policy, defaults = CanaryPolicy.from_settings(settings).thresholds(), CanaryPolicy().thresholds()
    schedule = {"steps", "bake_s", "min_requests"}
    assert {k: v for k, v in policy.items() if k not in schedule} == \
        {k: v for k, v in defaults.items() if k not in schedule}
    # a step that passes has enough labelled challenger requests for the quality check
    assert policy["min_requests"] >= policy["min_labels"]
    assert not config_from_args(["--quick", "--no-bad-challenger"]).bad_challenger


@pytest.mark.parametrize(("conf", "version"), [
    ({"model_name": "m", "model_version": "4", "registry_event": {}}, "4"),  # registry_events -> model_publish
    ({"loop": {"model": "m", "version": "5", "triggered_by": "model_publish"}}, "5"),  # handoff
    ({"model": "m", "challenger": "6"}, "6"),  # canary_promotion trigger form
    ({"model": "m", "version_or_alias": "7"}, "7"),  # model_publish trigger form
    ({}, None),
])
def test_run_version_reads_every_conf_shape(conf, version):
    assert bc.run_version(conf) == version


def test_the_report_shows_the_decision_and_the_reason_the_run_recorded():
    bad = {"version": 3, "alias": "canary", "rolled_back": True, "canary_run": "r1", "canary_state": "failed",
           "outcome": "rolled_back", "seconds": 12.5, "reason": "step 1 (25 %): quality: challenger auc 0.2 <x>",
           "steps": [{"step": 1, "percent": 25, "attempt": 0, "verdict": "fail", "canary_requests": 44,
                      "reason": "quality: challenger auc 0.2"}]}
    html = _bad_challenger_html(bad)
    assert "<b>rolled back</b>" in html and "&lt;x&gt;" in html and "<td>fail</td>" in html
    assert "NOT rolled back" in _bad_challenger_html({**bad, "rolled_back": False})
    assert "not offered" in _bad_challenger_html(None)
