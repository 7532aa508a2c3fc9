"""A default ``model_publish`` run on the real deployment, and its link buttons in a real browser.

The deployment (tests/deployment/airflow_stack.py: api-server, scheduler, dag-processor,
triggerer and a Celery worker, a Triton server over the stack's repository) publishes a freshly
registered scikit-learn model with the DAG's default params: the only conf is the model name, so
profiling is on and Model Analyzer runs inside the Celery worker. The run must succeed and the
version be READY on Triton. Then headless Chromium opens the ``record`` task instance and finds
the buttons "MLflow model version", "MLflow run", "Triton model" and "Grafana panel" pointing at
that version's MLflow page, its publish run, ``/v2/models/<name>/versions/<v>`` on Triton and the
model's panel of the Grafana dashboard; "Evidently report" (nothing recorded) shows no button.
The MLflow page the button opens shows the version's description.

With ``TRITONFLOW_DOCS_SCREENSHOTS=1`` the test also saves ``docs/run-links.png`` and
``docs/mlflow-version.png`` for docs/operating.md's screenshots.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.deployment.airflow_stack import GRAFANA_DASHBOARD_URL, Stack, get_stack
from tests.ui.browser import (
    UI_WAIT_S,
    chromium,
    docs_screenshots_wanted,
    save_docs_screenshot,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG_ID = "model_publish"
#: Seconds the default run may take: conversion, Model Analyzer's default sweep (its own limit is
#: TRITONFLOW_ANALYZER_TIMEOUT_S, 600 s), signing, load; minutes on a loaded 2-core machine, plus
#: the wait behind other model_publish runs of the session (max_active_runs=1).
RUN_TIMEOUT_S = 2400
TERMINAL = {"success", "failed"}
LINK_NAMES = {"Evidently report", "Grafana panel", "MLflow model version", "MLflow run", "Registry deliveries",
              "Triton model"}


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory) -> Stack:
    return get_stack(request, tmp_path_factory)


def _register_small_model(tracking_uri: str, name: str) -> int:
    """A scikit-learn pipeline logged with signature and input example, alias ``champion``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from tests.pipelines.test_publish_pipeline import churn_data, register

    X, y = churn_data(n=200, seed=5)
    return register(tracking_uri, name, make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), X)


def _failed_task_logs(stack: Stack, run_id: str) -> str:
    """The last lines of each failed task instance's log, for the failure message."""
    out = []
    tis = stack.api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
    for ti in tis:
        if ti["state"] in ("failed", "upstream_failed") and ti["try_number"]:
            try:
                doc = stack.api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/"
                                    f"{ti['try_number']}?full_content=true&map_index={ti['map_index']}")
                text = "\n".join(str(e.get("event", e)) if isinstance(e, dict) else str(e)
                                 for e in doc.get("content") or [])
            except Exception as exc:  # noqa: BLE001 - the message is best effort
                text = f"(log unavailable: {exc})"
            out.append(f"--- {ti['task_id']} ({ti['state']}):\n{text[-4000:]}")
    return "\n".join(out)


