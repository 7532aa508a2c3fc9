"""Desired-state model control against a real Triton (explicit mode): concurrent loads of one model.

Two tasks load different versions of one model at about the same time, from two threads and from
two processes (each with its own ``TRITONFLOW_HOME``, sharing only the coordination database).
Every version stays READY and each caller's reported versions are still true when it returns.
Each race is run RACE_TRIALS times (60: a race lost 5 % of the time passes all of them with
probability 0.95 ** 60 = 4.6 %), with the second request at several gaps after the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ground.coordination import CoordinationStore
from ground.exceptions import TritonflowError
from repository_sync.publish import publish_version
from repository_sync.triton.client import TritonModelControl
from repository_sync.triton.model_control import desired_versions, reconcile_model

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
default_model_filename: "model.onnx"
input [ {{ name: "features" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "probabilities" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def _fraud_onnx(path: Path, seed: int) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).normal(size=(4, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "w"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)],
        "fraud",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def served(tmp_path, signing_keys, triton_factory):
    """A repository with signed versions 1, 2, 3 of two models, and a Triton serving it."""
    repo = tmp_path / "repo"
    for name in ("fraud_model", "fraud_model_mp"):
        for v in (1, 2, 3):
            publish_version(repository=repo, model_name=name, version=v,
                            model_file=_fraud_onnx(tmp_path / f"{name}-{v}.onnx", v),
                            config=CONFIG.format(name=name), private_key=signing_keys.private,
                            trusted_keys=signing_keys.trusted_dir)
    triton = triton_factory(str(repo))
    return repo, triton, signing_keys


def _control(served, **kw) -> TritonModelControl:
    repo, triton, keys = served
    return TritonModelControl(triton.http_url, repository=str(repo), trusted_keys=keys.trusted_dir,
                              load_timeout_s=60, **kw)


#: Races each concurrent-load test runs. A race lost with probability p passes all N trials with
#: probability (1 - p) ** N: 0.95 ** 60 = 4.6 %, so a 5 % failure rate is caught 95 times in 100.
RACE_TRIALS = 60
#: Gaps (s) between the two load requests of a race, cycled over the trials (and which version
#: asks first alternates), so the second request lands before, during and after the first load.
RACE_GAPS_S = (0.0, 0.01, 0.03, 0.1, 0.2)


def _thread_race(served, name: str, first: int, second: int, gap: float) -> dict[int, list[int]]:
    """Two threads load ``first`` and, ``gap`` seconds later, ``second``; the versions each reported."""
    reported: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def task(version: int, delay: float) -> None:
        try:
            with _control(served, holder=f"task-v{version}") as control:
                barrier.wait(timeout=30)
                time.sleep(delay)
                reported[version] = control.load(name, version, keep_loaded=True)["versions"]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(first, 0.0)), threading.Thread(target=task, args=(second, gap))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    return reported


@pytest.mark.integration
def test_two_threads_loading_versions_of_one_model_both_stay_ready(served):
    """RACE_TRIALS races of two threads, each loading its version of one model (see RACE_GAPS_S)."""
    name = "fraud_model"
    with _control(served) as control:
        control.load(name, 1)
        for trial in range(RACE_TRIALS):
            gap = RACE_GAPS_S[trial % len(RACE_GAPS_S)]
            first, second = (3, 2) if trial % 2 == 0 else (2, 3)
            where = f"trial {trial} of {RACE_TRIALS} (v{first} first, then v{second} {gap} s later)"
            reported = _thread_race(served, name, first, second, gap)
            ready = control.ready_versions(name)
            assert ready == [1, 2, 3], (where, reported)
            # what each caller reported is still true after both returned
            assert all(v in reported[v] and set(reported[v]) <= set(ready) for v in reported), (where, reported)
            control.unload_versions(name, [2, 3])  # one request: 1 stays
            assert control.ready_versions(name) == [1], where


#: One long-lived loader process per version ("host"): for each start time read from stdin it makes
#: a fresh TritonModelControl on the shared coordination DB, waits for that time, loads its
#: version and prints the versions the load reported.
LOADER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from repository_sync.triton.client import TritonModelControl
    url, repo, keys, db, name, version = sys.argv[1:7]
    print("ready", flush=True)
    for line in sys.stdin:
        start_at = float(line)
        with TritonModelControl(url, repository=repo, trusted_keys=keys, load_timeout_s=60,
                                coordination=db, holder=f"dag-v{{version}}") as control:
            while time.time() < start_at:
                time.sleep(0.001)
            out = control.load(name, int(version), keep_loaded=True)
        print(json.dumps(out["versions"]), flush=True)
""")


