"""Shared Airflow test environment for tests/plugins and tests/dags.

Sets ``AIRFLOW_HOME`` (a fresh temporary folder per test session), disables example DAGs,
points the plugins folder at ``plugins/`` and puts it on ``sys.path`` -- before Airflow is
imported, because Airflow reads its configuration at import time. ``migrated_home()`` runs
``airflow db migrate`` (SQLite) once per session, in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
VENV_BIN = Path(sys.executable).parent

if "TRITONFLOW_TEST_AIRFLOW_HOME" not in os.environ:
    os.environ["TRITONFLOW_TEST_AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="tf_airflow_home_")
AIRFLOW_HOME = Path(os.environ["TRITONFLOW_TEST_AIRFLOW_HOME"])
EMPTY_DAGS = AIRFLOW_HOME / "empty_dags"
EMPTY_DAGS.mkdir(exist_ok=True)

ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
    "AIRFLOW__CORE__DAGS_FOLDER": str(EMPTY_DAGS),
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
}
for _k, _v in ENV.items():
    os.environ[_k] = _v
if str(PLUGINS) not in sys.path:
    sys.path.insert(0, str(PLUGINS))

_MIGRATED = AIRFLOW_HOME / ".migrated"


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for Airflow subprocesses: this session's Airflow settings plus ``extra``."""
    env = dict(os.environ)
    env.update(ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(PLUGINS), env.get("PYTHONPATH", "")])
    # dag.test() in Airflow 3.3.2 fails at the end of a successful run of a DAG with a deadline alert
    env["TRITONFLOW_DEADLINE_ALERTS"] = "false"
    env.update(extra)
    return env


def migrated_home() -> Path:
    """Run ``airflow db migrate`` once for this session's AIRFLOW_HOME; return the home."""
    if not _MIGRATED.exists():
        proc = subprocess.run(
            [str(VENV_BIN / "airflow"), "db", "migrate"],
            env=subprocess_env(), capture_output=True, text=True, timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        _MIGRATED.write_text("ok")
    return AIRFLOW_HOME
