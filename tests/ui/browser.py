"""Headless Chromium through chromedriver for the UI tests, and the docs screenshots they can save.

Set ``TRITONFLOW_DOCS_SCREENSHOTS=1`` to have the UI tests write the screenshots of docs/operating.md into
``docs/`` (PNG, palette-reduced to stay small); without it they write nothing outside pytest's
temporary folders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1000")
#: Seconds the UI may take to render an element on a loaded machine.
UI_WAIT_S = 90
#: Where the screenshots of docs/operating.md live.
DOCS = Path(__file__).resolve().parents[2] / "docs"
#: Environment variable that turns the docs screenshots on.
DOCS_SCREENSHOTS_ENV = "TRITONFLOW_DOCS_SCREENSHOTS"
#: Largest docs screenshot kept in the repository (bytes).
MAX_DOCS_PNG_BYTES = 300 * 1024


@contextlib.contextmanager
def chromium(window: str = "1400,1000") -> Iterator[Any]:
    """A headless Chromium WebDriver with a throw-away profile; fails the test when it is missing."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail("chromium / chromedriver missing: run scripts/setup.sh (Debian chromium, chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tf_chromium_")
    for flag in (*CHROMIUM_FLAGS, f"--window-size={window}", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(UI_WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def docs_screenshots_wanted() -> bool:
    """Whether this run should write the docs' screenshots into ``docs/``."""
    return os.environ.get(DOCS_SCREENSHOTS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def save_docs_screenshot(driver: Any, name: str) -> Path:
    """Save the browser's viewport as ``docs/<name>``, palette-reduced to under 300 KB.

    Raises:
        AssertionError: The PNG stays over :data:`MAX_DOCS_PNG_BYTES` after reduction.
    """
    import io

    from PIL import Image

    DOCS.mkdir(exist_ok=True)
    image = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    path = DOCS / name
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    size = path.stat().st_size
    assert size <= MAX_DOCS_PNG_BYTES, f"{path} is {size} bytes (limit {MAX_DOCS_PNG_BYTES})"
    return path