@pytest.mark.integration
def test_two_processes_loading_versions_of_one_model_both_stay_ready(served, tmp_path):
    repo, triton, keys = served
    name, db = "fraud_model_mp", f"sqlite:///{tmp_path / 'shared' / 'coordination.db'}"
    store = CoordinationStore(db)
    procs = {}
    try:
        for version in (3, 2):
            env = dict(os.environ, TRITONFLOW_HOME=str(tmp_path / f"host-v{version}"))
            procs[version] = subprocess.Popen(
                [sys.executable, "-c", LOADER.format(root=str(ROOT)), triton.http_url, str(repo),
                 str(keys.trusted_dir), db, name, str(version)],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        for proc in procs.values():
            assert proc.stdout.readline().strip() == "ready", proc.poll()
        with _control(served, coordination=store) as control:
            control.load(name, 1)
            for trial in range(RACE_TRIALS):
                gap = RACE_GAPS_S[trial % len(RACE_GAPS_S)]
                first, second = (3, 2) if trial % 2 == 0 else (2, 3)
                start_at = time.time() + 0.3
                procs[first].stdin.write(f"{start_at}\n")
                procs[second].stdin.write(f"{start_at + gap}\n")
                reported = {}
                for version, proc in procs.items():
                    line = proc.stdout.readline()
                    assert line, f"trial {trial}: the loader of version {version} died (rc {proc.poll()})"
                    reported[version] = json.loads(line)
                where = f"trial {trial} of {RACE_TRIALS} (v{first} first, then v{second} {gap} s later)"
                ready = control.ready_versions(name)
                assert ready == [1, 2, 3], (where, reported)
                assert all(v in reported[v] and set(reported[v]) <= set(ready) for v in reported), (where, reported)
                assert sorted(desired_versions(store, name)) == [1, 2, 3], where
                control.unload_versions(name, [2, 3])  # one request: 1 stays
                assert control.ready_versions(name) == [1], where
    finally:
        for proc in procs.values():
            proc.stdin.close()
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class _Aliases:
    """The registry's alias table as RegistryClient.aliases returns it (no MLflow needed here)."""

    def __init__(self, aliases):
        self._aliases = aliases

    def aliases(self, model):
        return dict(self._aliases)


@pytest.mark.integration
def test_reconcile_loads_what_the_registry_needs_plus_pinned_evaluations_in_one_request(served, tmp_path):
    name = "fraud_model"
    store = CoordinationStore(f"sqlite:///{tmp_path / 'c.db'}")
    with _control(served, coordination=store) as control:
        control.load(name, 1)
        control.load(name, 2, purpose="evaluation")  # a shadow evaluation in progress
        out = reconcile_model(control, _Aliases({"champion": 3, "previous_champion": 1}), name)
        assert out["versions"] == [1, 2, 3] and control.ready_versions(name) == [1, 2, 3]
        control.unload_versions(name, [2])  # the evaluation ended
        out = reconcile_model(control, _Aliases({"champion": 3, "previous_champion": 1}), name)
        assert out["versions"] == [1, 3] and control.ready_versions(name) == [1, 3]
        # a failed load (version 9 is not in the repository) leaves the desired set serving
        with pytest.raises(TritonflowError):
            control.load(name, 9)
        assert control.ready_versions(name) == [1, 3]
        assert sorted(desired_versions(store, name)) == [1, 3]
        # alias challenger on a version whose publish failed (nothing in the repository): the
        # registry's want is skipped and named, the served versions stay (the canary's reconcile
        # after a promotion failed on exactly this in the loop on the compose stack)
        out = reconcile_model(control, _Aliases({"champion": 3, "previous_champion": 1, "challenger": 9}), name)
        assert out["versions"] == [1, 3] and "9" in out["skipped"] and "not in repository" in out["skipped"]["9"]
        assert control.ready_versions(name) == [1, 3]


@pytest.mark.integration
def test_a_change_retried_while_triton_restarts_loads_the_desired_set_back(served, tmp_path):
    """Triton in explicit mode forgets every loaded version when it restarts. A reconcile sent while
    it is down fails (nothing changes); retried by ``when_triton_answers`` until it answers again, it
    loads the desired set (here a canary's rollback: both versions minus the challenger) back."""
    from ground.exceptions import ServiceUnavailableError
    from repository_sync.triton.model_control import reconcile, when_triton_answers

    name = "fraud_model"
    _, triton, _ = served
    store = CoordinationStore(f"sqlite:///{tmp_path / 'c.db'}")
    with _control(served, coordination=store, holder="canary") as control:
        reconcile(control, name, add=[1, 2], purpose="canary")  # champion 1 and challenger 2 loaded
        assert control.ready_versions(name) == [1, 2]
        triton.stop()
        with pytest.raises(ServiceUnavailableError):
            reconcile(control, name, remove=[2])
        assert sorted(desired_versions(store, name)) == [1, 2]  # unchanged by the failed change
        restart = threading.Timer(2.0, triton.start)
        restart.start()
        try:
            done = when_triton_answers(lambda: reconcile(control, name, remove=[2]), timeout_s=180, poll_s=0.5)
        finally:
            restart.join()
        assert done["versions"] == [1] and control.ready_versions(name) == [1]
        assert sorted(desired_versions(store, name)) == [1]
        triton.stop()  # a Triton that never comes back: the last error once the time is up
        t0 = time.monotonic()
        with pytest.raises(ServiceUnavailableError):
            when_triton_answers(lambda: reconcile(control, name, add=[3]), timeout_s=1.0, poll_s=0.2)
        assert time.monotonic() - t0 < 30
