"""Debian's Chromium through Debian's chromedriver, headless, for the page tests (never a
browser Selenium would download), and the waits those tests make on a page."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.helpers import require_tool

__all__ = ["WAIT", "chromium", "press", "until"]

_PACKAGES = "apt-get install chromium chromium-driver"

WAIT = 30.0
"""Seconds any page state is waited for; the page is polled every 50 ms, never slept on."""


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[WebDriver]:
    """A headless Chromium at desktop size with its profile in `profile`; quit afterwards."""
    binary = require_tool("chromium", install=_PACKAGES)
    chromedriver = require_tool("chromedriver", install=_PACKAGES)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: WebDriver, condition: Callable[[WebDriver], Any], timeout: float = WAIT) -> Any:
    """`condition`'s first truthy value, polled every 50 ms for up to `timeout` seconds."""
    # NOTE: a page that re-renders (or reloads on sign-out) between two looks leaves stale elements.
    return WebDriverWait(driver, timeout, poll_frequency=0.05,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException)).until(condition)


def press(driver: WebDriver, by: str, selector: str) -> None:
    """Clicks what `selector` finds, finding it again when the page re-rendered it between the
    look and the click (counts, states and the ops tables are redrawn as events arrive)."""
    until(driver, lambda d: d.find_element(by, selector).click() or True)
