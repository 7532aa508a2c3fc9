"""Canary promotion and rollback end to end on real services.

One real Triton (explicit model control over a folder repository) and one real NGINX gateway in
front of it are shared by the module (started with the same runtime classes the ``triton_factory``
and ``gateway_factory`` fixtures use); MLflow is the session's real tracking server. Each test
works on its own model name, so tests do not share routing, loaded versions or aliases.

The challenger is judged against its own expected behaviour: an expected-predictions file (its
probabilities and the inputs, what a shadow evaluation records) is passed as
``expected_predictions``, and the live shadow test makes one through the gateway's mirror.

Models are small scikit-learn classifiers on iris converted to ONNX
(``model_registry.conversion``), configured with ``model_registry.triton_config.build_config``,
signed and published with ``repository_sync.publish.publish_version``. A bounded loopback client
thread sends requests through the gateway during a canary and writes what it got into the
inference log (``drift_checks.inference_log.InferenceLogWriter``), the way a serving client does.
Nothing is faked, except a memory setting in the pre-flight test.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import requests

from ground.coordination import PROMOTION
from ground.exceptions import ConcurrencyError, DataError, PreflightError, RegistryError
from repository_sync.locks import store_for
from repository_sync.routing.gateway_probe import served_by, wait_live
from repository_sync.routing.traffic_plan import TrafficPlan
from tests.conftest import make_settings
from tritonflow.pipelines.canary import CanaryEnvironment
from tritonflow.pipelines.canary_loading import ensure_loaded
from tritonflow.pipelines.canary_promotion import PromotionRequest, run_promotion
from tritonflow.pipelines.canary_rollback import manual_rollback
from tritonflow.runtime.services import NginxGateway, TritonServer, free_port

pytestmark = pytest.mark.integration

#: Thresholds of the tests: a 1-2 s bake on a shared 2-core machine gives a few dozen requests, so
#: latency figures are noisy. The prediction thresholds are the defaults (KS 0.2, PSI 0.25): the
#: checks carry their own sampling margins.
TEST_POLICY = {"max_latency_ratio": 100.0, "max_mean_latency_ms": 5000.0, "max_extensions": 2}
STEPS = [50, 100]
BAKE_S = 1.5
MIN_REQUESTS = 10
FEATURES = ["f0", "f1", "f2", "f3"]
PREDICTIONS = ["probability_0", "probability_1", "probability_2"]


# ------------------------------------------------------------------------------------ models
@dataclasses.dataclass
class Onnx:
    path: Path
    config: str


def _convert(clf, X, name: str, folder: Path) -> Onnx:
    from mlflow.models import infer_signature

    from ground.settings import get_settings
    from model_registry.conversion.common import convert_sklearn
    from model_registry.triton_config import InstanceGroupSpec, build_config, to_pbtxt

    conv = convert_sklearn(clf, infer_signature(X, clf.predict_proba(X)), model_name=name, settings=get_settings())
    path = folder / f"{name}.onnx"
    path.write_bytes(conv.serialized())
    cfg = build_config("placeholder", conv.onnx_model, max_batch_size=16,
                       instance_groups=[InstanceGroupSpec("KIND_CPU", 1)])
    return Onnx(path, to_pbtxt(cfg))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Iris classifiers: ``good`` (champion), ``good2`` (healthy challenger, another C),
    ``shifted`` (trained on shuffled labels: near-uniform probabilities), and the binary
    ``bin``/``bin2`` (virginica or not) for the live shadow; ``clf`` holds the fitted models."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    folder = tmp_path_factory.mktemp("onnx")
    shuffled = np.random.default_rng(0).permutation(y)
    clf = {
        "good": LogisticRegression(max_iter=500).fit(X, y),
        "good2": LogisticRegression(max_iter=500, C=0.8).fit(X, y),
        "shifted": LogisticRegression(max_iter=500).fit(X, shuffled),
        "bin": LogisticRegression(max_iter=500).fit(X, y == 2),
        "bin2": LogisticRegression(max_iter=500, C=0.5).fit(X, y == 2),
    }
    out = {k: _convert(c, X, k, folder) for k, c in clf.items()}
    out.update(X=X, clf=clf, folder=folder)
    return out


def expected_file(models: dict, key: str, name: str) -> str:
    """An expected-predictions file of model ``key`` on the iris rows: one ``expected.<column>``
    per logged probability column (the per-output-column comparison) and the inputs."""
    from repository_sync.canary.checks import EXPECTED_SCORE_COLUMN

    X = models["X"]
    probs = models["clf"][key].predict_proba(X)
    frame = pd.DataFrame(X, columns=FEATURES)
    frame[EXPECTED_SCORE_COLUMN] = probs[:, -1]
    for j in range(probs.shape[1]):
        frame[f"expected.probability_{j}"] = probs[:, j]
    frame["source"] = "shadow_replay"
    path = models["folder"] / f"{name}-{key}-expected.parquet"
    frame.to_parquet(path, index=False)
    return str(path)


# ------------------------------------------------------------------------------------ services
@dataclasses.dataclass
class Stack:
    settings: object
    triton: TritonServer
    gateway: NginxGateway
    env: CanaryEnvironment
    repo: Path
    private_key: Path
    tracking_uri: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mlflow_server):
    """Real Triton + NGINX gateway + the session's MLflow, wired through Settings."""
    from repository_sync.signing import generate_key_pair

    home = tmp_path_factory.mktemp("canary-home")
    keys = home / "keys"
    generate_key_pair(keys / "signing.pem", keys / "trusted" / "current.pub")
    repo = home / "repo"
    settings = make_settings(
        home, repository_uri=str(repo), signing_key_path=keys / "signing.pem",
        signing_trusted_keys_dir=keys / "trusted", mlflow_tracking_uri=mlflow_server.tracking_uri,
        inference_log_root=str(home / "inference_logs"), load_timeout_s=60.0,
    )
    triton = TritonServer(settings, repository=str(repo)).start()
    gateway = None
    try:
        gateway = NginxGateway(settings, triton_http=triton.http_url).start()
        env = CanaryEnvironment.from_settings(settings, gateway=gateway)
        yield Stack(settings, triton, gateway, env, repo, keys / "signing.pem", mlflow_server.tracking_uri)
    finally:
        if gateway is not None:
            gateway.stop()
        triton.stop()


