"""The stack's light health checks (tritonflow.runtime.stack_health) against Airflow's own job table.

The table is created from Airflow 3.3's ORM model (``airflow.jobs.job.Job``) in a SQLite file, so
the query runs against the real schema; the rows are what a triggerer or dag-processor writes. The
checks in the running stack (Docker's health status of every Airflow service, against PostgreSQL
and Redis) are tested in tests/compose/test_stack_running.py.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
import sqlalchemy

from tests.compose.stack import ROOT
from tritonflow.runtime import stack_health


@pytest.fixture
def job_db(tmp_path, monkeypatch):
    """A SQLite metadata database holding Airflow's ``job`` table, named by the variable the check
    reads; returns (url, add_job)."""
    from airflow.jobs.job import Job

    url = f"sqlite:///{tmp_path / 'airflow.db'}"
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", url)
    engine = sqlalchemy.create_engine(url)
    Job.__table__.create(engine)

    def add_job(job_type: str, hostname: str, age_s: float, state: str = "running") -> None:
        beat = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=age_s)
        with engine.begin() as conn:
            conn.execute(Job.__table__.insert().values(job_type=job_type, hostname=hostname, state=state,
                                                       latest_heartbeat=beat, start_date=beat))

    yield url, add_job
    engine.dispose()


def test_a_running_job_with_a_recent_heartbeat_on_the_host_is_healthy(job_db, capsys):
    url, add_job = job_db
    add_job("TriggererJob", "triggerer-1", age_s=5)
    assert stack_health.main(["job", "--job-type", "TriggererJob", "--hostname", "triggerer-1"]) == 0
    assert capsys.readouterr().out.strip() == "healthy"


def test_a_stale_heartbeat_another_host_or_an_ended_job_is_not_healthy_and_says_why(job_db, capsys):
    url, add_job = job_db
    add_job("DagProcessorJob", "dp-1", age_s=120)
    add_job("DagProcessorJob", "dp-2", age_s=1, state="success")
    assert stack_health.main(["job", "--job-type", "DagProcessorJob", "--hostname", "dp-1"]) == 1
    assert "DagProcessorJob on 'dp-1': last heartbeat 120 s ago, more than 30 s" in capsys.readouterr().err
    assert stack_health.main(["job", "--job-type", "DagProcessorJob", "--hostname", "dp-2"]) == 1
    assert "no running DagProcessorJob on host 'dp-2'" in capsys.readouterr().err
    # the newest running job of the type on the host decides, as in `airflow jobs check`
    add_job("DagProcessorJob", "dp-1", age_s=2)
    assert stack_health.main(["job", "--job-type", "DagProcessorJob", "--hostname", "dp-1"]) == 0


def test_the_threshold_is_airflows_setting_of_the_job_type(job_db, capsys, monkeypatch):
    url, add_job = job_db
    add_job("TriggererJob", "t-1", age_s=120)
    argv = ["job", "--job-type", "TriggererJob", "--hostname", "t-1"]
    monkeypatch.setenv("AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD", "600")
    assert stack_health.main(argv) == 0
    capsys.readouterr()
    monkeypatch.setenv("AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD", "soon")
    assert stack_health.main(argv) == 1
    assert "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD='soon': expected a number of seconds" \
        in capsys.readouterr().err


def test_a_missing_database_or_broker_url_is_named(monkeypatch, capsys):
    monkeypatch.delenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", raising=False)
    monkeypatch.delenv("AIRFLOW__CELERY__BROKER_URL", raising=False)
    assert stack_health.main(["job", "--job-type", "TriggererJob", "--hostname", "h"]) == 1
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN is not set" in capsys.readouterr().err
    assert stack_health.main(["celery", "--hostname", "h"]) == 1
    assert "AIRFLOW__CELERY__BROKER_URL is not set" in capsys.readouterr().err


def test_the_check_runs_as_the_compose_file_calls_it_without_importing_airflow(job_db):
    url, add_job = job_db
    add_job("TriggererJob", "t-1", age_s=1)
    code = ("import runpy, sys; sys.argv = ['x', 'job', '--job-type', 'TriggererJob', '--hostname', 't-1']\n"
            "try:\n    runpy.run_module('tritonflow.runtime.stack_health', run_name='__main__')\n"
            "except SystemExit as e:\n    print('RC', e.code, 'airflow' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url})
    assert "RC 0 False" in proc.stdout, (proc.stdout, proc.stderr)
