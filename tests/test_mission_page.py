"""The mission pages in a real browser: Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver, against the web as the Procfile runs it (gunicorn, gevent) and a real
`sa-core run-worker` calling the fake provider over HTTP.

The module has its own database, so the web's event hub and the worker run across tests without
the per-test truncation (which restarts event ids under a running hub); each test acts as its own
org, so no test sees another's prompts (one checks exactly that).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from psycopg_pool import ConnectionPool
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import issue_token, revoke_token
from jobqueue.devtools.embedded_db import scratch_database
from jobqueue.devtools.fake_provider import FakeProvider
from tests.helpers import REPO, free_port, require_tool
from tests.processes import gunicorn

# NOTE: the whole module on one xdist worker (make test's --dist loadgroup), so its
# module-scoped web, worker and browser start once.
pytestmark = pytest.mark.xdist_group("mission_page")

API = "/sa-core/v1"
BROWSER_PACKAGES = "apt-get install chromium chromium-driver"

WAIT = 30.0
"""Seconds any page state is waited for; the page is polled every 50 ms, never slept on."""

_org_ids = iter(range(100, 10_000))


@pytest.fixture(scope="module")
def mission_settings(base_settings: Settings) -> Iterator[Settings]:
    with scratch_database("sa_mission", "SA_TEST_DATABASE_URL") as url:
        yield replace(base_settings, database_url=url, direct_database_url=url)


@pytest.fixture(scope="module")
def mission_pool(mission_settings: Settings) -> Iterator[ConnectionPool[DictConnection]]:
    pool = open_pool(mission_settings.database_url, name="mission-tests", max_size=4)
    yield pool
    pool.close()


# NOTE: a small pool: the module runs up to two web processes and a worker on a Postgres that
# other test runs may share.
WEB_ENV = {"SA_HEARTBEAT_INTERVAL": "0.2", "SA_SSE_KEEPALIVE": "1", "SA_SSE_TOKEN_CHECK": "0.5",
           "SA_POOL_MAX_SIZE": "4"}


@pytest.fixture(scope="module")
def web(mission_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with gunicorn(mission_settings, tmp_path_factory.mktemp("web"), **WEB_ENV) as base:
        yield base


@pytest.fixture(scope="module")
def worker(mission_settings: Settings, fake: FakeProvider) -> Iterator[None]:
    """One `sa-core run-worker` with two slots, short heartbeats (a cancel frees a slot at once)
    and short backoff (a failing prompt exhausts its attempts in well under a second)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "jobqueue.operator.cli", "run-worker", "--concurrency", "2"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "DATABASE_URL": mission_settings.database_url,
             "SA_PROVIDER_URL": fake.url, "SA_HEARTBEAT_INTERVAL": "0.2", "SA_POLL_INTERVAL": "0.1",
             "SA_BACKOFF_BASE": "0.05", "SA_BACKOFF_CAP": "0.2", "SA_SHUTDOWN_GRACE": "1"})
    yield
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """Debian's Chromium through Debian's chromedriver, never a browser Selenium would download."""
    chromium = require_tool("chromium", install=BROWSER_PACKAGES)
    chromedriver = require_tool("chromedriver", install=BROWSER_PACKAGES)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1280,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    yield driver
    driver.quit()


@pytest.fixture
def page(browser: WebDriver, web: str, worker: None) -> Iterator[WebDriver]:
    """The browser with no cookie left by an earlier test; extra tabs a test opened are closed
    after it."""
    # NOTE: WebDriver deletes only the cookies the current document sees, and the session
    # cookie's Path is the API's.
    browser.get(f"{web}{API}/openapi.json")
    browser.delete_all_cookies()
    yield browser
    for handle in browser.window_handles[1:]:
        browser.switch_to.window(handle)
        browser.close()
    browser.switch_to.window(browser.window_handles[0])


