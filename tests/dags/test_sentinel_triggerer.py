"""DAG ``champion_sentinel`` on a real Airflow deployment: the sentinel trigger runs in the
separately started ``airflow triggerer`` process and its ``unhealthy`` verdict rolls back.

Real services started here: Triton (explicit model control over a signed folder repository), the
NGINX gateway, the session's MLflow server, and the local Airflow deployment (api-server,
dag-processor, scheduler with the LocalExecutor, triggerer) parsing only ``champion_sentinel``.
The champion (v2) is unhealthy because its answers fall outside the validation range recorded on
its MLflow version (as in ``test_sentinel_dag``); a manual run through the REST API must defer,
probe from the triggerer, and resume on the worker side to roll back to v1 (or, when the renewal
run the unpause created beside it rolled back first, skip on its retry).
"""

from __future__ import annotations

import shutil
import time

import pytest

from tests.dags.test_canary_dags import settings_env
from tests.dags.test_sentinel_dag import DAGS, serve_unhealthy_champion
from tritonflow.demo import runs as rr
from tritonflow.runtime.airflow import AirflowDeployment
from tritonflow.runtime.airflow_api import AirflowApi
from tritonflow.runtime.airflow_config import AirflowConfig
from tritonflow.runtime.services import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "sentinel_triggerer_model"
#: Seconds between two probes: 3 failed probes in a row keep the task deferred for a few
#: seconds, long enough to see the ``deferred`` state through the REST API.
INTERVAL_S = 5.0
#: Seconds the DAG may take to appear and the run to end on a loaded two-core machine.
PARSE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, mlflow_server):
    """Served pair (champion v2 unhealthy, previous v1) and a local Airflow deployment whose
    processes (the triggerer included) see the same ``TRITONFLOW_*`` settings."""
    home = tmp_path_factory.mktemp("sentinel-triggerer-home")
    with serve_unhealthy_champion(home, mlflow_server.tracking_uri, MODEL, sentinel_interval_s=INTERVAL_S) as served:
        folder = home / "dags"
        folder.mkdir()
        shutil.copy(DAGS / "champion_sentinel.py", folder / "champion_sentinel.py")
        config = AirflowConfig.local(served["settings"], api_port=free_port(), execution_api_port=free_port(),
                                     worker_log_port=free_port(),
                                     triggerer_log_port=free_port(), dags_folder=folder,
                                     extra_env=settings_env(served["settings"]))
        dep = AirflowDeployment(config)
        dep.start()
        try:
            yield dict(served, deployment=dep)
        finally:
            dep.stop()


def test_the_triggerer_detects_an_unhealthy_champion_and_the_task_rolls_it_back(deployment):
    from repository_sync.routing.gateway_probe import served_by

    dep, reg, gateway = deployment["deployment"], deployment["reg"], deployment["gateway"]
    api = AirflowApi(dep.api_url)
    api.wait_for_dag("champion_sentinel", PARSE_TIMEOUT_S)
    api.unpause("champion_sentinel")
    run_id = "sentinel_triggerer_manual"
    api.post("/dags/champion_sentinel/dagRuns", {"dag_run_id": run_id, "logical_date": None,
                                                  "conf": {"models": [MODEL]}})
    seen: list[str | None] = []
    state = None
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        watch = [ti for ti in rr.task_instances(api, "champion_sentinel", run_id) if ti["task_id"] == "watch_champion"]
        if watch and (not seen or seen[-1] != watch[0]["state"]):
            seen.append(watch[0]["state"])
        state = api.get(f"/dags/champion_sentinel/dagRuns/{run_id}")["state"]
        if state in ("success", "failed"):
            break
        time.sleep(0.5)
    tis = {(ti["task_id"], ti.get("map_index")): ti["state"]
           for ti in rr.task_instances(api, "champion_sentinel", run_id)}
    assert state == "success", (state, tis, seen)
    watches = {run_id: tis[("watch_champion", 0)]}
    if watches[run_id] != "success":
        # Unpausing also made the timetable's renewal run (catchup off: the latest 6-hourly
        # interval; another one when a 6-hour boundary passes during the test). A scheduled run
        # watches every monitored model of the shared MLflow server, so this model is at any map
        # index there: find it by the task's rendered ``model``. Both sentinels see the unhealthy
        # answers; the first to resume takes the model's promotion lease and rolls back, the other
        # fails on the busy lease and, retried, skips (its champion is no longer the champion).
        assert watches[run_id] == "skipped", (tis, seen)
        while time.monotonic() < deadline and "success" not in watches.values():
            for other in rr.list_runs(api, "champion_sentinel"):
                if other["dag_run_id"] != run_id:
                    ours = [ti for ti in rr.task_instances(api, "champion_sentinel", other["dag_run_id"])
                            if ti["task_id"] == "watch_champion"
                            and (ti.get("rendered_fields") or {}).get("model") == MODEL]
                    watches[other["dag_run_id"]] = ours[0]["state"] if ours else None
            time.sleep(0.5)
    assert list(watches.values()).count("success") == 1, watches  # exactly one sentinel rolled back
    # the task deferred (gave up its worker slot) and its trigger ran in the triggerer process: a
    # trigger log exists only for a deferred task, and only the triggerer writes it. (The REST
    # polling above usually also sees the ``deferred`` state, but may miss it on a loaded host.)
    trigger_logs = list((dep.log_path / "dag_id=champion_sentinel").rglob("*.trigger.*.log"))
    assert any(f"sentinel watching {MODEL}" in p.read_text() for p in trigger_logs), (trigger_logs, seen)
    # the rollback (worker side, after the trigger's event) restored v1 everywhere
    assert reg.aliases(MODEL)["champion"] == 1
    assert {served_by(gateway.url, MODEL)[0] for _ in range(10)} == {"1"}
    tags = reg.get_version(MODEL, 2).tags
    assert "outside the validation range" in tags["tritonflow.sentinel.reason"]
    assert tags["tritonflow.sentinel.from"] == "2" and tags["tritonflow.sentinel.to"] == "1"
