"""The mission pages' server side: the session cookie (its attributes, same-origin only, the custom
header on writes, the bearer header winning, its end), the `ops` scope and the operator routes,
the pages' own CSP with the API's headers unchanged, and `create-token --scope`."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import create_token, issue_token, revoke_token
from service.auth import SESSION_COOKIE, SESSION_HEADER
from service.middleware_security import SECURITY_HEADERS
from service.resources.pages import PAGE_CSP, STATIC_DIR
from service.resources.session import SESSION_TTL_SECONDS
from tests.helpers import WorkerHarness, fetch_one, submit

API = "/sa-core/v1"
HOST = "falconframework.org"  # NOTE: the Host falcon.testing sends by default
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}
WRITE = {**SAME_ORIGIN, SESSION_HEADER: "1", "Origin": f"http://{HOST}"}


def jobs(pool: ConnectionPool[DictConnection]) -> int:
    return int(fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"])


def sign_in(client: falcon.testing.TestClient, headers: dict[str, str]) -> str:
    opened = client.simulate_post(f"{API}/session", headers=headers)
    assert opened.status_code == 201, opened.text
    return str(opened.cookies[SESSION_COOKIE].value)


def test_a_token_buys_an_httponly_strict_path_limited_short_lived_cookie(
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    opened = client.simulate_post(f"{API}/session", headers=auth)
    assert opened.status_code == 201
    assert {k: opened.json[k] for k in ("org_id", "user_id", "scopes")} == {
        "org_id": 1, "user_id": 10, "scopes": []}
    cookie = opened.cookies[SESSION_COOKIE]
    assert cookie.http_only and cookie.same_site == "Strict" and cookie.path == API
    assert not cookie.secure, "plain http: a Secure cookie would never come back"
    assert SESSION_TTL_SECONDS - 60 < int(cookie.max_age) <= SESSION_TTL_SECONDS
    assert cookie.value not in opened.text, "the id is in the cookie only"
    behind_tls = client.simulate_post(f"{API}/session", headers={**auth, "X-Forwarded-Proto": "https"})
    assert behind_tls.cookies[SESSION_COOKIE].secure


def test_a_session_never_outlives_its_token(
    client: falcon.testing.TestClient, pool: ConnectionPool[DictConnection],
) -> None:
    issued = issue_token(pool, 1, 10, expires_at=datetime.now(UTC) + timedelta(minutes=5))
    opened = client.simulate_post(f"{API}/session", headers={"Authorization": f"Bearer {issued.token}"})
    assert int(opened.cookies[SESSION_COOKIE].max_age) <= 300


def test_the_cookie_reads_and_with_the_custom_header_writes_for_its_own_org_only(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    session = {SESSION_COOKIE: sign_in(client, auth)}
    mine = submit(client, auth, text="mine")
    other = submit(client, {"Authorization": f"Bearer {create_token(pool, 2, 20)}"}, text="theirs")
    recent = client.simulate_get(f"{API}/mission/recent", cookies=session, headers=SAME_ORIGIN)
    assert recent.status_code == 200
    assert [i["prompt_id"] for i in recent.json["items"]] == [mine["prompt_id"]]
    assert client.simulate_get(f"{API}/jobs/{other['job_id']}", cookies=session).status_code == 404
    before = jobs(pool)
    unmarked = client.simulate_post(f"{API}/prompt", json={"text": "forged"}, cookies=session,
                                    headers=SAME_ORIGIN)
    assert unmarked.status_code == 403 and SESSION_HEADER in unmarked.json["description"]
    assert jobs(pool) == before
    posted = client.simulate_post(f"{API}/prompt", json={"text": "from the page"}, cookies=session,
                                  headers=WRITE)
    assert posted.status_code == 202
    cancelled = client.simulate_post(f"{API}/jobs/{posted.json['job_id']}/cancel", cookies=session,
                                     headers=WRITE)
    assert cancelled.json["state"] == "cancelled"


@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "none"},
    {"Origin": "http://evil.example"},
    {"Origin": f"https://{HOST}"},
    {"Origin": "null"},
    {**WRITE, "Origin": f"http://{HOST}.evil.example"},
], ids=["cross-site", "same-site", "typed-url", "other-origin", "other-scheme", "opaque-origin",
        "lookalike-host"])
def test_a_cookie_sent_from_another_origin_authenticates_nothing(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    headers: dict[str, str],
) -> None:
    session = {SESSION_COOKIE: sign_in(client, auth)}
    before = jobs(pool)
    for method, path in (("GET", "/mission/recent"), ("GET", "/mission/events"), ("POST", "/prompt")):
        refused = client.simulate_request(method, f"{API}{path}", cookies=session,
                                          headers={SESSION_HEADER: "1", **headers},
                                          json={"text": "forged"} if method == "POST" else None)
        assert refused.status_code == 403, (method, path, refused.text)
        assert refused.json["title"] == "Cross-origin request"
    assert jobs(pool) == before


def test_the_authorization_header_wins_over_the_cookie(
    client: falcon.testing.TestClient, auth: dict[str, str], other_org_auth: dict[str, str],
) -> None:
    session = {SESSION_COOKIE: sign_in(client, auth)}
    who = client.simulate_get(f"{API}/session", cookies=session, headers=other_org_auth)
    assert (who.json["org_id"], who.json["user_id"]) == (2, 20)
    wrong = client.simulate_get(f"{API}/session", cookies=session,
                                headers={"Authorization": "Bearer sa_not-a-token"})
    assert wrong.status_code == 401
    # NOTE: a session is opened only by presenting a token, never by another session.
    again = client.simulate_post(f"{API}/session", cookies=session, headers=WRITE)
    assert again.status_code == 400


@pytest.mark.parametrize("end", ["sign-out", "revoke", "expiry", "forged"])
def test_a_session_ends_with_sign_out_its_tokens_revocation_or_its_expiry(
    client: falcon.testing.TestClient, pool: ConnectionPool[DictConnection], end: str,
) -> None:
    token = create_token(pool, 1, 10)
    cookie = sign_in(client, {"Authorization": f"Bearer {token}"})
    session = {SESSION_COOKIE: cookie}
    assert client.simulate_get(f"{API}/session", cookies=session).status_code == 200
    if end == "sign-out":
        out = client.simulate_delete(f"{API}/session", cookies=session, headers=WRITE)
        assert out.status_code == 204
        assert out.cookies[SESSION_COOKIE].value == "" and out.cookies[SESSION_COOKIE].path == API
    elif end == "revoke":
        assert revoke_token(pool, token) is not None
    elif end == "expiry":
        with pool.connection() as conn:
            conn.execute("UPDATE sa_session SET expires_at = now() - interval '1 second'")
    else:
        session = {SESSION_COOKIE: cookie[:-2] + ("AA" if cookie[-2:] != "AA" else "BB")}
    ended = client.simulate_get(f"{API}/session", cookies=session)
    assert ended.status_code == 401 and ended.json["title"] == "Session ended"


def test_a_sign_in_prunes_expired_sessions(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    sign_in(client, auth)
    with pool.connection() as conn:
        conn.execute("UPDATE sa_session SET expires_at = now() - interval '1 second'")
    sign_in(client, auth)
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_session")["n"] == 1


def _ops_world(client: falcon.testing.TestClient, pool: ConnectionPool[DictConnection],
               workers: WorkerHarness) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """An operator of org 9, and org 2's failed job and queued job."""
    org2 = {"Authorization": f"Bearer {create_token(pool, 2, 20)}"}
    failed = submit(client, org2, text="refused [fake:400]")
    workers.build().run(once=True)
    queued = submit(client, org2, text="waiting")
    operator = {"Authorization": f"Bearer {issue_token(pool, 9, 90, scopes=('ops',)).token}"}
    return operator, failed, queued


