"""HTTP contract: auth, tenancy, validation (nothing written on a 4xx), and the polling feed."""

from __future__ import annotations

import uuid
from typing import Any

import falcon.testing
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from tests.helpers import WorkerHarness, fetch_one, submit


def row_counts(pool: ConnectionPool[DictConnection]) -> dict[str, int]:
    return fetch_one(pool, "SELECT (SELECT count(*) FROM sa_entity) AS entities, "
                           "(SELECT count(*) FROM sa_job) AS jobs, "
                           "(SELECT count(*) FROM sa_job_event) AS events")


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer"}, {"Authorization": "Basic abc"},
    {"Authorization": "Bearer sa_not-a-real-token"}, {"Authorization": "Bearer caf\u00e9"},
])
def test_api_routes_need_a_valid_token(client: falcon.testing.TestClient, headers: dict[str, str],
                                       pool: ConnectionPool[DictConnection]) -> None:
    before = row_counts(pool)
    for method, path in [("POST", "/sa-core/v1/prompt"), ("GET", f"/sa-core/v1/jobs/{uuid.uuid4()}"),
                         ("GET", "/sa-core/v1/mission/recent")]:
        result = client.simulate_request(method, path, headers=headers, json={"text": "hi"})
        assert result.status_code == 401
        assert set(result.json) == {"title", "description"}
        assert result.headers["www-authenticate"] == "Bearer"
    assert row_counts(pool) == before


def test_health_and_readiness_need_no_token(client: falcon.testing.TestClient) -> None:
    assert client.simulate_get("/healthz").json == {"ok": True}
    assert client.simulate_get("/readyz").status_code == 200


def test_submit_answers_202_with_location(client: falcon.testing.TestClient,
                                          auth: dict[str, str]) -> None:
    result = client.simulate_post("/sa-core/v1/prompt", json={"text": "hello"}, headers=auth)
    assert result.status_code == 202
    assert set(result.json) == {"prompt_id", "job_id", "state"}
    assert result.headers["location"] == f"/sa-core/v1/jobs/{result.json['job_id']}"
    job = client.simulate_get(result.headers["location"], headers=auth).json
    assert (job["state"], job["priority"], job["max_attempts"], job["attempt"]) == ("queued", 50, 3, 1)


BAD_BODIES: list[tuple[str, Any, int]] = [
    ("not json", b"{text: nope", 400),
    ("array body", [1, 2], 422),
    ("missing text", {"priority": 5}, 422),
    ("empty text", {"text": "   "}, 422),
    ("text not a string", {"text": 42}, 422),
    ("NUL in text", {"text": "a\u0000b"}, 422),
    ("too long", {"text": "x" * 100_001}, 422),
    ("unknown field", {"text": "hi", "colour": "red"}, 422),
    ("priority too high", {"text": "hi", "priority": 101}, 422),
    ("priority negative", {"text": "hi", "priority": -1}, 422),
    ("priority bool", {"text": "hi", "priority": True}, 422),
    ("priority string", {"text": "hi", "priority": "5"}, 422),
    ("max_attempts zero", {"text": "hi", "max_attempts": 0}, 422),
    ("max_attempts huge", {"text": "hi", "max_attempts": 11}, 422),
    ("parent not uuid", {"text": "hi", "parent_id": "abc"}, 422),
    ("parent number", {"text": "hi", "parent_id": 7}, 422),
    ("unknown parent", {"text": "hi", "parent_id": str(uuid.uuid4())}, 422),
    ("options not object", {"text": "hi", "options": []}, 422),
    ("unknown option", {"text": "hi", "options": {"logit_bias": 1}}, 422),
    ("depth too deep", {"text": "hi", "options": {"depth": 51}}, 422),
    ("model NUL", {"text": "hi", "options": {"model": "a\u0000"}}, 422),
    ("empty body", b"", 400),
    ("invalid UTF-8", b'{"text": "\xff"}', 400),
    ("NaN priority", b'{"text": "hi", "priority": NaN}', 400),
    ("Infinity priority", b'{"text": "hi", "priority": Infinity}', 400),
    ("nested 100k deep", b"[" * 100_000 + b"]" * 100_000, 400),
    ("trailing garbage", b'{"text": "hi"} x', 400),
    ("JSON null body", b"null", 422),
    ("JSON string body", b'"hello"', 422),
    ("lone surrogate in text", b'{"text": "a\\ud800b"}', 422),
    ("lone surrogate in model", b'{"text": "hi", "options": {"model": "\\udfff"}}', 422),
    ("text null", {"text": None}, 422),
    ("text array", {"text": ["a"]}, 422),
    ("tab-and-newline text", {"text": "\t\n \r"}, 422),
    ("priority fraction", {"text": "hi", "priority": 5.5}, 422),
    ("priority null", {"text": "hi", "priority": None}, 422),
    ("priority 10^30", {"text": "hi", "priority": 10**30}, 422),
    ("priority 1e400", b'{"text": "hi", "priority": 1e400}', 422),
    ("max_attempts fraction", {"text": "hi", "max_attempts": 2.5}, 422),
    ("max_attempts string", {"text": "hi", "max_attempts": "3"}, 422),
    ("parent in braces", {"text": "hi", "parent_id": "{12345678-1234-5678-1234-567812345678}"}, 422),
    ("parent without hyphens", {"text": "hi", "parent_id": "12345678123456781234567812345678"}, 422),
    ("parent URN", {"text": "hi", "parent_id": "urn:uuid:12345678-1234-5678-1234-567812345678"}, 422),
    ("parent with newline", {"text": "hi", "parent_id": "12345678-1234-5678-1234-567812345678\n"}, 422),
    ("options null", {"text": "hi", "options": None}, 422),
    ("options string", {"text": "hi", "options": "model=x"}, 422),
    ("model empty", {"text": "hi", "options": {"model": ""}}, 422),
    ("model number", {"text": "hi", "options": {"model": 4}}, 422),
    ("model too long", {"text": "hi", "options": {"model": "m" * 201}}, 422),
    ("depth negative", {"text": "hi", "options": {"depth": -1}}, 422),
    ("depth string", {"text": "hi", "options": {"depth": "3"}}, 422),
    ("depth bool", {"text": "hi", "options": {"depth": False}}, 422),
    ("two unknown fields", {"text": "hi", "zeta": 1, "alpha": 2}, 422),
]


