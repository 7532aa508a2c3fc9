"""Canary promotion and rollback over two Triton replicas behind one gateway.

Two real Triton processes (explicit model control) serve one folder repository (the NFS case);
the runtime's real NGINX gateway balances over both (``TRITONFLOW_TRITON_REPLICA_URLS``), and
MLflow is the session's real tracking server. The canary's own path -- loading, the traffic
steps, promotion, manual rollback -- runs unchanged and acts on every replica. Models, the
traffic client and the helpers are those of ``test_canary_pipeline``.
"""

from __future__ import annotations

import pandas as pd
import pytest

from repository_sync.triton.client import TritonModelControl
from tests.conftest import make_settings
from tests.pipelines import test_canary_pipeline as canary
from tritonflow.pipelines.canary import CanaryEnvironment
from tritonflow.pipelines.canary_rollback import manual_rollback
from tritonflow.runtime.services import NginxGateway, TritonServer, free_port

pytestmark = pytest.mark.integration

models = canary.models  # the module's classifiers (fixture)


@pytest.fixture(scope="module")
def replica_stack(tmp_path_factory, mlflow_server):
    """Two Tritons on one folder repository, a gateway over both, settings naming both."""
    from repository_sync.signing import generate_key_pair

    home = tmp_path_factory.mktemp("replicas-home")
    keys = home / "keys"
    generate_key_pair(keys / "signing.pem", keys / "trusted" / "current.pub")
    repo = home / "repo"
    second = TritonServer(make_settings(home / "second"), repository=str(repo))
    port = free_port()
    settings = make_settings(
        home, triton_http_port=port, triton_replica_urls=f"127.0.0.1:{port},{second.http_url}",
        repository_uri=str(repo), signing_key_path=keys / "signing.pem", signing_trusted_keys_dir=keys / "trusted",
        mlflow_tracking_uri=mlflow_server.tracking_uri, inference_log_root=str(home / "inference_logs"),
        load_timeout_s=60.0,
    )
    first = TritonServer(settings, repository=str(repo))
    started: list = []
    try:
        for service in (first, second):
            started.append(service.start())
        gateway = NginxGateway(settings)
        assert gateway.triton_servers == [first.http_url, second.http_url]
        started.append(gateway.start())
        env = CanaryEnvironment.from_settings(settings, gateway=gateway)
        yield canary.Stack(settings, first, gateway, env, repo, keys / "signing.pem",
                           mlflow_server.tracking_uri), (first, second)
    finally:
        for service in reversed(started):
            service.stop()


def _ready(servers, name: str) -> dict[str, list[int]]:
    out = {}
    for server in servers:
        with TritonModelControl(server.http_url) as tc:
            out[server.http_url] = tc.ready_versions(name)
    return out


def test_canary_promotes_and_rolls_back_on_every_replica(replica_stack, models):
    stack, servers = replica_stack
    name = "canary_replicas"
    canary.deploy(stack, models, name, {1: "good", 2: "good2"}, champion=1)
    assert set(map(tuple, _ready(servers, name).values())) == {(1,)}
    from drift_checks.reference import save_reference

    save_reference(stack.settings.inference_log_root, name, 2, pd.DataFrame(models["X"], columns=canary.FEATURES))
    with canary.Traffic(stack, name, models["X"]) as traffic:
        result = canary.promote(stack, name, "2", holder="canary_promotion/replicas/canary",
                                expected_predictions=canary.expected_file(models, "good2", name))
    assert result["outcome"] == "promoted", result
    assert canary.registry(stack).aliases(name)["champion"] == 2
    # champion and rollback target on both replicas; the gateway sends everything to version 2
    assert _ready(servers, name) == {s.http_url: [1, 2] for s in servers}
    assert canary.versions_served(stack, name) == {"2"}
    assert traffic.statuses and all(code == 200 for _, code in traffic.statuses)
    for server in servers:  # the gateway balanced the canary's traffic over both replicas
        with TritonModelControl(server.http_url) as tc:
            stats = tc.client.get_inference_statistics(name)["model_stats"]
        assert sum(int(m.get("inference_count", 0)) for m in stats) > 0, (server.http_url, stats)

    rolled = manual_rollback(name, "test: replicas", env=stack.env)
    assert rolled["rolled_back_to"] == 1 and rolled["unloaded"]
    assert _ready(servers, name) == {s.http_url: [1] for s in servers}
    assert canary.versions_served(stack, name) == {"1"}
