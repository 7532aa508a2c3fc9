"""One run of ``python -m tritonflow.demo --quick --keep-running`` shared by the tests that need it.

:func:`get_quick_run` runs the demo once per test session (tests/test_demo.py and the UI test
use the same run) and leaves its Airflow UI, MLflow and gateway up until the session ends, when
they are stopped by their pid files (:func:`tritonflow.demo.config.stop_leftovers`).

``TF_TEST_DEMO_HOME=<home>`` reuses a quick run made by hand instead
(``python -m tritonflow.demo --quick --keep-running --home <home> > <home>/../demo.out``): the tests
read its ``report/summary.json`` and output, and the UI test its still-running api-server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Seconds the quick demo may take on a loaded two-core machine (measured: about 60 min at load 40).
DEMO_TIMEOUT_S = 5400

_RUN: dict = {}


def get_quick_run(request, tmp_path_factory) -> dict:
    """The summary of the session's quick demo run (``report/summary.json``) plus ``_home``,
    ``_progress`` (the ``[ t s]`` lines) and ``_last_line`` (the benchmark JSON, parsed)."""
    if "error" in _RUN:
        pytest.fail(_RUN["error"])
    if "summary" in _RUN:
        return _RUN["summary"]
    from tritonflow.demo.config import stop_leftovers

    if os.environ.get("TF_TEST_DEMO_HOME"):
        home = Path(os.environ["TF_TEST_DEMO_HOME"])
        stdout = (home.parent / "demo.out").read_text()
        _RUN["summary"] = _summary(home, stdout)
        return _RUN["summary"]
    home = tmp_path_factory.mktemp("demo") / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRITONFLOW_"))}
    env["PYTHONPATH"] = str(REPO)
    request.config.add_cleanup(lambda: stop_leftovers(home))
    proc = subprocess.run([sys.executable, "-m", "tritonflow.demo", "--quick", "--keep-running",
                           "--home", str(home)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)
    progress = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("["))
    assert proc.stdout.strip().splitlines()[-1].startswith("{"), "the demo's last line is not its JSON"
    (home.parent / "demo.out").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr[-20000:])
    if proc.returncode != 0:
        _RUN["error"] = (f"demo failed (rc {proc.returncode}), output {home.parent / 'demo.out'}:\n"
                         f"{progress[-6000:]}\n{proc.stderr[-3000:]}")
        pytest.fail(_RUN["error"])
    _RUN["summary"] = _summary(home, proc.stdout)
    return _RUN["summary"]


def _summary(home: Path, stdout: str) -> dict:
    summary = json.loads((home / "report" / "summary.json").read_text())
    summary["_home"] = str(home)
    summary["_progress"] = "\n".join(line for line in stdout.splitlines() if line.startswith("["))
    stdout = stdout.split("\n--- stderr ---\n")[0]
    last = [line for line in stdout.strip().splitlines() if line.startswith('{"closed_loop_s"')][-1]
    summary["_last_line"] = json.loads(last)
    return summary
