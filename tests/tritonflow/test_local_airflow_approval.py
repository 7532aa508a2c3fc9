"""On a real local Airflow (scheduler, dag-processor, triggerer, api-server) and a real MLflow, a run
of a model under policy ``approve`` waits in its ``approval`` task until a person approves through
the REST API (``PATCH .../hitlDetails``); then the task after it runs and the answer is on the
challenger's MLflow version. An approval nobody answers times out (after a few seconds for one run
here) to a reject by nobody, recorded on the version the same way. The CLI answers and waits as the
REST API does, and so does a person in headless Chromium on the UI's Required Actions page (review
drawer, Comment field, Approve / Reject buttons).
A run that outlasts its deadline alert is reported through the failure notifier to a webhook.

The deployment also runs the real ``canary_promotion`` DAG against a real Triton and NGINX gateway
started here, for models under policy ``approve-steps``: after the approval, a person decides at
each pause of the canary, once by the CLI (continue, continue: promoted) and once on the Required
Actions page (hold, then roll back), while a loopback client sends requests through the gateway; a
third canary's requests start failing while its pause waits, and it rolls back without an answer.
The real ``canary_rollback`` DAG, asked to let a person choose, offers the model's signed versions
and rolls back to the one picked over the REST API.
Each outcome is checked in the MLflow tags, the gateway's weights and Triton's loaded versions.

With ``TRITONFLOW_DOCS_SCREENSHOTS=1`` the UI tests save ``docs/required-actions.png`` and
``docs/canary-pause.png``."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import make_settings
from tests.dags.test_canary_dags import settings_env
from tests.polling import wait_until
from tritonflow.runtime.airflow import AirflowDeployment
from tritonflow.runtime.airflow_api import AirflowApi, AirflowApiError
from tritonflow.runtime.airflow_config import AirflowConfig
from tritonflow.runtime.services import NginxGateway, TritonServer, free_port

pytestmark = [pytest.mark.integration]

DAGS = Path(__file__).parent / "approval_airflow_dags"
#: The real canary DAG, run beside the test DAGs.
CANARY_DAG = Path(__file__).resolve().parents[2] / "dags" / "canary_promotion.py"
ROLLBACK_DAG = CANARY_DAG.with_name("canary_rollback.py")
DAG_ID = "approval_gate"
PROMOTION = "canary_promotion"
ROLLBACK = "canary_rollback"
#: Seconds each wait may take on a loaded two-core machine.
WAIT_S = 300
#: Seconds the approval of the run that times out waits (``TRITONFLOW_APPROVAL_TIMEOUT_H``, that run's
#: only); Airflow's scheduler applies the default answer at its next timeout sweep (every 15 s).
APPROVAL_TIMEOUT_S = 8
#: The canaries' schedule here: two steps of a 3 s bake, five challenger requests a step.
CANARY_CONF = {"challenger": "2", "steps": [50, 100], "bake_s": 3, "min_requests": 5}


def _register_under_approve(client) -> str:
    """A new registered model with versions 1 and 2 and promotion policy ``approve``; its name."""
    name = f"approve-{uuid.uuid4().hex[:6]}"
    client.create_registered_model(name)
    for _ in range(2):
        client.create_model_version(name, source="s3://nowhere/model")
    client.set_registered_model_tag(name, "tritonflow.promotion_policy", "approve")
    return name


@pytest.fixture(scope="module")
def model(mlflow_server):
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.tracking_uri)
    return _register_under_approve(client), client


class Sink(BaseHTTPRequestHandler):
    """The alert webhook: keeps every JSON body posted to it."""

    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        Sink.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def alert_sink():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/alerts"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def serving(tmp_path_factory, mlflow_server):
    """Settings of a real Triton and NGINX gateway (started here) that the deployment's tasks use."""
    from repository_sync.signing import generate_key_pair

    home = tmp_path_factory.mktemp("approval_airflow")
    keys = home / "keys"
    generate_key_pair(keys / "signing.pem", keys / "trusted" / "current.pub")
    settings = make_settings(
        home, start_timeout_s=600, mlflow_tracking_uri=mlflow_server.tracking_uri,
        repository_uri=str(home / "repo"), signing_key_path=keys / "signing.pem",
        signing_trusted_keys_dir=keys / "trusted", inference_log_root=str(home / "inference_logs"),
        load_timeout_s=120.0, canary_analysis_interval_s=1.0, canary_max_extensions=1,
        canary_pause_timeout_s=float(WAIT_S), canary_hard_min_requests=5,
        # a 3 s bake on a loaded two-core machine: latency is noise here
        canary_max_latency_ratio=100.0, canary_max_mean_latency_ms=5000.0,
    )
    triton = TritonServer(settings, repository=settings.repository_uri).start()
    gateway = None
    try:
        gateway = NginxGateway(settings, triton_http=triton.http_url).start()
        yield {"settings": settings, "gateway": gateway, "home": home}
    finally:
        if gateway is not None:
            gateway.stop()
        triton.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, serving, alert_sink):
    import shutil

    settings = serving["settings"]
    dags = tmp_path_factory.mktemp("approval_dags")
    for path in [*DAGS.glob("*.py"), CANARY_DAG, ROLLBACK_DAG]:
        shutil.copy(path, dags / path.name)
    config = AirflowConfig.local(settings, api_port=free_port(), execution_api_port=free_port(),
                                 worker_log_port=free_port(),
                                 triggerer_log_port=free_port(), dags_folder=dags,
                                 extra_env={**settings_env(settings), "TRITONFLOW_ALERT_WEBHOOK_URL": alert_sink})
    dep = AirflowDeployment(config)
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()


