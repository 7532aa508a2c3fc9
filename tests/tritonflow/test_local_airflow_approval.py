"""On a real local Airflow (scheduler, dag-processor, triggerer, api-server) and a real MLflow, a run
of a model under policy ``approve`` waits in its ``approval`` task until a person approves through
the REST API (``PATCH .../hitlDetails``); then the task after it runs and the answer is on the
challenger's MLflow version. The CLI answers and waits the same way, and so does a person in headless
Chromium on the UI's Required Actions page (review drawer, Comment field, Approve / Reject buttons).
A run that outlasts its deadline alert is reported through the failure notifier to a webhook.

With ``TRITONFLOW_DOCS_SCREENSHOTS=1`` the UI test saves ``docs/required-actions.png``."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ground.settings import Settings
from tritonflow.runtime.airflow import AirflowDeployment
from tritonflow.runtime.airflow_api import AirflowApi, AirflowApiError
from tritonflow.runtime.airflow_config import AirflowConfig
from tritonflow.runtime.services import free_port

pytestmark = [pytest.mark.integration]

DAGS = Path(__file__).parent / "approval_airflow_dags"
DAG_ID = "approval_gate"
#: Seconds each wait may take on a loaded two-core machine.
WAIT_S = 300


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
def deployment(tmp_path_factory, mlflow_server, alert_sink):
    home = tmp_path_factory.mktemp("approval_airflow")
    settings = Settings.from_env({}, home=home, start_timeout_s=600, mlflow_tracking_uri=mlflow_server.tracking_uri)
    config = AirflowConfig.local(settings, api_port=free_port(), worker_log_port=free_port(),
                                 triggerer_log_port=free_port(), dags_folder=DAGS,
                                 extra_env={"TRITONFLOW_ALERT_WEBHOOK_URL": alert_sink})
    dep = AirflowDeployment(config)
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()


def _wait(what: str, probe, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"{what} not seen within {timeout_s:.0f} s")


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


def _open_review_drawer(driver, base_url: str, name: str) -> None:
    """On the Required Actions page (pending only), open the review drawer of ``name``'s approval."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.ui.browser import UI_WAIT_S

    subject = f"Start the canary of {name} v2?"

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
        _open_review_drawer(driver, deployment.api_url, approved)
        _in_drawer(driver, "[data-testid='hitl-option-Approve']").click()
        _wait("the approval's answer", lambda: _answered(api, f"ui_{approved}"))
        _open_review_drawer(driver, deployment.api_url, rejected)
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
