"""Security basics: headers on every answer, CORS off by default and per allowed origin, no token
or prompt text in the logs."""

from __future__ import annotations

import uuid
from dataclasses import replace

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service import resources
from service.app import create_app
from service.middleware_security import SECURITY_HEADERS
from tests.helpers import WorkerHarness, submit

API = "/sa-core/v1"
ORIGIN = "https://app.example.com"


def assert_hardened(result: falcon.testing.Result) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert result.headers[name.lower()] == value, name
    assert result.headers["cache-control"] == "no-store"


def test_every_answer_carries_the_security_headers(
    settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = falcon.testing.TestClient(create_app(replace(settings, max_body_bytes=64), pool))
    done = client.simulate_post(f"{API}/prompt", json={"text": "hi"}, headers=auth)
    answers = [
        done,
        client.simulate_get(f"{API}/jobs/{done.json['job_id']}", headers=auth),
        client.simulate_get("/healthz"), client.simulate_get("/readyz"),
        client.simulate_get(f"{API}/openapi.json"),
        client.simulate_get(f"{API}/mission/recent"),  # 401
        client.simulate_get(f"{API}/jobs/{uuid.uuid4()}", headers=auth),  # 404
        client.simulate_get(f"{API}/nothing-here", headers=auth),  # 404, no route
        client.simulate_post(f"{API}/prompt", body="x" * 65, headers=auth),  # 413
        client.simulate_post(f"{API}/prompt", body="x", headers={**auth, "Content-Type": "text/plain"}),
        client.simulate_post(f"{API}/prompt", json={"text": ""}, headers=auth),  # 422
        client.simulate_delete(f"{API}/prompt", headers=auth),  # 405
    ]
    assert [a.status_code for a in answers] == [202, 200, 200, 200, 200, 401, 404, 404, 413, 415, 422, 405]

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(resources.jobs, "get_job", boom)
    crashed = client.simulate_get(f"{API}/jobs/{done.json['job_id']}", headers=auth)
    assert crashed.status_code == 500 and set(crashed.json) == {"title", "description"}
    for answer in [*answers, crashed]:
        assert_hardened(answer)


def test_cors_is_off_by_default(client: falcon.testing.TestClient, auth: dict[str, str]) -> None:
    plain = client.simulate_get(f"{API}/mission/recent", headers={**auth, "Origin": ORIGIN})
    assert plain.status_code == 200
    preflight = client.simulate_options(f"{API}/prompt", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    for answer in (plain, preflight):
        assert not [h for h in answer.headers if h.lower().startswith("access-control-")]


def test_cors_allows_exactly_the_configured_origins(
    settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
) -> None:
    cors = replace(settings, cors_origins=(ORIGIN, "http://localhost:5173"))
    client = falcon.testing.TestClient(create_app(cors, pool))
    preflight = client.simulate_options(f"{API}/prompt", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, idempotency-key"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "idempotency-key" in preflight.headers["access-control-allow-headers"]
    assert "access-control-allow-credentials" not in preflight.headers

    actual = client.simulate_post(f"{API}/prompt", json={"text": "from the browser"},
                                  headers={**auth, "Origin": ORIGIN})
    assert actual.status_code == 202
    assert actual.headers["access-control-allow-origin"] == ORIGIN
    assert "Location" in actual.headers["access-control-expose-headers"]

    other = client.simulate_post(f"{API}/prompt", json={"text": "elsewhere"},
                                 headers={**auth, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    evil_preflight = client.simulate_options(f"{API}/prompt", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in evil_preflight.headers


def test_no_token_and_no_prompt_text_reach_the_logs(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret_text = f"confidential-{uuid.uuid4().hex}"
    token = auth["Authorization"].split()[1]
    capsys.readouterr()
    done = submit(client, auth, text=secret_text, options={"model": "fake-model"})
    client.simulate_post(f"{API}/prompt", headers={**auth, "Idempotency-Key": "log-key"},
                         json={"text": secret_text})
    client.simulate_post(f"{API}/prompt", headers={**auth, "Idempotency-Key": "log-key"},
                         json={"text": secret_text + " changed"})
    client.simulate_post(f"{API}/prompt", json={"text": secret_text + "\u0000"}, headers=auth)
    client.simulate_get(f"{API}/jobs/{done['job_id']}", headers={"Authorization": f"Bearer {token}x"})
    client.simulate_get(f"{API}/mission/events", params={"access_token": token + "x"})
    client.simulate_get(f"{API}/mission/recent", headers=auth)
    workers.build().run(once=True)
    client.simulate_get(f"{API}/prompts/{done['prompt_id']}", headers=auth)
    logged = capsys.readouterr()
    lines = (logged.out + logged.err).splitlines()
    assert any('"http.request"' in line for line in lines), "the requests were logged"
    assert any(done["job_id"] in line for line in lines), "the job ids were logged"
    for line in lines:
        assert secret_text not in line
        assert token not in line
