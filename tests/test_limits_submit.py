"""Bounds on what a submit and a sign-in control (docs/limits.md): a batch's bytes, every time
offset a client may write, stop sequences as OpenAI takes them, a batch's errors naming their
items, and a token's sessions."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import falcon.testing
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.routes import load_routes
from jobqueue.core.settings import Settings
from jobqueue.devtools.fake_provider import FakeProvider
from service.app import create_app
from service.events.hub import EventHub
from tests.helpers import WorkerHarness, fetch_all, fetch_one, submit, wait_for

API = "/sa-core/v1"
BATCH = f"{API}/prompts/batch"

# NOTE: every hour a client may write, each with its first, a middle and its last minute.
OFFSETS = [timezone(sign * timedelta(hours=hours, minutes=minutes))
           for sign in (1, -1) for hours in range(24) for minutes in (0, 1, 30, 59)
           if (hours, minutes) != (0, 0) or sign == 1]


def _jobs(pool: ConnectionPool[DictConnection]) -> int:
    return int(fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"])


def _spelled(instant: datetime, tz: timezone) -> str:
    return instant.astimezone(tz).isoformat(timespec="seconds")


# --- batch bytes ------------------------------------------------------------------------------


def test_a_batch_has_a_byte_bound_of_its_own_and_past_it_nothing_is_written(
    client: falcon.testing.TestClient, auth: dict[str, str], settings: Settings,
    pool: ConnectionPool[DictConnection],
) -> None:
    # NOTE: 1,000 prompts of 2 KB: twice SA_MAX_BODY_BYTES, well inside SA_BATCH_MAX_BYTES.
    fits = {"prompts": [{"text": f"{n:04d} " + "a" * 2_000} for n in range(1000)]}
    assert settings.max_body_bytes < len(json.dumps(fits)) < settings.batch_max_bytes
    result = client.simulate_post(BATCH, json=fits, headers=auth)
    assert result.status_code == 202, result.text
    assert len(result.json["items"]) == 1000

    too_big = {"prompts": [{"text": "b" * 5_000} for _ in range(1000)]}
    assert len(json.dumps(too_big)) > settings.batch_max_bytes
    refused = client.simulate_post(BATCH, json=too_big, headers=auth)
    assert refused.status_code == 413
    assert "SA_BATCH_MAX_BYTES" in refused.json["description"]
    assert _jobs(pool) == 1000

    one = client.simulate_post(f"{API}/prompt", headers=auth,
                               json={"text": "c" * 100, "options": {"system": "s" * 1_100_000}})
    assert one.status_code == 413 and "SA_MAX_BODY_BYTES" in one.json["description"]
    assert _jobs(pool) == 1000


# --- time offsets -----------------------------------------------------------------------------


def test_every_offset_up_to_23_59_schedules_the_same_instant_on_prompt_and_batch(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    due = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    for tz in OFFSETS:
        result = client.simulate_post(f"{API}/prompt", headers=auth,
                                      json={"text": f"at {tz}", "run_at": _spelled(due, tz)})
        assert result.status_code == 202, (tz, result.text)
    batch = client.simulate_post(BATCH, headers=auth, json={"prompts": [
        {"text": f"batch at {tz}", "run_at": _spelled(due, tz)} for tz in OFFSETS]})
    assert batch.status_code == 202, batch.text

    rows = fetch_all(pool, "SELECT scheduled_for FROM sa_job")
    assert len(rows) == 2 * len(OFFSETS)
    assert {row["scheduled_for"] for row in rows} == {due}


def test_every_offset_up_to_23_59_is_a_since_the_feed_reads(
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    before = datetime.now(UTC) - timedelta(minutes=1)
    submit(client, auth, text="after since")
    for tz in OFFSETS:
        result = client.simulate_get(f"{API}/mission/recent", headers=auth,
                                     params={"since": _spelled(before, tz)})
        assert result.status_code == 200, (tz, result.text)
        assert [item["text"] for item in result.json["items"]] == ["after since"], tz


@pytest.mark.parametrize("spelled", ["2030-01-01T00:00:00+24:00", "2030-01-01T00:00:00-24:00",
                                     "2030-01-01T00:00:00+23:60", "2030-01-01T00:00:00+2359"])
def test_an_offset_past_23_59_is_a_422_that_names_the_item(
    client: falcon.testing.TestClient, auth: dict[str, str], spelled: str,
    pool: ConnectionPool[DictConnection],
) -> None:
    result = client.simulate_post(BATCH, headers=auth, json={"prompts": [
        {"text": "fine"}, {"text": "bad", "run_at": spelled}]})
    assert result.status_code == 422
    assert result.json["description"].startswith("prompts[1].run_at:")
    assert _jobs(pool) == 0


# --- stop sequences ---------------------------------------------------------------------------


def test_a_blank_stop_sequence_is_taken_as_openai_takes_it_and_the_job_runs(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    lone = submit(client, auth, text="stop at a blank line", options={"stop": "\n\n"})
    several = submit(client, auth, text="stop at blanks", options={"stop": [" ", "\t", "\n\n"]})
    stored = {str(r["id"]): r["execution_options"]["stop"]
              for r in fetch_all(pool, "SELECT id, execution_options FROM sa_job")}
    assert stored == {lone["job_id"]: ["\n\n"], several["job_id"]: [" ", "\t", "\n\n"]}
    workers.start()
    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'succeeded'")
             ["n"] == 2)

    for stop, why in (("", "must not be empty"), ([""], "must not be empty"),
                      (["a", "\x00"], "NUL")):
        result = client.simulate_post(f"{API}/prompt", headers=auth,
                                      json={"text": "x", "options": {"stop": stop}})
        assert result.status_code == 422 and why in result.json["description"], stop


# --- batch errors name their item -------------------------------------------------------------


def test_a_batch_with_unknown_models_names_each_item_and_writes_nothing(
    settings: Settings, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    fake: FakeProvider, hub: EventHub,
) -> None:
    routes = load_routes({"SA_PROVIDER_ROUTES": json.dumps({"routes": [{
        "name": "main", "base_url": fake.url, "models": ["fake-model"]}]})})
    client = falcon.testing.TestClient(create_app(replace(settings, provider_routes=routes), pool,
                                                  hub=hub))
    result = client.simulate_post(BATCH, headers=auth, json={"prompts": [
        {"text": "fine"}, {"text": "fine too", "options": {"model": "fake-model"}},
        {"text": "no such model", "options": {"model": "nope"}},
        {"text": "nor this one", "options": {"model": "nah"}}]})
    assert result.status_code == 422
    description = result.json["description"]
    assert description.startswith("prompts[2].options.model: no route serves model 'nope'")
    assert "prompts[3].options.model: no route serves model 'nah'" in description
    assert "prompts[0]" not in description and "prompts[1]" not in description
    assert _jobs(pool) == 0


# --- sessions per token -----------------------------------------------------------------------


@pytest.fixture
def three_sessions(settings: Settings,
                   pool: ConnectionPool[DictConnection]) -> Iterator[falcon.testing.TestClient]:
    hub = EventHub.from_settings(pool, settings)
    yield falcon.testing.TestClient(create_app(replace(settings, sessions_per_token=3), pool,
                                               hub=hub))
    hub.stop()


def test_a_token_keeps_its_newest_sessions_and_signing_in_again_ends_the_oldest(
    three_sessions: falcon.testing.TestClient, auth: dict[str, str],
    other_org_auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    web = three_sessions
    cookies = []
    for _ in range(5):
        opened = web.simulate_post(f"{API}/session", headers=auth)
        assert opened.status_code == 201, opened.text
        cookies.append(opened.cookies["sa_session"].value)
    other = web.simulate_post(f"{API}/session", headers=other_org_auth)
    assert other.status_code == 201

    def who(cookie: str) -> int:
        return web.simulate_get(f"{API}/session", headers={"Cookie": f"sa_session={cookie}"}
                                ).status_code

    assert [who(cookie) for cookie in cookies] == [401, 401, 200, 200, 200]
    assert who(other.cookies["sa_session"].value) == 200
    counts = fetch_all(pool, "SELECT t.org_id, count(*) AS n FROM sa_session s "
                             "JOIN sa_api_token t ON t.id = s.token_id GROUP BY t.org_id "
                             "ORDER BY t.org_id")
    assert [(row["org_id"], row["n"]) for row in counts] == [(1, 3), (2, 1)]


def test_a_sign_in_that_would_wait_for_another_of_its_token_is_told_to_retry_at_once(
    three_sessions: falcon.testing.TestClient, auth: dict[str, str],
    other_org_auth: dict[str, str], settings: Settings,
) -> None:
    web = three_sessions
    # NOTE: a sign-in of the same token, caught mid-way: its transaction holds the token's row.
    with psycopg.connect(settings.database_url) as holder:
        holder.execute("SELECT 1 FROM sa_api_token WHERE org_id = 1 FOR UPDATE")
        started = time.monotonic()
        busy = web.simulate_post(f"{API}/session", headers=auth)
        assert time.monotonic() - started < 2, "refused at once, not after waiting for the lock"
        assert busy.status_code == 429, busy.text
        assert busy.headers["retry-after"] == "1" and "sa_session" not in busy.cookies
        # NOTE: another token's sign-in is not held back.
        assert web.simulate_post(f"{API}/session", headers=other_org_auth).status_code == 201
    assert web.simulate_post(f"{API}/session", headers=auth).status_code == 201
