"""The Triton tools' environment is explicit: nothing of the calling worker's Python leaks into it.

Checked with the real interpreters: the Python backend stub embeds the system ``libpython3.11``
(``ldd triton_python_backend_stub``), so the system ``python3.11`` stands in for the stub, started
with the environment tritonserver gets, from a hostile worker environment.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import make_settings
from tritonflow.runtime.services import INHERITED_PYTHON_VARIABLES, triton_environment, triton_site_packages

HOSTILE = {"PATH": "", "PYTHONHOME": "/nonexistent/python", "PYTHONPATH": "/nonexistent/site-packages",
           "VIRTUAL_ENV": "/work/.venv", "PYTHONSTARTUP": "/nonexistent/startup.py", "PYTHONSAFEPATH": "1",
           "AWS_ACCESS_KEY_ID": "kept", "LD_LIBRARY_PATH": "/opt/worker/lib"}


def test_the_callers_python_variables_never_reach_the_tools(tmp_path):
    s = make_settings(tmp_path)
    env = triton_environment(s, HOSTILE)
    assert not {k for k in INHERITED_PYTHON_VARIABLES if k in env} - {"PYTHONPATH", "PYTHONNOUSERSITE"}
    assert env["PYTHONPATH"] == str(triton_site_packages(s)) and env["PYTHONNOUSERSITE"] == "1"
    assert env["PATH"].split(":")[:4] == [str(s.triton_venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
    assert env["LD_LIBRARY_PATH"].startswith(str(triton_site_packages(s) / "nvidia_pytriton.libs"))
    assert env["LD_LIBRARY_PATH"].endswith(":/opt/worker/lib")
    assert env["AWS_ACCESS_KEY_ID"] == "kept" and env["HOME"] == str(s.home)


def test_the_backend_stubs_python_imports_numpy_and_onnxruntime_from_a_bare_worker(tmp_path):
    s = make_settings(tmp_path)
    stub_python = shutil.which("python3.11", path="/usr/bin:/bin")
    if not stub_python or not triton_site_packages(s).is_dir():
        pytest.skip("no system python3.11 or no Triton tools environment on this host")
    for base in ({"PATH": "/usr/bin:/bin"}, HOSTILE):  # `env -i PATH=/usr/bin:/bin`, and a worse one
        proc = subprocess.run([stub_python, "-c", "import numpy, onnxruntime, sys; print(numpy.__file__)"],
                              env=triton_environment(s, base), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert Path(proc.stdout.strip()).is_relative_to(triton_site_packages(s))
