"""Leases and coordination state in the shared database (SQLite and a real PostgreSQL).

The races run in separate processes, each with its own ``TRITONFLOW_HOME`` (as two hosts would
have) and the same coordination database URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from ground.coordination import PROMOTION, CoordinationStore
from ground.exceptions import LeaseBusyError, LeaseLostError
from repository_sync.locks import promotion_lock

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request, tmp_path):
    """A fresh coordination database: a SQLite file, or a new PostgreSQL database (dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared' / 'coordination.db'}"
        return
    psycopg = pytest.importorskip("psycopg")
    name = f"i11coord_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # pragma: no cover - PostgreSQL not reachable here
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} not reachable: {exc}")
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    yield url
    from ground.coordination import _ENGINES

    for key in [k for k in _ENGINES if name in k]:
        _ENGINES.pop(key).dispose()
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


RACER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from repository_sync.locks import promotion_lock
    from ground.settings import get_settings
    from ground.exceptions import LeaseBusyError
    start_at, holder = float(sys.argv[1]), sys.argv[2]
    while time.time() < start_at:
        time.sleep(0.001)
    try:
        with promotion_lock("churn_model", settings=get_settings(), holder=holder) as lease:
            print(json.dumps({{"won": holder, "token": lease.token}}), flush=True)
            time.sleep(3)
    except LeaseBusyError as exc:
        print(json.dumps({{"lost": holder, "error": str(exc), "holder": exc.holder}}), flush=True)
""")


def test_two_hosts_race_for_one_promotion_exactly_one_wins_the_other_names_the_holder(db_url, tmp_path):
    code = RACER.format(root=str(ROOT))
    start_at = time.time() + 3.0
    procs = []
    for i in range(4):
        env = dict(os.environ, TRITONFLOW_HOME=str(tmp_path / f"host{i}"),
                   TRITONFLOW_COORDINATION_DB_URL=db_url)
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(start_at), f"canary_promotion/run_{i}"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    winners = [r["won"] for r in results if "won" in r]
    losers = [r for r in results if "lost" in r]
    assert len(winners) == 1, results
    for r in losers:
        assert r["holder"] == winners[0]
        assert winners[0] in r["error"] and "'churn_model'" in r["error"] and " since " in r["error"]
    # no host-local lock file anywhere under the homes
    assert not list(tmp_path.glob("host*/locks/*"))


def test_lease_expires_when_its_holder_stops_heartbeating(db_url):
    store = CoordinationStore(db_url, ttl_s=1.0)
    first = store.acquire(PROMOTION, "churn_model", holder="worker-a")
    with pytest.raises(LeaseBusyError, match="worker-a"):
        store.acquire(PROMOTION, "churn_model", holder="worker-b")
    first.stop_heartbeat()  # a hung or partitioned worker: no more renewals
    time.sleep(1.3)
    second = store.acquire(PROMOTION, "churn_model", holder="worker-b", timeout_s=5)
    assert second.token > first.token  # fencing token: the later holder's is larger
    with pytest.raises(LeaseLostError):
        first.check()
    first.release()  # the former holder cannot free the new holder's lease
    assert store.holder_of(PROMOTION, "churn_model")["holder"] == "worker-b"
    second.release()
    assert store.holder_of(PROMOTION, "churn_model") is None


def test_lease_history_names_each_holder_host_and_whether_it_released(db_url):
    """Every acquisition stays readable after the lease is freed: who, on which host and pid, its
    fencing token, and a release time only for a holder that released it (not for one that lost it)."""
    import socket

    store = CoordinationStore(db_url, ttl_s=1.0)
    t0 = time.time()
    first = store.acquire(PROMOTION, "churn_model", holder="canary_promotion/run_1/canary")
    first.stop_heartbeat()
    time.sleep(1.3)  # expired: the next holder takes it over
    second = store.acquire(PROMOTION, "churn_model", holder="canary_promotion/run_2/canary", timeout_s=5)
    first.release()  # lost: no release recorded
    second.release()
    with store.hold("model-control", "churn_model", holder="model_publish/run_3/load"):
        pass
    rows = store.lease_history(since=t0)
    assert [(r["purpose"], r["holder"], r["token"]) for r in rows] == [
        (PROMOTION, "canary_promotion/run_1/canary", first.token),
        (PROMOTION, "canary_promotion/run_2/canary", second.token),
        ("model-control", "model_publish/run_3/load", 1),
    ]
    assert {r["host"] for r in rows} == {socket.gethostname()} and {r["pid"] for r in rows} == {os.getpid()}
    assert rows[0]["released_at"] is None
    assert rows[1]["released_at"] >= rows[1]["acquired_at"] > rows[0]["acquired_at"]
    assert rows[2]["released_at"] is not None
    assert [r["holder"] for r in store.lease_history(purposes=("model-control",))] == ["model_publish/run_3/load"]
    assert store.lease_history(since=time.time() + 60) == []


def test_heartbeat_keeps_a_lease_held_past_its_ttl(db_url):
    store = CoordinationStore(db_url, ttl_s=0.6)
    with store.hold(PROMOTION, "churn_model", holder="long promotion") as lease:
        time.sleep(1.5)
        with pytest.raises(LeaseBusyError, match="long promotion"):
            store.acquire(PROMOTION, "churn_model", holder="other")
        lease.check()


def test_lease_of_a_killed_process_on_this_host_is_taken_over_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from repository_sync.locks import promotion_lock
        with promotion_lock("churn_model", url={url!r}, holder="airflow-worker-7", ttl_s=600):
            print("held", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(LeaseBusyError, match=f"(?s)airflow-worker-7.*pid {proc.pid}"):
            with promotion_lock("churn_model", url=url):
                pass
    finally:
        proc.kill()
        proc.wait()
    with promotion_lock("churn_model", url=url, holder="after crash") as lease:
        assert lease.token == 2


COUNTER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from ground.coordination import CoordinationStore
    store = CoordinationStore(sys.argv[1])
    for _ in range(40):
        with store.locked_state("test", "counter") as (conn, value):
            store.set_state("test", "counter", (value or 0) + 1, conn=conn)
""")


