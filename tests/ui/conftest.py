from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "agents"))  # agent_helpers (tiny Trainer helpers)

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def char_tokenizer():
    from agent_helpers import make_char_tokenizer

    return make_char_tokenizer()


@pytest.fixture(scope="session")
def _chromium() -> Iterator[object]:
    """Headless Chromium from Debian under its chromedriver. Missing is a failure, not a skip:
    ``make system-deps`` installs both (apt-get install chromium chromium-driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    chromium = shutil.which("chromium") or CHROMIUM
    driver_path = shutil.which("chromedriver") or CHROMEDRIVER
    missing = [p for p in (chromium, driver_path) if not os.path.exists(p)]
    if missing:
        pytest.fail(f"{missing} not found: install Debian's chromium and chromium-driver (make system-deps)")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never downloads a browser or driver
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1700", "--disable-extensions", "--no-first-run"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=DriverService(executable_path=driver_path), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def browser(_chromium) -> Iterator[object]:
    """The session's Chromium, on a blank page with its console log drained before and after each
    test: a page a test leaves open (a run's live stream, which reconnects) cannot log into the next
    test's console once its service has stopped."""
    _chromium.get("about:blank")
    _chromium.get_log("browser")
    yield _chromium
    _chromium.get("about:blank")
    _chromium.get_log("browser")
