"""Idempotent submits: replays, refusals, scoping per (org, user), expiry, racing repeats, pruning."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from typing import Any

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import create_token
from jobqueue.engine.idempotency import prune_expired_keys
from jobqueue.operator.cli import main
from service.app import create_app
from tests.helpers import fetch_all, fetch_one

PROMPT = "/sa-core/v1/prompt"


def post(client: falcon.testing.TestClient, auth: dict[str, str], key: str | None,
         body: Any) -> falcon.testing.Result:
    headers = {**auth} if key is None else {**auth, "Idempotency-Key": key}
    if isinstance(body, bytes):
        return client.simulate_post(PROMPT, body=body,
                                    headers={**headers, "Content-Type": "application/json"})
    return client.simulate_post(PROMPT, json=body, headers=headers)


def job_count(pool: ConnectionPool[DictConnection]) -> int:
    return int(fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"])


def token_for(pool: ConnectionPool[DictConnection], org: int, user: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(pool, org, user)}"}


def test_a_repeat_replays_the_first_answer_and_queues_nothing(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    first = post(client, auth, "order-42", {"text": "hello", "priority": 7})
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    # Same request: other key order, spacing, and a default spelled out.
    again = post(client, auth, "order-42",
                 b'{ "priority" : 7,\n "text": "hello", "max_attempts": 3, "options": {} }')
    assert again.status_code == 202, again.text
    assert again.json == first.json
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"]
    assert job_count(pool) == 1
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_entity")["n"] == 1


def test_the_same_key_with_another_body_answers_422_and_writes_nothing(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    assert post(client, auth, "k1", {"text": "hello"}).status_code == 202
    for other in ({"text": "hello!"}, {"text": "hello", "priority": 49},
                  {"text": "hello", "options": {"depth": 3}}):
        refused = post(client, auth, "k1", other)
        assert refused.status_code == 422, refused.text
        assert refused.json["title"] == "Idempotency-Key reused"
        assert set(refused.json) == {"title", "description"}
    assert job_count(pool) == 1


def test_keys_are_scoped_per_org_and_user(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    mine = post(client, auth, "shared-key", {"text": "hello"}).json
    teammate = post(client, token_for(pool, 1, 11), "shared-key", {"text": "hello"})
    stranger = post(client, token_for(pool, 2, 10), "shared-key", {"text": "hello"})
    for other in (teammate, stranger):
        assert other.status_code == 202 and "idempotent-replayed" not in other.headers
        assert other.json["job_id"] != mine["job_id"]
    assert job_count(pool) == 3
    # A different body under someone else's key is not a conflict either.
    assert post(client, token_for(pool, 1, 12), "shared-key", {"text": "other"}).status_code == 202


def test_an_expired_key_is_treated_as_absent(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    old = post(client, auth, "daily", {"text": "report"}).json
    with pool.connection() as conn:
        conn.execute("UPDATE sa_idempotency_key SET created_at = now() - interval '24 hours 1 second'")
    # Expired: even a different body is accepted, as a new submit that takes the key over.
    new = post(client, auth, "daily", {"text": "another report"})
    assert new.status_code == 202 and "idempotent-replayed" not in new.headers
    assert new.json["job_id"] != old["job_id"]
    key = fetch_one(pool, "SELECT job_id, created_at > now() - interval '1 minute' AS fresh "
                          "FROM sa_idempotency_key")
    assert key == {"job_id": uuid.UUID(new.json["job_id"]), "fresh": True}
    assert post(client, auth, "daily", {"text": "another report"}).json == new.json
    assert job_count(pool) == 2


def test_without_a_key_every_submit_queues(client: falcon.testing.TestClient, auth: dict[str, str],
                                           pool: ConnectionPool[DictConnection]) -> None:
    for _ in range(3):
        assert post(client, auth, None, {"text": "same"}).status_code == 202
    assert job_count(pool) == 3
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_idempotency_key")["n"] == 0


@pytest.mark.parametrize("max_queued", [0, 10_000], ids=["no cap (one statement)", "cap (org lock)"])
def test_racing_repeats_enqueue_once(
    settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str], max_queued: int,
) -> None:
    client = falcon.testing.TestClient(create_app(replace(settings, org_max_queued=max_queued), pool))
    threads_n = 12
    start = threading.Barrier(threads_n)
    answers: list[falcon.testing.Result] = []
    lock = threading.Lock()

    def submit(i: int) -> None:
        # Two bodies race for the key: the winner's repeats replay, the others are refused.
        body = {"text": "raced", "priority": 10 if i % 2 else 20}
        start.wait(5)
        result = post(client, auth, "race-key", body)
        with lock:
            answers.append(result)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == threads_n
    assert job_count(pool) == 1
    job = fetch_one(pool, "SELECT id, priority FROM sa_job")
    accepted = [a for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code == 422]
    assert len(accepted) + len(refused) == threads_n
    assert len(accepted) == threads_n // 2 and {a.json["job_id"] for a in accepted} == {str(job["id"])}
    assert sum("idempotent-replayed" not in a.headers for a in accepted) == 1
    assert all(a.json["title"] == "Idempotency-Key reused" for a in refused)


def test_a_replay_is_answered_even_when_the_queue_is_full(
    settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
) -> None:
    client = falcon.testing.TestClient(create_app(replace(settings, org_max_queued=1), pool))
    first = post(client, auth, "only-one", {"text": "fills the queue"})
    assert first.status_code == 202
    assert post(client, auth, None, {"text": "over the cap"}).status_code == 429
    replay = post(client, auth, "only-one", {"text": "fills the queue"})
    assert replay.status_code == 202 and replay.json == first.json
    assert post(client, auth, "only-one", {"text": "something else"}).status_code == 422
    assert job_count(pool) == 1


def test_expired_keys_are_pruned(client: falcon.testing.TestClient, auth: dict[str, str],
                                 pool: ConnectionPool[DictConnection],
                                 capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                 database_url: str) -> None:
    for i in range(5):
        post(client, auth, f"key-{i}", {"text": f"t{i}"})
    with pool.connection() as conn:
        conn.execute("UPDATE sa_idempotency_key SET created_at = now() - interval '2 days' "
                     "WHERE key IN ('key-0', 'key-1', 'key-2')")
    assert prune_expired_keys(pool, page=2) == 3
    assert [r["key"] for r in fetch_all(pool, "SELECT key FROM sa_idempotency_key ORDER BY key")] == [
        "key-3", "key-4"]
    with pool.connection() as conn:
        conn.execute("UPDATE sa_idempotency_key SET created_at = now() - interval '2 days'")
    monkeypatch.setenv("DATABASE_URL", database_url)
    capsys.readouterr()
    assert main(["prune-idempotency-keys"]) == 0
    assert "deleted 2 expired idempotency key(s)" in capsys.readouterr().out
    assert job_count(pool) == 5