def _wait(what: str, probe, timeout_s: float = WAIT_S):
    return wait_until(what, probe, timeout_s)


def test_a_run_under_approve_waits_for_a_person_and_goes_on_once_approved(deployment, model):
    name, client = model
    api = AirflowApi(deployment.api_url)
    api.wait_for_dag(DAG_ID, WAIT_S)
    api.unpause(DAG_ID)
    run_id = f"approve_{uuid.uuid4().hex[:6]}"
    api.post(f"/dags/{DAG_ID}/dagRuns", {"dag_run_id": run_id, "logical_date": None, "conf": {"model": name}})
    path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approval/-1/hitlDetails"

    def detail():
        try:
            return api.get(path)
        except AirflowApiError as exc:
            if exc.status == 404:
                return None
            raise

    asked = _wait("the approval request", detail)
    assert name in asked["subject"] and "v2" in asked["subject"] and "**Shadow**" in asked["body"]
    assert asked["defaults"] == ["Reject"] and asked.get("responded_at") is None
    time.sleep(5)  # still waiting: nothing after the approval ran
    after = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/after")
    assert after["state"] not in ("running", "success", "skipped"), after
    api.patch(path, {"chosen_options": ["Approve"], "params_input": {}})
    _wait("the run's success", lambda: api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"] == "success")
    assert api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/after")["state"] == "success"
    tags = client.get_model_version(name, "2").tags
    assert tags["tritonflow.approval.answer"] == "approved" and tags["tritonflow.approval.by"] != "nobody"
    assert tags["tritonflow.approval.policy"] == "approve" and "tritonflow.status" not in tags


def test_the_cli_rejects_a_waiting_approval_with_a_comment_and_waits_for_the_run(deployment, model, capsys):
    from tritonflow import cli

    name, client = model
    api = AirflowApi(deployment.api_url)
    api.wait_for_dag(DAG_ID, WAIT_S)
    api.unpause(DAG_ID)
    assert cli.answer_approval(api, name, approve=False, dag_id=DAG_ID) == cli.EXIT_FAILED  # nothing waits
    assert "no approval of model" in capsys.readouterr().err
    run_id = cli.start_run(api, DAG_ID, {"model": name})
    _wait("the approval request", lambda: cli.pending_approvals(api, name, DAG_ID))
    rc = cli.answer_approval(api, name, approve=False, comment="p99 too high", dag_id=DAG_ID, wait=True,
                             timeout_s=WAIT_S)
    out, err = capsys.readouterr()
    assert rc == cli.EXIT_OK, err
    assert f"rejected the canary of model {name!r} version 2 (run {run_id}" in out
    assert api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/after")["state"] == "skipped"
    tags = client.get_model_version(name, "2").tags
    assert tags["tritonflow.approval.answer"] == "rejected" and tags["tritonflow.approval.note"] == "p99 too high"
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "approval"


def test_an_approval_nobody_answers_times_out_to_a_reject_by_nobody_on_the_version(deployment, model):
    import datetime as dt

    client = model[1]
    name = _register_under_approve(client)
    api = AirflowApi(deployment.api_url)
    api.wait_for_dag(DAG_ID, WAIT_S)
    api.unpause(DAG_ID)
    run_id = f"timeout_{uuid.uuid4().hex[:6]}"
    api.post(f"/dags/{DAG_ID}/dagRuns", {"dag_run_id": run_id, "logical_date": None,
                                         "conf": {"model": name, "approval_timeout_h": APPROVAL_TIMEOUT_S / 3600}})
    # nobody answers; the DAG's own response_timeout (30 min) would outlast this wait: the setting counts
    run = api.wait_for_run(DAG_ID, run_id, WAIT_S)
    assert run["state"] == "success", run  # a rejection skips the rest: the run itself succeeds
    assert api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/after")["state"] == "skipped"
    detail = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approval/-1/hitlDetails")
    assert detail["response_received"] and detail["chosen_options"] == ["Reject"], detail
    assert detail.get("responded_by_user") is None, detail
    asked, answered = (dt.datetime.fromisoformat(detail[k]) for k in ("created_at", "responded_at"))
    assert answered - asked >= dt.timedelta(seconds=APPROVAL_TIMEOUT_S), detail
    tags = client.get_model_version(name, "2").tags
    assert (tags["tritonflow.approval.answer"], tags["tritonflow.approval.by"], tags["tritonflow.approval.policy"]) \
        == ("rejected", "nobody", "approve"), tags
    assert tags["tritonflow.approval.note"] == "timed out: the default answer is reject"
    assert abs(dt.datetime.fromisoformat(tags["tritonflow.approval.at"]) - answered) < dt.timedelta(seconds=1), tags
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "approval"
    assert "timed out" in tags["tritonflow.rejection_reason"] and "by nobody" in tags["tritonflow.rejection_reason"]


def _open_review_drawer(driver, base_url: str, subject: str) -> None:
    """On the Required Actions page (pending only), open the review drawer of the request ``subject``."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.ui.browser import UI_WAIT_S

    def drawer_button(drv):
        for row in drv.find_elements(By.CSS_SELECTOR, "tbody tr"):
            if subject in row.text:
                return row.find_element(By.CSS_SELECTOR, "button[aria-label='Open Review Drawer']")
        return False

    driver.get(f"{base_url}/required_actions?response_received=false")
    wait = WebDriverWait(driver, UI_WAIT_S, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(drawer_button).click()
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "[role='dialog']"), subject))


def _in_drawer(driver, css: str):
    """The clickable element ``css`` inside the open review drawer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.ui.browser import UI_WAIT_S

    return WebDriverWait(driver, UI_WAIT_S).until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, f"[role='dialog'] {css}")))


