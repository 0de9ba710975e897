"""`Prefer: wait` under caps (docs/limits.md): per token and per web process, so waits never
hold every connection; past a cap a submit is still accepted and answered 202 at once
(SA-Wait-Skipped), and `sa-core run-prompt` still prints its answer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import falcon.testing
import httpx
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import create_token
from service.app import create_app
from service.events.hub import EventHub
from tests.helpers import WorkerHarness, fetch_one, wait_for
from tests.processes import gunicorn

API = "/sa-core/v1"
PROMPT = f"{API}/prompt"
# NOTE: a prompt due in an hour never ends by itself here: a wait on it holds until cancelled,
# or for its whole minute.
LATER = {"text": "due later", "delay_seconds": 3600}
CANCEL_QUEUED = "UPDATE sa_job SET state = 'cancelled', finished_at = now() WHERE state = 'queued'"


def _bearer(pool: ConnectionPool[DictConnection], org: int, user: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(pool, org, user)}"}


def _cancel_queued(pool: ConnectionPool[DictConnection]) -> None:
    with pool.connection() as conn:
        conn.execute(CANCEL_QUEUED)


class Held:
    """Requests sent in threads, each answer kept as it comes."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str], dict[str, object]]] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def send(self, call: Callable[[], tuple[int, dict[str, str], dict[str, object]]]) -> None:
        def run() -> None:
            answer = call()
            with self._lock:
                self.answers.append(answer)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in self._threads)


def test_waits_are_capped_per_token_and_per_process_and_past_a_cap_the_submit_is_202_at_once(
    settings: Settings, pool: ConnectionPool[DictConnection], hub: EventHub,
) -> None:
    web = falcon.testing.TestClient(create_app(replace(settings, wait_max_per_token=2,
                                                       wait_max=3), pool, hub=hub))
    a, b, c = (_bearer(pool, 1, user) for user in (10, 11, 12))

    def post(headers: dict[str, str], prefer: str = "wait=60") -> Callable[
            [], tuple[int, dict[str, str], dict[str, object]]]:
        def call() -> tuple[int, dict[str, str], dict[str, object]]:
            result = web.simulate_post(PROMPT, json=LATER, headers={**headers, "Prefer": prefer})
            return result.status_code, dict(result.headers), result.json
        return call

    held = Held()
    held.send(post(a))
    held.send(post(a))
    wait_for(lambda: hub.watched_jobs == 2)
    status, headers, body = post(a)()
    assert (status, headers.get("sa-wait-skipped")) == (202, "cap")
    assert "preference-applied" not in headers and body["state"] == "queued"
    held.send(post(b))
    wait_for(lambda: hub.watched_jobs == 3)
    status, headers, _ = post(c)()
    assert (status, headers.get("sa-wait-skipped")) == (202, "cap"), "the process holds its cap"
    assert held.answers == [] and fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 5

    _cancel_queued(pool)
    held.join()
    assert sorted((s, h.get("preference-applied"), body["state"]) for s, h, body in held.answers
                  ) == [(200, "wait=60", "cancelled")] * 3
    status, headers, _ = post(a, "wait=1")()
    assert (status, headers.get("preference-applied")) == (202, "wait=1"), "the slots came back"


def test_a_wait_flood_cannot_hold_the_web_process_and_other_orgs_are_served(
    settings: Settings, tmp_path: Path, pool: ConnectionPool[DictConnection],
) -> None:
    # NOTE: the setup, one web process: four tokens flood waits that never end by
    # themselves (60 s); at most 5 per token and 12 in all hold a connection.
    flooders = [_bearer(pool, 1, user) for user in (10, 11, 12, 13)]
    other = _bearer(pool, 2, 20)
    with gunicorn(settings, tmp_path, SA_WEB_CONNECTIONS="200", SA_WAIT_MAX="12",
                  SA_WAIT_MAX_PER_TOKEN="5") as base, httpx.Client(base_url=base,
                                                                   timeout=30.0) as http:
        held = Held()
        for headers in flooders:
            for _ in range(10):
                held.send(lambda headers=headers: _http_post(base, headers))  # type: ignore[misc]
        wait_for(lambda: len(held.answers) == 40 - 12, timeout=50)
        assert {(s, h.get("sa-wait-skipped")) for s, h, _ in held.answers} == {(202, "cap")}
        tokens = [str(body["token"]) for _, _, body in held.answers]
        assert all(10 - tokens.count(f["Authorization"]) <= 5 for f in flooders)

        assert _waits_open(base) == 12
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 200
        assert http.post(PROMPT, json={"text": "another org"}, headers=other).status_code == 202
        assert http.post(PROMPT, json={"text": "another org waits"},
                         headers={**other, "Prefer": "wait=0"}).status_code == 202
        assert len(held.answers) == 28

        _cancel_queued(pool)
        held.join()
        assert sorted(s for s, _, _ in held.answers) == [200] * 12 + [202] * 28


def _http_post(base: str, headers: dict[str, str]) -> tuple[int, dict[str, str], dict[str, object]]:
    result = httpx.post(f"{base}{PROMPT}", json=LATER, headers={**headers, "Prefer": "wait=60"},
                        timeout=90.0)
    return result.status_code, dict(result.headers), {"token": headers["Authorization"],
                                                      **result.json()}


def _waits_open(base: str) -> float:
    """The web's `sa_waits_open` gauge, as a scrape of its /metrics reads it."""
    page = httpx.get(f"{base}/metrics", timeout=10.0).text
    return sum(float(line.split()[-1]) for line in page.splitlines()
               if line.startswith("sa_waits_open"))


def test_run_prompt_prints_its_answer_when_its_wait_is_past_the_cap(
    settings: Settings, tmp_path: Path, pool: ConnectionPool[DictConnection],
    auth: dict[str, str], workers: WorkerHarness, cli: Callable[[list[str]], int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with gunicorn(settings, tmp_path, SA_WAIT_MAX_PER_TOKEN="1") as base:
        held = Held()
        held.send(lambda: _http_post(base, auth))
        wait_for(lambda: _waits_open(base) == 1, timeout=30)
        workers.start()
        token = auth["Authorization"].removeprefix("Bearer ")
        assert cli(["run-prompt", "answer me past the cap", "--url", base, "--token", token]) == 0
        out = capsys.readouterr().out
        assert "answer me past the cap" in out
        _cancel_queued(pool)
        held.join()
        assert [s for s, _, _ in held.answers] == [200]
