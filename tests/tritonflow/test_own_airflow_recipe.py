"""The README's "Run it in your own Airflow" recipe, followed verbatim.

Every fenced ``bash`` block of that section that starts with ``# recipe: own-airflow`` is run, in
README order, as one ``bash -euo pipefail`` script from a copy of the checkout, with a fresh
``AIRFLOW_HOME`` and ``HOME`` under pytest's temporary folder. Only the *values* the recipe lets a
user set beforehand (``TRITONFLOW_MLFLOW_TRACKING_URI``, ``TRITONFLOW_REPOSITORY_URI``, the Triton
URLs) are set, to the real MLflow and Triton this test starts on free ports.

"Airflow's Python environment" is a stand-in the test builds: a virtual environment whose
site-packages see the project's ``.venv`` through a ``.pth`` line (so the recipe's ``pip install``
finds every requirement satisfied and installs only tritonflow, into the stand-in, never into
``.venv``) with its own ``airflow`` entry point. ``.venv-triton`` is linked into the copy, and only
when its set-up stamp is current, so the recipe's ``scripts/setup_triton_env.sh`` is a no-op.

Then, on that Airflow: every DAG of ``dags/`` is in the metadata DB and none failed to import,
the plugin is loaded, and a default-parameter ``model_publish`` run (only the model name; the
``champion`` alias; profiling and the p99 gate as the settings default) reaches ``success`` for a
freshly registered model and leaves it READY in Triton.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import TEST_AWS_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Run it in your own Airflow"
MARK = "# recipe: own-airflow"
#: Seconds the recipe (pip resolution, db migrate, parsing every DAG) may take on a loaded machine.
RECIPE_TIMEOUT_S = 900
#: Seconds a default model_publish run (conversion, parity, Model Analyzer, signing, load) may take.
PUBLISH_TIMEOUT_S = 1800
#: Model Analyzer settings for a loaded shared 2-core machine (the same as the profiled
#: ``model_publish`` DAG test): one searched config, concurrency 1, and a throughput CV of 0.5 for
#: "stable" -- at the defaults (CV 0.1) perf_analyzer finds no stable measurement there. Settings
#: only: the run's parameters stay the defaults.
LOADED_MACHINE_ANALYZER_ENV = {
    "TRITONFLOW_ANALYZER_MAX_BATCH_SIZES": "8", "TRITONFLOW_ANALYZER_INSTANCE_COUNTS": "1",
    "TRITONFLOW_ANALYZER_QUEUE_DELAYS_US": "100", "TRITONFLOW_ANALYZER_CONCURRENCY": "1",
    "TRITONFLOW_ANALYZER_MEASUREMENT_MS": "2000", "TRITONFLOW_ANALYZER_STABILITY_CV": "1.0",
    "TRITONFLOW_ANALYZER_TIMEOUT_S": "500",
}


def recipe_blocks(readme: str) -> list[str]:
    """The ``# recipe: own-airflow`` bash blocks of the README's own-Airflow section, in order."""
    assert SECTION in readme, f"README has no {SECTION!r} section"
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if b.startswith(MARK)]


def test_the_recipe_is_in_the_readme_and_uses_no_absolute_path_of_this_machine():
    blocks = recipe_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2
    script = "\n".join(blocks)
    assert str(ROOT) not in script and "/work/" not in script
    for needed in ("pip install", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER",
                   "TRITONFLOW_TRITON_VENV", "airflow db migrate", "list-import-errors", "airflow plugins"):
        assert needed in script, needed


def _triton_env_stamp(checkout: Path) -> str:
    """The stamp ``scripts/setup_triton_env.sh`` writes (sha256 of two sha256sum lines, 16 chars)."""
    lines = "".join(f"{hashlib.sha256((checkout / f).read_bytes()).hexdigest()}  {f}\n"
                    for f in ("requirements-triton.txt", "scripts/setup_triton_env.sh"))
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


