"""Fixtures of the plugin tests: Airflow environment, a real MLflow server."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.plugins import airflow_env  # noqa: F401  (sets the Airflow environment first)


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """AIRFLOW_HOME with a migrated SQLite metadata DB."""
    return airflow_env.migrated_home()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_tracking_uri(request, tmp_path_factory) -> str:
    """Tracking URI of a real MLflow server (the lead's ``mlflow_server`` fixture when present)."""
    try:
        yield request.getfixturevalue("mlflow_server").tracking_uri
        return
    except pytest.FixtureLookupError:
        pass
    tmp = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server",
         "--backend-store-uri", f"sqlite:///{tmp / 'db.sqlite'}",
         "--default-artifact-root", str(tmp / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {(tmp / 'server.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        proc.terminate()
        raise RuntimeError("mlflow server did not become healthy in 120 s")
    yield uri
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
