"""The mission pages in a real browser: Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver, against the web as the Procfile runs it (gunicorn, gevent) and a real
`sa-core run-worker` calling the fake provider over HTTP.

The module has its own database, so the web's event hub and the worker run across tests without
the per-test truncation (which restarts event ids under a running hub); each test acts as its own
org, so no test sees another's prompts (one checks exactly that).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from psycopg_pool import ConnectionPool
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import issue_token, revoke_token
from jobqueue.devtools.embedded_db import scratch_database
from jobqueue.devtools.fake_provider import FakeProvider
from tests.axe import serious_violations
from tests.browser import chromium, press, until
from tests.helpers import REPO, fetch_one, free_port
from tests.processes import gunicorn, run_process

# NOTE: the whole module on one xdist worker (make test's --dist loadgroup), so its
# module-scoped web, worker and browser start once.
pytestmark = pytest.mark.xdist_group("mission_page")

API = "/sa-core/v1"

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
    with chromium(tmp_path_factory.mktemp("chromium")) as driver:
        yield driver


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


@contextlib.contextmanager
def phone_width(driver: WebDriver) -> Iterator[None]:
    """The page at a phone's width (390 px) for the block, then at the desktop width again."""
    driver.set_window_size(390, 844)
    try:
        yield
    finally:
        driver.set_window_size(1280, 900)


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
        conn.execute("UPDATE sa_job SET state = 'cancelled', waiting = false, finished_at = now() "
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
    # NOTE: alone in its second it is "... is now succeeded"; with the blockers' cancels, a sum.
    until(page, lambda d: re.search(r"is now succeeded|\d+ succeeded",
                                    d.find_element(By.ID, "announcer").text))


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
    assert done["response"] == f"echo[3]: user:{root} | assistant:echo[1]: user:{root} | user:{reply}", (
        "the reply ran in its thread, the root's answer included")
    click(page, reply, "Thread")
    thread = until(page, lambda d: _visible(d, "thread"))
    assert page.switch_to.active_element == thread
    entries = until(page, lambda d: [e.text for e in d.find_elements(
        By.CSS_SELECTOR, "#thread-list .prompt-text")] or None)
    assert entries == [root, reply]
    page.switch_to.active_element.send_keys(Keys.ESCAPE)
    until(page, lambda d: not d.find_element(By.ID, "thread").is_displayed())
    with phone_width(page):
        assert page.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"), "no sideways scroll"


def test_two_clicks_on_send_make_one_prompt(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    text = f"once {uuid.uuid4().hex[:6]}"
    page.find_element(By.ID, "text").send_keys(text)
    page.execute_script("const send = document.querySelector('#compose button[type=submit]');"
                        "send.click(); send.click();")
    drop_in(page, text, "succeeded")
    sent = fetch_one(mission_pool, "SELECT count(*) AS n FROM sa_entity "
                                   "WHERE kind = 'prompt' AND org_id = %s AND content = %s",
                     viewer.org_id, text)
    assert sent["n"] == 1
    assert page.find_element(By.CSS_SELECTOR, "#compose button[type=submit]").is_enabled()


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
    assert cancelled["buttons"] == ["Retry"] and cancelled["response"] is None
    job = httpx.get(f"{web}{API}/prompts/{cancelled['prompt_id']}", headers=viewer.headers).json()
    assert [j["state"] for j in job["jobs"]] == ["cancelled"]
    for job_id in blockers:
        viewer.cancel(job_id)
    # NOTE: a cancelled prompt can be run again, as the API allows.
    click(page, text, "Retry")
    drop_in(page, text, "succeeded")
    job = httpx.get(f"{web}{API}/prompts/{cancelled['prompt_id']}", headers=viewer.headers).json()
    assert [j["state"] for j in job["jobs"]] == ["succeeded", "superseded"]


def test_a_running_retry_shows_no_error_from_the_attempt_before(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    text = f"unavailable once {uuid.uuid4().hex[:6]} [fake:flaky=1] [fake:latency=2]"
    compose(page, text)
    second = until(page, lambda d: (x := drop(d, text)) and x["state"] == "running"
                   and x["attempts"] and x["attempts"].startswith("attempt 2") and x)
    assert second["error"] is None
    drop_in(page, text, "succeeded")


def test_focus_stays_where_the_action_left_it(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    until(page, lambda d: d.switch_to.active_element.get_attribute("id") == "text")
    blockers = occupy_worker(viewer)
    text = f"focus {uuid.uuid4().hex[:6]}"
    prompt_id = viewer.submit(text)["prompt_id"]
    drop_in(page, text, "queued")
    in_drop = f'#field .drop[data-prompt-id="{prompt_id}"]'
    press(page, By.CSS_SELECTOR, f"{in_drop} button.cancel")
    drop_in(page, text, "cancelled")
    focused = page.switch_to.active_element
    assert focused.get_attribute("data-prompt-id") == prompt_id, "the cancelled drop keeps the focus"
    for job_id in blockers:
        viewer.cancel(job_id)
    press(page, By.CSS_SELECTOR, f"{in_drop} button.retry")
    drop_in(page, text, "succeeded")
    assert page.execute_script(
        "return document.querySelector(arguments[0]).contains(document.activeElement)", in_drop)


def _luminance(rgb: str) -> float:
    channels = [int(c) / 255 for c in re.findall(r"\d+", rgb)[:3]]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a: str, b: str) -> float:
    light, dark = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_the_focus_ring_stands_out_and_each_drop_button_names_its_prompt(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    texts = [f"named {n} {uuid.uuid4().hex[:6]}" for n in range(2)]
    for text in texts:
        viewer.submit(text)
    for text in texts:
        drop_in(page, text, "succeeded")
    names = page.execute_script("return [...document.querySelectorAll('#field button.continue')]"
                                ".map((b) => b.getAttribute('aria-label'))")
    assert len(names) >= 2 and len(set(names)) == len(names), names
    # NOTE: Tab from the compose box, so that :focus-visible applies as for a keyboard user.
    page.find_element(By.ID, "text").send_keys(Keys.TAB)
    ring, page_bg, panel_bg = page.execute_script("""
const style = getComputedStyle(document.activeElement);
return [style.outlineStyle === 'none' ? null : style.outlineColor,
        getComputedStyle(document.body).backgroundColor,
        getComputedStyle(document.getElementById('compose')).backgroundColor];""")
    assert ring is not None, "a focused control shows a ring"
    assert min(_contrast(ring, page_bg), _contrast(ring, panel_bg)) >= 3, (ring, page_bg, panel_bg)


def test_a_burst_of_prompts_is_announced_in_a_few_sentences(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    until(page, lambda d: connection(d) == "live")
    page.execute_script("""
window.announced = [];
new MutationObserver(() => {
  const text = document.getElementById('announcer').textContent;
  if (text) window.announced.push(text);
}).observe(document.getElementById('announcer'), {childList: true, characterData: true, subtree: true});""")
    tag = uuid.uuid4().hex[:6]
    answer = httpx.post(f"{web}{API}/prompts/batch", headers=viewer.headers, timeout=10,
                        json={"prompts": [{"text": f"burst {tag} {n}"} for n in range(40)]})
    assert answer.status_code == 202, answer.text
    for n in range(40):
        drop_in(page, f"burst {tag} {n}", "succeeded")
    announced = until(page, lambda d: (said := d.execute_script("return window.announced"))
                      and "succeeded" in said[-1] and said)
    # NOTE: one announcement per state change was 80 for these 40 prompts.
    assert len(announced) < 20, announced


def test_answers_show_code_in_monospace_and_nothing_in_them_runs(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    text = (f"code {uuid.uuid4().hex[:6]}\n```python\nprint('<b>hi</b>')\n```\n"
            "then `inline` <img src=x onerror=\"window.ran=1\">")
    prompt_id = viewer.submit(text)["prompt_id"]
    drop_in(page, text, "succeeded")
    shown = page.execute_script("""
const drop = document.querySelector(`#field .drop[data-prompt-id="${arguments[0]}"]`);
const answer = drop.querySelector('.response-text');
return {blocks: [...answer.querySelectorAll('pre > code')].map((c) => c.textContent),
        inline: [...answer.querySelectorAll(':not(pre) > code')].map((c) => c.textContent),
        font: getComputedStyle(answer.querySelector('pre > code')).fontFamily,
        markup: drop.querySelectorAll('img, b, script').length, ran: window.ran || null};""", prompt_id)
    assert shown["blocks"] == ["print('<b>hi</b>')"]
    assert shown["inline"] == ["inline"]
    assert "mono" in shown["font"].lower()
    assert (shown["markup"], shown["ran"]) == (0, None)


def test_a_long_prompt_is_collapsed_until_the_reader_asks_for_all_of_it(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    text = f"long {uuid.uuid4().hex[:6]}\n" + "\n".join(f"line {n} of a long paste" for n in range(200))
    prompt_id = viewer.submit(text)["prompt_id"]
    drop_in(page, text, "succeeded")
    with phone_width(page):
        height = ("return document.querySelector(`#field .drop[data-prompt-id=\"${arguments[0]}\"]`)"
                  ".getBoundingClientRect().height")
        collapsed = page.execute_script(height, prompt_id)
        assert collapsed < 800, "a 200-line prompt and its echo take a few lines each"
        # NOTE: read in one script: a late event redraws the drop between two looks.
        expanded = ("return [...document.querySelectorAll(`#field .drop[data-prompt-id=\"${arguments[0]}\"]"
                    " button.more`)].map((b) => b.getAttribute('aria-expanded'))")
        assert page.execute_script(expanded, prompt_id) == ["false", "false"]
        press(page, By.CSS_SELECTOR, f'#field .drop[data-prompt-id="{prompt_id}"] button.more')
        assert page.execute_script(height, prompt_id) > collapsed + 2000
        assert page.execute_script(expanded, prompt_id) == ["true", "false"]


def test_a_queued_prompt_says_why_it_waits_with_a_countdown_that_moves(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    later = f"later {uuid.uuid4().hex[:6]}"
    first = viewer.submit(later, delay_seconds=90)
    after = f"after it {uuid.uuid4().hex[:6]}"
    viewer.submit(after, after=first["job_id"])
    why = ("return [...document.querySelectorAll('#field .drop')].find((li) => li.querySelector("
           "'.prompt-text').textContent === arguments[0])?.querySelector('.why')?.textContent")
    start = until(page, lambda d: d.execute_script(why, later))
    shown = re.fullmatch(r"starts in (\d+) s", start)
    assert shown and 60 <= int(shown.group(1)) <= 90, start
    until(page, lambda d: d.execute_script(why, later) != start, timeout=5)
    moved = int(re.findall(r"\d+", page.execute_script(why, later))[0])
    assert moved < int(re.findall(r"\d+", start)[0])
    assert page.execute_script(why, after) == f"waits for “{later}” to succeed"
    # NOTE: as a 429 leaves a job: queued again, its attempt kept, until the route's pause ends.
    throttled = f"throttled {uuid.uuid4().hex[:6]}"
    put_back = viewer.submit(throttled, delay_seconds=45)
    with mission_pool.connection() as conn:
        conn.execute("UPDATE sa_job SET error_kind = 'rate_limit', error_message = 'provider "
                     "answered 429' WHERE id = %s", (put_back["job_id"],))
    page.refresh()
    assert re.fullmatch(r"route throttled, resumes in \d+ s",
                        until(page, lambda d: d.execute_script(why, throttled)))
    viewer.cancel(put_back["job_id"])
    viewer.cancel(first["job_id"])


def test_a_streamed_answer_shows_as_it_is_written_and_again_after_a_reload(
    page: WebDriver, base_settings: Settings, fake: FakeProvider, tmp_path: Path,
) -> None:
    # NOTE: a database, web and worker of its own: the module's worker would take the job
    # unstreamed.
    with scratch_database("sa_mission_stream", "SA_TEST_DATABASE_URL") as url:
        settings = replace(base_settings, database_url=url, direct_database_url=url)
        pool = open_pool(url, name="mission-stream", max_size=2)
        routes = json.dumps({"routes": [{"name": "streamed", "base_url": fake.url, "stream": True}]})
        try:
            with gunicorn(settings, tmp_path, **WEB_ENV) as base, run_process(
                    [sys.executable, "-m", "jobqueue.operator.cli", "run-worker"],
                    {"DATABASE_URL": url, "SA_PROVIDER_URL": None, "SA_PROVIDER_ROUTES": routes,
                     "SA_STREAM_INTERVAL": "0.05", "SA_POLL_INTERVAL": "0.1"},
                    tmp_path / "worker.log"):
                viewer = Viewer(pool, base)
                viewer.sign_in(page)
                until(page, lambda d: connection(d) == "live")
                words = " ".join(f"w{n}" for n in range(30))
                text = f"{words} [fake:stream-gap=0.2]"
                prompt_id = viewer.submit(text)["prompt_id"]
                partial = ("return document.querySelector(`#field .drop[data-prompt-id=\"${arguments[0]}\"]"
                           " .response-text.partial`)?.textContent || ''")
                first = until(page, lambda d: d.execute_script(partial, prompt_id))
                grown = until(page, lambda d: len(x := d.execute_script(partial, prompt_id))
                              > len(first) and x)
                assert grown.startswith("echo[1]:") and grown.startswith(first)
                assert drop(page, text)["state"] == "running"
                # NOTE: a reload shows the text so far at once (partial_text), then goes on.
                page.refresh()
                again = until(page, lambda d: d.execute_script(partial, prompt_id))
                assert len(again) >= len(grown)
                done = drop_in(page, text, "succeeded")
                assert done["response"] == f"echo[1]: user:{text}"
                assert page.execute_script(partial, prompt_id) == ""
        finally:
            pool.close()


def test_the_drops_filter_by_state_with_counts_and_by_a_searched_text(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    tag = uuid.uuid4().hex[:6]
    texts = [f"apple {tag}", f"pear {tag}", f"plum {tag} [fake:400]"]
    for text in texts:
        viewer.submit(text)
    for text, state in zip(texts, ["succeeded", "succeeded", "failed"], strict=True):
        drop_in(page, text, state)
    shown = ("return [...document.querySelectorAll('#field .drop')].filter((li) => !li.hidden)"
             ".map((li) => li.querySelector('.prompt-text').textContent)")
    chips = ("return [...document.querySelectorAll('#state-filter button')]"
             ".map((b) => b.textContent + (b.getAttribute('aria-pressed') === 'true' ? '*' : ''))")
    until(page, lambda d: d.execute_script(chips) == ["all 3*", "succeeded 2", "failed 1"])
    press(page, By.CSS_SELECTOR, '#state-filter [data-state="failed"]')
    until(page, lambda d: d.execute_script(shown) == [texts[2]])
    assert page.execute_script(chips) == ["all 3", "succeeded 2", "failed 1*"]
    press(page, By.CSS_SELECTOR, '#state-filter [data-state="all"]')
    page.find_element(By.ID, "search").send_keys("PEAR")
    until(page, lambda d: d.execute_script(shown) == [texts[1]])
    # NOTE: answers are searched too: the echo of the apple prompt holds its text.
    search = page.find_element(By.ID, "search")
    search.clear()
    search.send_keys("echo[1]: user:apple")
    until(page, lambda d: d.execute_script(shown) == [texts[0]])


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


def _web_processes(port: int) -> list[int]:
    """The gunicorn master and worker serving `port` (both carry its PORT in their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and b"gunicorn" in (entry / "cmdline").read_bytes()
                    and f"PORT={port}".encode() in (entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


def test_a_frozen_server_is_shown_as_unreachable_and_the_page_goes_live_when_it_thaws(
    page: WebDriver, mission_settings: Settings, mission_pool: ConnectionPool[DictConnection],
    tmp_path: Path, web: str,
) -> None:
    port = free_port()
    with gunicorn(mission_settings, tmp_path, port=port, **WEB_ENV) as base:
        viewer = Viewer(mission_pool, base)
        viewer.sign_in(page)
        until(page, lambda d: connection(d) == "live")
        frozen = _web_processes(port)
        assert len(frozen) == 2, frozen
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            # NOTE: the stream's socket stays open, so only the page's own probe can tell.
            until(page, lambda d: connection(d) != "live"
                  and d.find_element(By.ID, "conn").get_attribute("data-reachable") == "false")
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        until(page, lambda d: connection(d) == "live")
        text = f"after the thaw {uuid.uuid4().hex[:6]}"
        viewer.submit(text)
        drop_in(page, text, "succeeded")


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
    press(page, By.XPATH, running)
    until(page, lambda d: not d.find_elements(By.XPATH, running))
    retry = f"//table[@id='failures']//button[@data-job-id='{failing['job_id']}']"
    until(page, lambda d: d.find_elements(By.XPATH, retry))
    until(page, lambda d: "provider_4xx" in d.find_element(By.ID, "kinds").text)
    press(page, By.XPATH, retry)
    until(page, lambda d: not d.find_elements(By.XPATH, retry))
    user.cancel(blockers[1])
    states = httpx.get(f"{web}{API}/prompts/{failing['prompt_id']}", headers=user.headers).json()
    assert [j["state"] for j in states["jobs"]][1] == "superseded"


_READS = """
return performance.getEntriesByType('resource').map((e) => new URL(e.name).pathname)
  .filter((path) => path.endsWith(arguments[0])).length;
"""


def reads(driver: WebDriver, path: str) -> int:
    """How many requests the page made to `path` (an API route) since it loaded."""
    count: int = driver.execute_script(_READS, path)
    return count


def test_a_reopened_page_loads_the_present_not_the_history_and_applies_events_as_they_come(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    sent = [viewer.submit(f"later {n}", delay_seconds=3600) for n in range(60)]
    viewer.sign_in(page)
    until(page, lambda d: drop(d, "later 59") and drop(d, "later 10"))
    assert drop(page, "later 9") is None
    assert (reads(page, "/mission/prompts"), reads(page, "/mission/recent")) == (1, 0)
    older = until(page, lambda d: _visible(d, "older"))
    older.click()
    until(page, lambda d: drop(d, "later 0"))
    until(page, lambda d: not d.find_element(By.ID, "older").is_displayed())
    until(page, lambda d: connection(d) == "live")

    # NOTE: cancelled, retried as new jobs, run and answered elsewhere: every change reaches the
    # page as an event and is applied from its data, with no read of the feed.
    for n in range(55, 60):
        viewer.cancel(sent[n]["job_id"])
        drop_in(page, f"later {n}", "cancelled")
    for n in range(55, 60):
        retried = httpx.post(f"{web}{API}/prompts/{sent[n]['prompt_id']}/retry",
                             headers=viewer.headers, timeout=10)
        assert retried.status_code == 202, retried.text
    for n in range(55, 60):
        assert drop_in(page, f"later {n}", "succeeded")["response"] == f"echo[1]: user:later {n}"
    assert reads(page, "/mission/recent") == 0


def test_axe_finds_no_serious_violation_on_the_page_in_its_main_states(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    page.get(f"{web}/mission")
    until(page, lambda d: _visible(d, "token"))
    assert serious_violations(page) == [], "sign-in"
    viewer = Viewer(mission_pool, web)
    viewer.submit("waits for later", delay_seconds=3600)
    viewer.submit("fails [fake:400]")
    viewer.submit("answers with code\n\n```\nprint(1)\n```")
    viewer.sign_in(page)
    drop_in(page, "fails [fake:400]", "failed")
    until(page, lambda d: (x := drop(d, "answers with code\n\n```\nprint(1)\n```"))
          and x["state"] == "succeeded")
    assert serious_violations(page) == [], "drops queued, failed and succeeded"
    press(page, By.CSS_SELECTOR, "#field .drop.is-orphan a.details")
    until(page, lambda d: d.execute_script(_ATTEMPTS))
    assert serious_violations(page) == [], "a prompt's details"
    page.find_element(By.ID, "detail-close").click()
    click(page, "fails [fake:400]", "Retry")
    with phone_width(page):
        assert serious_violations(page) == [], "at 390 px"


_ATTEMPTS = """
return [...document.querySelectorAll('#detail-body .detail-attempts tbody tr')]
  .map((tr) => [...tr.children].slice(0, 8).map((td) => td.textContent));
"""


def test_a_prompts_details_show_every_attempt_and_have_an_address_of_their_own(
    page: WebDriver, web: str, mission_pool: ConnectionPool[DictConnection],
) -> None:
    viewer = Viewer(mission_pool, web)
    viewer.sign_in(page)
    text = f"flaky once {uuid.uuid4().hex[:6]} [fake:flaky=1]"
    prompt_id = viewer.submit(text, options={"temperature": 0.5})["prompt_id"]
    drop_in(page, text, "succeeded")
    press(page, By.CSS_SELECTOR, f'#field .drop[data-prompt-id="{prompt_id}"] a.details')
    # NOTE: the model the worker called (its SA_PROVIDER_MODEL), as the ledger has it.
    model = fetch_one(mission_pool, "SELECT model FROM sa_ledger l JOIN sa_job j ON j.id = l.job_id "
                                    "WHERE j.prompt_id = %s LIMIT 1", prompt_id)["model"]
    expected = [["1", "provider_5xx", "retried", model, "default", "503"],
                ["2", "succeeded", "", model, "default", "200"]]
    rows = until(page, lambda d: (r := d.execute_script(_ATTEMPTS)) and len(r) == 2 and r)
    assert [row[:6] for row in rows] == expected
    assert rows[1][7] == f"{len(text.split())} in, {len(text.split()) + 1} out"
    shown = page.find_element(By.ID, "detail-body").text
    assert "temperature: 0.5" in shown and "null" not in shown
    assert page.current_url.endswith(f"#prompt={prompt_id}")
    page.refresh()
    rows = until(page, lambda d: (r := d.execute_script(_ATTEMPTS)) and len(r) == 2 and r)
    assert [row[:6] for row in rows] == expected
    page.find_element(By.ID, "detail-close").click()
    assert not page.find_element(By.ID, "detail").is_displayed()
    assert "#prompt=" not in page.current_url