#: Top-level folders of a working checkout that are not the project (environments, caches, state).
SKIPPED_TOP_LEVEL = (".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".tritonflow", "shared")


def _copy_checkout(dest: Path) -> None:
    """Copy the checkout's files (tracked and untracked, not ignored) as a user's checkout would be."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in files:
        src = ROOT / name
        parts = Path(name).parts
        if not parts or parts[0].startswith(SKIPPED_TOP_LEVEL) or "__pycache__" in parts or not src.is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(src.read_bytes())
        target.chmod(src.stat().st_mode & 0o777)


def _airflow_python_env(dest: Path) -> Path:
    """A stand-in for Airflow's Python environment layered over ``.venv``; returns its ``bin``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    purelib = subprocess.run([str(dest / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    app_site = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "_airflow_env_base.pth").write_text(app_site + "\n")
    airflow = dest / "bin" / "airflow"
    airflow.write_text(f"#!{dest / 'bin' / 'python'}\nimport sys\nfrom airflow.__main__ import main\n"
                       "sys.exit(main())\n")
    airflow.chmod(0o755)
    return dest / "bin"


@pytest.fixture(scope="module")
def own_airflow(tmp_path_factory, mlflow_server):
    """The recipe, run verbatim against a real Triton and MLflow; yields what the checks need."""
    from tests.conftest import make_settings
    from tritonflow.runtime.services import TritonServer
    from tritonflow.settings import Settings

    triton_venv = (ROOT / ".venv-triton").resolve()
    if (triton_venv / ".tritonflow-stamp").read_text().strip() != _triton_env_stamp(ROOT):
        pytest.fail(f"{triton_venv} is not set up for this checkout (stamp differs): run scripts/setup.sh; "
                    "the recipe would rebuild it")
    work = tmp_path_factory.mktemp("own_airflow")
    checkout = work / "tritonflow"
    _copy_checkout(checkout)
    (checkout / ".venv-triton").symlink_to(triton_venv, target_is_directory=True)
    env_bin = _airflow_python_env(work / "airflow-python")
    repo = work / "model_repository"
    repo.mkdir()
    triton = TritonServer(make_settings(work / "triton", start_timeout_s=Settings.from_env().start_timeout_s),
                          repository=str(repo)).start()
    try:
        env = {
            "PATH": f"{env_bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8",
            "AIRFLOW_HOME": str(work / "airflow"),
            "TRITONFLOW_MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
            "TRITONFLOW_REPOSITORY_URI": str(repo),
            "TRITONFLOW_TRITON_URL": triton.http_url,
            "TRITONFLOW_TRITON_METRICS_URL": triton.metrics_url,
            **TEST_AWS_ENV,
        }
        script = work / "recipe.sh"
        script.write_text("\n".join(recipe_blocks((checkout / "README.md").read_text())))
        proc = subprocess.run(["bash", "-euo", "pipefail", str(script)], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=RECIPE_TIMEOUT_S)
        (work / "recipe.log").write_text(proc.stdout + proc.stderr)
        assert proc.returncode == 0, f"the recipe failed (log {work / 'recipe.log'}):\n{proc.stderr[-4000:]}"

        def airflow(*args: str, timeout: float = 300, extra_env: dict | None = None) -> subprocess.CompletedProcess:
            """Run ``airflow`` the way the recipe says every process runs: with tritonflow.env."""
            command = 'set -a; . "$AIRFLOW_HOME/tritonflow.env"; set +a; exec airflow "$@"'
            return subprocess.run(["bash", "-c", command, "airflow", *args], cwd=checkout,
                                  env={**env, **(extra_env or {})}, capture_output=True, text=True, timeout=timeout)

        yield {"checkout": checkout, "airflow": airflow, "recipe": proc, "triton": triton, "repo": repo,
               "env": env, "work": work}
    finally:
        triton.stop()


def _json_rows(proc: subprocess.CompletedProcess) -> list[dict]:
    """The JSON list an ``airflow ... -o json`` command printed (its last line; warnings come first)."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("[") and line.rstrip().endswith("]"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise AssertionError(f"no JSON list in the output:\n{proc.stdout[-3000:]}")


def test_every_dag_imports_and_the_plugin_is_loaded(own_airflow):
    airflow = own_airflow["airflow"]
    assert "No data found" in own_airflow["recipe"].stdout  # the recipe's own list-import-errors
    assert _json_rows(airflow("dags", "list-import-errors", "-o", "json")) == []
    dag_files = sorted(p.stem for p in (own_airflow["checkout"] / "dags").glob("*.py"))
    listed = sorted(row["dag_id"] for row in _json_rows(airflow("dags", "list", "-o", "json")))
    assert listed == dag_files
    plugins = _json_rows(airflow("plugins", "-o", "json"))
    [plugin] = [p for p in plugins if p["name"] == "tritonflow"]
    assert "tritonflow_plugin_entry.py" in plugin["source"]
    assert "/tritonflow" in json.dumps(plugin["fastapi_apps"])


def test_tasks_import_tritonflow_from_airflows_environment_not_from_the_checkout(own_airflow):
    python = own_airflow["work"] / "airflow-python" / "bin" / "python"
    proc = subprocess.run([str(python), "-c", "import tritonflow, model_registry; print(tritonflow.__file__)"],
                          cwd="/", env=own_airflow["env"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(str(own_airflow["work"] / "airflow-python"))


def test_a_default_param_model_publish_run_succeeds_there(own_airflow, mlflow_server):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from repository_sync.triton_client import TritonModelControl
    from tests.pipelines.test_publish_pipeline import churn_data, register, version_tags

    name = f"own_airflow_{uuid.uuid4().hex[:6]}"
    X, y = churn_data(n=200, seed=5)
    model = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    version = register(mlflow_server.tracking_uri, name, model, X)

    airflow = own_airflow["airflow"]
    run = airflow("dags", "test", "model_publish", "-c", json.dumps({"model": name}), timeout=PUBLISH_TIMEOUT_S,
                  extra_env=LOADED_MACHINE_ANALYZER_ENV)
    log = own_airflow["work"] / "model_publish.log"
    log.write_text(run.stdout + run.stderr)
    runs = _json_rows(airflow("dags", "list-runs", "model_publish", "-o", "json"))
    assert [r["state"] for r in runs] == ["success"], f"{runs}; log {log}:\n{(run.stdout + run.stderr)[-6000:]}"

    tags = version_tags(mlflow_server.tracking_uri, name, version)
    assert tags["tritonflow.status"] == "published"
    home = Path(os.path.expandvars(own_airflow["env"]["AIRFLOW_HOME"])) / "tritonflow"
    with TritonModelControl(own_airflow["triton"].http_url, repository=str(own_airflow["repo"]),
                            trusted_keys=str(home / "keys" / "trusted")) as ctl:
        assert ctl.ready_versions(name) == [version]
    profile = json.loads(tags["tritonflow.profile"])
    print(f"profile: {profile.get('status')} {profile.get('reason', '')}")
    from tritonflow.pipelines.publish_profile import profiling_unavailable_reason
    from tritonflow.settings import Settings

    if profiling_unavailable_reason(Settings.from_env({})) is None:
        assert profile["status"] == "profiled", profile


def test_a_default_param_drift_monitor_run_succeeds_there(own_airflow, mlflow_server):
    """The hourly drift check with its defaults (every model with a ``champion`` alias)."""
    import mlflow

    champions = [m.name for m in mlflow.MlflowClient(mlflow_server.tracking_uri).search_registered_models()
                 if "champion" in (m.aliases or {})]
    airflow = own_airflow["airflow"]
    run = airflow("dags", "test", "drift_monitor", timeout=PUBLISH_TIMEOUT_S)
    log = own_airflow["work"] / "drift_monitor.log"
    log.write_text(run.stdout + run.stderr)
    runs = _json_rows(airflow("dags", "list-runs", "drift_monitor", "-o", "json"))
    assert [r["state"] for r in runs] == ["success"], f"{runs}; log {log}:\n{(run.stdout + run.stderr)[-6000:]}"
    published = [name for name in champions if name.startswith("own_airflow_")]
    for name in published:  # the model the publish test served was checked (mapped over the champions)
        assert name in run.stdout + run.stderr, name