def deploy(stack: Stack, models: dict, name: str, versions: dict[int, str], champion: int = 1) -> None:
    """Publish ``versions`` ({version: model key}) of ``name``, register them in MLflow, load the
    champion and route 100 % of the gateway's traffic to it."""
    from mlflow import MlflowClient

    from model_registry.registry import RegistryClient
    from repository_sync.publish import publish_version

    client = MlflowClient(stack.tracking_uri)
    client.create_registered_model(name)
    for v, key in sorted(versions.items()):
        m = models[key]
        publish_version(repository=str(stack.repo), model_name=name, version=v, model_file=m.path,
                        config=m.config.replace('name: "placeholder"', f'name: "{name}"'),
                        private_key=stack.private_key, trusted_keys=stack.settings.signing_trusted_keys_dir)
        mv = client.create_model_version(name, source=f"s3://tritonflow-test-models/{name}/{v}")
        assert int(mv.version) == v
    RegistryClient(stack.tracking_uri).promote(name, champion, reason="initial deployment")
    ensure_loaded(name, [champion], env=stack.env)
    plan = TrafficPlan.single(name, champion)
    stack.env.router().apply(plan)
    wait_live(stack.gateway.url, plan)


def registry(stack: Stack):
    from model_registry.registry import RegistryClient

    return RegistryClient(stack.tracking_uri)


def ready_versions(stack: Stack, name: str) -> list[int]:
    with stack.env.triton() as tc:
        return tc.ready_versions(name)


def versions_served(stack: Stack, name: str, n: int = 20) -> set:
    return {served_by(stack.gateway.url, name)[0] for _ in range(n)}