def test_state_read_check_write_is_atomic_across_processes(db_url):
    code = COUNTER.format(root=str(ROOT))
    CoordinationStore(db_url)  # create the tables once
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert CoordinationStore(db_url).get_state("test", "counter") == 120


@pytest.mark.integration
def test_two_celery_workers_with_different_homes_race_for_one_promotion(tmp_path):
    """Real Celery workers (Redis broker), each with its own TRITONFLOW_HOME, one PostgreSQL."""
    pytest.importorskip("celery")
    redis = pytest.importorskip("redis")
    psycopg = pytest.importorskip("psycopg")
    try:
        redis.Redis(host="127.0.0.1", port=6379).ping()
    except Exception as exc:  # pragma: no cover
        pytest.skip(f"Redis on 127.0.0.1:6379 not reachable: {exc}")
    name = f"i11coord_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # pragma: no cover
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} not reachable: {exc}")
    db_url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    broker = f"redis://127.0.0.1:6379/{11 + int(uuid.uuid4().int % 4)}"
    queue = f"promotion-race-{uuid.uuid4().hex[:8]}"
    workers = []
    try:
        for i in range(2):
            env = dict(os.environ, TRITONFLOW_HOME=str(tmp_path / f"host{i}"),
                       TRITONFLOW_COORDINATION_DB_URL=db_url, TRITONFLOW_TEST_CELERY_BROKER=broker,
                       TRITONFLOW_TEST_WORKER=f"worker{i}", PYTHONPATH=str(ROOT))
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.repository_sync.celery_promotion_app",
                 "worker", "--pool", "solo", "--queues", queue, "--hostname", f"worker{i}@%h",
                 "--loglevel", "WARNING"],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        os.environ["TRITONFLOW_TEST_CELERY_BROKER"] = broker
        from tests.repository_sync.celery_promotion_app import app

        app.conf.broker_url = app.conf.result_backend = broker
        deadline = time.monotonic() + 120
        while len(app.control.ping(timeout=1.0) or []) < 2:
            assert time.monotonic() < deadline, "the two Celery workers did not come up"
        start_at = time.time() + 2.0
        # one task per worker (solo pool: a worker runs one task at a time)
        results = [app.send_task("promote", args=["churn_model", start_at, 4.0], queue=queue)
                   for _ in range(2)]
        outcomes = [r.get(timeout=120) for r in results]
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        os.environ.pop("TRITONFLOW_TEST_CELERY_BROKER", None)
        from ground.coordination import _ENGINES

        for key in [k for k in _ENGINES if name in k]:
            _ENGINES.pop(key).dispose()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    winners = [o for o in outcomes if "won" in o]
    losers = [o for o in outcomes if "lost" in o]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert {o["home"] for o in outcomes} == {str(tmp_path / "host0"), str(tmp_path / "host1")}
    assert losers[0]["holder"] == winners[0]["won"]
    assert winners[0]["won"] in losers[0]["error"] and "'churn_model'" in losers[0]["error"]
