"""Hostile requests beyond the body table of test_http_api: media type, size, chunked bodies,
headers, malformed ids on every route, bodies on routes that take none, cursors. Every answer is
a JSON {title, description} 4xx, and nothing is written."""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import replace
from typing import Any

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.app import create_app
from tests.helpers import fetch_one, submit

API = "/sa-core/v1"
SMALL_LIMIT = 1024


def counts(pool: ConnectionPool[DictConnection]) -> dict[str, int]:
    return fetch_one(pool, "SELECT (SELECT count(*) FROM sa_entity) AS entities, "
                           "(SELECT count(*) FROM sa_job) AS jobs, "
                           "(SELECT count(*) FROM sa_job_event) AS events, "
                           "(SELECT count(*) FROM sa_idempotency_key) AS keys")


def assert_json_error(result: falcon.testing.Result, status: int) -> None:
    assert result.status_code == status, result.text
    assert result.headers["content-type"] == "application/json"
    assert set(result.json) == {"title", "description"}
    assert result.json["title"] and result.json["description"]


@pytest.fixture
def small_client(settings: Settings, pool: ConnectionPool[DictConnection]) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(create_app(replace(settings, max_body_bytes=SMALL_LIMIT), pool))


# (case, headers, body, status): POST /prompt with a valid token; `body` is sent as-is.
BAD_REQUESTS: list[tuple[str, dict[str, str], bytes, int]] = [
    ("text/plain body", {"Content-Type": "text/plain"}, b'{"text": "hi"}', 415),
    ("no Content-Type", {}, b'{"text": "hi"}', 415),
    ("form body", {"Content-Type": "application/x-www-form-urlencoded"}, b"text=hi", 415),
    ("JSON in Latin-1", {"Content-Type": "application/json; charset=latin-1"}, b'{"text": "hi"}', 415),
    ("json-ish type", {"Content-Type": "application/jsonx"}, b'{"text": "hi"}', 415),
    ("Content-Length over the limit", {"Content-Type": "application/json",
                                       "Content-Length": str(10**12)}, b'{"text": "hi"}', 413),
    ("body over the limit", {"Content-Type": "application/json"},
     json.dumps({"text": "x" * SMALL_LIMIT}).encode(), 413),
    ("over the limit and not JSON", {"Content-Type": "text/plain"}, b"x" * (SMALL_LIMIT + 1), 413),
    ("Idempotency-Key empty", {"Content-Type": "application/json", "Idempotency-Key": ""},
     b'{"text": "hi"}', 400),
    ("Idempotency-Key with a space", {"Content-Type": "application/json", "Idempotency-Key": "a b"},
     b'{"text": "hi"}', 400),
    ("Idempotency-Key 256 chars", {"Content-Type": "application/json", "Idempotency-Key": "k" * 256},
     b'{"text": "hi"}', 400),
    ("Idempotency-Key not ASCII", {"Content-Type": "application/json", "Idempotency-Key": "cl\u00e9"},
     b'{"text": "hi"}', 400),
]