def test_the_ops_routes_need_the_ops_scope_and_change_nothing_without_it(
    client: falcon.testing.TestClient, pool: ConnectionPool[DictConnection], workers: WorkerHarness,
    auth: dict[str, str],
) -> None:
    _, failed, queued = _ops_world(client, pool, workers)
    session = {SESSION_COOKIE: sign_in(client, auth)}
    states = fetch_one(pool, "SELECT string_agg(state, ',' ORDER BY created_at) AS s FROM sa_job")
    for method, path in (("GET", "/ops/overview"), ("POST", f"/ops/jobs/{queued['job_id']}/cancel"),
                         ("POST", f"/ops/jobs/{failed['job_id']}/retry")):
        for credentials in ({"headers": auth}, {"cookies": session, "headers": WRITE}):
            refused = client.simulate_request(method, f"{API}{path}", **credentials)  # type: ignore[arg-type]
            assert refused.status_code == 403, refused.text
            assert "--scope ops" in refused.json["description"]
    assert fetch_one(pool, "SELECT string_agg(state, ',' ORDER BY created_at) AS s FROM sa_job") == states


def test_an_operator_sees_every_orgs_queue_and_cancels_and_retries_any_orgs_jobs(
    client: falcon.testing.TestClient, pool: ConnectionPool[DictConnection], workers: WorkerHarness,
) -> None:
    operator, failed, queued = _ops_world(client, pool, workers)
    view = client.simulate_get(f"{API}/ops/overview", headers=operator).json
    org2 = next(o for o in view["metrics"]["orgs"] if o["org_id"] == 2)
    assert org2["jobs_by_state"]["queued"] == 1 and org2["jobs_by_state"]["failed"] == 1
    assert view["metrics"]["all"]["errors_by_kind"]["provider_4xx"]["errors"] == 1
    assert [j["id"] for j in view["failures"]] == [failed["job_id"]]
    assert view["failures"][0]["error_kind"] == "provider_4xx" and view["running"] == []
    cancelled = client.simulate_post(f"{API}/ops/jobs/{queued['job_id']}/cancel", headers=operator)
    assert cancelled.status_code == 200 and cancelled.json["state"] == "cancelled"
    assert "operator user 90 of org 9" in cancelled.json["error_message"]
    again = client.simulate_post(f"{API}/ops/jobs/{queued['job_id']}/cancel", headers=operator)
    assert again.status_code == 409
    retried = client.simulate_post(f"{API}/ops/jobs/{failed['job_id']}/retry", headers=operator)
    assert retried.status_code == 202 and retried.json["supersedes"] == failed["job_id"]
    missing = client.simulate_post(f"{API}/ops/jobs/{uuid.uuid4()}/retry", headers=operator)
    assert missing.status_code == 404


