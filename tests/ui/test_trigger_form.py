"""The Airflow UI's trigger forms, driven in a real headless Chromium.

The form is rendered by the api-server of the real deployment (tests/deployment/airflow_stack.py)
from the DAG's typed ``Param``s. The tests fill it like a user, submit, and check through the
REST API that the run was created with exactly the values typed; values the Params forbid (a
negative ``atol``, a version selector that is neither a number nor an alias name) never become a
run, and the refusal says what is expected in words. The ``model_publish`` form opens without any
field in an error state, with readable labels; an optional choice cleared by the user submits
null and the run is created. A screenshot of the page is saved under the test's tmp folder when an
assertion fails (and of the opened ``model_publish`` form always: ``trigger_form.png``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.deployment.airflow_stack import Stack, get_stack
from tests.ui.browser import UI_WAIT_S, chromium

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG_ID = "model_publish"


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory) -> Stack:
    return get_stack(request, tmp_path_factory)


@pytest.fixture
def browser(request, tmp_path):
    """Headless Chromium through chromedriver; a PNG of the page is kept when the test fails."""
    with chromium() as driver:
        yield driver
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            shot = tmp_path / "trigger_form_failure.png"
            try:
                driver.save_screenshot(str(shot))
                print(f"screenshot: {shot}")
            except Exception:  # noqa: BLE001 - the browser itself may be gone
                pass


def _wait(driver, css: str, *, clickable: bool = False):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    cond = ec.element_to_be_clickable if clickable else ec.presence_of_element_located
    return WebDriverWait(driver, UI_WAIT_S).until(cond((By.CSS_SELECTOR, css)))


def _type(driver, param: str, text: str, attempts: int = 3) -> None:
    """Replace the value of the form field of ``param`` the way a user does (select all, type).

    The form's fields are controlled React inputs: on a loaded machine a re-render can land between
    two keystrokes and drop the ones before it (``0.002`` arrived as ``2``). A user sees that and
    types again; so does this: the field must show ``text``, else it is cleared and typed again,
    one key at a time with a pause, up to ``attempts`` times. A leading minus goes with the next
    key: a lone ``-`` is no number, and the number field renders it as ``NaN``, so a negative
    number typed one key at a time could never arrive.
    """
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    shown = None
    for attempt in range(attempts):
        field = _wait(driver, f"input[name='element_{param}']", clickable=True)
        field.click()
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.BACKSPACE)
        for key in ([text] if attempt == 0 else _keys(text)):
            field.send_keys(key)
            if attempt:
                time.sleep(0.2)
        try:
            WebDriverWait(driver, 5).until(lambda d: _value(d, param) == text)
            return
        except TimeoutException:
            shown = _value(driver, param)
    pytest.fail(f"the form field {param!r} shows {shown!r} after typing {text!r} {attempts} times")


def _keys(text: str) -> list[str]:
    """``text`` one key at a time, a leading minus together with the key after it."""
    return [text[:2], *text[2:]] if text.startswith("-") else list(text)


def _value(driver, param: str) -> str:
    return _wait(driver, f"input[name='element_{param}']").get_attribute("value")


def _open_form(driver, stack: Stack, dag_id: str = DAG_ID) -> None:
    driver.get(f"{stack.url}/dags/{dag_id}")
    _wait(driver, "button[aria-label='Trigger Dag']", clickable=True).click()
    _wait(driver, "[data-testid='trigger-dag-submit']")


def _invalid_fields(driver) -> list[str]:
    """Names of the Params whose form field is marked invalid."""
    from selenium.webdriver.common.by import By

    return [el.get_attribute("name").removeprefix("element_")
            for el in driver.find_elements(By.CSS_SELECTOR, "input[aria-invalid='true']")]


def _submit(driver) -> None:
    """Click Trigger; fail naming the fields that keep the form from submitting."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(driver, 20).until(
            ec.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid='trigger-dag-submit']"))).click()
    except TimeoutException:
        pytest.fail(f"the trigger form refuses to submit; fields marked invalid: {_invalid_fields(driver)} "
                    "(a Param whose default is '' counts as a missing required value in the Airflow 3 "
                    "form: declare it type=['null', 'string'] with default None)")


def _runs(stack: Stack, dag_id: str = DAG_ID) -> list[dict]:
    return stack.api.dag_runs(dag_id)


def _wait_new_run(stack: Stack, before: set[str], timeout_s: float = UI_WAIT_S, dag_id: str = DAG_ID) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    new: list[dict] = []
    while time.monotonic() < deadline and not new:
        new = [r for r in _runs(stack, dag_id) if r["dag_run_id"] not in before]
        time.sleep(1)
    return new


def test_trigger_form_creates_a_model_publish_run_with_the_typed_params(stack, browser):
    stack.api.wait_for_dag(DAG_ID, timeout_s=120)
    params = stack.api.get(f"/dags/{DAG_ID}/details")["params"]
    assert {"model", "version_or_alias", "atol"} <= set(params), sorted(params)
    assert params["atol"]["schema"].get("minimum") == 0
    before = {r["dag_run_id"] for r in _runs(stack)}

    _open_form(browser, stack)
    _type(browser, "model", stack.model)
    _type(browser, "version_or_alias", "3")
    _type(browser, "atol", "0.002")
    _submit(browser)

    new = _wait_new_run(stack, before)
    assert len(new) == 1, f"no run created by the form; runs: {_runs(stack)}"
    (run,) = new
    assert run["run_type"] == "manual"
    conf = run["conf"]
    assert (conf["model"], conf["version_or_alias"], conf["atol"]) == (stack.model, "3", 0.002)
    # Params left alone keep their declared defaults.
    for name in set(params) - {"model", "version_or_alias", "atol"}:
        assert conf[name] == params[name]["value"], name


