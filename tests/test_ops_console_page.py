"""The operator console in a real browser (Debian's Chromium through Selenium), kept cheap: one
browser and one web (gunicorn, as the Procfile runs it) for the module, no worker.

It walks what an operator does: filter the explorer, open a job's history by its link, cancel a
filtered set in bulk after seeing its count, find the action in the log; pause and resume a
route; and, with an `ops:read` token, see the same views with no action on them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from psycopg_pool import ConnectionPool
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import issue_token
from jobqueue.devtools.embedded_db import scratch_database
from tests.axe import serious_violations
from tests.browser import chromium, press, until
from tests.helpers import fetch_one
from tests.processes import gunicorn

pytestmark = pytest.mark.xdist_group("ops_console_page")

API = "/sa-core/v1"


@pytest.fixture(scope="module")
def ops_settings(base_settings: Settings) -> Iterator[Settings]:
    with scratch_database("sa_opspage", "SA_TEST_DATABASE_URL") as url:
        yield replace(base_settings, database_url=url, direct_database_url=url)


@pytest.fixture(scope="module")
def ops_pool(ops_settings: Settings) -> Iterator[ConnectionPool[DictConnection]]:
    pool = open_pool(ops_settings.database_url, name="ops-page-tests", max_size=2)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def web(ops_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # NOTE: a provider URL makes the `default` route; no test here calls it (no worker runs).
    with gunicorn(ops_settings, tmp_path_factory.mktemp("web"), SA_POOL_MAX_SIZE="4",
                  SA_OPS_BULK_BATCH="2", SA_PROVIDER_URL="http://127.0.0.1:9/v1") as base:
        yield base


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    with chromium(tmp_path_factory.mktemp("chromium")) as driver:
        yield driver


@pytest.fixture
def page(browser: WebDriver, web: str) -> WebDriver:
    browser.get(f"{web}{API}/openapi.json")
    browser.delete_all_cookies()
    return browser


def sign_in(driver: WebDriver, web: str, token: str) -> None:
    driver.get(f"{web}/mission/ops")
    field = until(driver, lambda d: (n := d.find_element(By.ID, "token")).is_displayed() and n)
    field.send_keys(token)
    field.submit()
    until(driver, lambda d: d.find_element(By.ID, "app").is_displayed())


def text_of(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def visible(driver: WebDriver, element_id: str) -> bool:
    return bool(driver.find_element(By.ID, element_id).is_displayed())


def test_filter_open_a_history_bulk_cancel_after_the_count_and_find_it_in_the_log(
    page: WebDriver, web: str, ops_pool: ConnectionPool[DictConnection],
) -> None:
    org = 500 + uuid.uuid4().int % 1000
    user = {"Authorization": f"Bearer {issue_token(ops_pool, org, 1).token}"}
    jobs = [httpx.post(f"{web}{API}/prompt", headers=user, timeout=10,
                       json={"text": f"later {i}", "delay_seconds": 3600}).json()["job_id"]
            for i in range(3)]
    sign_in(page, web, issue_token(ops_pool, 9, 90, scopes=("ops",)).token)
    # NOTE: the charts are the page's own SVG: this minute's enqueued jobs draw a line.
    until(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-jobs svg polyline.s0"))

    page.find_element(By.ID, "f-org").send_keys(str(org))
    press(page, By.ID, "f-apply")
    links = "//table[@id='jobs']//a[@data-job-id]"
    until(page, lambda d: d.find_element(By.ID, "jobs").get_attribute("data-filter") == f"org={org}")
    until(page, lambda d: sorted(a.get_attribute("data-job-id")
                                 for a in d.find_elements(By.XPATH, links)) == sorted(jobs))
    press(page, By.XPATH, f"{links}[@data-job-id='{jobs[0]}']")
    assert page.current_url.endswith(f"#job={jobs[0]}"), "a job has an address"
    until(page, lambda d: visible(d, "job") and "(created)" in text_of(d, "job-transitions"))

    press(page, By.ID, "bulk-count")
    until(page, lambda d: text_of(d, "bulk-summary").startswith("3 jobs match: 3 can be cancelled"))
    press(page, By.ID, "bulk-cancel")
    until(page, lambda d: "Cancelled 3 jobs" in text_of(d, "bulk-summary"))
    assert fetch_one(ops_pool, "SELECT count(*) AS n FROM sa_job WHERE org_id = %s "
                               "AND state = 'cancelled'", org)["n"] == 3
    until(page, lambda d: "bulk_cancel" in text_of(d, "audit")
          and f"org_id={org}" in text_of(d, "audit"))
    # NOTE: the open history follows: its job now ends cancelled.
    until(page, lambda d: "cancelled" in text_of(d, "job-transitions"))


def test_pause_and_resume_a_route_from_the_console(
    page: WebDriver, web: str, ops_pool: ConnectionPool[DictConnection],
) -> None:
    sign_in(page, web, issue_token(ops_pool, 9, 91, scopes=("ops",)).token)
    state = "//span[@class='route-state'][@data-route='default']"
    until(page, lambda d: d.find_element(By.XPATH, state).text == "running")
    press(page, By.XPATH, "//button[@aria-label='Pause route default']")
    until(page, lambda d: d.find_element(By.XPATH, state).text.startswith("paused"))
    press(page, By.XPATH, "//button[@aria-label='Resume route default']")
    until(page, lambda d: d.find_element(By.XPATH, state).text == "running")
    until(page, lambda d: "resume_route" in text_of(d, "audit") and "pause_route" in text_of(d, "audit"))


def test_an_ops_read_token_sees_the_console_without_its_actions(
    page: WebDriver, web: str, ops_pool: ConnectionPool[DictConnection],
) -> None:
    user = {"Authorization": f"Bearer {issue_token(ops_pool, 9, 1).token}"}
    assert httpx.post(f"{web}{API}/prompt", headers=user, timeout=10,
                      json={"text": "to look at", "delay_seconds": 3600}).status_code == 202
    sign_in(page, web, issue_token(ops_pool, 9, 92, scopes=("ops:read",)).token)
    until(page, lambda d: visible(d, "readonly-note") and d.find_elements(By.XPATH,
          "//span[@class='route-state']"))
    until(page, lambda d: d.find_elements(By.XPATH, "//table[@id='jobs']//a[@data-job-id]"))
    for element_id in ("selected-cancel", "selected-retry"):
        assert not visible(page, element_id)
    assert not any(b.is_displayed() for b in page.find_elements(By.XPATH, "//table//button"))
    assert not any(b.is_displayed() for b in page.find_elements(By.XPATH, "//table//input"))


def test_axe_finds_no_serious_violation_on_the_console_in_its_main_states(
    page: WebDriver, web: str, ops_pool: ConnectionPool[DictConnection],
) -> None:
    page.get(f"{web}/mission/ops")
    until(page, lambda d: (n := d.find_element(By.ID, "token")).is_displayed() and n)
    assert serious_violations(page) == [], "sign-in"
    user = {"Authorization": f"Bearer {issue_token(ops_pool, 9, 1).token}"}
    job = httpx.post(f"{web}{API}/prompt", headers=user, timeout=10,
                     json={"text": "for the checker", "delay_seconds": 3600}).json()["job_id"]
    sign_in(page, web, issue_token(ops_pool, 9, 93, scopes=("ops",)).token)
    links = "//table[@id='jobs']//a[@data-job-id]"
    until(page, lambda d: d.find_elements(By.XPATH, f"{links}[@data-job-id='{job}']")
          and d.find_elements(By.CSS_SELECTOR, "#chart-jobs svg"))
    assert serious_violations(page) == [], "explorer, panels and charts"
    # NOTE: at a phone's width the filters stack and wide tables scroll inside their panels.
    page.set_window_size(390, 844)
    try:
        until(page, lambda d: d.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"))
    finally:
        page.set_window_size(1280, 900)
    press(page, By.XPATH, f"{links}[@data-job-id='{job}']")
    until(page, lambda d: visible(d, "job") and "(created)" in text_of(d, "job-transitions"))
    assert serious_violations(page) == [], "a job's history"
