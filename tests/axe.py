"""axe-core, Deque's accessibility checker, run in the page under test (tests/vendor/axe.min.js,
axe-core 4.14.1 from npm, MPL-2.0: a test-only asset, never served by the product)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selenium.webdriver.remote.webdriver import WebDriver

__all__ = ["serious_violations"]

_AXE = (Path(__file__).parent / "vendor" / "axe.min.js").read_text(encoding="utf-8")

_RUN = """
const done = arguments[arguments.length - 1];
axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa',
                                                     'best-practice']}})
  .then((result) => done(result.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' '))}))))
  .catch((err) => done([{id: 'axe-error', impact: 'critical', help: String(err), nodes: []}]));
"""


def serious_violations(driver: WebDriver) -> list[dict[str, Any]]:
    """The serious and critical violations axe-core finds in the page as it stands."""
    if not driver.execute_script("return typeof axe !== 'undefined'"):
        driver.execute_script(_AXE)
    found: list[dict[str, Any]] = driver.execute_async_script(_RUN)
    return [v for v in found if v["impact"] in ("serious", "critical")]