def test_trigger_form_never_submits_a_negative_atol_or_an_invalid_version(stack, browser):
    stack.api.wait_for_dag(DAG_ID, timeout_s=120)
    before = {r["dag_run_id"] for r in _runs(stack)}
    _open_form(browser, stack)
    _type(browser, "model", stack.model)

    # A negative tolerance: the number field enforces the Param's minimum on blur. _type sees the
    # typed -1 in the field before it returns (else the check below would pass on an empty field).
    from selenium.webdriver.support.ui import WebDriverWait

    _type(browser, "atol", "-1")
    _wait(browser, "input[name='element_model']", clickable=True).click()  # leave the field
    WebDriverWait(browser, UI_WAIT_S).until(lambda d: _value(d, "atol") not in ("-1", "-"))
    shown = _value(browser, "atol")
    assert shown == "" or float(shown) >= 0, shown  # clamped to the minimum, or cleared

    # A version selector outside the Param's pattern: the API refuses the run and the form says so,
    # naming the parameter.
    _type(browser, "version_or_alias", "3; drop")
    _submit(browser)
    WebDriverWait(browser, UI_WAIT_S).until(
        lambda d: "Invalid input for param version_or_alias" in d.find_element("tag name", "body").text
    )
    page = browser.find_element("tag name", "body").text
    # the refusal says what is expected in words, never as a regular expression
    assert "version number (e.g. 3) or alias" in page, page[-2000:]
    assert "does not match" not in page and "[0-9]" not in page, page[-2000:]
    # the refusal shown is the API's answer to the trigger request itself (runs are created
    # synchronously by that request), so no run can appear after it: no waiting needed
    created = [r for r in _runs(stack) if r["dag_run_id"] not in before]
    assert created == [], f"the form created runs from invalid input: {created}"

    # The same refusal through the REST API for the negative atol the form would not send.
    from tritonflow.runtime.airflow_api import AirflowApiError

    with pytest.raises(AirflowApiError, match="atol") as err:
        stack.api.post(f"/dags/{DAG_ID}/dagRuns",
                       {"logical_date": None, "conf": {"model": stack.model, "atol": -1}})
    assert err.value.status == 400


def test_the_model_publish_form_opens_without_errors_and_with_readable_labels(stack, browser, tmp_path):
    stack.api.wait_for_dag(DAG_ID, timeout_s=120)
    params = stack.api.get(f"/dags/{DAG_ID}/details")["params"]
    assert params["version_or_alias"]["value"] is None and params["model"]["value"] is None
    _open_form(browser, stack)
    _wait(browser, "input[name='element_version_or_alias']")
    time.sleep(1)  # let the form validate its initial values
    assert _invalid_fields(browser) == [], "the trigger form opens with fields in an error state"
    page = browser.find_element("tag name", "body").text
    for title in ("Model", "Version or alias", "Absolute tolerance", "Largest batch", "Served format"):
        assert title in page, f"label {title!r} missing from the form"
    assert "empty only for runs started by a registry event" not in page
    # TRITONFLOW_TRIGGER_FORM_SCREENSHOT=docs/trigger-form.png refreshes docs/operating.md's picture
    shot = Path(os.environ.get("TRITONFLOW_TRIGGER_FORM_SCREENSHOT") or tmp_path / "trigger_form.png")
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")

    # only the model typed: the run is created, the version left empty (champion, else latest)
    before = {r["dag_run_id"] for r in _runs(stack)}
    _type(browser, "model", stack.model)
    _submit(browser)
    (run,) = _wait_new_run(stack, before)
    assert run["conf"]["model"] == stack.model and run["conf"]["version_or_alias"] is None, run["conf"]


def test_a_cleared_optional_choice_submits_null_and_creates_a_run(stack, browser):
    dag_id = "registry_events"
    stack.api.wait_for_dag(dag_id, timeout_s=120)
    assert stack.api.get(f"/dags/{dag_id}/details")["params"]["stage"]["schema"].get("examples")
    before = {r["dag_run_id"] for r in _runs(stack, dag_id)}
    _open_form(browser, stack, dag_id)
    _type(browser, "stage", "Production")
    _type(browser, "stage", "")  # the user clears the choice again
    _submit(browser)

    new = _wait_new_run(stack, before, dag_id=dag_id)
    assert len(new) == 1, f"no run created by the form; runs: {_runs(stack, dag_id)}"
    assert new[0]["conf"]["stage"] is None, new[0]["conf"]

    # A value that is none of the choices is refused by the API server, in words.
    from tritonflow.runtime.airflow_api import AirflowApiError

    with pytest.raises(AirflowApiError, match="is not a 'one of Staging, Production, Archived, None'") as err:
        stack.api.post(f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": {"stage": "Prod"}})
    assert err.value.status == 400