# ------------------------------------------------------------------------------------ traffic
class Traffic:
    """Bounded loopback client: sends iris rows through the gateway and logs what it got, under
    the request id it sends (``X-Request-Id``) so mirrored answers can be paired with it."""

    def __init__(self, stack: Stack, name: str, X: np.ndarray, max_requests: int = 20_000,
                 flush_s: float = 0.2, classes: int = 3):
        from drift_checks.inference_log import InferenceLogWriter, LogSchema

        self.url = f"{stack.gateway.url}/v2/models/{name}/infer"
        self.X = X
        self.max_requests = max_requests
        self.flush_s = flush_s
        self.predictions = PREDICTIONS[:classes]
        self.writer = InferenceLogWriter(
            stack.settings.inference_log_root, name,
            LogSchema({c: "float" for c in FEATURES}, {c: "float" for c in self.predictions}),
        )
        self.stop_event = threading.Event()
        self.statuses: list[tuple[str | None, int]] = []
        self.rows: list[dict] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.rng = np.random.default_rng(1)

    def __enter__(self) -> "Traffic":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
        self._flush()

    def _one(self) -> None:
        row = self.X[self.rng.integers(len(self.X))]
        body = json.dumps({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32",
                                       "data": [float(v) for v in row]}],
                           "outputs": [{"name": "probabilities"}]}).encode()
        rid = uuid.uuid4().hex
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "X-Request-Id": rid})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                version, payload = resp.headers.get("X-Tritonflow-Version"), json.loads(resp.read())
                self.statuses.append((version, resp.status))
        except urllib.error.HTTPError as exc:
            self.statuses.append((exc.headers.get("X-Tritonflow-Version"), exc.code))
            return
        except (urllib.error.URLError, OSError):
            self.statuses.append((None, 0))
            return
        probs = payload["outputs"][0]["data"]
        rec = {"request_id": rid, "timestamp": pd.Timestamp.now(tz="UTC"),
               "model_version": int(version)}
        rec.update({c: float(v) for c, v in zip(FEATURES, row, strict=True)})
        rec.update({c: float(p) for c, p in zip(self.predictions, probs, strict=True)})
        self.rows.append(rec)

    def _flush(self) -> None:
        rows, self.rows = self.rows, []
        if rows:
            self.writer.write(pd.DataFrame(rows))

    def _run(self) -> None:
        last = time.monotonic()
        sent = 0
        while not self.stop_event.is_set() and sent < self.max_requests:
            self._one()
            sent += 1
            if time.monotonic() - last >= self.flush_s:
                self._flush()
                last = time.monotonic()


def promote(stack: Stack, name: str, challenger, **kw):
    kw.setdefault("steps", STEPS)
    kw.setdefault("bake_s", BAKE_S)
    kw.setdefault("min_requests", MIN_REQUESTS)
    kw.setdefault("policy_overrides", TEST_POLICY)
    runtime = {"env": kw.pop("env", stack.env), **{k: kw.pop(k) for k in ("sleep", "clock") if k in kw}}
    return run_promotion(PromotionRequest(name, challenger, champion=kw.pop("champion", None), **kw), **runtime)


# ------------------------------------------------------------------------------------ promotion
@pytest.fixture(scope="module")
def promoted(stack, models):
    """``canary_ok``: v1 (old, unused), v2 champion, v3 healthy challenger promoted by a canary
    while a second promotion of the same model is attempted."""
    from drift_checks.reference import save_reference

    name = "canary_ok"
    deploy(stack, models, name, {1: "good", 2: "good", 3: "good2"}, champion=2)
    # the challenger's drift reference (as a publish stores it): the coverage check's bins
    save_reference(stack.settings.inference_log_root, name, 3, pd.DataFrame(models["X"], columns=FEATURES))
    expected = expected_file(models, "good2", name)
    outcome: dict = {}

    def first():
        try:
            outcome["result"] = promote(stack, name, "3", holder="canary_promotion/run_A/canary",
                                        expected_predictions=expected)
        except BaseException as exc:  # noqa: BLE001 - reported by the tests
            outcome["error"] = exc

    with Traffic(stack, name, models["X"]) as traffic:
        thread = threading.Thread(target=first)
        thread.start()
        deadline = time.monotonic() + 60
        while not store_for(settings=stack.settings).holder_of(PROMOTION, name):
            assert time.monotonic() < deadline and thread.is_alive(), outcome
            time.sleep(0.05)
        try:
            promote(stack, name, "3", holder="canary_promotion/run_B/canary")
        except ConcurrencyError as exc:
            outcome["second"] = exc
        thread.join(timeout=180)
    outcome["traffic"] = traffic.statuses
    return outcome


