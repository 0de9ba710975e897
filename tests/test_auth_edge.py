"""Deny by default: every route but the public ones needs a token, whatever the path's spelling;
malformed headers answer 4xx; the token cache forgets a revoked token at once and honours expiry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import falcon.testing
import httpx
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.listener import NotificationListener
from jobqueue.core.queries.token import TOKEN_REVOKED_LISTEN
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Authenticator, Caller, IssuedToken, issue_token, revoke_token
from tests.helpers import fetch_one, submit, wait_for
from tests.processes import gunicorn

API = "/sa-core/v1"
# NOTE: fixed, not uuid4(): it is in test ids, which must not change from one collection to the
# next (pytest-xdist refuses workers whose collections differ; --lf and -k need stable ids).
SOME_ID = "5c0ffee0-0000-4000-8000-00000000a11d"

PROTECTED = [
    f"{API}/jobs/{SOME_ID}", f"//sa-core/v1/jobs/{SOME_ID}", f"///sa-core/v1/jobs/{SOME_ID}",
    f"{API}/jobs/{SOME_ID}/", f"//sa-core/v1/prompts/{SOME_ID}", f"{API}/mission/recent",
    "//sa-core/v1/mission/recent", f"//sa-core/v1/prompts/{SOME_ID}/retry",
]


def jobs_written(pool: ConnectionPool[DictConnection]) -> int:
    return int(fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"])


@pytest.mark.parametrize("path", PROTECTED)
def test_every_path_but_the_public_routes_needs_a_token(
    client: falcon.testing.TestClient, path: str,
) -> None:
    refused = client.simulate_get(path)
    assert refused.status_code == 401, refused.text
    assert set(refused.json) == {"title", "description"}
    assert refused.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", ["/healthz", "//healthz", "/healthz/", "/readyz", "/metrics",
                                  f"{API}/openapi.json"])
def test_the_public_routes_answer_without_a_token(
    client: falcon.testing.TestClient, path: str,
) -> None:
    assert client.simulate_get(path).status_code == 200


def test_a_doubled_slash_reaches_the_route_only_with_a_token_and_answers_like_it(
    client: falcon.testing.TestClient, auth: dict[str, str], other_org_auth: dict[str, str],
) -> None:
    job_id = submit(client, auth, text="mine")["job_id"]
    assert client.simulate_get(f"//sa-core/v1/jobs/{job_id}", headers=auth).json["id"] == job_id
    assert client.simulate_get(f"//sa-core/v1/jobs/{job_id}",
                               headers=other_org_auth).status_code == 404
    assert client.simulate_get(f"//sa-core/v1/jobs/{SOME_ID}", headers=auth).status_code == 404
    assert client.simulate_post("//sa-core/v1/prompt", json={"text": "x"}).status_code == 401
    misspelt = client.simulate_get("//sa-core/v1/mission/recent", params={"snce": "x"}, headers=auth)
    assert misspelt.status_code == 400


BAD_AUTHORIZATION = ["Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Token abc", "bearer", " ",
                     "Bearer a b", "Bearer sa_\x7f", "Bearer sa_é", "Bearer\tsa_x y",
                     "Bearer " + "x" * 5000]


@pytest.mark.parametrize("value", BAD_AUTHORIZATION)
def test_an_odd_authorization_header_answers_401_and_writes_nothing(
    client: falcon.testing.TestClient, pool: ConnectionPool[DictConnection], value: str,
) -> None:
    refused = client.simulate_post(f"{API}/prompt", json={"text": "x"},
                                   headers={"Authorization": value})
    assert refused.status_code == 401, refused.text
    assert jobs_written(pool) == 0


MALFORMED: list[tuple[dict[str, str], int]] = [
    ({"Content-Type": "text/plain"}, 415),
    ({"Content-Type": ";;;=="}, 415),
    ({"Content-Type": "application/json; charset=latin-1"}, 415),
    ({"Idempotency-Key": ""}, 400),
    ({"Idempotency-Key": "é"}, 400),
    ({"Idempotency-Key": "a b"}, 400),
    ({"Idempotency-Key": "k" * 256}, 400),
    ({"Transfer-Encoding": "chunked", "Content-Length": "5000000"}, 413),
]


@pytest.mark.parametrize(("headers", "status"), MALFORMED, ids=[str(h) for h, _ in MALFORMED])
def test_a_malformed_header_answers_4xx_and_writes_nothing(
    client: falcon.testing.TestClient, pool: ConnectionPool[DictConnection],
    auth: dict[str, str], headers: dict[str, str], status: int,
) -> None:
    answer = client.simulate_post(f"{API}/prompt", body=b'{"text": "x"}',
                                  headers={"Content-Type": "application/json", **auth, **headers})
    assert answer.status_code == status, answer.text
    assert set(answer.json) == {"title", "description"}
    assert jobs_written(pool) == 0


@pytest.mark.parametrize("request_id", ["é" * 10, "a b", "x" * 500, "\x01", ""])
def test_an_unusable_request_id_is_replaced_not_refused_or_echoed(
    client: falcon.testing.TestClient, auth: dict[str, str], request_id: str,
) -> None:
    answer = client.simulate_post(f"{API}/prompt", json={"text": "x"},
                                  headers={**auth, "X-Request-ID": request_id})
    assert answer.status_code == 202
    assert answer.headers["x-request-id"] != request_id
    assert len(answer.headers["x-request-id"]) == 32


# --- the token cache -----------------------------------------------------------------------


def sql_revoke(pool: ConnectionPool[DictConnection], token_id: int) -> None:
    """Revokes behind the cache's back: no notification is sent."""
    with pool.connection() as conn:
        conn.execute("UPDATE sa_api_token SET revoked_at = now() WHERE id = %s", (token_id,))


