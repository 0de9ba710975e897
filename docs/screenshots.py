"""Takes docs/mission.md's screenshots of the mission pages (docs/mission-*.png) with Debian's Chromium.

Run from the repository root: `.venv/bin/python docs/screenshots.py` (needs the local Postgres,
or SA_TEST_DATABASE_URL, and `apt-get install chromium chromium-driver`). It starts the fake
provider, a scratch database, the web (gunicorn, as the Procfile runs it) and a worker, fills
the field with one prompt in each state, and saves a desktop and a phone-width view of /mission
and a desktop view of /mission/ops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from jobqueue.core.db import open_pool
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import issue_token
from jobqueue.devtools.embedded_db import scratch_database
from jobqueue.devtools.fake_provider import FakeConfig, FakeProvider

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
API = "/sa-core/v1"


def main() -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    # NOTE: run as a script, the repository root is not on sys.path; the tests' gunicorn helper is.
    sys.path.insert(0, str(REPO))
    from tests.processes import gunicorn

    with FakeProvider(config=FakeConfig()) as fake, \
            scratch_database("sa_shots", "SA_TEST_DATABASE_URL") as url, \
            tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env({"DATABASE_URL": url, "SA_PROVIDER_URL": fake.url})
        worker = subprocess.Popen(
            [sys.executable, "-m", "jobqueue.operator.cli", "run-worker", "--concurrency", "2"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "DATABASE_URL": url, "SA_PROVIDER_URL": fake.url,
                 "SA_POLL_INTERVAL": "0.1", "SA_BACKOFF_BASE": "0.05", "SA_SHUTDOWN_GRACE": "1"})
        pool = open_pool(url, name="shots", max_size=2)
        try:
            with gunicorn(settings, Path(tmp), SA_PROVIDER_URL=fake.url) as base:
                token = issue_token(pool, 1, 1, scopes=("ops",)).token
                headers = {"Authorization": f"Bearer {token}"}

                def post(path: str, body: dict[str, object] | None = None) -> dict[str, str]:
                    answer = httpx.post(base + API + path, json=body, headers=headers, timeout=10)
                    answer.raise_for_status()
                    result: dict[str, str] = answer.json()
                    return result

                first = post("/prompt", {"text": "Summarise the retry policy in one line."})
                options = webdriver.ChromeOptions()
                options.binary_location = "/usr/bin/chromium"
                for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-background-networking", "--disable-component-update",
                             "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp}/chromium"):
                    options.add_argument(flag)
                driver = webdriver.Chrome(options=options,
                                          service=Service(executable_path="/usr/bin/chromedriver"))
                wait = WebDriverWait(driver, 20, poll_frequency=0.05)
                try:
                    driver.set_window_size(1280, 1500)
                    driver.get(base + "/mission")
                    box = wait.until(lambda d: d.find_element("id", "token"))
                    box.send_keys(token)
                    box.submit()
                    wait.until(lambda d: d.execute_script(
                        "return document.querySelector('#field .drop.is-settled .response-text')"))
                    post("/prompt", {"text": "And in three words?", "parent_id": first["prompt_id"]})
                    post("/prompt", {"text": "A prompt the provider refuses [fake:400]"})
                    for n in (1, 2):
                        post("/prompt", {"text": f"A long answer, part {n} [fake:latency=60]"})
                    post("/prompt", {"text": "Waiting for a free worker slot"})
                    cancelled = post("/prompt", {"text": "Never mind this one"})
                    post(f"/jobs/{cancelled['job_id']}/cancel")
                    wait.until(lambda d: d.execute_script(
                        "const s = [...document.querySelectorAll('#field .drop')]"
                        ".map((li) => li.dataset.state).sort().join(',');"
                        "return s === 'cancelled,failed,queued,running,running,succeeded,succeeded'"
                        " && document.querySelectorAll('.response-text').length === 2"
                        " && document.getElementById('conn').dataset.mode === 'live';"))
                    driver.save_screenshot(str(DOCS / "mission-desktop.png"))
                    driver.set_window_size(390, 1400)
                    driver.save_screenshot(str(DOCS / "mission-phone.png"))
                    # NOTE: a prompt's details, at the phone's width (its table scrolls inside).
                    driver.find_element("css selector", "#field .drop.is-orphan a.details").click()
                    wait.until(lambda d: d.execute_script(
                        "return document.querySelector('#detail-body .detail-attempts tbody tr')"))
                    driver.save_screenshot(str(DOCS / "mission-details-phone.png"))
                    driver.find_element("id", "detail-close").click()
                    # NOTE: tall enough for the console's charts, explorer, routes and log.
                    driver.set_window_size(1280, 2600)
                    post("/ops/routes/pause", {"route": "default", "seconds": 1,
                                               "reason": "shown in the log"})
                    driver.get(base + "/mission/ops")
                    wait.until(lambda d: d.execute_script(
                        "return document.querySelectorAll('#running button').length === 2"
                        " && document.querySelectorAll('#jobs a.job-link').length >= 7"
                        " && document.querySelector('#chart-jobs polyline') !== null"
                        " && document.querySelectorAll('#audit tbody tr').length === 1"))
                    driver.save_screenshot(str(DOCS / "mission-ops.png"))
                finally:
                    driver.quit()
        finally:
            pool.close()
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=15)


if __name__ == "__main__":
    main()