def test_healthy_challenger_is_promoted_alias_moved_previous_kept_both_loaded(stack, promoted):
    assert "error" not in promoted, promoted.get("error")
    result = promoted["result"]
    assert result["outcome"] == "promoted", result
    assert [s["verdict"] for s in result["steps"]][-2:] == ["pass", "pass"]
    assert all(s["verdict"] != "fail" for s in result["steps"])
    aliases = registry(stack).aliases("canary_ok")
    assert aliases["champion"] == 3 and aliases["previous_champion"] == 2
    # gateway at 100 % challenger; Triton keeps exactly the new champion and the rollback target
    assert stack.env.router().current_plan("canary_ok").weights == {3: 100}
    assert versions_served(stack, "canary_ok") == {"3"}
    assert ready_versions(stack, "canary_ok") == [2, 3]
    # no request failed through the whole promotion
    assert promoted["traffic"] and all(code == 200 for _, code in promoted["traffic"])


def test_every_step_is_recorded_on_the_challengers_model_version(stack, promoted):
    result = promoted["result"]
    tags = registry(stack).get_version("canary_ok", 3).tags
    prefix = f"tritonflow.canary.{result['canary_id']}."
    steps = {k: json.loads(v) for k, v in tags.items() if k.startswith(prefix + "step.")}
    assert len(steps) == len(result["steps"])
    for step in steps.values():
        assert step["challenger_version"] == 3 and step["champion_version"] == 2
        assert step["verdict"] in ("pass", "inconclusive") and step["canary_requests"] is not None
        assert step["thresholds"]["max_prediction_ks"] == 0.2  # the default
        # the gateway's status log counted the challenger's requests beside Triton's counters
        assert step["error_counts_source"] == "max(triton, gateway)", step["error_counts_source"]
        assert step["gateway_requests"] > 0 and step["gateway_failures"] == 0
    judged = [s for s in steps.values() if s["percent"] == 50 and s["verdict"] == "pass"]
    assert judged and judged[0]["prediction_ks"] is not None  # the distribution was compared
    # against the challenger's own expected predictions, column by column, matched on inputs
    checks = judged[0]["prediction_checks"]
    assert judged[0]["prediction_source"] == "shadow_replay"
    assert {c["column"] for c in checks} == {"probability_0", "probability_1", "probability_2"}
    assert all(c["matched_on_inputs"] for c in checks)
    assert judged[0]["coverage"] is not None and judged[0]["coverage"]["features"][0]["bins"] >= 2
    assert tags[prefix + "outcome"] == "promoted"


def test_every_analysis_is_in_the_canarys_mlflow_run_with_its_plot(stack, promoted):
    from mlflow import MlflowClient

    run = promoted["result"]["canary_run"]
    client = MlflowClient(stack.tracking_uri)
    history = client.get_metric_history(run["run_id"], "verdict")
    assert len(history) == run["analyses"] >= len(promoted["result"]["steps"])
    assert sorted(m.step for m in history) == list(range(1, run["analyses"] + 1))
    files = {f.path for f in client.list_artifacts(run["run_id"], "canary")}
    assert files == {"canary/analyses.json", "canary/canary.png"}
    tags = client.get_run(run["run_id"]).data.tags
    assert tags["tritonflow.canary_outcome"] == "promoted" and tags["tritonflow.challenger_version"] == "3"