@contextlib.contextmanager
def _screenshot_on_failure(driver, path: Path):
    """Keep a PNG of the page at ``path`` (and print where) when the block raises."""
    try:
        yield
    except BaseException:
        driver.save_screenshot(str(path))
        print(f"screenshot: {path}")
        raise


def _answered(api: AirflowApi, run_id: str) -> bool:
    """Whether the approval of run ``run_id`` has an answer (so the browser may leave the page)."""
    return bool(api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approval/-1/hitlDetails")
                .get("response_received"))


def test_a_person_approves_one_canary_and_rejects_another_on_the_required_actions_page(deployment, model,
                                                                                        tmp_path):
    from tests.ui.browser import chromium, docs_screenshots_wanted, save_docs_screenshot
    from tritonflow import cli

    client = model[1]
    approved, rejected = _register_under_approve(client), _register_under_approve(client)
    api = AirflowApi(deployment.api_url)
    api.wait_for_dag(DAG_ID, WAIT_S)
    api.unpause(DAG_ID)
    for name in (approved, rejected):
        api.post(f"/dags/{DAG_ID}/dagRuns", {"dag_run_id": f"ui_{name}", "logical_date": None, "conf": {"model": name}})
    # The drawer's buttons stay disabled unless the task already waits when it opens, and an answer
    # within a second of the task's parking races Airflow 3.3.2's executor: open the page as a
    # person would, once both wait.
    for name in (approved, rejected):
        _wait(f"the approval of {name} waiting", lambda name=name: cli.pending_approvals(api, name, DAG_ID))
    time.sleep(5)
    with chromium() as driver, _screenshot_on_failure(driver, tmp_path / "required_actions_failure.png"):
        _open_review_drawer(driver, deployment.api_url, f"Start the canary of {approved} v2?")
        _in_drawer(driver, "[data-testid='hitl-option-Approve']").click()
        _wait("the approval's answer", lambda: _answered(api, f"ui_{approved}"))
        _open_review_drawer(driver, deployment.api_url, f"Start the canary of {rejected} v2?")
        _in_drawer(driver, "input[name='element_comment']").send_keys("p99 too high")
        if docs_screenshots_wanted():
            save_docs_screenshot(driver, "required-actions.png")
        _in_drawer(driver, "[data-testid='hitl-option-Reject']").click()
        _wait("the rejection's answer", lambda: _answered(api, f"ui_{rejected}"))
    for name in (approved, rejected):  # a rejection skips the rest: the run itself still succeeds
        run = api.wait_for_run(DAG_ID, f"ui_{name}", WAIT_S)
        assert run["state"] == "success", run
    assert api.get(f"/dags/{DAG_ID}/dagRuns/ui_{approved}/taskInstances/after")["state"] == "success"
    tags = client.get_model_version(approved, "2").tags
    assert tags["tritonflow.approval.answer"] == "approved" and tags["tritonflow.approval.by"] not in ("", "nobody")
    assert "tritonflow.status" not in tags and "tritonflow.approval.note" not in tags
    assert api.get(f"/dags/{DAG_ID}/dagRuns/ui_{rejected}/taskInstances/after")["state"] == "skipped"
    tags = client.get_model_version(rejected, "2").tags
    assert tags["tritonflow.approval.answer"] == "rejected" and tags["tritonflow.approval.note"] == "p99 too high"
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "approval"
    assert tags["tritonflow.approval.by"] not in ("", "nobody")


