"""The Airflow UI of the quick demo's deployment, driven in a real headless Chromium.

After the session's quick demo run (tests/demo_run.py, ``--keep-running``: the api-server stays
up) the test opens each loop DAG's runs page like a user and checks that the demo's runs of the
five loop DAGs are listed; a screenshot of each page is saved in the demo's report folder
(``report/airflow_ui_<dag_id>.png``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.demo_run import get_quick_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1600,1100")
#: Seconds the UI may take to render on a loaded machine.
UI_WAIT_S = 90
LOOP_DAGS = ("drift_monitor", "shadow_evaluation", "retrain", "model_publish", "canary_promotion")


@pytest.fixture(scope="module")
def quick_run(request, tmp_path_factory) -> dict:
    return get_quick_run(request, tmp_path_factory)


@pytest.fixture
def browser():
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail("chromium / chromedriver missing: run scripts/setup.sh (Debian chromium, chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tf_chromium_")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(UI_WAIT_S)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.parametrize("dag_id", LOOP_DAGS)
def test_the_demo_runs_are_listed_in_the_airflow_ui(quick_run, browser, dag_id):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    url = quick_run["deployment"]["airflow_ui"]
    run_ids = [r["run_id"] for r in quick_run["dag_runs"] if r["dag_id"] == dag_id]
    assert run_ids, f"the demo has no {dag_id} run"
    shot = Path(quick_run["_home"]) / "report" / f"airflow_ui_{dag_id}.png"
    browser.get(f"{url}/dags/{dag_id}/runs")
    try:
        WebDriverWait(browser, UI_WAIT_S).until(
            lambda d: any(rid in d.page_source for rid in run_ids))
    except TimeoutException:
        browser.save_screenshot(str(shot))
        pytest.fail(f"none of the demo's {dag_id} runs {run_ids[:5]} is listed at {url}/dags/{dag_id}/runs "
                    f"(screenshot {shot})")
    browser.save_screenshot(str(shot))
    listed = [rid for rid in run_ids if rid in browser.page_source]
    # the page lists the most recent runs first; every run of a DAG with few runs is there
    assert len(listed) >= min(len(run_ids), 10), (listed, run_ids)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