def test_a_cached_token_is_forgotten_at_once_when_revoked(
    pool: ConnectionPool[DictConnection], settings: Settings,
) -> None:
    authenticator = Authenticator(pool, ttl=600.0, fallback_ttl=0.0)
    listener = NotificationListener(settings.direct_database_url, TOKEN_REVOKED_LISTEN,
                                    authenticator.forget, authenticator.clear).start()
    authenticator.revocations = listener.listening
    try:
        assert listener.listening.wait(5)
        kept, revoked = issue_token(pool, 1, 10), issue_token(pool, 1, 11)
        assert authenticator.authenticate(kept.token) == Caller(1, 10)
        assert authenticator.authenticate(revoked.token) == Caller(1, 11)
        # NOTE: proves the cache is in use: a revoke nobody announced goes unnoticed for its TTL.
        sql_revoke(pool, kept.id)
        assert authenticator.authenticate(kept.token) == Caller(1, 10)

        assert revoke_token(pool, str(revoked.id)) is not None
        wait_for(lambda: authenticator.authenticate(revoked.token) is None, timeout=1.0,
                 interval=0.005)
    finally:
        listener.stop()


def test_without_listen_a_cached_token_lives_only_the_short_ttl(
    pool: ConnectionPool[DictConnection],
) -> None:
    authenticator = Authenticator(pool, ttl=600.0, fallback_ttl=0.3)
    issued = issue_token(pool, 1, 10)
    assert authenticator.authenticate(issued.token) == Caller(1, 10)
    sql_revoke(pool, issued.id)
    wait_for(lambda: authenticator.authenticate(issued.token) is None, timeout=2.0)


def test_a_cached_token_stops_working_when_it_expires(pool: ConnectionPool[DictConnection]) -> None:
    authenticator = Authenticator(pool, ttl=600.0, fallback_ttl=600.0)
    issued = issue_token(pool, 1, 10)
    with pool.connection() as conn:
        conn.execute("UPDATE sa_api_token SET expires_at = now() + interval '0.3 seconds' "
                     "WHERE id = %s", (issued.id,))
    assert authenticator.authenticate(issued.token) == Caller(1, 10)
    wait_for(lambda: authenticator.authenticate(issued.token) is None, timeout=2.0)


def test_invalid_tokens_are_never_remembered(pool: ConnectionPool[DictConnection]) -> None:
    authenticator = Authenticator(pool, ttl=600.0, fallback_ttl=600.0, max_entries=2)
    issued = issue_token(pool, 1, 10)
    guesses: list[Any] = [authenticator.authenticate(f"sa_guess-{i}") for i in range(50)]
    assert guesses == [None] * 50
    assert authenticator.authenticate(issued.token) == Caller(1, 10)


def test_the_web_process_forgets_a_revoked_token_at_once(
    settings: Settings, tmp_path: Path, pool: ConnectionPool[DictConnection],
) -> None:
    kept, revoked = issue_token(pool, 1, 10), issue_token(pool, 1, 11)
    with gunicorn(settings, tmp_path) as base, httpx.Client(base_url=base, timeout=10) as http:
        wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM pg_stat_activity "
                                         "WHERE datname = current_database() AND query = %s",
                                   TOKEN_REVOKED_LISTEN)["n"] == 1)

        def status(issued: IssuedToken) -> int:
            return http.get(f"{API}/mission/recent",
                            headers={"Authorization": f"Bearer {issued.token}"}).status_code

        assert status(kept) == 200 and status(revoked) == 200
        # NOTE: the process caches: a revoke nobody announced goes unnoticed (for up to 60 s).
        sql_revoke(pool, kept.id)
        assert status(kept) == 200
        assert revoke_token(pool, str(revoked.id)) is not None
        wait_for(lambda: status(revoked) == 401, timeout=1.0, interval=0.005)