def _wait_run(stack: Stack, run_id: str) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    run: dict = {}
    while time.monotonic() < deadline:
        try:
            run = stack.api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}")
        except (TimeoutError, urllib.error.URLError):  # API server busy: ask again
            time.sleep(5)
            continue
        if run["state"] in TERMINAL:
            return run
        time.sleep(5)
    pytest.fail(f"{DAG_ID} run {run_id} not finished within {RUN_TIMEOUT_S} s (state {run.get('state')}); "
                f"logs under {stack.deployment.log_path}")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 (loopback)
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _link_buttons(driver) -> dict[str, str]:
    """``{button text: href}`` of the extra link buttons on the task instance page (``{}`` while it re-renders)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return {a.text.strip(): a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a[href]")
                if a.text.strip() in LINK_NAMES}
    except StaleElementReferenceException:  # the page refreshed its data under us: ask again
        return {}


@pytest.mark.timeout(RUN_TIMEOUT_S + 600)
def test_default_model_publish_succeeds_and_its_links_render_and_point_to_the_right_pages(stack):
    from mlflow import MlflowClient

    tracking_uri = stack.env["TRITONFLOW_MLFLOW_TRACKING_URI"]
    name = f"links_{uuid.uuid4().hex[:6]}"
    version = _register_small_model(tracking_uri, name)
    stack.api.wait_for_dag(DAG_ID, timeout_s=300)
    stack.api.unpause(DAG_ID)

    # The default run: only the (required) model; every other param keeps its default.
    run_id = stack.api.post(f"/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"model": name}})["dag_run_id"]
    run = _wait_run(stack, run_id)
    assert run["state"] == "success", _failed_task_logs(stack, run_id)

    # Published: READY on the stack's Triton, profiled by Model Analyzer inside the Celery worker.
    status, _ = _get(f"http://{stack.triton.http_url}/v2/models/{name}/versions/{version}/ready")
    assert status == 200, f"{name} v{version} is not READY on Triton"
    tags = dict(MlflowClient(tracking_uri).get_model_version(name, str(version)).tags)
    assert tags["tritonflow.status"] == "published"
    profile = json.loads(tags["tritonflow.profile"])
    print(f"profile of {name} v{version} in the worker: {profile['status']}")
    # Model Analyzer ran in the worker and measured: "profiled", or on a host too busy for a stable
    # measurement "inconclusive" (the generated config kept, the version not judged by the noise)
    assert profile["status"] in ("profiled", "inconclusive"), profile
    if profile["status"] == "profiled":
        assert profile["configs_measured"] >= 1 and profile["throughput"] > 0, profile
    else:
        assert "could be measured stably" in profile["reason"], profile
    assert not [k for k in tags if k.startswith("tritonflow.rejected")], tags

    # What the api-server serves for the record task: four links, and no Evidently report.
    served = stack.api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/record/links")["extra_links"]
    publish_run = tags["tritonflow.publish_run_id"]
    experiment = MlflowClient(tracking_uri).get_run(publish_run).info.experiment_id
    expected = {
        "MLflow model version": f"{tracking_uri}/#/models/{name}/versions/{version}",
        "MLflow run": f"{tracking_uri}/#/experiments/{experiment}/runs/{publish_run}",
        "Triton model": f"http://{stack.triton.http_url}/v2/models/{name}/versions/{version}",
        "Grafana panel": f"{GRAFANA_DASHBOARD_URL}?var-model={name}&viewPanel=1",
    }
    assert served == {**expected, "Evidently report": None, "Registry deliveries": None}

    with chromium() as driver:
        driver.get(f"{stack.url}/dags/{DAG_ID}/runs/{run_id}/tasks/record/details")
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            WebDriverWait(driver, UI_WAIT_S).until(lambda d: len(_link_buttons(d)) >= len(expected))
        except Exception:
            pytest.fail(f"the link buttons did not render; found {_link_buttons(driver)} on {driver.current_url}")
        time.sleep(2)  # the details refresh once more after the first render
        WebDriverWait(driver, UI_WAIT_S).until(lambda d: len(_link_buttons(d)) >= len(expected))
        buttons = _link_buttons(driver)
        assert buttons == expected  # no "Evidently report" button: nothing was recorded for it
        if docs_screenshots_wanted():
            first = driver.find_element("link text", "MLflow model version")
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", first)
            time.sleep(1)
            save_docs_screenshot(driver, "run-links.png")

        # The buttons lead to the right pages: Triton answers with the model version's metadata ...
        status, body = _get(buttons["Triton model"])
        assert status == 200 and json.loads(body)["name"] == name, body[:300]
        # ... and the MLflow button opens the version page, which shows the version's description.
        description = MlflowClient(tracking_uri).get_model_version(name, str(version)).description
        assert description, "the published version has no description"
        assert "Published" in description, description
        driver.get(buttons["MLflow model version"])
        WebDriverWait(driver, UI_WAIT_S).until(lambda d: "Published" in d.find_element("tag name", "body").text)
        body_text = driver.find_element("tag name", "body").text
        assert name in body_text and f"Version {version}" in body_text, body_text[:1000]
        if docs_screenshots_wanted():
            from selenium.webdriver.common.by import By

            for close in driver.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
                close.click()  # MLflow's assistant side panel, open by default, hides half the page
            time.sleep(1)
            save_docs_screenshot(driver, "mlflow-version.png")