def test_waiting_on_a_failed_run_names_the_run_its_state_and_the_failed_task(deployment, capsys):
    from tritonflow import cli

    api = AirflowApi(deployment.api_url)
    api.wait_for_dag("fails_at_once", WAIT_S)
    api.unpause("fails_at_once")
    run_id = cli.start_run(api, "fails_at_once", {})
    assert cli.finish_run(api, "fails_at_once", run_id, wait=True, timeout_s=WAIT_S) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert f"run {run_id} of DAG fails_at_once ended failed; failed task(s): broken" in err


def test_a_run_that_outlasts_its_deadline_is_reported_through_the_notifier(deployment):
    from tritonflow import cli

    api = AirflowApi(deployment.api_url)
    api.wait_for_dag("overruns_its_deadline", WAIT_S)
    api.unpause("overruns_its_deadline")
    run_id = cli.start_run(api, "overruns_its_deadline", {})
    alert = _wait("the deadline alert", lambda: [m for m in Sink.received if m.get("run_id") == run_id])[0]
    assert alert["dag_id"] == "overruns_its_deadline" and alert["expected"] == "2 s"
    assert alert["state"] in ("queued", "running") and "overran its deadline" in alert["text"]
    assert api.wait_for_run("overruns_its_deadline", run_id, WAIT_S)["state"] == "success"  # an alert, not a kill


# ------------------------------------------------------------------------ decisions at canary pauses
@pytest.fixture(scope="module")
def onnx(tmp_path_factory):
    """Two iris classifiers converted to ONNX once (``1``: the champion, ``2``: the challenger)."""
    import numpy as np
    from mlflow.models import infer_signature
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    from ground.settings import get_settings
    from model_registry.conversion.common import convert_sklearn

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    folder = tmp_path_factory.mktemp("onnx")
    out = {"X": X}
    for version, c in ((1, 1.0), (2, 0.8)):
        clf = LogisticRegression(max_iter=500, C=c).fit(X, y)
        conv = convert_sklearn(clf, infer_signature(X, clf.predict_proba(X)), model_name="iris",
                               settings=get_settings())
        path = folder / f"v{version}.onnx"
        path.write_bytes(conv.serialized())
        out[version] = (path, conv.onnx_model)
    return out


