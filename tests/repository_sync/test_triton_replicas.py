"""Several Triton replicas on one S3 (moto) repository, controlled as one.

Real Triton processes (explicit model control) read one moto S3 repository; the replica set loads,
unloads and reloads on every replica under one lease per model, and a replica that cannot load a
version blocks the change and leaves the others as they were.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from ground.coordination import CoordinationStore
from ground.exceptions import DataError, ModelLoadError, ModelLoadRefusedError, ParityError
from ground.values import parse_replica_urls
from repository_sync.publish import publish_version
from repository_sync.triton.client import TritonModelControl
from repository_sync.triton.model_control import desired_versions, reconcile
from repository_sync.triton.replicas import TritonReplicaSet, triton_control
from tests.conftest import make_settings
from tests.repository_sync.test_model_control import CONFIG, _fraud_onnx
from tritonflow.runtime.services import NginxGateway

NAME = "fraud_model"


# --------------------------------------------------------------------------- no service
def test_replica_urls_parse_in_order_without_duplicates():
    assert parse_replica_urls(" a:8000, http://b:8001/ ,a:8000,,") == ["a:8000", "b:8001"]
    with pytest.raises(DataError, match="not host:port"):
        parse_replica_urls("a:8000,b")


def test_settings_default_to_the_single_triton_url(tmp_path):
    one = make_settings(tmp_path / "one", triton_url="t1:8000")
    assert one.triton_replica_http_urls == ["t1:8000"]
    two = make_settings(tmp_path / "two", triton_url="t1:8000", triton_replica_urls="t1:8000,t2:8000")
    assert two.triton_replica_http_urls == ["t1:8000", "t2:8000"]
    assert isinstance(triton_control(one), TritonModelControl)
    both = triton_control(two)
    assert isinstance(both, TritonReplicaSet) and both.urls == ["t1:8000", "t2:8000"]
    assert isinstance(triton_control(two, "t9:8000"), TritonModelControl)  # an explicit URL wins
    both.close()
    # replicas named without TRITONFLOW_TRITON_URL: the default URL passed along is no override
    three = make_settings(tmp_path / "three", triton_replica_urls="t1:8000,t2:8000")
    assert isinstance(triton_control(three, three.triton_http_url), TritonReplicaSet)


def test_gateway_upstream_lists_every_replica(tmp_path):
    s = make_settings(tmp_path, triton_replica_urls="127.0.0.1:8000,127.0.0.1:9000")
    conf = NginxGateway(s).render_config()
    upstream = conf.split("upstream triton {", 1)[1].split("}", 1)[0]
    assert "server 127.0.0.1:8000;" in upstream and "server 127.0.0.1:9000;" in upstream
    assert "server 127.0.0.1:7000;" in NginxGateway(s, triton_http="127.0.0.1:7000").render_config()


# --------------------------------------------------------------------------- real replicas
@pytest.fixture
def s3_repo(tmp_path, s3_server, signing_keys):
    """A moto S3 repository with signed versions 1 and 2 of ``fraud_model``."""
    import boto3

    bucket = f"replicas-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    url = f"s3://{s3_server.endpoint_url}/{bucket}/triton"
    for v in (1, 2):
        publish_version(repository=url, model_name=NAME, version=v,
                        model_file=_fraud_onnx(tmp_path / f"{NAME}-{v}.onnx", v), config=CONFIG.format(name=NAME),
                        private_key=signing_keys.private, trusted_keys=signing_keys.trusted_dir,
                        endpoint_url=s3_server.endpoint_url)
    return url


def _set(urls, url, s3_server, keys, store) -> TritonReplicaSet:
    return TritonReplicaSet(urls, repository=url, trusted_keys=keys.trusted_dir, endpoint_url=s3_server.endpoint_url,
                            load_timeout_s=30, coordination=store, holder="test")


@pytest.mark.integration
def test_replicas_on_one_s3_repository_load_unload_and_roll_back_together(
        tmp_path, s3_repo, s3_server, signing_keys, triton_factory):
    a, b = triton_factory(s3_repo), triton_factory(s3_repo)
    settings = make_settings(tmp_path / "home", triton_url=a.http_url,
                             triton_replica_urls=f"{a.http_url},{b.http_url}")
    store = CoordinationStore.from_settings(settings)
    with _set([a.http_url, b.http_url], s3_repo, s3_server, signing_keys, store) as replicas:
        assert replicas.coordination_key(NAME) == NAME  # one lease and one desired set per model
        info = replicas.load(NAME, 1)
        assert set(info["replicas"]) == {a.http_url, b.http_url}
        assert all(r["versions"] == [1] and r["signatures"]["1"] == info["signature_digest"]
                   for r in info["replicas"].values())
        assert replicas.ready_by_replica(NAME) == {a.http_url: [1], b.http_url: [1]}

        # publish's load and smoke test: every replica answers; a parity failure on one removes it again
        x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
        logits = x @ np.random.default_rng(2).normal(size=(4, 2)).astype(np.float32)
        want = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        with pytest.raises(ParityError, match=f"replica {a.http_url} .1 of 2."):
            replicas.load_and_smoke_test(NAME, 2, {"features": x}, {"probabilities": want + 0.5})
        assert replicas.ready_by_replica(NAME) == {a.http_url: [1], b.http_url: [1]}
        info, _ = replicas.load_and_smoke_test(NAME, 2, {"features": x}, {"probabilities": want}, atol=1e-5)
        assert {u: r["smoke"]["rows_sent"] for u, r in info["replicas"].items()} == {a.http_url: 6, b.http_url: 6}
        replicas.unload_versions(NAME, [2])
        assert replicas.ready_by_replica(NAME) == {a.http_url: [1], b.http_url: [1]}

        # canary: champion 1 and challenger 2 side by side on every replica (the canary's own path)
        from tritonflow.pipelines.canary import CanaryEnvironment
        from tritonflow.pipelines.canary_loading import ensure_loaded, unload_version

        env = CanaryEnvironment(settings=settings, triton_url=settings.triton_http_url, metrics_url="",
                                gateway_url="", gateway_conf_dir=tmp_path / "gw", gateway_reload=None,
                                gateway_test=None, repository_uri=s3_repo, trusted_keys=signing_keys.trusted_dir,
                                tracking_uri="", inference_log_root="", endpoint_url=s3_server.endpoint_url)
        with env.triton() as tc:
            assert isinstance(tc, TritonReplicaSet)
        loaded = ensure_loaded(NAME, [1, 2], env=env)
        assert loaded["versions"] == [1, 2] and loaded["loaded_now"] == [2]
        assert replicas.ready_by_replica(NAME) == {a.http_url: [1, 2], b.http_url: [1, 2]}
        # promotion: the old champion leaves every replica
        unload_version(env, NAME, 1, keep_config_of=2)
        assert replicas.ready_by_replica(NAME) == {a.http_url: [2], b.http_url: [2]}
        # rollback: the target back on every replica, then the rolled-back version removed
        with env.triton() as tc:
            tc.verify(NAME, 1)
            reconcile(tc, NAME, add=[1], config_version=1)
        unload_version(env, NAME, 2, keep_config_of=1)
        assert replicas.ready_by_replica(NAME) == {a.http_url: [1], b.http_url: [1]}
        assert set(desired_versions(store, NAME)) == {1}
        replicas.unload(NAME)
        assert replicas.ready_versions_any(NAME) == []


@pytest.mark.integration
def test_a_replica_that_cannot_load_blocks_the_change_and_leaves_the_others(
        tmp_path, s3_repo, s3_server, signing_keys, triton_factory):
    good = triton_factory(s3_repo)
    # The broken replica serves a folder holding version 1 only: it cannot read version 2.
    local = tmp_path / "partial"
    publish_version(repository=local, model_name=NAME, version=1, model_file=_fraud_onnx(tmp_path / "v1.onnx", 1),
                    config=CONFIG.format(name=NAME), private_key=signing_keys.private,
                    trusted_keys=signing_keys.trusted_dir)
    broken = triton_factory(str(local))
    store = CoordinationStore(f"sqlite:///{Path(tmp_path) / 'coordination.db'}")
    with _set([good.http_url, broken.http_url], s3_repo, s3_server, signing_keys, store) as replicas:
        replicas.load(NAME, 1)
        assert replicas.ready_by_replica(NAME) == {good.http_url: [1], broken.http_url: [1]}
        with pytest.raises((ModelLoadRefusedError, ModelLoadError), match=f"replica {broken.http_url} .2 of 2."):
            replicas.load(NAME, 2)
        # the replica changed first is back to the desired set; the desired set is unchanged
        assert replicas.ready_by_replica(NAME) == {good.http_url: [1], broken.http_url: [1]}
        assert set(desired_versions(store, NAME)) == {1}
    # the broken replica first: the change stops there and the good one is never touched
    with _set([broken.http_url, good.http_url], s3_repo, s3_server, signing_keys, store) as replicas:
        with pytest.raises((ModelLoadRefusedError, ModelLoadError), match=f"replica {broken.http_url} .1 of 2."):
            replicas.load(NAME, 2)
        assert replicas.ready_by_replica(NAME) == {broken.http_url: [1], good.http_url: [1]}
        assert replicas.is_ready(NAME, 1) and not replicas.is_ready(NAME, 2)