@pytest.mark.parametrize(("case", "body", "status"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_submits_answer_4xx_json_and_write_nothing(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    case: str, body: Any, status: int,
) -> None:
    before = row_counts(pool)
    if isinstance(body, bytes):
        result = client.simulate_post("/sa-core/v1/prompt", body=body,
                                      headers={**auth, "Content-Type": "application/json"})
    else:
        result = client.simulate_post("/sa-core/v1/prompt", json=body, headers=auth)
    assert result.status_code == status, result.text
    assert set(result.json) == {"title", "description"}
    assert row_counts(pool) == before


def test_another_orgs_objects_answer_404_like_missing_ones(
    client: falcon.testing.TestClient, auth: dict[str, str], other_org_auth: dict[str, str],
    workers: WorkerHarness, pool: ConnectionPool[DictConnection],
) -> None:
    mine = submit(client, auth, text="secret")
    workers.build().run(once=True)
    response_id = fetch_one(pool, "SELECT response_id FROM sa_job WHERE id = %s", mine["job_id"])
    for path in (f"/sa-core/v1/jobs/{mine['job_id']}", f"/sa-core/v1/prompts/{mine['prompt_id']}",
                 f"/sa-core/v1/prompts/{response_id['response_id']}"):
        theirs = client.simulate_get(path, headers=other_org_auth)
        missing = client.simulate_get(path.rsplit("/", 1)[0] + f"/{uuid.uuid4()}", headers=auth)
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json["title"] == missing.json["title"]
    assert client.simulate_get("/sa-core/v1/jobs/not-a-uuid", headers=auth).status_code == 404
    stolen_parent = client.simulate_post("/sa-core/v1/prompt", headers=other_org_auth,
                                         json={"text": "hi", "parent_id": mine["prompt_id"]})
    assert stolen_parent.status_code == 422
    feed = client.simulate_get("/sa-core/v1/mission/recent", headers=other_org_auth).json
    assert feed["items"] == []


def test_guard_rejects_an_illegal_transition_issued_as_raw_sql(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    job_id = submit(client, auth, text="guarded")["job_id"]
    with pool.connection() as conn, pytest.raises(psycopg.errors.CheckViolation, match="illegal"):
        conn.execute("UPDATE sa_job SET state = 'succeeded' WHERE id = %s", (job_id,))
    workers.build().run(once=True)
    for target in ("queued", "running", "failed", "cancelled"):
        with pool.connection() as conn, pytest.raises(psycopg.errors.CheckViolation, match="terminal"):
            conn.execute("UPDATE sa_job SET state = %s WHERE id = %s", (target, job_id))
    with pool.connection() as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE sa_job SET error_message = 'rewritten' WHERE id = %s", (job_id,))
    assert fetch_one(pool, "SELECT state, error_message FROM sa_job WHERE id = %s", job_id) == {
        "state": "succeeded", "error_message": None}


def test_database_guard_and_python_table_agree(pool: ConnectionPool[DictConnection]) -> None:
    from jobqueue.core.states import TRANSITIONS, JobState

    # NOTE: each pair runs on a scratch row in a rolled-back transaction; the row is put in its
    # source state with triggers off (replica role), then the guarded UPDATE is tried.
    legal = set()
    for src in JobState:
        for dst in JobState:
            if src == dst:
                continue
            with pool.connection() as conn:
                try:
                    with conn.transaction(force_rollback=True):
                        conn.execute("INSERT INTO sa_entity (id, kind, org_id, created_by, "
                                     "correlation_id, content) VALUES (%s, 'prompt', 1, 1, %s, 'x')",
                                     (pid := uuid.uuid4(), pid))
                        job = uuid.uuid4()
                        conn.execute("INSERT INTO sa_job (id, prompt_id, org_id, created_by) "
                                     "VALUES (%s, %s, 1, 1)", (job, pid))
                        conn.execute("SET LOCAL session_replication_role = replica")
                        conn.execute("UPDATE sa_job SET state = %s, worker_claim = 'w', "
                                     "response_id = %s WHERE id = %s", (src.value, pid, job))
                        conn.execute("SET LOCAL session_replication_role = origin")
                        conn.execute("UPDATE sa_job SET state = %s WHERE id = %s", (dst.value, job))
                        legal.add((src, dst))
                except psycopg.errors.CheckViolation:
                    pass
    assert legal == {(a, b) for a, b in TRANSITIONS if a is not None}


def test_mission_recent_rejects_a_bad_cursor(client: falcon.testing.TestClient,
                                             auth: dict[str, str]) -> None:
    result = client.simulate_get("/sa-core/v1/mission/recent?since=yesterday", headers=auth)
    assert result.status_code == 400
    assert "since" in result.json["description"]