def test_the_pages_are_public_with_a_strict_csp_and_the_api_keeps_its_headers(
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    assert "'unsafe-inline'" not in PAGE_CSP and "'unsafe-eval'" not in PAGE_CSP
    for path, kind in (("/mission", "text/html"), ("/mission/ops", "text/html"),
                       ("/mission/assets/mission.js", "text/javascript"),
                       ("/mission/assets/api.js", "text/javascript"),
                       ("/mission/assets/mission.css", "text/css")):
        page = client.simulate_get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith(kind)
        assert page.headers["content-security-policy"] == PAGE_CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["x-frame-options"] == "DENY"
        revalidated = client.simulate_get(path, headers={"If-None-Match": page.headers["etag"]})
        assert revalidated.status_code == 304
    for path in ("/mission/assets/nope.js", "/mission/assets/mission.html",
                 "/mission/assets/..%2F..%2Fapp.py"):
        missing = client.simulate_get(path)
        assert missing.status_code == 404
        assert missing.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    api = client.simulate_get(f"{API}/mission/recent", headers=auth)
    for name, value in SECURITY_HEADERS.items():
        assert api.headers[name.lower()] == value


def test_the_pages_hold_no_inline_script_or_style_and_never_submit_the_token_in_a_url() -> None:
    # NOTE: should the scripts not run, a native submit of the sign-in form would put the token
    # in a URL: the fields have no name (nothing to submit) and the CSP forbids form submission.
    assert "form-action 'none'" in PAGE_CSP
    for page in STATIC_DIR.glob("*.html"):
        html = page.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), page.name
        assert "<style" not in html and " style=" not in html and re.search(r"\son\w+=", html) is None
        assert re.search(r"<(input|textarea)[^>]*\bname=", html) is None, page.name
    for script in STATIC_DIR.glob("*.js"):
        source = script.read_text()
        assert "innerHTML" not in source and "eval(" not in source, script.name


def test_create_token_with_the_ops_scope_keeps_its_output_contract(
    cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str],
    client: falcon.testing.TestClient,
) -> None:
    assert cli(["create-token", "--org", "3", "--user", "30", "--scope", "ops"]) == 0
    text = capsys.readouterr().out.strip()
    assert "scopes ops" in text
    token = text.split()[-1]
    who = client.simulate_get(f"{API}/session", headers={"Authorization": f"Bearer {token}"})
    assert who.json == {"org_id": 3, "user_id": 30, "scopes": ["ops"]}
    assert cli(["create-token", "--org", "3", "--user", "31", "--json"]) == 0
    document = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert document["scopes"] == []
    plain = client.simulate_get(f"{API}/ops/overview",
                                headers={"Authorization": f"Bearer {document['token']}"})
    assert plain.status_code == 403
    with pytest.raises(SystemExit) as refused:
        cli(["create-token", "--org", "3", "--user", "30", "--scope", "admin"])
    assert refused.value.code == 2