def _published_model(serving, onnx, prefix: str, versions: int):
    """A new model with ``versions`` versions published and signed in the repository (odd ones the
    first classifier, even ones the second) and registered in MLflow; its name and MLflow client."""
    from mlflow import MlflowClient

    from model_registry.triton_config import InstanceGroupSpec, build_config, to_pbtxt
    from repository_sync.publish import publish_version

    settings = serving["settings"]
    name = f"{prefix}_{uuid.uuid4().hex[:6]}"
    client = MlflowClient(settings.resolved_mlflow_tracking_uri)
    client.create_registered_model(name)
    for version in range(1, versions + 1):
        path, model = onnx[2 - version % 2]
        config = to_pbtxt(build_config(name, model, max_batch_size=16,
                                       instance_groups=[InstanceGroupSpec("KIND_CPU", 1)]))
        publish_version(repository=settings.repository_uri, model_name=name, version=version, model_file=path,
                        config=config, private_key=settings.signing_key_path,
                        trusted_keys=settings.signing_trusted_keys_dir)
        client.create_model_version(name, source=f"s3://tritonflow-test-models/{name}/{version}")
    return name, client


def _serve_only(serving, name: str, version: int) -> None:
    """Load ``version`` of ``name`` in Triton and send it all of the gateway's traffic."""
    from repository_sync.routing.gateway_probe import wait_live
    from repository_sync.routing.traffic_plan import TrafficPlan
    from tritonflow.pipelines.canary_loading import ensure_loaded

    env = _canary_env(serving)
    ensure_loaded(name, [version], env=env)
    plan = TrafficPlan.single(name, version)
    env.router().apply(plan)
    wait_live(serving["gateway"].url, plan)


def _canary_model(serving, onnx) -> str:
    """A model under policy ``approve-steps``: v1 and v2 published and signed, v1 champion at 100 %."""
    from model_registry.registry import RegistryClient

    name, client = _published_model(serving, onnx, "steps", 2)
    client.set_registered_model_tag(name, "tritonflow.promotion_policy", "approve-steps")
    RegistryClient(serving["settings"].resolved_mlflow_tracking_uri).promote(name, 1, reason="initial deployment")
    _serve_only(serving, name, 1)
    return name


def _canary_env(serving):
    from tritonflow.pipelines.canary import CanaryEnvironment

    return CanaryEnvironment.from_settings(serving["settings"], gateway=serving["gateway"])


def _served(serving, name: str) -> tuple[dict, list]:
    """The gateway's weights of ``name`` and the versions READY in Triton."""
    env = _canary_env(serving)
    with env.triton() as tc:
        ready = sorted(tc.ready_versions(name))
    return dict(env.router().current_plan(name).weights), ready


def _traffic(serving, name: str, onnx):
    """A loopback client sending iris rows through the gateway, logging what it got (the canary reads it);
    once its ``broken`` is set, it sends requests that Triton refuses (a wrong input shape) instead.
    It sends until its ``with`` block ends: Traffic's default cap (20,000 requests) was spent before the
    first pause when the machine was fast, and a pause then saw no request at all, failing or not."""
    import types
    import urllib.error
    import urllib.request

    from tests.pipelines.test_canary_pipeline import Traffic

    class Client(Traffic):
        broken = False

        def _one(self) -> None:
            if not self.broken:
                return super()._one()
            body = json.dumps({"inputs": [{"name": "features", "shape": [1, 3], "datatype": "FP32",
                                           "data": [1.0, 2.0, 3.0]}]}).encode()
            req = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=10).close()
            except (urllib.error.URLError, OSError):
                pass
            return None

    return Client(types.SimpleNamespace(gateway=serving["gateway"], settings=serving["settings"]), name, onnx["X"],
                  max_requests=10**9)


def _pause_detail(api: AirflowApi, run_id: str, number: int) -> dict:
    return api.get(f"/dags/{PROMOTION}/dagRuns/{run_id}/taskInstances/step_decision/{number - 1}/hitlDetails")