def test_old_repository_versions_are_collected_but_never_champion_or_rollback_target(stack, promoted):
    gc = promoted["result"]["gc"]
    assert gc["deleted"] == [1]
    assert not (stack.repo / "canary_ok" / "1").exists()
    assert (stack.repo / "canary_ok" / "2").is_dir() and (stack.repo / "canary_ok" / "3").is_dir()
    # the serving config on disk is now the new champion's
    assert (stack.repo / "canary_ok" / "config.pbtxt").read_bytes() == \
        (stack.repo / "canary_ok" / "3" / "config.pbtxt.intended").read_bytes()


def test_second_concurrent_promotion_fails_naming_the_holder(promoted):
    err = promoted.get("second")
    assert isinstance(err, ConcurrencyError), promoted
    assert "canary_ok" in str(err) and "canary_promotion/run_A/canary" in str(err)


def test_rerun_for_the_version_already_champion_at_100_percent_is_a_noop(stack, promoted):
    before = stack.env.router().current_plan("canary_ok").digest
    result = promote(stack, "canary_ok", "champion")
    assert result["outcome"] == "noop" and result["challenger"] == 3
    assert stack.env.router().current_plan("canary_ok").digest == before
    assert registry(stack).aliases("canary_ok")["champion"] == 3


def test_manual_rollback_routes_to_previous_champion_then_moves_the_alias_back(stack, promoted):
    result = manual_rollback("canary_ok", "test: bad business metrics", env=stack.env)
    assert result["rolled_back_from"] == 3 and result["rolled_back_to"] == 2
    assert stack.env.router().current_plan("canary_ok").weights == {2: 100}
    assert versions_served(stack, "canary_ok") == {"2"}
    aliases = registry(stack).aliases("canary_ok")
    assert aliases["champion"] == 2 and "previous_champion" not in aliases
    assert ready_versions(stack, "canary_ok") == [2]
    # a second rollback has no target: it stops instead of re-promoting version 3
    with pytest.raises(RegistryError, match="previous_champion"):
        manual_rollback("canary_ok", "again", env=stack.env)


# ------------------------------------------------------------------------------------ rollbacks
def test_challenger_serving_other_than_it_was_evaluated_is_rolled_back_gateway_first(stack, models):
    """Version 2 was evaluated as ``good2`` (its expected predictions) but what serves is a model
    trained on shuffled labels (a wrong artifact): its answers differ from its own expected ones."""
    name = "canary_shift"
    deploy(stack, models, name, {1: "good", 2: "shifted"})
    with Traffic(stack, name, models["X"]):
        result = promote(stack, name, 2, expected_predictions=expected_file(models, "good2", name))
    assert result["outcome"] == "rolled_back", result
    assert result["steps"][-1]["verdict"] == "fail" and "expected predictions" in result["reason"]
    actions = [a[0] for a in result["rollback"]["actions"]]
    assert actions == ["gateway_to_champion", "challenger_unloaded"]
    assert stack.env.router().current_plan(name).weights == {1: 100}
    assert versions_served(stack, name) == {"1"}
    assert ready_versions(stack, name) == [1]
    reg = registry(stack)
    assert reg.aliases(name)["champion"] == 1
    tags = reg.get_version(name, 2).tags
    prefix = f"tritonflow.canary.{result['canary_id']}."
    assert tags[prefix + "outcome"] == "rolled_back"
    failed = [json.loads(v) for k, v in tags.items() if k.startswith(prefix + "step.")]
    assert any(s["verdict"] == "fail" and s["prediction_ks"] > 0.2 for s in failed)
    # the canary judged it bad: rejected (stage canary), so no later canary promotes it again
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "canary"
    assert "expected predictions" in tags["tritonflow.rejection_reason"] and result["rejected"]
    with pytest.raises(DataError, match="rejected at stage canary"):
        promote(stack, name, 2)


