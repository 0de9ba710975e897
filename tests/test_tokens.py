"""Tokens: `create-token --expires`, `revoke-token`, expiry and revocation take effect at once,
digests compared in constant time, the token never printed again."""

from __future__ import annotations

import hmac
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core import tokens
from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.operator.cli import main
from service.app import create_app
from tests.helpers import fetch_one

JOBS = "/sa-core/v1/mission/recent"
PROMPT = "/sa-core/v1/prompt"


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, database_url: str,
        capsys: pytest.CaptureFixture[str]) -> pytest.CaptureFixture[str]:
    monkeypatch.setenv("DATABASE_URL", database_url)
    capsys.readouterr()
    return capsys


def created(cli: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    cli.readouterr()  # NOTE: drops the request log lines of earlier HTTP calls
    assert main(["create-token", "--org", "1", "--user", "10", "--json", *args]) == 0
    return dict(json.loads(cli.readouterr().out))


def bearer(token: object) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_revoking_by_token_or_by_id_stops_it_at_once(
    client: falcon.testing.TestClient, cli: pytest.CaptureFixture[str],
) -> None:
    first, second, third = created(cli), created(cli), created(cli)
    for issued in (first, second, third):
        assert client.simulate_get(JOBS, headers=bearer(issued["token"])).status_code == 200

    cli.readouterr()
    assert main(["revoke-token", str(first["token"])]) == 0
    out = cli.readouterr().out
    assert f"token {first['id']} (org 1, user 10) revoked" in out
    assert str(first["token"]) not in out
    assert main(["revoke-token", str(second["id"])]) == 0
    cli.readouterr()

    for issued in (first, second):
        refused = client.simulate_get(JOBS, headers=bearer(issued["token"]))
        assert refused.status_code == 401 and refused.json["title"] == "Invalid token"
    assert client.simulate_get(JOBS, headers=bearer(third["token"])).status_code == 200

    cli.readouterr()
    assert main(["revoke-token", str(first["id"])]) == 0
    assert "was already revoked" in cli.readouterr().out


def jobs_written(pool: ConnectionPool[DictConnection]) -> int:
    return int(fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"])


@pytest.mark.parametrize("cap", [0, 100], ids=["uncapped", "capped"])
def test_a_submit_checks_its_token_and_a_revoke_or_expiry_applies_at_once(
    settings: Settings, pool: ConnectionPool[DictConnection], cli: pytest.CaptureFixture[str],
    cap: int,
) -> None:
    client = falcon.testing.TestClient(create_app(replace(settings, org_max_queued=cap), pool))
    revoked, expiring = created(cli), created(cli)
    for issued in (revoked, expiring):
        accepted = client.simulate_post(PROMPT, json={"text": "hi"}, headers=bearer(issued["token"]))
        assert accepted.status_code == 202, accepted.text
    assert main(["revoke-token", str(revoked["id"])]) == 0
    with pool.connection() as conn:
        conn.execute("UPDATE sa_api_token SET expires_at = now() - interval '1 second' WHERE id = %s",
                     (expiring["id"],))
    before = jobs_written(pool)
    for issued in (revoked, expiring):
        refused = client.simulate_post(PROMPT, json={"text": "hi"}, headers=bearer(issued["token"]))
        assert refused.status_code == 401 and refused.json["title"] == "Invalid token"
        assert refused.headers["www-authenticate"] == "Bearer"
    assert jobs_written(pool) == before


def test_a_submit_with_a_bad_token_answers_401_whatever_its_body(
    client: falcon.testing.TestClient,
) -> None:
    large = {"text": "x" * 20_000, "unknown": 1}
    refused = client.simulate_post(PROMPT, json=large, headers=bearer("sa_not-a-real-token"))
    assert refused.status_code == 401 and refused.json["title"] == "Invalid token"
    # NOTE: the token is checked before the body is read: a bad one learns nothing more.
    for body in ({"unknown": 1}, {"text": ""}, [1]):
        small = client.simulate_post(PROMPT, json=body, headers=bearer("sa_not-a-real-token"))
        assert small.status_code == 401 and small.json["title"] == "Invalid token", body
    broken = client.simulate_post(PROMPT, body=b"{", headers={**bearer("sa_not-a-real-token"),
                                                               "Content-Type": "application/json"})
    assert broken.status_code == 401


@pytest.mark.parametrize("unknown", ["sa_no-such-token", "999999", str(2**64), "-1", ""])
def test_revoking_an_unknown_token_exits_1(cli: pytest.CaptureFixture[str], unknown: str) -> None:
    assert main(["revoke-token", unknown]) == 1
    assert "no such token" in cli.readouterr().err


def test_a_token_created_with_expires_stops_working_when_it_expires(
    client: falcon.testing.TestClient, cli: pytest.CaptureFixture[str],
    pool: ConnectionPool[DictConnection],
) -> None:
    issued = created(cli, "--expires", "2h")
    assert issued["expires_at"] is not None
    expires = datetime.fromisoformat(str(issued["expires_at"]))
    assert abs(expires - (datetime.now(UTC) + timedelta(hours=2))) < timedelta(minutes=1)
    assert client.simulate_get(JOBS, headers=bearer(issued["token"])).status_code == 200
    with pool.connection() as conn:
        conn.execute("UPDATE sa_api_token SET expires_at = now() - interval '1 second' WHERE id = %s",
                     (issued["id"],))
    refused = client.simulate_get(JOBS, headers=bearer(issued["token"]))
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"

    dated = created(cli, "--expires", "2999-01-31")
    assert str(dated["expires_at"]).startswith("2999-01-31T00:00:00")
    assert created(cli)["expires_at"] is None
    cli.readouterr()
    plain = main(["create-token", "--org", "1", "--user", "10", "--expires", "30d"])
    out = cli.readouterr().out
    assert plain == 0 and ", expires " in out and out.split()[-1].startswith("sa_")
    row = fetch_one(pool, "SELECT count(*) AS n FROM sa_api_token "
                          "WHERE expires_at > now() + interval '29 days'")
    assert row["n"] >= 2


@pytest.mark.parametrize("bad", ["2020-01-01", "0s", "soon", "-5m", "12 parsecs"])
def test_a_bad_expiry_is_a_usage_error(cli: pytest.CaptureFixture[str], bad: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["create-token", "--org", "1", "--user", "10", "--expires", bad])
    assert exit_info.value.code == 2
    assert "--expires" in cli.readouterr().err


def test_the_fetched_digest_is_compared_in_constant_time(
    pool: ConnectionPool[DictConnection], monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = tokens.create_token(pool, 1, 10)
    seen: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return original(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", spy)
    assert tokens.Authenticator(pool).authenticate(token) == tokens.Caller(1, 10)
    assert seen == [(tokens.hash_token(token), tokens.hash_token(token))]
    stored = fetch_one(pool, "SELECT token_hash FROM sa_api_token")["token_hash"]
    assert bytes(stored) == tokens.hash_token(token) and token.encode() not in bytes(stored)
