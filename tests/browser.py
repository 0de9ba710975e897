"""Debian's Chromium through Debian's chromedriver, headless, for the page tests: never a
browser Selenium would download."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

from tests.helpers import require_tool

__all__ = ["chromium"]

_PACKAGES = "apt-get install chromium chromium-driver"


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