def test_unreachable_metrics_endpoint_fails_the_canary_and_rolls_back(stack, models):
    name = "canary_nometrics"
    deploy(stack, models, name, {1: "good", 2: "good2"})
    env = dataclasses.replace(stack.env, metrics_url=f"http://127.0.0.1:{free_port()}/metrics")
    result = promote(stack, name, 2, env=env)
    assert result["outcome"] == "rolled_back", result
    assert "metrics unavailable" in result["reason"] and "unreachable" in result["reason"]
    assert stack.env.router().current_plan(name).weights == {1: 100}
    assert ready_versions(stack, name) == [1]
    assert registry(stack).aliases(name)["champion"] == 1
    # nothing was measured: the rollback says nothing of the challenger, which is not rejected
    assert result["rejected"] == "" and registry(stack).get_version(name, 2).tags.get("tritonflow.status") != "rejected"


def test_preflight_refuses_before_touching_traffic(stack, models):
    name = "canary_nomemory"
    deploy(stack, models, name, {1: "good", 2: "good2"})
    before = stack.env.router().current_plan(name)
    settings = dataclasses.replace(stack.settings, preflight_memory_margin_mib=10**9)  # 1 PiB margin
    env = dataclasses.replace(stack.env, settings=settings)
    with pytest.raises(PreflightError, match=r"canary_nomemory.*traffic was not touched"):
        promote(stack, name, 2, env=env)
    assert stack.env.router().current_plan(name) == before
    assert ready_versions(stack, name) == [1]


def test_gateway_reload_failure_keeps_the_previous_routing(stack, models):
    name = "canary_reload"
    deploy(stack, models, name, {1: "good", 2: "good2"})
    broken = stack.gateway.conf_dir / "http.d" / "zz-broken-by-someone-else.conf"
    calls = []

    def sleep_then_break(seconds):
        time.sleep(seconds)
        if not calls:  # after step 1's bake, another change breaks the gateway's config
            broken.write_text("this is not nginx syntax\n")
        calls.append(seconds)

    try:
        with Traffic(stack, name, models["X"]):
            result = promote(stack, name, 2, sleep=sleep_then_break, min_requests=1,
                             policy_overrides={**TEST_POLICY, "max_extensions": 0})
        step1 = TrafficPlan.canary(name, 1, 2, STEPS[0])
        assert result["outcome"] == "rollback_failed", result
        assert "gateway" in result["rollback"]["error"]
        # NGINX refused every later config: the step-1 split is still what routes, and the
        # challenger, still receiving traffic, was not unloaded
        assert stack.env.router().current_plan(name).digest == step1.digest
        assert {served_by(stack.gateway.url, name)[1] for _ in range(10)} == {step1.digest}
        assert ready_versions(stack, name) == [1, 2]
    finally:
        broken.unlink(missing_ok=True)
    stack.env.router().apply(TrafficPlan.single(name, 1))


def test_challenger_unloaded_mid_canary_is_rolled_back(stack, models):
    name = "canary_vanish"
    deploy(stack, models, name, {1: "good", 2: "good2"})

    def unload_behind_our_back(seconds):
        with stack.env.triton() as tc:
            cfg = tc.model_config(name)
            cfg["version_policy"] = {"specific": {"versions": [1]}}
            tc.client.load_model(name, config=json.dumps(cfg))
        time.sleep(seconds)

    with Traffic(stack, name, models["X"]):
        result = promote(stack, name, 2, sleep=unload_behind_our_back)
    assert result["outcome"] == "rolled_back", result
    # rolled back because the challenger vanished from Triton (its counters disappeared or restarted
    # from zero when it was unloaded/reloaded, or, when a hard-check look came first, the gateway
    # saw its requests fail), not for another reason
    failed = [s for s in result["steps"] if s["verdict"] == "fail"]
    assert failed and failed[-1] is result["steps"][-1], result["steps"]
    gone = ("version 2 is not in Triton's metrics", "version 2 counters went backwards", "challenger error rate")
    assert any(g in failed[-1]["reason"] for g in gone), failed
    assert failed[-1]["reason"] in result["reason"]
    assert result["rollback"]["gateway_ok"]
    assert stack.env.router().current_plan(name).weights == {1: 100}
    assert versions_served(stack, name) == {"1"}
    assert ready_versions(stack, name) == [1]
    assert registry(stack).aliases(name)["champion"] == 1


