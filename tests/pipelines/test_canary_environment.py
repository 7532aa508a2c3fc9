"""Where the canary, the manual rollback and the sentinel find the trusted keys and the gateway.

Guards: with only ``TRITONFLOW_HOME`` set (an Airflow where tritonflow is pip-installed, as the
own-Airflow recipe of docs/deployment.md does), the canary looked in ``<site-packages>/.tritonflow/keys/trusted``
(the settings' default, relative to the installed package) while the publish pipeline had put
the keys under ``<TRITONFLOW_HOME>/keys/trusted``: every ``canary_promotion`` pre-flight,
``canary_rollback`` and sentinel failed with "trusted key source ... does not exist". And
``TRITONFLOW_GATEWAY_URL`` (or the gateway connection) was ignored unless the gateway reloads
through its watcher: the canary waited for its plans on ``http://<host>:<gateway_port>``.
"""

from __future__ import annotations

from pathlib import Path

from ground.settings import Settings
from tritonflow.pipelines.canary import CanaryEnvironment
from tritonflow.pipelines.publish import ensure_signing_keys


def test_the_canary_verifies_with_the_keys_the_publish_pipeline_generated_under_home(tmp_path):
    settings = Settings.from_env({"TRITONFLOW_HOME": str(tmp_path / "home")})
    keys = ensure_signing_keys(settings)  # what the first publish does
    env = CanaryEnvironment.from_settings(settings)
    assert Path(env.trusted_keys) == keys.trusted_dir == tmp_path / "home" / "keys" / "trusted"
    assert any(Path(env.trusted_keys).glob("*.pub"))


def test_a_configured_trusted_keys_folder_wins(tmp_path):
    settings = Settings.from_env({"TRITONFLOW_HOME": str(tmp_path / "home"),
                                  "TRITONFLOW_SIGNING_TRUSTED_KEYS_DIR": str(tmp_path / "trusted")})
    assert Path(CanaryEnvironment.from_settings(settings).trusted_keys) == tmp_path / "trusted"


def test_the_gateway_url_setting_is_where_the_canary_checks_its_plans(tmp_path):
    base = {"TRITONFLOW_HOME": str(tmp_path / "home"), "TRITONFLOW_GATEWAY_PORT": "8181"}
    env = CanaryEnvironment.from_settings(Settings.from_env({**base, "TRITONFLOW_GATEWAY_URL": "http://gw.internal:9000"}))
    assert env.gateway_url == "http://gw.internal:9000"
    assert env.gateway_conf_dir == tmp_path / "home" / "run" / "gateway"  # the local runtime's gateway reloads
    assert CanaryEnvironment.from_settings(Settings.from_env(base)).gateway_url.endswith(":8181")