@pytest.mark.parametrize(("case", "headers", "body", "status"), BAD_REQUESTS,
                         ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_answer_4xx_json_and_write_nothing(
    small_client: falcon.testing.TestClient, auth: dict[str, str],
    pool: ConnectionPool[DictConnection], case: str, headers: dict[str, str], body: bytes,
    status: int,
) -> None:
    before = counts(pool)
    result = small_client.simulate_post(f"{API}/prompt", body=body, headers={**auth, **headers})
    assert_json_error(result, status)
    assert counts(pool) == before


def test_a_body_at_the_limit_is_accepted(small_client: falcon.testing.TestClient,
                                         auth: dict[str, str]) -> None:
    body = json.dumps({"text": "x"}).encode()
    body = body[:-1] + b" " * (SMALL_LIMIT - len(body)) + b"}"
    assert len(body) == SMALL_LIMIT
    result = small_client.simulate_post(f"{API}/prompt", body=body,
                                        headers={**auth, "Content-Type": "application/json; charset=UTF-8"})
    assert result.status_code == 202, result.text


def _call(app: Any, env: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Calls the WSGI app with a hand-made environ (one a strict validator would refuse)."""
    seen: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen["status"] = status

    answer = b"".join(app(env, start_response))
    return seen["status"], json.loads(answer)


def _chunked(app: Any, body: bytes, auth: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """POSTs `body` as a WSGI server passes a chunked request: no CONTENT_LENGTH, de-chunked input."""
    env = falcon.testing.create_environ(
        method="POST", path=f"{API}/prompt",
        headers={**auth, "Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    env.pop("CONTENT_LENGTH", None)
    env["wsgi.input"] = io.BytesIO(body)
    env["wsgi.input_terminated"] = True
    return _call(app, env)


def test_a_malformed_content_length_answers_400(settings: Settings, pool: ConnectionPool[DictConnection],
                                                auth: dict[str, str]) -> None:
    app = create_app(settings, pool)
    before = counts(pool)
    for bad in ("abc", "-5", "1e3"):
        env = falcon.testing.create_environ(method="POST", path=f"{API}/prompt", body=b'{"text": "hi"}',
                                            headers={**auth, "Content-Type": "application/json"})
        env["CONTENT_LENGTH"] = bad
        status, answer = _call(app, env)
        assert status.startswith("400") and set(answer) == {"title", "description"}, (bad, answer)
    assert counts(pool) == before


def test_chunked_bodies_are_read_bounded(settings: Settings, pool: ConnectionPool[DictConnection],
                                         auth: dict[str, str]) -> None:
    app = create_app(replace(settings, max_body_bytes=SMALL_LIMIT), pool)
    before = counts(pool)
    status, answer = _chunked(app, json.dumps({"text": "y" * 4 * SMALL_LIMIT}).encode(), auth)
    assert status.startswith("413") and set(answer) == {"title", "description"}
    assert counts(pool) == before
    status, answer = _chunked(app, json.dumps({"text": "chunked but small"}).encode(), auth)
    assert status.startswith("202"), answer
    job = fetch_one(pool, "SELECT e.content FROM sa_job j JOIN sa_entity e ON e.id = j.prompt_id "
                          "WHERE j.id = %s", answer["job_id"])
    assert job["content"] == "chunked but small"


@pytest.mark.parametrize("raw_id", ["not-a-uuid", "1", "x" * 1000, "12345678-1234-5678-1234-56781234567g",
                                    "%00", "..%2f..%2fetc"])
def test_malformed_ids_answer_404_like_missing_ones_on_every_route(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    raw_id: str,
) -> None:
    before = counts(pool)
    missing = client.simulate_get(f"{API}/jobs/{uuid.uuid4()}", headers=auth)
    for method, path in [("GET", f"{API}/jobs/{raw_id}"), ("POST", f"{API}/jobs/{raw_id}/cancel"),
                         ("GET", f"{API}/prompts/{raw_id}"), ("POST", f"{API}/prompts/{raw_id}/retry")]:
        result = client.simulate_request(method, path, headers=auth)
        assert_json_error(result, 404)
        assert result.json["title"] == missing.json["title"] == "Not found"
    assert counts(pool) == before


@pytest.mark.parametrize(("body", "status", "named"), [
    ({"force": True}, 422, "force"),
    ([1], 422, None),
    ("cancel", 422, None),
    (b"{not json", 400, None),
])
def test_routes_without_a_body_refuse_one(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    body: Any, status: int, named: str | None,
) -> None:
    done = submit(client, auth, text="keep me queued")
    before = counts(pool)
    for path in (f"{API}/jobs/{done['job_id']}/cancel", f"{API}/prompts/{done['prompt_id']}/retry"):
        if isinstance(body, bytes):
            result = client.simulate_post(path, body=body,
                                          headers={**auth, "Content-Type": "application/json"})
        else:
            result = client.simulate_post(path, json=body, headers=auth)
        assert_json_error(result, status)
        if named:
            assert named in result.json["description"]
        plain = client.simulate_post(path, body="x", headers={**auth, "Content-Type": "text/plain"})
        assert_json_error(plain, 415)
    assert counts(pool) == before
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", done["job_id"])["state"] == "queued"
    # An empty object (or no body) is fine.
    ok = client.simulate_post(f"{API}/jobs/{done['job_id']}/cancel", json={}, headers=auth)
    assert ok.status_code == 200 and ok.json["state"] == "cancelled"


@pytest.mark.parametrize("since", [
    "yesterday", "2024-13-01", "2024-02-30", "2023-02-29", "1900-02-29", "2024-04-31",
    "0000-01-01", "0000-02-29", "2024-01-01T25:00", "2024-01-01T10:00z",
    "2024-01-01\n", "2024-01-01T10:00:00+0100", "20240101", "2024-W01", "", "2024-01-01T10:00:00.1234567",
])
def test_bad_cursors_answer_400(client: falcon.testing.TestClient, auth: dict[str, str],
                                since: str) -> None:
    result = client.simulate_get(f"{API}/mission/recent", params={"since": since}, headers=auth,
                                 params_csv=False)
    assert_json_error(result, 400)
    assert "since" in result.json["description"]


@pytest.mark.parametrize("since", ["2024-01-01", "2024-02-29", "2000-02-29T23:59", "0001-01-01",
                                   "9999-12-31T23:59:59.999999", "2024-01-01T10:00", "2024-01-01T10:00:00Z",
                                   "2024-01-01 10:00:00.5+02:00", "2024-01-01T10:00:00.123456-05:30"])
def test_good_cursors_are_accepted(client: falcon.testing.TestClient, auth: dict[str, str],
                                   since: str) -> None:
    result = client.simulate_get(f"{API}/mission/recent", params={"since": since}, headers=auth)
    assert result.status_code == 200, result.text


def test_unknown_fields_are_named(client: falcon.testing.TestClient, auth: dict[str, str]) -> None:
    result = client.simulate_post(f"{API}/prompt", json={"text": "hi", "colour": "red"}, headers=auth)
    assert result.status_code == 422 and result.json["description"].startswith("colour:")
    result = client.simulate_post(f"{API}/prompt", json={"text": "hi", "options": {"logit_bias": 1}},
                                  headers=auth)
    assert result.status_code == 422 and result.json["description"].startswith("options.logit_bias:")


def test_integral_floats_count_as_integers(client: falcon.testing.TestClient, auth: dict[str, str]) -> None:
    # NOTE: JSON Schema (and so the OpenAPI document) calls 5.0 an integer.
    done = submit(client, auth, text="hi", priority=5.0, max_attempts=2.0, options={"depth": 1e1})
    job = client.simulate_get(f"{API}/jobs/{done['job_id']}", headers=auth).json
    assert (job["priority"], job["max_attempts"], job["execution_options"]) == (5, 2, {"depth": 10})


def test_errors_are_json_whatever_the_client_accepts(client: falcon.testing.TestClient,
                                                     auth: dict[str, str]) -> None:
    for accept in ("application/xml", "text/html", "text/plain"):
        result = client.simulate_get(f"{API}/jobs/{uuid.uuid4()}", headers={**auth, "Accept": accept})
        assert_json_error(result, 404)
    not_allowed = client.simulate_delete(f"{API}/prompt", headers=auth)
    assert_json_error(not_allowed, 405)
    assert "POST" in not_allowed.headers["allow"]