# ------------------------------------------------------------------------------------ dangling rollback target
def test_dangling_rollback_target_is_refused_naming_alias_and_version(stack, tmp_path):
    """a cleanup deletes (through REST, version as a string) the version that still
    carries ``previous_champion``; the manual rollback stops naming the alias and the version,
    and touches neither the gateway nor Triton."""
    from mlflow import MlflowClient

    name = "canary_dangling_alias"
    client = MlflowClient(stack.tracking_uri)
    client.create_registered_model(name)
    for v in (1, 2):
        client.create_model_version(name, source=f"s3://tritonflow-test-models/{name}/{v}")
    reg = registry(stack)
    reg.promote(name, 1)
    reg.promote(name, 2)
    assert reg.aliases(name) == {"champion": 2, "previous_champion": 1}
    requests.delete(f"{stack.tracking_uri}/api/2.0/mlflow/model-versions/delete",
                    json={"name": name, "version": "1"}, timeout=30).raise_for_status()
    with pytest.raises(RegistryError) as err:
        manual_rollback(name, "test: dangling rollback target", env=stack.env)
    msg = str(err.value)
    assert "previous_champion" in msg and "version 1" in msg and "latest" not in msg
    assert stack.env.router().current_plan(name) is None
    assert reg.aliases(name)["champion"] == 2


# ------------------------------------------------------------------------------------ live shadow
def test_live_shadow_pairs_mirrored_answers_by_request_id_and_feeds_the_canary(stack, models):
    """``shadow_evaluation``'s live mode: the gateway mirrors the champion's requests to the
    challenger, clients only get the champion's answers, the pairs become the challenger's
    expected predictions, and the canary judges the challenger against them."""
    from tritonflow.pipelines.shadow_compare import compare
    from tritonflow.pipelines.shadow_live import live

    name = "canary_live"
    deploy(stack, models, name, {1: "bin", 2: "bin2"})
    before = stack.env.router().current_plan(name)
    info = {v: {"version": v, "triton_model_name": name, "triton_model_version": v,
                "input_columns": FEATURES, "reference_metrics": {}} for v in (1, 2)}
    settings = dataclasses.replace(stack.settings, mlflow_tracking_uri=stack.tracking_uri)
    with Traffic(stack, name, models["X"], classes=2) as traffic:
        shadow = live(name, info[1], info[2], settings=settings, duration_s=4, percent=100)
    assert {v for v, _ in traffic.statuses} == {"1"}  # clients never saw the challenger
    assert shadow["mode"] == "live" and shadow["mirror"]["dropped"] == 0
    assert shadow["paired"] >= 10 and shadow["paired"] >= shadow["mirror"]["forwarded"] - 5
    pairs = pd.read_parquet(shadow["uri"])
    expected = pd.read_parquet(shadow["expected_uri"])
    truth = models["clf"]["bin2"].predict_proba(expected[FEATURES].to_numpy(np.float32))[:, 1]
    np.testing.assert_allclose(expected["expected_score"], truth, atol=1e-5)  # paired by request id
    np.testing.assert_allclose(pairs["challenger_score"], expected["expected_score"])
    # the gateway routes exactly as before and the challenger is unloaded again
    assert stack.env.router().current_plan(name) == before
    assert ready_versions(stack, name) == [1]

    decision = compare(shadow, settings=settings, record=False)
    assert decision["canary_conf"]["expected_predictions"] == shadow["expected_uri"]
    with Traffic(stack, name, models["X"], classes=2):
        result = promote(stack, name, 2, expected_predictions=decision["canary_conf"]["expected_predictions"])
    assert result["outcome"] == "promoted", result
    tags = registry(stack).get_version(name, 2).tags
    steps = [json.loads(v) for k, v in tags.items() if k.startswith(f"tritonflow.canary.{result['canary_id']}.step.")]
    assert any(s["prediction_source"] == "live_mirror" and s["verdict"] == "pass" for s in steps)
