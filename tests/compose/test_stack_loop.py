"""The whole quick loop in the docker-compose stack: ``python -m tritonflow.demo --quick --stack compose``.

The stack is built (images reused when current) and started as the demo's own compose project
(``tritonflow-demo``, its own ports), the quick sweep runs in it on the NOAA data with the
CeleryExecutor and two workers, and the stack is removed afterwards. The summary then shows that
the loop really ran distributed: the driver created only ``drift_monitor`` runs, the scheduler
made every other run, a closed loop (drift alert -> retrained challenger promoted) used both
workers, the model-control leases were held from both, and the flipped-label challenger requested
through the registry inside the stack was rolled back by its canary.

Needs a Docker engine; fails, never skips, without one (as the other stack tests). Marked ``long``:
the README's test command (``scripts/test_groups.sh``) runs it in the stack group once the other
stack tests have removed their stack, so one stack of fourteen containers runs at a time on 2
cores; ``bash scripts/test.sh -m long`` runs it alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.compose.stack import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.slow, pytest.mark.long,
              pytest.mark.timeout(3600)]

#: Seconds the demo may take (build check, up, seed, the quick sweep, down) on a loaded 2-core machine.
LOOP_TIMEOUT_S = 3600


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> dict:
    probe = subprocess.run(["bash", "-c", "command -v dockerd && command -v docker-compose"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail("Docker cannot run on this machine: dockerd or docker-compose is missing "
                    "(scripts/setup.sh installs Debian's docker.io and docker-compose)")
    home = tmp_path_factory.mktemp("stack-loop") / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRITONFLOW_", "MLFLOW_"))}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "tritonflow.demo", "--quick", "--stack", "compose",
                           "--home", str(home)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=LOOP_TIMEOUT_S)
    progress = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("["))
    (home.parent / "demo.out").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr[-20000:])
    # On failure the whole tail: a failed ``stack.sh up`` explains itself in lines of docker-compose's
    # and in each unhealthy service's health log, which do not start with "[".
    assert proc.returncode == 0, f"the quick loop in the stack failed (rc {proc.returncode}):\n" \
                                 f"{proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads((home / "report" / "summary.json").read_text())
    summary["_progress"] = progress
    return summary


def _runs(summary: dict, dag_id: str) -> list[dict]:
    return [r for r in summary["dag_runs"] if r["dag_id"] == dag_id]


def test_the_loop_ran_on_the_celery_workers_with_every_run_but_the_hours_made_by_the_scheduler(loop):
    assert loop["deployment"]["executor"] == "CeleryExecutor"
    workers = set(loop["deployment"]["workers"])
    assert len(workers) == 2, loop["deployment"]
    runs = loop["dag_runs"]
    by_driver = [r for r in runs if r["triggered_by"] == "driver"]
    assert {r["dag_id"] for r in by_driver} == {"drift_monitor"}
    assert len(by_driver) == len(loop["hours"])
    for dag_id in ("shadow_evaluation", "retrain", "model_publish", "canary_promotion"):
        made = _runs(loop, dag_id)
        assert made, f"no {dag_id} run:\n{loop['_progress'][-4000:]}"
        assert all(r["triggered_by"] != "driver" for r in made), made
    # every task instance ran on one of the two workers, and both took a share
    hosts = {ti["hostname"] for ti in loop["task_instances"] if ti["state"] == "success"}
    assert hosts <= workers and hosts == workers, (hosts, loop["tasks_per_host"])


def test_a_closed_loop_promoted_a_retrained_challenger_using_both_workers(loop):
    loops = loop["closed_loops"]
    assert loops, f"no challenger was promoted:\n{loop['_progress'][-4000:]}"
    first = loops[0]
    assert first["to"] != first["from"] and first["seconds"] > 0
    assert len(set(first["hosts"])) == 2, first
    # the model-control leases (what serves) were taken from both workers, through the shared database
    control = loop["lease_holders_per_host"].get("model-control", {})
    assert len([h for h in control if h in set(loop["deployment"]["workers"])]) == 2, loop["lease_holders_per_host"]


def test_the_flipped_label_challenger_requested_through_the_stacks_registry_is_rolled_back(loop):
    bad = loop["bad_challenger"]
    assert bad, "no bad challenger was offered"
    runs = {(r["dag_id"], r["run_id"]): r for r in loop["dag_runs"]}
    publish = runs.get(("model_publish", bad["publish_run"]))
    canary = runs.get(("canary_promotion", bad["canary_run"]))
    assert publish and canary, bad
    assert publish["triggered_by"].startswith("dag:registry_events/"), publish
    assert bad["outcome"] == "rolled_back" and bad["rolled_back"] is True, bad
    assert bad["champion_after"] == bad["champion_before"] != bad["version"]


def test_the_demo_stack_is_removed_afterwards(loop):
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project=tritonflow-demo"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert not left, left