class Viewer:
    """One org's user: their token and their way of using the page."""

    def __init__(self, pool: ConnectionPool[DictConnection], base: str, *, ops: bool = False) -> None:
        self.org_id = next(_org_ids)
        self.base = base
        self.token = issue_token(pool, self.org_id, 1, scopes=("ops",) if ops else ()).token
        self.headers = {"Authorization": f"Bearer {self.token}"}

    def sign_in(self, driver: WebDriver, path: str = "/mission") -> None:
        driver.get(self.base + path)
        token = until(driver, lambda d: _visible(d, "token"))
        token.send_keys(self.token)
        token.submit()
        until(driver, lambda d: d.find_element(By.ID, "signin").get_attribute("hidden") is not None)

    def submit(self, text: str, **body: Any) -> dict[str, Any]:
        answer = httpx.post(f"{self.base}{API}/prompt", json={"text": text, **body},
                            headers=self.headers, timeout=10)
        assert answer.status_code == 202, answer.text
        result: dict[str, Any] = answer.json()
        return result

    def cancel(self, job_id: str) -> None:
        answer = httpx.post(f"{self.base}{API}/jobs/{job_id}/cancel", headers=self.headers, timeout=10)
        assert answer.status_code in (200, 409), answer.text


def until(driver: WebDriver, condition: Callable[[WebDriver], Any], timeout: float = WAIT) -> Any:
    # NOTE: a page that re-renders (or reloads on sign-out) between two looks leaves stale elements.
    return WebDriverWait(driver, timeout, poll_frequency=0.05,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException)).until(condition)


def _visible(driver: WebDriver, element_id: str) -> Any:
    node = driver.find_element(By.ID, element_id)
    return node if node.is_displayed() else None


_DROP = """
const drop = [...document.querySelectorAll('#field .drop')]
  .find((li) => li.querySelector('.prompt-text').textContent === arguments[0]);
if (!drop) return null;
const text = (sel) => { const n = drop.querySelector(sel); return n ? n.textContent : null; };
return {state: drop.dataset.state, prompt_id: drop.dataset.promptId, response: text('.response-text'),
        error: text('.error-text'), attempts: text('.attempts'),
        buttons: [...drop.querySelectorAll('button')].map((b) => b.textContent)};
"""


def drop(driver: WebDriver, text: str) -> dict[str, Any] | None:
    """The drop showing `text`: its state, response, error, attempts and buttons (None: absent)."""
    found: dict[str, Any] | None = driver.execute_script(_DROP, text)
    return found


def drop_in(driver: WebDriver, text: str, state: str) -> dict[str, Any]:
    """Waits until the drop showing `text` is in `state` (and, once succeeded, shows its
    response, which a page of /mission/recent brings just after the event); returns it."""
    found: dict[str, Any] = until(driver, lambda d: (x := drop(d, text)) and x["state"] == state
                                  and (state != "succeeded" or x["response"] is not None) and x)
    return found


def click(driver: WebDriver, text: str, label: str) -> None:
    driver.execute_script("""
const drop = [...document.querySelectorAll('#field .drop')]
  .find((li) => li.querySelector('.prompt-text').textContent === arguments[0]);
[...drop.querySelectorAll('button')].find((b) => b.textContent === arguments[1]).click();
""", text, label)


def compose(driver: WebDriver, text: str) -> None:
    box = driver.find_element(By.ID, "text")
    box.send_keys(text)
    driver.find_element(By.CSS_SELECTOR, "#compose button[type=submit]").click()


def connection(driver: WebDriver) -> str:
    mode: str = driver.find_element(By.ID, "conn").get_attribute("data-mode") or ""
    return mode


@pytest.fixture(autouse=True)
def _no_job_left_running(mission_pool: ConnectionPool[DictConnection]) -> Iterator[None]:
    """Cancels what a failed test left queued or running (its blockers hold the worker's slots
    for a minute), so one failure does not starve the tests after it."""
    yield
    with mission_pool.connection() as conn:
        conn.execute("UPDATE sa_job SET state = 'cancelled', finished_at = now() "
                     "WHERE state IN ('queued', 'running')")


