"""GET /mission/events: own events only, in id order, no gap, no duplicate; one hub per process."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import falcon
import falcon.testing
import httpx
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Authenticator, Caller
from service.app import create_app
from service.auth import AuthMiddleware
from service.events.hub import EventHub, HubConfig
from service.events.replay import replay_events
from service.events.subscription import SubscriptionClosed
from service.resources.events import MissionEvents
from tests.helpers import REPO, WorkerHarness, fetch_all, fetch_one, submit, wait_for
from tests.processes import gunicorn
from tests.sse_client import (
    API,
    CANCEL,
    EVENTS,
    open_http_stream,
    open_wsgi_stream,
    raw_streams,
    token_headers,
)

TERMINAL = {"succeeded", "failed", "cancelled", "superseded"}

# NOTE: web hubs LISTEN sa_job_event, workers sa_job_queued; both count here.
LISTENERS = ("SELECT count(*) AS n FROM pg_stat_activity "
             "WHERE datname = current_database() AND query LIKE 'LISTEN sa\\_job\\_%%'")


# --- fixtures -----------------------------------------------------------------------------


def ready_hub(pool: ConnectionPool[DictConnection], **config: Any) -> EventHub:
    """A hub driven by hand (no thread, no LISTEN): each poll_once() is one read."""
    hub = EventHub(pool, HubConfig(poll_interval=60.0, **config))
    wait_for(lambda: not hub.poll_once())
    return hub


def all_event_ids(pool: ConnectionPool[DictConnection], caller: Caller) -> list[int]:
    rows = fetch_all(pool, "SELECT id FROM sa_job_event WHERE org_id = %s AND created_by = %s "
                           "ORDER BY id", caller.org_id, caller.user_id)
    return [r["id"] for r in rows]


def last_event_id(pool: ConnectionPool[DictConnection]) -> int:
    return int(fetch_one(pool, "SELECT coalesce(max(id), 0) AS n FROM sa_job_event")["n"])


# --- the stream ---------------------------------------------------------------------------


def test_a_client_sees_its_prompt_go_queued_running_succeeded(
    app: falcon.App[falcon.Request, falcon.Response], client: falcon.testing.TestClient,
    auth: dict[str, str], workers: WorkerHarness,
) -> None:
    stream = open_wsgi_stream(app, auth)
    assert stream.status.startswith("200")
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["cache-control"] == "no-cache"

    job_id = submit(client, auth, text="follow me")["job_id"]
    workers.start()

    wait_for(lambda: "succeeded" in stream.states(job_id))
    mine = [e for e in stream.events if e["job_id"] == job_id]
    assert [(e["from_state"], e["to_state"]) for e in mine] == [
        (None, "queued"), ("queued", "running"), ("running", "succeeded")]
    assert mine[-1]["response_id"] is not None
    assert all(e["attempt"] == 1 and e["error_kind"] is None for e in mine)
    assert {"prompt_id", "at"} <= mine[0].keys()
    assert stream.ids == sorted(set(stream.ids))


def test_a_client_never_sees_another_users_or_another_orgs_events(
    app: falcon.App[falcon.Request, falcon.Response], client: falcon.testing.TestClient,
    pool: ConnectionPool[DictConnection], hub: EventHub, workers: WorkerHarness,
) -> None:
    callers = [Caller(1, 10), Caller(1, 11), Caller(2, 10)]
    headers = [token_headers(pool, c.org_id, c.user_id) for c in callers]
    streams = [open_wsgi_stream(app, h) for h in headers]
    jobs = [{submit(client, h, text=f"mine {i}")["job_id"] for i in range(2)} for h in headers]
    workers.start()

    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'succeeded'")
             ["n"] == 6)
    everything = last_event_id(pool)
    wait_for(lambda: (hub.cursor or 0) >= everything)
    for caller, stream, own in zip(callers, streams, jobs, strict=True):
        wait_for(lambda s=stream, c=caller: s.ids == all_event_ids(pool, c))
        assert {e["job_id"] for e in stream.events} == own


def test_the_token_may_come_as_a_query_parameter_on_the_stream_only(
    app: falcon.App[falcon.Request, falcon.Response], client: falcon.testing.TestClient,
    auth: dict[str, str],
) -> None:
    token = auth["Authorization"].split()[1]
    stream = open_wsgi_stream(app, {}, query=f"access_token={token}")
    assert stream.status.startswith("200")
    job_id = submit(client, auth, text="via query token")["job_id"]
    wait_for(lambda: stream.states(job_id) == ["queued"])

    assert client.simulate_get(EVENTS, query_string="access_token=nope").status_code == 401
    assert client.simulate_get(EVENTS).status_code == 401
    elsewhere = client.simulate_get(f"{API}/jobs/{job_id}", query_string=f"access_token={token}")
    assert elsewhere.status_code == 401


def test_a_malformed_last_event_id_is_a_400(
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    result = client.simulate_get(EVENTS, headers={**auth, "Last-Event-ID": "12abc"})
    assert result.status_code == 400
    assert set(result.json) == {"title", "description"}


def test_an_idle_stream_gets_keepalive_comments(
    pool: ConnectionPool[DictConnection], hub: EventHub, auth: dict[str, str],
) -> None:
    app = falcon.App(middleware=[AuthMiddleware(Authenticator(pool))])
    app.add_route(EVENTS, MissionEvents(pool, hub, keepalive=0.05))
    stream = open_wsgi_stream(app, auth, stop_when=lambda s: s.comments.count("keepalive") >= 2)
    assert stream.done.wait(10)
    assert stream.events == []


# --- no gap, no duplicate -----------------------------------------------------------------


def test_reconnecting_with_last_event_id_loses_nothing_and_repeats_nothing(
    app: falcon.App[falcon.Request, falcon.Response], client: falcon.testing.TestClient,
    auth: dict[str, str], caller: Caller, pool: ConnectionPool[DictConnection],
    workers: WorkerHarness,
) -> None:
    first = open_wsgi_stream(app, auth, stop_when=lambda s: len(s.events) >= 1)
    jobs = [submit(client, auth, text=f"job {i}")["job_id"] for i in range(3)]
    assert first.done.wait(10)
    seen = first.ids
    assert 1 <= len(seen) <= 3

    # While disconnected: the rest of the queueing, then every run.
    workers.start()
    wait_for(lambda: all(fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", j)["state"]
                         == "succeeded" for j in jobs))

    second = open_wsgi_stream(app, {**auth, "Last-Event-ID": str(seen[-1])})
    expected = all_event_ids(pool, caller)
    assert len(expected) == 9
    wait_for(lambda: seen + second.ids == expected)
    # A fresh client (no Last-Event-ID) starts from now: no replay, but a resume point.
    fresh = open_wsgi_stream(app, auth)
    assert fresh.events == [] and fresh.ids_only == [expected[-1]]


def test_the_hub_delivers_out_of_order_commits_in_id_order_exactly_once(
    database_url: str, pool: ConnectionPool[DictConnection], client: falcon.testing.TestClient,
    auth: dict[str, str],
) -> None:
    early, late = (submit(client, auth, text=t)["job_id"] for t in ("early", "late"))
    hub = ready_hub(pool)
    sub = hub.subscribe(1, 10, b"token")
    start = hub.cursor
    assert start is not None

    with psycopg.connect(database_url) as slow:
        slow.execute(CANCEL, (early,))          # takes id start + 1; commits last
        with pool.connection() as fast:
            fast.execute(CANCEL, (late,))       # takes id start + 2; commits first
        assert hub.poll_once(full=False) is True, "start + 2 is held back behind start + 1"
        assert hub.poll_once(full=True) is True
        assert sub.wait(0) == [] and hub.cursor == start
    assert hub.poll_once(full=False) is False
    events = sub.wait(0)
    assert [(e.id, str(e.job_id)) for e in events] == [(start + 1, early), (start + 2, late)]
    assert hub.poll_once() is False and sub.wait(0) == []


def test_an_aborted_transaction_leaves_a_gap_the_hub_steps_over(
    database_url: str, pool: ConnectionPool[DictConnection], client: falcon.testing.TestClient,
    auth: dict[str, str],
) -> None:
    doomed, kept = (submit(client, auth, text=t)["job_id"] for t in ("doomed", "kept"))
    hub = ready_hub(pool)
    sub = hub.subscribe(1, 10, b"token")
    start = hub.cursor
    assert start is not None

    with psycopg.connect(database_url) as slow:
        slow.execute(CANCEL, (doomed,))
        with pool.connection() as fast:
            fast.execute(CANCEL, (kept,))
        assert hub.poll_once() is True
        slow.rollback()
    wait_for(lambda: not hub.poll_once())
    assert [(e.id, str(e.job_id)) for e in sub.wait(0)] == [(start + 2, kept)]


def test_out_of_order_commits_reach_live_and_replaying_streams_without_gap_or_duplicate(
    database_url: str, app: falcon.App[falcon.Request, falcon.Response], hub: EventHub,
    client: falcon.testing.TestClient, auth: dict[str, str], caller: Caller,
    pool: ConnectionPool[DictConnection],
) -> None:
    early, late = (submit(client, auth, text=t)["job_id"] for t in ("early", "late"))
    live = open_wsgi_stream(app, auth)
    queued = all_event_ids(pool, caller)

    with psycopg.connect(database_url) as slow:
        slow.execute(CANCEL, (early,))
        with pool.connection() as fast:
            fast.execute(CANCEL, (late,))
        committed_late = last_event_id(pool)
        rounds = hub.rounds
        wait_for(lambda: hub.rounds >= rounds + 2)       # the hub has looked since
        assert hub.cursor is not None and hub.cursor < committed_late
        # A client resuming during the gap gets the replay up to the hub's cursor only.
        resuming = open_wsgi_stream(app, {**auth, "Last-Event-ID": str(queued[0])})
    expected = all_event_ids(pool, caller)
    wait_for(lambda: live.ids == expected[len(queued):])
    wait_for(lambda: resuming.ids == expected[1:])
    assert [e["job_id"] for e in live.events] == [early, late]


def test_a_client_too_far_behind_is_dropped_alone_and_recovers_by_replay(
    pool: ConnectionPool[DictConnection], client: falcon.testing.TestClient,
    auth: dict[str, str], caller: Caller,
) -> None:
    hub = ready_hub(pool, client_buffer=2)
    slow = hub.subscribe(1, 10, b"token")
    fast = hub.subscribe(1, 10, b"token")
    start = hub.cursor
    assert start is not None
    got: list[int] = []
    for i in range(3):
        submit(client, auth, text=f"burst {i}")
        hub.poll_once()
        got += [e.id for e in fast.wait(0)]

    with pytest.raises(SubscriptionClosed, match="behind"):
        slow.wait(0)
    assert got == all_event_ids(pool, caller)
    assert hub.subscriber_count == 1
    replayed = [e.id for page in replay_events(pool, 1, 10, start, hub.cursor or 0, page_size=2)
                for e in page]
    assert replayed == got


# --- polling stays equivalent -------------------------------------------------------------


def test_polling_mission_recent_sees_the_same_final_states_as_the_stream(
    app: falcon.App[falcon.Request, falcon.Response], client: falcon.testing.TestClient,
    auth: dict[str, str], workers: WorkerHarness,
) -> None:
    stream = open_wsgi_stream(app, auth)
    texts = ["fine", "also fine", "rejected [fake:400]", f"sse flaky {uuid.uuid4()} [fake:flaky=1]",
             "never runs"]
    prompts = {t: submit(client, auth, text=t) for t in texts}
    cancel = client.simulate_post(f"{API}/jobs/{prompts['never runs']['job_id']}/cancel", headers=auth)
    assert cancel.status_code == 200
    workers.start()

    polled: dict[str, str] = {}
    cursor: str | None = None

    def poll() -> bool:
        nonlocal cursor
        result = client.simulate_get(f"{API}/mission/recent",
                                     params={"cursor": cursor} if cursor else None, headers=auth)
        assert result.status_code == 200
        cursor = result.json["next_cursor"]
        polled.update({item["prompt_id"]: item["state"] for item in result.json["items"]})
        return len(polled) == len(texts) and set(polled.values()) <= TERMINAL

    wait_for(poll)
    streamed: dict[str, str] = {}

    def finals() -> bool:
        streamed.update({e["prompt_id"]: e["to_state"] for e in stream.events})
        return streamed == polled

    wait_for(finals)
    assert sorted(polled.values()) == ["cancelled", "failed", "succeeded", "succeeded", "succeeded"]


# --- the real web process (gunicorn, gevent) ----------------------------------------------


def _read_until(socks: list[socket.socket], done: Callable[[bytes], bool], timeout: float) -> list[bytes]:
    received = {sock: b"" for sock in socks}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)

        def all_done() -> bool:
            for key, _ready in selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                received[sock] += sock.recv(65536)
            return all(done(data) for data in received.values())

        wait_for(all_done, timeout=timeout, interval=0)
    return [received[sock] for sock in socks]


def test_one_gevent_web_process_holds_100_streams_on_one_listen_connection_and_posts_stay_served(
    settings: Settings, tmp_path: Path, database_url: str, pool: ConnectionPool[DictConnection],
    auth: dict[str, str],
) -> None:
    with gunicorn(settings, tmp_path, SA_SSE_MAX_STREAMS_PER_TOKEN="100") as base:
        baseline = fetch_one(pool, "SELECT count(*) AS n FROM pg_stat_activity "
                                   "WHERE datname = current_database()")["n"]
        socks = raw_streams(base, auth, 100)
        try:
            sessions = fetch_one(pool, "SELECT count(*) AS n FROM pg_stat_activity "
                                       "WHERE datname = current_database()")["n"]
            assert sessions <= baseline + settings.pool_max_size + 1, "a connection per client"
            wait_for(lambda: fetch_one(pool, LISTENERS)["n"] == 1)

            with httpx.Client(base_url=base, headers=auth, timeout=30.0) as http:
                held = http.post(f"{API}/prompt", json={"text": "held"}).json()["job_id"]
                cancelled: list[httpx.Response] = []
                with psycopg.connect(database_url) as locker:
                    locker.execute("SELECT 1 FROM sa_job WHERE id = %s FOR UPDATE", (held,))
                    blocked = threading.Thread(target=lambda: cancelled.append(
                        httpx.post(f"{base}{API}/jobs/{held}/cancel", headers=auth, timeout=30.0)))
                    blocked.start()
                    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM pg_stat_activity "
                                                     "WHERE datname = current_database() "
                                                     "AND wait_event_type = 'Lock'")["n"] == 1)
                    # NOTE: the cancel now waits inside psycopg in the only web process; if that
                    # wait blocked the process (no gevent-aware wait), no POST could be answered.
                    posted = [http.post(f"{API}/prompt", json={"text": f"p{i}"}) for i in range(10)]
                    assert [r.status_code for r in posted] == [202] * 10
                    assert blocked.is_alive() and cancelled == []
                blocked.join(30)
                assert [r.status_code for r in cancelled] == [200]

            assert last_event_id(pool) == 12
            received = _read_until(socks, lambda data: data.count(b"event: job.state_changed") == 12,
                                   timeout=20)
            for data in received:
                got = [int(line.split()[1]) for line in data.decode().splitlines()
                       if line.startswith("id: ")]
                assert got == sorted(set(got)) and len(got) == 12
                assert data.rfind(b'"to_state":"cancelled"') > data.rfind(b'"to_state":"queued"')
        finally:
            for sock in socks:
                sock.close()


def test_poll_only_mode_streams_and_runs_jobs_without_any_listen(
    settings: Settings, tmp_path: Path, pool: ConnectionPool[DictConnection],
    auth: dict[str, str],
) -> None:
    env = {"SA_LISTEN": "0", "SA_POLL_INTERVAL": "0.1"}
    with gunicorn(settings, tmp_path, **env) as base:
        stream = open_http_stream(base, auth)
        worker = subprocess.Popen(
            [sys.executable, "-m", "jobqueue.operator.cli", "run-worker"], cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "DATABASE_URL": settings.database_url,
                 "SA_PROVIDER_URL": settings.provider_url, **env})
        try:
            job_id = httpx.post(f"{base}{API}/prompt", json={"text": "no listen"}, headers=auth,
                                timeout=10).json()["job_id"]
            wait_for(lambda: stream.states(job_id) == ["queued", "running", "succeeded"])
            wait_for(lambda: fetch_one(pool, LISTENERS)["n"] == 0)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=15) == 0


def test_a_long_running_cli_worker_wakes_on_notify_long_before_its_poll(
    settings: Settings, pool: ConnectionPool[DictConnection], client: falcon.testing.TestClient,
    auth: dict[str, str],
) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobqueue.operator.cli", "run-worker"], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "DATABASE_URL": settings.database_url,
             "SA_PROVIDER_URL": settings.provider_url, "SA_POLL_INTERVAL": "600"})
    try:
        wait_for(lambda: fetch_one(pool, LISTENERS)["n"] == 1)
        job_id = submit(client, auth, text="wake the cli worker")["job_id"]
        wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", job_id)["state"]
                 == "succeeded")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0


def test_a_notification_wakes_the_hub_long_before_its_poll(
    pool: ConnectionPool[DictConnection], settings: Settings, client: falcon.testing.TestClient,
    auth: dict[str, str],
) -> None:
    hub = EventHub.from_settings(pool, replace(settings, poll_interval=600.0))
    app = create_app(settings, pool, hub=hub)
    try:
        stream = open_wsgi_stream(app, auth)
        # NOTE: a listener of an earlier test's process may linger a moment in pg_stat_activity
        # after that process exited.
        wait_for(lambda: fetch_one(pool, LISTENERS)["n"] == 1)
        rounds = hub.rounds
        job_id = submit(client, auth, text="notify me")["job_id"]
        wait_for(lambda: stream.states(job_id) == ["queued"])
        assert hub.rounds <= rounds + 2
    finally:
        hub.stop()