def _pauses(client, name: str) -> dict:
    """The pause tags of the last canary on ``name``'s v2, by number, and the version's tags."""
    tags = client.get_model_version(name, "2").tags
    prefix = f"tritonflow.canary.{tags['tritonflow.canary.latest']}."
    pauses = {int(k[len(prefix + "pause."):]): json.loads(v) for k, v in tags.items()
              if k.startswith(prefix + "pause.") and k[len(prefix + "pause."):].isdigit()}
    return {"pauses": pauses, "tags": tags, "prefix": prefix}


def _start_approved_canary(api: AirflowApi, name: str) -> str:
    """A canary_promotion run of ``name`` v2, approved by the CLI once its approval waits; its run id."""
    from tritonflow import cli

    api.wait_for_dag(PROMOTION, WAIT_S)
    api.unpause(PROMOTION)
    run_id = cli.start_run(api, PROMOTION, {"model": name, **CANARY_CONF})
    _wait("the approval before the canary", lambda: cli.pending_approvals(api, name))
    assert cli.answer_approval(api, name, approve=True) == cli.EXIT_OK
    return run_id


def test_under_approve_steps_a_person_continues_at_each_pause_by_the_cli_and_the_challenger_is_promoted(
        deployment, serving, onnx):
    from mlflow import MlflowClient

    from tritonflow import cli

    name = _canary_model(serving, onnx)
    api = AirflowApi(deployment.api_url)
    with _traffic(serving, name, onnx):
        run_id = _start_approved_canary(api, name)
        _wait("the first pause", lambda: cli.pending_pauses(api, name))
        first = _pause_detail(api, run_id, 1)
        assert first["subject"] == f"Canary of {name} v2 at 50 %: pass (Continue / Hold / Roll back)?"
        assert first["options"] == ["Continue", "Hold", "Roll back"] and first["defaults"] == ["Continue"]
        assert "**Automatic verdict: pass**" in first["body"] and "| challenger requests |" in first["body"]
        assert _served(serving, name)[0] == {1: 50, 2: 50}  # traffic stays at the step's split meanwhile
        assert cli.decide_pause(api, name, "hold", run_id="another_run") == cli.EXIT_FAILED
        assert cli.decide_pause(api, name, "continue", comment="50 % looks fine") == cli.EXIT_OK
        _wait("the pause at 100 %", lambda: [p for p in cli.pending_pauses(api, name) if "100 %" in p["subject"]])
        print(_pause_detail(api, run_id, 2)["body"])  # a short bake on a busy machine may be inconclusive
        assert cli.decide_pause(api, name, "continue", wait=True, timeout_s=WAIT_S) == cli.EXIT_OK
    assert api.get(f"/dags/{PROMOTION}/dagRuns/{run_id}")["state"] == "success"
    client = MlflowClient(serving["settings"].resolved_mlflow_tracking_uri)
    got = _pauses(client, name)
    assert {n: (p["step"], p["percent"], p["decision"], p["source"], p["policy"]) for n, p in got["pauses"].items()} \
        == {1: (1, 50, "continue", "person", "approve-steps"), 2: (2, 100, "continue", "person", "approve-steps")}
    assert got["pauses"][1]["by"] not in ("", "nobody") and got["pauses"][1]["note"] == "50 % looks fine"
    assert got["pauses"][1]["at"] and got["pauses"][1]["verdict"] == "pass"
    assert got["pauses"][2]["verdict"] in ("pass", "inconclusive")  # continued either way: promoted
    tags = got["tags"]
    assert tags[got["prefix"] + "outcome"] == "promoted"
    assert tags[got["prefix"] + "promotion_policy"] == "approve-steps"
    assert tags["tritonflow.approval.answer"] == "approved" and tags["tritonflow.approval.policy"] == "approve-steps"
    assert client.get_registered_model(name).aliases["champion"] == "2"
    assert _served(serving, name) == ({2: 100}, [1, 2])  # the old champion stays loaded as rollback target
    tis = api.get(f"/dags/{PROMOTION}/dagRuns/{run_id}/taskInstances?limit=100")
    states = {t["map_index"]: t["state"] for t in tis["task_instances"] if t["task_id"] == "step_decision"}
    assert states == {0: "success", 1: "success", 2: "skipped", 3: "skipped"}  # pauses 3, 4 never reached