def occupy_worker(viewer: Viewer) -> list[str]:
    """Fills both of the worker's slots with prompts that take a minute; returns their job ids."""
    return [viewer.submit(f"blocker {n} [fake:latency=60]")["job_id"] for n in range(2)]


def test_a_prompt_goes_queued_running_succeeded_with_its_response_shown(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    until(page, lambda d: connection(d) == "live")
    blockers = occupy_worker(viewer)
    text = f"hello {uuid.uuid4().hex[:6]} [fake:latency=1]"
    compose(page, text)
    assert drop_in(page, text, "queued")["buttons"] == ["Cancel"]
    for job_id in blockers:
        viewer.cancel(job_id)
    assert drop_in(page, text, "running")["buttons"] == ["Cancel"]
    done = drop_in(page, text, "succeeded")
    assert done["response"] == f"echo[1]: user:{text}"
    assert done["attempts"] == "attempt 1 of 3"
    until(page, lambda d: "is now succeeded" in d.find_element(By.ID, "announcer").text)


def test_a_reply_typed_from_the_keyboard_continues_the_thread_and_the_thread_view_follows_it(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    root = f"root {uuid.uuid4().hex[:6]}"
    viewer.submit(root)
    drop_in(page, root, "succeeded")
    click(page, root, "Continue")
    focused = page.switch_to.active_element
    assert focused.get_attribute("id") == "text", "Continue puts the cursor in the compose box"
    reply = f"reply {uuid.uuid4().hex[:6]}"
    focused.send_keys(reply, Keys.CONTROL, Keys.ENTER)
    done = drop_in(page, reply, "succeeded")
    assert done["response"] == f"echo[2]: user:{root} | user:{reply}", "the reply ran in its thread"
    click(page, reply, "Thread")
    thread = until(page, lambda d: _visible(d, "thread"))
    assert page.switch_to.active_element == thread
    entries = until(page, lambda d: [e.text for e in d.find_elements(
        By.CSS_SELECTOR, "#thread-list .prompt-text")] or None)
    assert entries == [root, reply]
    page.switch_to.active_element.send_keys(Keys.ESCAPE)
    until(page, lambda d: not d.find_element(By.ID, "thread").is_displayed())
    page.set_window_size(390, 844)
    try:
        assert page.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"), "no sideways scroll"
    finally:
        page.set_window_size(1280, 900)


def test_a_failed_prompt_shows_the_retry_chip_and_a_retry_succeeds(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    # NOTE: the fake provider answers 503 to this exact text three times: the prompt uses up its
    # three attempts and fails; the user's retry is the fourth call, which succeeds.
    text = f"flaky {uuid.uuid4().hex[:6]} [fake:flaky=3]"
    compose(page, text)
    failed = drop_in(page, text, "failed")
    assert failed["buttons"] == ["Retry"]
    assert failed["error"].startswith("provider_5xx")
    assert failed["attempts"] == "attempt 3 of 3"
    assert "is-orphan" in (page.find_element(
        By.CSS_SELECTOR, f"[data-prompt-id='{failed['prompt_id']}']").get_attribute("class") or "")
    click(page, text, "Retry")
    done = drop_in(page, text, "succeeded")
    assert done["response"] == f"echo[1]: user:{text}" and done["error"] is None


def test_cancel_a_queued_prompt(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    blockers = occupy_worker(viewer)
    text = f"never mind {uuid.uuid4().hex[:6]}"
    compose(page, text)
    drop_in(page, text, "queued")
    click(page, text, "Cancel")
    cancelled = drop_in(page, text, "cancelled")
    assert cancelled["buttons"] == [] and cancelled["response"] is None
    for job_id in blockers:
        viewer.cancel(job_id)
    job = httpx.get(f"{web}{API}/prompts/{cancelled['prompt_id']}", headers=viewer.headers).json()
    assert [j["state"] for j in job["jobs"]] == ["cancelled"]


def test_closing_the_page_during_a_slow_prompt_and_reopening_it_shows_the_result(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    text = f"slow {uuid.uuid4().hex[:6]} [fake:latency=2]"
    compose(page, text)
    prompt_id = drop_in(page, text, "running")["prompt_id"]
    page.get(f"{web}/healthz")  # NOTE: the page is gone: its stream and timers with it
    with mission_pool.connection() as conn:
        until(page, lambda d: conn.execute("SELECT state FROM sa_job WHERE prompt_id = %s",
                                           (prompt_id,)).fetchone()["state"] == "succeeded")
    page.get(f"{web}/mission")
    done = drop_in(page, text, "succeeded")
    assert done["response"] == f"echo[1]: user:{text}"


def test_two_pages_of_one_user_stay_consistent(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    first = page.current_window_handle
    page.switch_to.new_window("tab")
    page.get(f"{web}/mission")
    second = page.current_window_handle
    until(page, lambda d: connection(d) == "live")
    blockers = occupy_worker(viewer)
    text = f"shared {uuid.uuid4().hex[:6]}"
    compose(page, text)
    drop_in(page, text, "queued")
    page.switch_to.window(first)
    drop_in(page, text, "queued")
    click(page, text, "Cancel")
    drop_in(page, text, "cancelled")
    page.switch_to.window(second)
    drop_in(page, text, "cancelled")
    for job_id in blockers:
        viewer.cancel(job_id)
    fields = []
    for handle in (first, second):
        page.switch_to.window(handle)
        fields.append(until(page, lambda d: d.execute_script(
            "const ds = [...document.querySelectorAll('#field .drop')];"
            "return ds.every((li) => li.dataset.state === 'cancelled') && "
            "ds.map((li) => [li.dataset.promptId, li.dataset.state]);")))
    assert fields[0] == fields[1] and len(fields[0]) == 3


def test_another_orgs_prompt_never_appears(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer, stranger = Viewer(mission_pool, web), Viewer(mission_pool, web)
    viewer.sign_in(page)
    until(page, lambda d: connection(d) == "live")
    secret = f"the stranger's secret {uuid.uuid4().hex[:6]}"
    stranger.submit(secret)
    mine = f"mine {uuid.uuid4().hex[:6]}"
    viewer.submit(mine)
    drop_in(page, mine, "succeeded")
    page.refresh()
    drop_in(page, mine, "succeeded")
    assert secret not in page.find_element(By.TAG_NAME, "body").text
    assert len(page.find_elements(By.CSS_SELECTOR, "#field .drop")) == 1


def test_the_page_falls_back_to_polling_when_the_web_stops_and_converges_when_it_returns(
    page: WebDriver, mission_settings: Settings, mission_pool: ConnectionPool[DictConnection],
    tmp_path: Path, web: str,
) -> None:
    port = free_port()
    with gunicorn(mission_settings, tmp_path, port=port, **WEB_ENV) as base:
        viewer = Viewer(mission_pool, base)
        viewer.sign_in(page)
        until(page, lambda d: connection(d) == "live")
        # NOTE: 4 s, so the page sees it running and the web is down well before it ends.
        text = f"while you were away {uuid.uuid4().hex[:6]} [fake:latency=4]"
        compose(page, text)
        drop_in(page, text, "running")
    # NOTE: the web is down: the stream fails, the page polls (and says it cannot reach the
    # server) while the worker finishes the prompt.
    until(page, lambda d: connection(d) == "polling")
    until(page, lambda d: d.find_element(By.ID, "conn").get_attribute("data-reachable") == "false")
    with mission_pool.connection() as conn:
        until(page, lambda d: conn.execute("SELECT state FROM sa_job WHERE prompt_id = %s", (
            drop(d, text)["prompt_id"],)).fetchone()["state"] == "succeeded")
    assert drop(page, text)["state"] == "running"
    with gunicorn(mission_settings, tmp_path, port=port, **WEB_ENV):
        done = drop_in(page, text, "succeeded")
        assert done["response"] == f"echo[1]: user:{text}"
        until(page, lambda d: connection(d) == "live")
        again = f"after the restart {uuid.uuid4().hex[:6]}"
        viewer.submit(again)
        drop_in(page, again, "succeeded")


def test_a_page_refused_its_stream_converges_by_polling_and_goes_live_once_a_stream_is_free(
    page: WebDriver, mission_settings: Settings, mission_pool: ConnectionPool[DictConnection],
    tmp_path: Path, web: str,
) -> None:
    with gunicorn(mission_settings, tmp_path, **{**WEB_ENV, "SA_SSE_MAX_STREAMS_PER_TOKEN": "1"}) as base:
        viewer = Viewer(mission_pool, base)
        viewer.sign_in(page)
        until(page, lambda d: connection(d) == "live")
        first = page.current_window_handle
        page.switch_to.new_window("tab")
        page.get(f"{base}/mission")
        # NOTE: the token's one stream is the first tab's: this tab's stream is refused (429).
        until(page, lambda d: connection(d) == "polling")
        text = f"polled {uuid.uuid4().hex[:6]}"
        viewer.submit(text)
        done = drop_in(page, text, "succeeded")
        assert done["response"] == f"echo[1]: user:{text}"
        assert connection(page) == "polling"
        assert page.find_element(By.ID, "conn").get_attribute("data-reachable") == "true"
        second = page.current_window_handle
        page.switch_to.window(first)
        page.close()
        page.switch_to.window(second)
        until(page, lambda d: connection(d) == "live")


def test_revoking_the_token_signs_the_open_page_out_and_leaves_nothing_of_it_on_screen(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    text = f"private {uuid.uuid4().hex[:6]}"
    viewer.submit(text)
    drop_in(page, text, "succeeded")
    assert revoke_token(mission_pool, viewer.token) is not None
    until(page, lambda d: _visible(d, "signin") and connection(d) == "signedout")
    assert text not in page.find_element(By.TAG_NAME, "body").text


def test_the_operator_view_refuses_a_token_without_the_ops_scope(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    Viewer(mission_pool, web).sign_in(page, "/mission/ops")
    refused = until(page, lambda d: _visible(d, "refused"))
    assert "ops" in refused.text
    assert not page.find_element(By.ID, "app").is_displayed()


def test_the_operator_view_shows_every_orgs_queue_and_cancels_and_retries(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    operator, user = Viewer(mission_pool, web, ops=True), Viewer(mission_pool, web)
    blockers = occupy_worker(user)
    failing = user.submit(f"refused {uuid.uuid4().hex[:6]} [fake:400]")
    operator.sign_in(page, "/mission/ops")
    row = f"//table[@id='depth']//tr[td[1]='{user.org_id}']"
    until(page, lambda d: [c.text for c in d.find_elements(By.XPATH, f"{row}/td")][1:3] == ["1", "2"])
    running = f"//table[@id='running']//button[@data-job-id='{blockers[0]}']"
    until(page, lambda d: d.find_elements(By.XPATH, running))
    page.find_element(By.XPATH, running).click()
    until(page, lambda d: not d.find_elements(By.XPATH, running))
    retry = f"//table[@id='failures']//button[@data-job-id='{failing['job_id']}']"
    until(page, lambda d: d.find_elements(By.XPATH, retry))
    until(page, lambda d: "provider_4xx" in d.find_element(By.ID, "kinds").text)
    page.find_element(By.XPATH, retry).click()
    until(page, lambda d: not d.find_elements(By.XPATH, retry))
    user.cancel(blockers[1])
    states = httpx.get(f"{web}{API}/prompts/{failing['prompt_id']}", headers=user.headers).json()
    assert [j["state"] for j in states["jobs"]][1] == "superseded"
