"""The two mission feeds under abuse: paged polling, stalls from unrelated transactions, database
roles, stream caps, revoked tokens, dead clients, bounded replay and hostile Last-Event-IDs."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import falcon
import falcon.testing
import httpx
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.queries import job_event as event_q
from jobqueue.core.queries import mission as mission_q
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Authenticator, Caller, issue_token, revoke_token
from jobqueue.engine.claim import claim
from service.app import create_app
from service.auth import AuthMiddleware
from service.events.hub import EventHub
from service.resources.events import MissionEvents
from tests.helpers import fetch_all, plan_nodes, submit, wait_for
from tests.processes import gunicorn
from tests.sse_client import API, CANCEL, EVENTS, open_wsgi_stream, raw_streams, token_headers

RECENT = f"{API}/mission/recent"


def poll_all(client: falcon.testing.TestClient, headers: dict[str, str], cursor: str | None,
             **params: Any) -> tuple[list[dict[str, Any]], str]:
    """Follows /mission/recent page by page until has_more is false; returns items and cursor."""
    items: list[dict[str, Any]] = []
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        result = client.simulate_get(RECENT, params=query, headers=headers)
        assert result.status_code == 200, result.text
        assert len(result.json["items"]) <= int(params.get("limit", 100))
        items += result.json["items"]
        cursor = result.json["next_cursor"]
        if not result.json["has_more"]:
            assert cursor is not None
            return items, cursor


def hub_caught_up(hub: EventHub, pool: ConnectionPool[DictConnection]) -> bool:
    last = fetch_all(pool, "SELECT coalesce(max(id), 0) AS n FROM sa_job_event")[0]["n"]
    return (hub.wait_ready(1.0) or 0) >= last


@pytest.fixture
def feeds(app: falcon.App[falcon.Request, falcon.Response]) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(app)


# --- /mission/recent pages the event log --------------------------------------------------


def test_recent_pages_by_cursor_with_no_miss_and_no_repeat_even_under_heartbeats(
    feeds: falcon.testing.TestClient, hub: EventHub, pool: ConnectionPool[DictConnection],
    auth: dict[str, str],
) -> None:
    prompts = [submit(feeds, auth, text=f"page {i}")["prompt_id"] for i in range(7)]
    wait_for(lambda: hub_caught_up(hub, pool))

    items, cursor = poll_all(feeds, auth, None, limit=3)
    assert [item["prompt_id"] for item in items] == prompts

    # Heartbeats (and anything else that only touches updated_at) write no event.
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET running_heartbeat_at = now()")
    again, cursor = poll_all(feeds, auth, cursor, limit=3)
    assert again == []

    cancelled = feeds.simulate_post(f"{API}/jobs/{items[2]['job_id']}/cancel", headers=auth)
    assert cancelled.status_code == 200
    wait_for(lambda: hub_caught_up(hub, pool))
    changed, _ = poll_all(feeds, auth, cursor, limit=3)
    assert [(item["prompt_id"], item["state"]) for item in changed] == [(prompts[2], "cancelled")]


def test_recent_starts_from_since_and_answers_bad_paging_parameters_400(
    feeds: falcon.testing.TestClient, hub: EventHub, pool: ConnectionPool[DictConnection],
    auth: dict[str, str],
) -> None:
    submit(feeds, auth, text="before")
    wait_for(lambda: hub_caught_up(hub, pool))
    items, _ = poll_all(feeds, auth, None, since="2999-01-01")
    assert items == []
    items, _ = poll_all(feeds, auth, None, since="0001-01-01")
    assert [item["text"] for item in items] == ["before"]

    for params in ({"limit": "0"}, {"limit": "501"}, {"limit": "x"}, {"cursor": "nope"},
                   {"cursor": "A" * 12}, {"scope": "everyone"}):
        result = feeds.simulate_get(RECENT, params=params, headers=auth)
        assert result.status_code == 400, params
        assert set(result.json) == {"title", "description"}


def test_both_feeds_show_the_viewers_own_prompts_unless_org_scope_is_asked_for(
    feeds: falcon.testing.TestClient, app: falcon.App[falcon.Request, falcon.Response],
    hub: EventHub, pool: ConnectionPool[DictConnection], auth: dict[str, str],
) -> None:
    colleague = token_headers(pool, 1, 11)
    outsider = token_headers(pool, 2, 10)
    mine_stream = open_wsgi_stream(app, auth)
    org_stream = open_wsgi_stream(app, auth, query="scope=org")
    mine = submit(feeds, auth, text="mine")["prompt_id"]
    theirs = submit(feeds, colleague, text="theirs")["prompt_id"]
    submit(feeds, outsider, text="another org")
    wait_for(lambda: hub_caught_up(hub, pool))

    own, _ = poll_all(feeds, auth, None)
    org, _ = poll_all(feeds, auth, None, scope="org")
    assert [item["prompt_id"] for item in own] == [mine]
    assert [item["prompt_id"] for item in org] == [mine, theirs]
    wait_for(lambda: [(e["prompt_id"], e["created_by"]) for e in org_stream.events]
             == [(mine, 10), (theirs, 11)])
    assert [e["prompt_id"] for e in mine_stream.events] == [mine]


# --- /mission/prompts: the present state, as of a log position ----------------------------------

PROMPTS = f"{API}/mission/prompts"


def snapshot_all(client: falcon.testing.TestClient, headers: dict[str, str],
                 **params: Any) -> tuple[list[dict[str, Any]], int, int]:
    """Follows /mission/prompts page by page; returns the items (each prompt once, the first
    page's copy kept), the first page's event_id, and the number of pages."""
    items: dict[str, dict[str, Any]] = {}
    first: int | None = None
    pages = 0
    before: str | None = None
    while True:
        result = client.simulate_get(PROMPTS, params={**params, **({"before": before} if before else {})},
                                     headers=headers)
        assert result.status_code == 200, result.text
        pages += 1
        first = result.json["event_id"] if first is None else first
        for item in result.json["items"]:
            items.setdefault(item["prompt_id"], item)
        before = result.json["next_before"]
        if not result.json["has_more"]:
            assert first is not None
            return list(items.values()), first, pages


def test_the_snapshot_pages_prompts_newest_activity_first_and_the_stream_continues_from_it(
    feeds: falcon.testing.TestClient, app: falcon.App[falcon.Request, falcon.Response],
    hub: EventHub, pool: ConnectionPool[DictConnection], auth: dict[str, str],
) -> None:
    prompts = [submit(feeds, auth, text=f"snap {i}") for i in range(7)]
    submit(feeds, token_headers(pool, 2, 10), text="another org")
    submit(feeds, token_headers(pool, 1, 11), text="a colleague")
    # NOTE: the oldest prompt changes last, so it has the newest activity.
    assert feeds.simulate_post(f"{API}/jobs/{prompts[0]['job_id']}/cancel",
                               headers=auth).status_code == 200
    wait_for(lambda: hub_caught_up(hub, pool))

    items, event_id, pages = snapshot_all(feeds, auth, limit=3)
    assert [item["prompt_id"] for item in items] == (
        [prompts[0]["prompt_id"]] + [p["prompt_id"] for p in reversed(prompts[1:])])
    assert [item["state"] for item in items] == ["cancelled"] + ["queued"] * 6
    assert pages == 3
    assert event_id == fetch_all(pool, "SELECT max(id) AS n FROM sa_job_event")[0]["n"]
    first = feeds.simulate_get(PROMPTS, headers=auth).json
    assert poll_all(feeds, auth, first["cursor"]) == ([], first["cursor"])
    org, _, _ = snapshot_all(feeds, auth, scope="org")
    assert [item["text"] for item in org][:2] == ["snap 0", "a colleague"]
    assert "another org" not in {item["text"] for item in org}

    stream = open_wsgi_stream(app, auth, query=f"last_event_id={event_id}")
    later = submit(feeds, auth, text="after the snapshot")
    wait_for(lambda: [e["prompt_id"] for e in stream.events] == [later["prompt_id"]])

    for params in ({"limit": "0"}, {"limit": "201"}, {"before": "nope"}, {"scope": "all"},
                   {"cursor": "AAAAAAAAACo"}):
        result = feeds.simulate_get(PROMPTS, params=params, headers=auth)
        assert result.status_code == 400, params
        assert set(result.json) == {"title", "description"}


def test_a_page_of_prompts_without_answers_is_cut_by_count_not_by_bytes(
    feeds: falcon.testing.TestClient, hub: EventHub, pool: ConnectionPool[DictConnection],
    auth: dict[str, str],
) -> None:
    # NOTE: a prompt without an answer once counted as a whole answer's bytes (64 KiB): a page of
    # queued prompts ended after 16 of them.
    for n in range(40):
        submit(feeds, auth, text=f"no answer yet {n}")
    wait_for(lambda: hub_caught_up(hub, pool))
    snapshot = feeds.simulate_get(PROMPTS, params={"limit": 40}, headers=auth).json
    assert (len(snapshot["items"]), snapshot["has_more"]) == (40, False)
    recent = feeds.simulate_get(RECENT, params={"limit": 40}, headers=auth).json
    assert len(recent["items"]) == 40


def test_a_prompt_with_thousands_of_events_costs_the_snapshot_pages_of_its_own(
    feeds: falcon.testing.TestClient, hub: EventHub, pool: ConnectionPool[DictConnection],
    auth: dict[str, str],
) -> None:
    old = submit(feeds, auth, text="the old one")
    busy = submit(feeds, auth, text="retried for ever")
    # NOTE: 6,000 more events of one prompt (a snapshot page walks 5,000 at most), written as
    # the log would hold them after as many retry cycles.
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO sa_job_event (job_id, prompt_id, org_id, created_by, from_state, to_state, attempt) "
            "SELECT %(job)s, %(prompt)s, 1, 10, 'queued', 'queued', 1 FROM generate_series(1, 6000)",
            {"job": busy["job_id"], "prompt": busy["prompt_id"]})
    wait_for(lambda: hub_caught_up(hub, pool))
    items, _, pages = snapshot_all(feeds, auth, limit=50)
    assert [item["prompt_id"] for item in items] == [busy["prompt_id"], old["prompt_id"]]
    assert pages == 2


@pytest.fixture
def role_pools(database_url: str) -> Iterator[tuple[ConnectionPool[DictConnection], str]]:
    """A pool connected as a "web" role, and the conninfo of a "worker" role (neither superuser)."""
    suffix = uuid.uuid4().hex[:8]
    roles = [f"sa_web_{suffix}", f"sa_worker_{suffix}"]
    with psycopg.connect(database_url, autocommit=True) as admin:
        for role in roles:
            admin.execute(f"CREATE ROLE {role} LOGIN")  # type: ignore[arg-type]
            admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")  # type: ignore[arg-type]
            admin.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")  # type: ignore[arg-type]
    web = open_pool(database_url.replace("user=postgres", f"user={roles[0]}"), name="web-role",
                    max_size=4)
    try:
        yield web, database_url.replace("user=postgres", f"user={roles[1]}")
    finally:
        web.close()
        with psycopg.connect(database_url, autocommit=True) as admin:
            for role in roles:
                admin.execute(f"DROP OWNED BY {role}")  # type: ignore[arg-type]
                admin.execute(f"DROP ROLE {role}")  # type: ignore[arg-type]


def test_a_late_commit_by_another_role_is_not_skipped_by_the_next_poll(
    role_pools: tuple[ConnectionPool[DictConnection], str], settings: Settings,
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    web_pool, worker_conninfo = role_pools
    early, late = (submit(client, auth, text=t) for t in ("early", "late"))
    web_hub = EventHub.from_settings(web_pool, replace(settings, listen=False))
    web = falcon.testing.TestClient(create_app(settings, web_pool, hub=web_hub))
    try:
        _, cursor = poll_all(web, auth, None)
        with psycopg.connect(worker_conninfo) as worker:
            worker.execute(CANCEL, (early["job_id"],))   # takes the lower id, commits last
            with psycopg.connect(worker_conninfo, autocommit=True) as other:
                other.execute(CANCEL, (late["job_id"],))
            rounds = web_hub.rounds
            wait_for(lambda: web_hub.rounds >= rounds + 2)
            during, cursor = poll_all(web, auth, cursor)
            assert during == []
        wait_for(lambda: bool(poll_all(web, auth, cursor)[0]))
        after, _ = poll_all(web, auth, cursor)
        assert [(i["prompt_id"], i["state"]) for i in after] == [
            (early["prompt_id"], "cancelled"), (late["prompt_id"], "cancelled")]
    finally:
        web_hub.stop()


# --- the hub and transactions it must not wait for ----------------------------------------


def test_an_idle_transaction_and_a_rolled_back_enqueue_stall_no_live_event_nor_a_start(
    database_url: str, app: falcon.App[falcon.Request, falcon.Response], settings: Settings,
    pool: ConnectionPool[DictConnection], client: falcon.testing.TestClient,
    auth: dict[str, str],
) -> None:
    doomed = submit(client, auth, text="doomed")["job_id"]
    stream = open_wsgi_stream(app, auth)
    with psycopg.connect(database_url) as idle, psycopg.connect(database_url) as aborted:
        # An idle session that wrote elsewhere (it holds an xid), and one event id rolled back.
        idle.execute("CREATE TEMP TABLE scratch (x int)")
        idle.execute("INSERT INTO scratch VALUES (1)")
        aborted.execute(CANCEL, (doomed,))
        aborted.rollback()
        live = submit(client, auth, text="live")["job_id"]
        wait_for(lambda: stream.states(live) == ["queued"])

        fresh = EventHub.from_settings(pool, replace(settings, listen=False))
        try:
            assert fresh.wait_ready(5.0) is not None
            fresh_stream = open_wsgi_stream(create_app(settings, pool, hub=fresh), auth)
            later = submit(client, auth, text="later")["job_id"]
            wait_for(lambda: fresh_stream.states(later) == ["queued"])
        finally:
            fresh.stop()


def test_an_open_transaction_that_wrote_an_event_holds_live_events_until_it_commits(
    database_url: str, app: falcon.App[falcon.Request, falcon.Response], hub: EventHub,
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    early, late = (submit(client, auth, text=t)["job_id"] for t in ("early", "late"))
    stream = open_wsgi_stream(app, auth)
    wait_for(lambda: hub.cursor is not None)
    with psycopg.connect(database_url) as slow:
        slow.execute(CANCEL, (early,))
        with psycopg.connect(database_url, autocommit=True) as fast:
            fast.execute(CANCEL, (late,))
        rounds = hub.rounds
        wait_for(lambda: hub.rounds >= rounds + 3)
        assert stream.states(late) == []
    wait_for(lambda: stream.states(late) == ["cancelled"])
    assert [e["job_id"] for e in stream.events] == [early, late]


# --- streams: bounded replay, hostile ids, caps, revoke, dead clients ---------------------


def test_a_replay_is_bounded_per_stream_and_the_reconnects_deliver_everything_once(
    pool: ConnectionPool[DictConnection], hub: EventHub, client: falcon.testing.TestClient,
    auth: dict[str, str], caller: Caller,
) -> None:
    for i in range(5):
        submit(client, auth, text=f"history {i}")
    app = falcon.App(middleware=[AuthMiddleware(Authenticator(pool))])
    app.add_route(EVENTS, MissionEvents(pool, hub, replay_limit=2))
    wait_for(lambda: hub_caught_up(hub, pool))

    got: list[int] = []
    for _ in range(3):
        # NOTE: the first two streams end on their own after two events; the last one follows
        # live events and is closed by the client once it has the newest.
        stream = open_wsgi_stream(app, {**auth, "Last-Event-ID": str(got[-1] if got else 0)},
                                  stop_when=lambda s: 5 in s.ids)
        assert stream.done.wait(10)
        assert len(stream.ids) <= 2
        got += stream.ids
    assert got == [r["id"] for r in fetch_all(
        pool, "SELECT id FROM sa_job_event WHERE created_by = %s ORDER BY id", caller.user_id)]


@pytest.mark.parametrize("headers, query", [
    ({"Last-Event-ID": "9" * 4300}, ""),
    ({"Last-Event-ID": str(2**63)}, ""),
    ({"Last-Event-ID": "-1"}, ""),
    ({"Last-Event-ID": "1e3"}, ""),
    ({}, "last_event_id=" + "9" * 4300),
    ({}, f"last_event_id={2**63}"),
    ({}, "last_event_id=-1"),
    ({"Last-Event-ID": "0"}, "last_event_id=-1"),
    ({"Last-Event-ID": "0"}, "last_event_id=%205"),
])
def test_a_huge_or_malformed_last_event_id_is_a_400(
    client: falcon.testing.TestClient, auth: dict[str, str], headers: dict[str, str], query: str,
) -> None:
    result = client.simulate_get(EVENTS, headers={**auth, **headers}, query_string=query)
    assert result.status_code == 400
    assert set(result.json) == {"title", "description"}


def _ended(sock: socket.socket, timeout: float) -> bool:
    """Reads the stream until the server ends it (its last chunk, or a close); True if it did
    within `timeout`."""
    sock.settimeout(timeout)
    received = b""
    try:
        while not received.endswith(b"\r\n0\r\n\r\n"):
            data = sock.recv(65536)
            if not data:
                return True
            received += data
    except TimeoutError:
        return False
    return True


def _keeps_alive(sock: socket.socket, timeout: float) -> bool:
    """Reads the stream (past its opening lines) until a keepalive comment; False on an end."""
    sock.settimeout(timeout)
    received = b""
    while b"keepalive" not in received:
        data = sock.recv(65536)
        if not data or received.endswith(b"\r\n0\r\n\r\n"):
            return False
        received += data
    return True


def test_stream_caps_answer_429_while_healthz_answers_and_revoked_or_dead_streams_end(
    settings: Settings, tmp_path: Path, pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    tokens = {name: token_headers(pool, caller.org_id, caller.user_id) for name in "abc"}
    env = {"SA_SSE_MAX_STREAMS_PER_TOKEN": "3", "SA_SSE_MAX_STREAMS": "5",
           "SA_SSE_KEEPALIVE": "0.5", "SA_SSE_TOKEN_CHECK": "0.5"}
    with gunicorn(settings, tmp_path, **env) as base, \
            httpx.Client(base_url=base, timeout=5.0) as http:
        a_streams = raw_streams(base, tokens["a"], 3)
        refused = http.get(EVENTS, headers=tokens["a"])
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert set(refused.json()) == {"title", "description"}

        b_streams = raw_streams(base, tokens["b"], 2)
        full = http.get(EVENTS, headers=tokens["c"])
        assert full.status_code == 429 and "SA_SSE_MAX_STREAMS" in full.json()["description"]
        assert http.get("/healthz").status_code == 200
        assert http.post(f"{API}/prompt", json={"text": "still served"},
                         headers=tokens["c"]).status_code == 202

        # A client that left frees its slot within about a keepalive interval.
        a_streams.pop().close()
        a_streams.append(wait_for(lambda: _open_stream(base, tokens["a"]), timeout=5))

        # A revoked token's open streams end within seconds; the others go on.
        revoke_token(pool, tokens["b"]["Authorization"].split()[1])
        for sock in b_streams:
            assert _ended(sock, 5.0), "a revoked token's stream kept going"
        for sock in a_streams:
            assert _keeps_alive(sock, 5.0), "a stream of a valid token ended"
        assert http.get(EVENTS, headers=tokens["b"]).status_code == 401
        for sock in a_streams:
            sock.close()


def _open_stream(base: str, headers: dict[str, str]) -> socket.socket | None:
    """Opens one stream on a plain socket; None (and the socket closed) when it is refused."""
    port = int(base.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall((f"GET {EVENTS} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        assert data, "closed before its status line"
        head += data
    if head.startswith(b"HTTP/1.1 200"):
        return sock
    assert head.startswith(b"HTTP/1.1 429"), head
    sock.close()
    return None


@pytest.mark.parametrize("statement, index", [
    (mission_q.MISSION_PAGE_FOR_USER, "sa_job_event_org_user_idx"),
    (mission_q.MISSION_PAGE_FOR_ORG, "sa_job_event_org_idx"),
    (mission_q.MISSION_START_FOR_USER, "sa_job_event_org_user_idx"),
    (mission_q.MISSION_START_FOR_ORG, "sa_job_event_org_idx"),
    (mission_q.MISSION_LATEST_FOR_USER, "sa_job_event_org_user_idx"),
    (mission_q.MISSION_LATEST_FOR_ORG, "sa_job_event_org_idx"),
    (event_q.JOB_EVENT_LIST_FOR_ORG_BETWEEN, "sa_job_event_org_idx"),
    (event_q.JOB_EVENT_LIST_FOR_USER_BETWEEN, "sa_job_event_org_user_idx"),
])
def test_the_feeds_read_one_orgs_events_through_their_index(
    many_jobs: DictConnection, statement: str, index: str,
) -> None:
    # NOTE: many users per org, so one user's events are a small part of the org's.
    many_jobs.execute("UPDATE sa_job_event SET created_by = id % 20 + 1")
    many_jobs.execute("ANALYZE sa_job_event")
    nodes = plan_nodes(many_jobs, statement, {
        "org_id": 7, "user_id": 1, "after": 0, "upto": 2**62, "limit": 100, "text_chars": 100,
        "before": 2**62, "scan": 5000,
        "max_bytes": 1_048_576,
        "since": datetime(2000, 1, 1, tzinfo=UTC)})
    assert index in {node.get("Index Name") for node in nodes}
    assert "Seq Scan" not in {node["Node Type"] for node in nodes}


def test_a_stream_ends_within_seconds_of_its_tokens_expiry(
    settings: Settings, pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    hub = EventHub.from_settings(pool, replace(settings, listen=False, sse_token_check=0.2))
    try:
        app = create_app(settings, pool, hub=hub)
        expires = datetime.now(UTC) + timedelta(seconds=1.5)
        token = issue_token(pool, caller.org_id, caller.user_id, expires_at=expires).token
        lasting = open_wsgi_stream(app, token_headers(pool, caller.org_id, caller.user_id))
        stream = open_wsgi_stream(app, {"Authorization": f"Bearer {token}"})
        assert stream.status.startswith("200")
        assert stream.done.wait(10), "an expired token's stream kept going"
        assert datetime.now(UTC) >= expires
        assert not lasting.done.is_set()
    finally:
        hub.stop()


def test_a_hub_started_while_an_event_writer_is_open_answers_streams_and_polls_at_once(
    database_url: str, settings: Settings, pool: ConnectionPool[DictConnection],
    feeds: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    early = submit(feeds, auth, text="early")
    _, cursor = poll_all(feeds, auth, None)
    fresh = EventHub.from_settings(pool, replace(settings, listen=False))
    app = create_app(settings, pool, hub=fresh)
    web = falcon.testing.TestClient(app)
    try:
        with psycopg.connect(database_url) as slow:
            slow.execute(CANCEL, (early["job_id"],))
            stream = open_wsgi_stream(app, auth)
            assert stream.status.startswith("200")
            page = web.simulate_get(RECENT, params={"cursor": cursor}, headers=auth)
            assert page.status_code == 200
            assert page.json["items"] == [] and page.json["next_cursor"] == cursor
            later = submit(feeds, auth, text="later")
        wait_for(lambda: stream.states(later["job_id"]) == ["queued"])
        items, _ = poll_all(web, auth, cursor)
        assert [(i["prompt_id"], i["state"]) for i in items] == [
            (early["prompt_id"], "cancelled"), (later["prompt_id"], "queued")]
    finally:
        fresh.stop()


def test_a_due_queued_prompt_says_what_holds_it_back_its_orgs_running_cap_or_budget(
    settings: Settings, pool: ConnectionPool[DictConnection], hub: EventHub, auth: dict[str, str],
) -> None:
    feeds = falcon.testing.TestClient(create_app(replace(settings, org_max_running=1), pool, hub=hub))
    running = submit(feeds, auth, text="takes the org's one place")
    submit(feeds, auth, text="waits for it")
    submit(feeds, auth, text="not due yet", delay_seconds=3600)
    assert [job.id for job in claim(pool, "feeds-test", 1, 100)] == [uuid.UUID(running["job_id"])]
    wait_for(lambda: hub_caught_up(hub, pool))

    def holds(path: str) -> dict[str, str | None]:
        items = feeds.simulate_get(path, headers=auth).json["items"]
        return {item["text"]: item["held"] for item in items}

    expected = {"takes the org's one place": None, "waits for it": "running_cap", "not due yet": None}
    assert holds(PROMPTS) == holds(RECENT) == expected
    with pool.connection() as conn:
        conn.execute("INSERT INTO sa_org_spend (org_id, day, shard, cost) "
                     "VALUES (1, (now() AT TIME ZONE 'UTC')::date, 0, 1)")
    budgeted = falcon.testing.TestClient(create_app(
        replace(settings, org_max_running=1, org_budget_daily=0.5), pool, hub=hub))
    items = budgeted.simulate_get(PROMPTS, headers=auth).json["items"]
    assert {i["text"]: i["held"] for i in items} == {**expected, "waits for it": "budget"}