def test_a_person_holds_a_canary_at_its_pause_then_rolls_it_back_on_the_required_actions_page(
        deployment, serving, onnx, tmp_path):
    from mlflow import MlflowClient

    from tests.ui.browser import chromium, docs_screenshots_wanted, save_docs_screenshot
    from tritonflow import cli

    name = _canary_model(serving, onnx)
    api = AirflowApi(deployment.api_url)
    subject = f"Canary of {name} v2 at 50 %"

    def answered(number):
        return bool(_pause_detail(api, run_id, number).get("response_received"))

    with _traffic(serving, name, onnx), chromium() as driver, \
            _screenshot_on_failure(driver, tmp_path / "canary_pause_failure.png"):
        run_id = _start_approved_canary(api, name)
        _wait("the first pause", lambda: cli.pending_pauses(api, name))
        time.sleep(5)  # as a person would: see tests above (an answer within a second races Airflow 3.3.2)
        _open_review_drawer(driver, deployment.api_url, subject)
        _in_drawer(driver, "[data-testid='hitl-option-Hold']").click()
        _wait("the hold", lambda: answered(1))
        second = _wait("the pause after the hold", lambda: cli.pending_pauses(api, name))[0]
        assert second["subject"].startswith(subject) and second["options"] == ["Continue", "Roll back"]
        time.sleep(5)
        _open_review_drawer(driver, deployment.api_url, subject)
        _in_drawer(driver, "input[name='element_comment']").send_keys("latency budget exceeded elsewhere")
        if docs_screenshots_wanted():
            save_docs_screenshot(driver, "canary-pause.png")
        _in_drawer(driver, "[data-testid='hitl-option-Roll back']").click()
        _wait("the rollback", lambda: answered(2))
        run = api.wait_for_run(PROMOTION, run_id, WAIT_S)
    assert run["state"] == "failed", run  # a rolled-back canary fails its run
    client = MlflowClient(serving["settings"].resolved_mlflow_tracking_uri)
    got = _pauses(client, name)
    assert {n: (p["percent"], p["attempt"], p["decision"], p["source"]) for n, p in got["pauses"].items()} == {
        1: (50, 1, "hold", "person"), 2: (50, 2, "rollback", "person")}
    assert got["pauses"][2]["note"] == "latency budget exceeded elsewhere"
    assert got["pauses"][2]["by"] not in ("", "nobody") and got["pauses"][2]["options"] == ["continue", "rollback"]
    tags = got["tags"]
    assert tags[got["prefix"] + "outcome"] == "rolled_back"
    assert "rolled back at its pause by" in tags[got["prefix"] + "reason"]
    assert "tritonflow.status" not in tags  # a person's rollback is no verdict on the challenger
    assert client.get_registered_model(name).aliases["champion"] == "1"
    assert _served(serving, name) == ({1: 100}, [1])  # gateway back first, then the challenger unloaded


def test_a_check_failing_while_a_pause_waits_rolls_back_at_once_and_closes_the_request(deployment, serving, onnx):
    from mlflow import MlflowClient

    from tritonflow import cli

    name = _canary_model(serving, onnx)
    api = AirflowApi(deployment.api_url)
    with _traffic(serving, name, onnx) as traffic:
        run_id = _start_approved_canary(api, name)
        _wait("the first pause", lambda: cli.pending_pauses(api, name))
        traffic.broken = True  # while nobody answers, every request fails
        run = api.wait_for_run(PROMOTION, run_id, WAIT_S)  # well before the pause's timeout of WAIT_S
    assert run["state"] == "failed", run
    client = MlflowClient(serving["settings"].resolved_mlflow_tracking_uri)
    got = _pauses(client, name)
    pause = got["pauses"][1]
    assert (pause["decision"], pause["source"], pause["by"]) == ("rollback", "check", "nobody"), pause
    assert "error rate" in pause["note"], pause
    tags = got["tags"]
    assert "failed while waiting at its pause" in tags[got["prefix"] + "reason"]
    assert tags["tritonflow.status"] == "rejected" and tags["tritonflow.rejected_stage"] == "canary"  # judged
    # the question is closed with the canary's decision (nobody's), not left pending
    detail = _pause_detail(api, run_id, 1)
    assert detail["response_received"] and detail["chosen_options"] == ["Roll back"], detail
    assert detail.get("responded_by_user") is None and not cli.pending_pauses(api, name)
    assert _served(serving, name) == ({1: 100}, [1])


# ------------------------------------------------------------------ rollback to a version a person picks
def test_a_person_picks_the_rollback_version_among_the_signed_ones_over_rest_and_it_serves(
        deployment, serving, onnx):
    from model_registry.registry import RegistryClient
    from repository_sync.routing.gateway_probe import served_by
    from tritonflow import cli

    # v1..v4 signed; v2 rejected by the sentinel; v3 previous champion, v4 champion serving 100 %
    name, client = _published_model(serving, onnx, "pick", 4)
    for version in ("1", "2", "3", "4"):
        client.set_model_version_tag(name, version, "tritonflow.signature_digest", "published here")
    client.set_model_version_tag(name, "2", "tritonflow.status", "rejected")
    client.set_model_version_tag(name, "2", "tritonflow.rejected_stage", "sentinel")
    client.set_model_version_tag(name, "2", "tritonflow.rejection_reason", "error rate 40 %")
    registry = RegistryClient(serving["settings"].resolved_mlflow_tracking_uri)
    for version in (3, 4):
        registry.promote(name, version, reason="earlier promotions")
    _serve_only(serving, name, 4)
    api = AirflowApi(deployment.api_url)
    api.wait_for_dag(ROLLBACK, WAIT_S)
    api.unpause(ROLLBACK)
    run_id = f"pick_{uuid.uuid4().hex[:6]}"
    reason = "v3 and v4 share a broken feature"
    api.post(f"/dags/{ROLLBACK}/dagRuns", {"dag_run_id": run_id, "logical_date": None,
                                           "conf": {"model": name, "reason": reason, "choose_version": True}})
    path = f"/dags/{ROLLBACK}/dagRuns/{run_id}/taskInstances/choose_version/-1/hitlDetails"

    def waiting():
        try:
            detail = api.get(path)
        except AirflowApiError as exc:
            if exc.status == 404:
                return None
            raise
        return detail if detail["task_instance"]["state"] in cli.WAITING_STATES else None

    asked = _wait("the version choice", waiting)
    assert asked["subject"] == f"Roll {name} back to which version?"
    assert asked["options"] == ["v3 (previous_champion)", "v2 (rejected by the sentinel)", "v1"], asked
    assert asked["defaults"] == ["v3 (previous_champion)"] and not asked["response_received"], asked
    assert reason in asked["body"] and "| v2 |" in asked["body"] and "at sentinel: error rate 40 %" in asked["body"]
    assert _served(serving, name) == ({4: 100}, [4])  # nothing moves while the choice waits
    time.sleep(max(0.0, cli.APPROVAL_SETTLE_S - cli.seconds_since(asked["created_at"])))  # see APPROVAL_SETTLE_S
    api.patch(path, {"chosen_options": ["v1"], "params_input": {}})
    run = api.wait_for_run(ROLLBACK, run_id, WAIT_S)
    assert run["state"] == "success", run
    chosen = api.xcom(ROLLBACK, run_id, "choose_version")
    assert chosen["version"] == 1 and chosen["chosen_by"] not in ("", "form", "timeout"), chosen
    result = api.xcom(ROLLBACK, run_id, "rollback")
    assert (result["rolled_back_from"], result["rolled_back_to"], result["unloaded"]) == (4, 1, True), result
    for version in ("1", "4"):  # the record goes on both versions
        tags = client.get_model_version(name, version).tags
        assert (tags["tritonflow.rollback.from"], tags["tritonflow.rollback.to"],
                tags["tritonflow.rollback.reason"]) == ("4", "1", reason), tags
    assert registry.aliases(name) == {"champion": 1}  # previous_champion cleared: a second rollback stops
    done = [e.record for e in registry.audit_log(name) if e.action == "rollback" and e.outcome == "rolled_back"]
    assert [(r.get("reason"), r.get("observed_champion"), r.get("champion")) for r in done] == [(reason, 4, 1)]
    assert _served(serving, name) == ({1: 100}, [1])  # gateway on v1, v4 unloaded
    assert {served_by(serving["gateway"].url, name)[0] for _ in range(5)} == {"1"}
