"""Bounds on what the feeds and reads hand out (docs/limits.md): a long answer travels cut with a
flag and whole from its own route, SSE replay pages and /mission/recent pages stop at their bytes
and miss nothing, a prompt's jobs come in pages that cost their own rows, a delta is bounded, and
non-reading clients of large answers leave the web process small."""

from __future__ import annotations

import array
import fcntl
import socket
import termios
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import falcon.testing
import httpx
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries import mission as mission_q
from jobqueue.core.queries import partial as partial_q
from jobqueue.core.settings import Settings
from service.app import create_app
from service.events.hub import EventHub
from service.events.replay import replay_events
from tests.helpers import WorkerHarness, fetch_all, fetch_one, submit, wait_for
from tests.processes import gunicorn
from tests.sse_client import EVENTS, open_wsgi_stream

API = "/sa-core/v1"
RECENT = f"{API}/mission/recent"


def _app(settings: Settings, pool: ConnectionPool[DictConnection],
         hub: EventHub, **changes: Any) -> falcon.App[falcon.Request, falcon.Response]:
    return create_app(replace(settings, **changes), pool, hub=hub)


def _succeeded(pool: ConnectionPool[DictConnection]) -> int:
    return int(fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'succeeded'")["n"])


# --- a long answer ----------------------------------------------------------------------------


def test_a_long_answer_travels_cut_with_a_flag_and_comes_whole_from_its_route(
    app: falcon.App[falcon.Request, falcon.Response], client: falcon.testing.TestClient,
    auth: dict[str, str], settings: Settings, workers: WorkerHarness,
    other_org_auth: dict[str, str],
) -> None:
    chars = settings.feed_text_max_chars
    stream = open_wsgi_stream(app, auth)
    done = submit(client, auth, text="a long one [fake:bytes=50000]")
    short = submit(client, auth, text="a short one")
    workers.start()
    wait_for(lambda: "succeeded" in stream.states(done["job_id"])
             and "succeeded" in stream.states(short["job_id"]))

    by_job = {e["job_id"]: e for e in stream.events if e["to_state"] == "succeeded"}
    long_event, short_event = by_job[done["job_id"]], by_job[short["job_id"]]
    assert len(long_event["response_text"]) == chars and long_event["response_truncated"] is True
    assert short_event["response_truncated"] is False
    whole = client.simulate_get(f"{API}/responses/{long_event['response_id']}", headers=auth)
    assert whole.status_code == 200 and len(whole.json["content"]) == 50_000
    assert whole.json["content"].startswith(long_event["response_text"])
    assert client.simulate_get(f"{API}/responses/{long_event['response_id']}",
                               headers=other_org_auth).status_code == 404
    assert client.simulate_get(f"{API}/responses/{done['prompt_id']}",
                               headers=auth).status_code == 404, "a prompt is not a response"

    items = {i["job_id"]: i for i in client.simulate_get(RECENT, headers=auth).json["items"]}
    assert len(items[done["job_id"]]["response_text"]) == chars
    assert items[done["job_id"]]["response_truncated"] is True
    assert items[done["job_id"]]["text_truncated"] is False
    assert items[short["job_id"]]["response_truncated"] is False
    prompt = client.simulate_get(f"{API}/prompts/{done['prompt_id']}", headers=auth).json
    assert len(prompt["response"]["content"]) == 50_000


# --- pages bounded by bytes -------------------------------------------------------------------


def test_replay_pages_stop_at_their_bytes_and_the_replay_misses_nothing(
    settings: Settings, pool: ConnectionPool[DictConnection], hub: EventHub,
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    for n in range(8):
        submit(client, auth, text=f"answer {n} [fake:bytes=3000]")
    workers.start()
    wait_for(lambda: _succeeded(pool) == 8)
    last = int(fetch_one(pool, "SELECT max(id) AS n FROM sa_job_event")["n"])
    wait_for(lambda: (hub.wait_ready(1.0) or 0) >= last)

    pages = list(replay_events(pool, 1, 10, 0, last, page_bytes=4096, text_chars=100_000))
    assert [e.id for page in pages for e in page] == list(range(1, last + 1))
    for page in pages:
        texts = [len((e.response_text or "").encode()) for e in page]
        assert sum(texts[:-1]) < 4096, "a page stops once its texts pass the bound"
    assert len(pages) >= 4 and all(len(p[-1].response_text or "") == 3000 for p in pages[:-1])

    replaying = open_wsgi_stream(_app(settings, pool, hub, page_max_bytes=4096,
                                      feed_text_max_chars=100_000),
                                 {**auth, "Last-Event-ID": "0"})
    wait_for(lambda: replaying.ids == list(range(1, last + 1)))


def test_recent_pages_stop_at_their_bytes_and_following_them_misses_nothing(
    settings: Settings, pool: ConnectionPool[DictConnection], hub: EventHub,
    auth: dict[str, str],
) -> None:
    web = falcon.testing.TestClient(_app(settings, pool, hub, page_max_bytes=4096))
    texts = [f"{n:02d} " + "p" * 1500 for n in range(10)]
    for text in texts:
        submit(web, auth, text=text)
    seen: list[str] = []
    cursor = None
    while True:
        page = web.simulate_get(RECENT, headers=auth,
                                params={"limit": 500, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200
        assert len(page.content) < 3 * 4096
        seen += [item["text"] for item in page.json["items"]]
        cursor = page.json["next_cursor"]
        if not page.json["has_more"]:
            break
        assert len(page.json["items"]) <= 3
    assert seen == texts


def test_recent_texts_travel_cut_with_a_flag(
    settings: Settings, pool: ConnectionPool[DictConnection], hub: EventHub, auth: dict[str, str],
) -> None:
    web = falcon.testing.TestClient(_app(settings, pool, hub, feed_text_max_chars=100))
    done = submit(web, auth, text="q" * 250)
    item = web.simulate_get(RECENT, headers=auth).json["items"][0]
    assert (item["text"], item["text_truncated"]) == ("q" * 100, True)
    whole = web.simulate_get(f"{API}/prompts/{done['prompt_id']}", headers=auth).json
    assert whole["prompt"]["content"] == "q" * 250


# --- a prompt's jobs, paged -------------------------------------------------------------------


def _retry_and_cancel(client: falcon.testing.TestClient, auth: dict[str, str], prompt_id: str,
                      times: int) -> None:
    for _ in range(times):
        retried = client.simulate_post(f"{API}/prompts/{prompt_id}/retry", headers=auth)
        assert retried.status_code == 202, retried.text
        cancelled = client.simulate_post(f"{API}/jobs/{retried.json['job_id']}/cancel",
                                         headers=auth)
        assert cancelled.status_code == 200


def _all_pages(client: falcon.testing.TestClient, auth: dict[str, str], prompt_id: str,
               **params: Any) -> list[dict[str, Any]]:
    pages, cursor = [], None
    while True:
        page = client.simulate_get(f"{API}/prompts/{prompt_id}", headers=auth,
                                   params={**params, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        pages.append(page.json)
        cursor = page.json["next_cursor"]
        assert (cursor is not None) == page.json["has_more"]
        if cursor is None:
            return pages


def test_a_prompts_jobs_come_newest_first_in_pages_with_its_response_on_each(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    done = submit(client, auth, text="answered once")
    workers.build().run(once=True)
    assert _succeeded(pool) == 1
    _retry_and_cancel(client, auth, done["prompt_id"], 24)

    pages = _all_pages(client, auth, done["prompt_id"], limit=7)
    assert [len(p["jobs"]) for p in pages] == [7, 7, 7, 4]
    jobs = [job["id"] for p in pages for job in p["jobs"]]
    newest_first = [str(r["id"]) for r in fetch_all(
        pool, "SELECT id FROM sa_job WHERE prompt_id = %s ORDER BY created_at DESC, id",
        done["prompt_id"])]
    assert jobs == newest_first and len(set(jobs)) == 25
    assert {p["response"]["content"] for p in pages} == {pages[0]["response"]["content"]}
    assert pages[0]["response"]["content"].startswith("")
    assert len(client.simulate_get(f"{API}/prompts/{done['prompt_id']}", headers=auth)
               .json["jobs"]) == 20
    for limit in (0, 101):
        assert client.simulate_get(f"{API}/prompts/{done['prompt_id']}", headers=auth,
                                   params={"limit": limit}).status_code == 400


def test_a_prompts_jobs_page_stops_at_its_bytes(
    settings: Settings, pool: ConnectionPool[DictConnection], hub: EventHub,
    auth: dict[str, str],
) -> None:
    web = falcon.testing.TestClient(_app(settings, pool, hub, page_max_bytes=2048))
    done = submit(web, auth, text="big options", options={"system": "s" * 900})
    web.simulate_post(f"{API}/jobs/{done['job_id']}/cancel", headers=auth)
    _retry_and_cancel(web, auth, done["prompt_id"], 5)
    pages = _all_pages(web, auth, done["prompt_id"], limit=100)
    assert [len(p["jobs"]) for p in pages] == [3, 3]


def test_a_page_of_jobs_reads_its_own_rows_whatever_the_statistics_say(
    pool: ConnectionPool[DictConnection], truncated_tables: None,
) -> None:
    # NOTE: statistics taken while one prompt's 5,000 retries were the whole table, then 20,000
    # newer jobs of other prompts: a walk of sa_job_created_idx would read them all.
    prompt = uuid.uuid4()
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        conn.execute("ALTER TABLE sa_job DISABLE TRIGGER USER")
        conn.execute("INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, "
                     "content) VALUES (%s, 'prompt', 1, 1, %s, 'x')", (prompt, prompt))
        conn.execute("INSERT INTO sa_job (id, prompt_id, org_id, created_by, state, created_at, "
                     "finished_at) SELECT gen_random_uuid(), %s, 1, 1, 'cancelled', "
                     "now() - interval '1 day' - n * interval '1 second', now() "
                     "FROM generate_series(1, 5000) n", (prompt,))
        conn.execute("ANALYZE sa_job")
        conn.execute("INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, "
                     "content) SELECT g, 'prompt', 1, 1, g, 'x' "
                     "FROM (SELECT gen_random_uuid() AS g FROM generate_series(1, 20000)) s")
        conn.execute("INSERT INTO sa_job (id, prompt_id, org_id, created_by, state, created_at, "
                     "finished_at) SELECT gen_random_uuid(), id, 1, 1, 'cancelled', now(), now() "
                     "FROM sa_entity WHERE id <> %s", (prompt,))
        middle = conn.execute("SELECT created_at, id FROM sa_job WHERE prompt_id = %s "
                              "ORDER BY created_at DESC, id OFFSET 2500 LIMIT 1",
                              (prompt,)).fetchone()
        assert middle is not None
        for before in ((None, None), (middle["created_at"], middle["id"])):
            scans = _sa_job_scans(conn, job_q.JOB_LIST_FOR_PROMPT_PAGE, {
                "prompt_id": prompt, "org_id": 1, "before_at": before[0], "before_id": before[1],
                "limit": 21, "max_bytes": 1 << 20})
            # NOTE: the LIMIT, and the one row the window reads ahead.
            assert [(n["Index Name"], n["Actual Rows"] <= 22) for n in scans] == [
                ("sa_job_prompt_idx", True)], scans
        scans = _sa_job_scans(conn, job_q.JOB_GET_LATEST_RESPONSE_ID_FOR_PROMPT,
                              {"prompt_id": prompt, "org_id": 1})
        assert [n["Index Name"] for n in scans] == ["sa_job_prompt_idx"], scans
        scans = _sa_job_scans(conn, mission_q.MISSION_PROMPTS_LATEST, {
            "prompt_ids": [prompt], "org_id": 1, "text_chars": 100, "max_bytes": 1 << 20})
        assert [(n["Index Name"], n["Actual Rows"]) for n in scans] == [("sa_job_prompt_idx", 1)]


def _sa_job_scans(conn: DictConnection, statement: str,
                  params: dict[str, Any]) -> list[dict[str, Any]]:
    """The reads of sa_job in the executed plan of `statement`, run as lookup.py runs it."""
    with conn.transaction(force_rollback=True):
        conn.execute(job_q.JOB_PAGE_PLAN_SETTINGS)
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchone()
    assert row is not None

    def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node] + [n for child in node.get("Plans", []) for n in walk(child)]

    return [n for n in walk(row["QUERY PLAN"][0]["Plan"]) if n.get("Relation Name") == "sa_job"]


# --- deltas -----------------------------------------------------------------------------------


def test_a_delta_carries_at_most_the_text_bound_and_its_offset_shows_the_rest(
    app: falcon.App[falcon.Request, falcon.Response], client: falcon.testing.TestClient,
    auth: dict[str, str], settings: Settings, pool: ConnectionPool[DictConnection],
) -> None:
    chars = settings.feed_text_max_chars
    stream = open_wsgi_stream(app, auth)
    done = submit(client, auth, text="streamed")
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET state = 'running', worker_claim = 'w1', claimed_at = "
                     "now(), started_at = now(), running_heartbeat_at = now() WHERE id = %s",
                     (done["job_id"],))
    wait_for(lambda: stream.states(done["job_id"]) == ["queued", "running"])
    with pool.connection() as conn:
        conn.execute(partial_q.JOB_DELTA_APPEND_MANY_IF_CLAIMED, {
            "job_id": [uuid.UUID(done["job_id"])], "claim": ["w1"], "attempt": [1], "offset": [0],
            "text": ["t" * 50_000]})
    wait_for(lambda: stream.deltas)
    assert [(d["offset"], len(d["text"])) for d in stream.deltas] == [(50_000 - chars, chars)]
    job = client.simulate_get(f"{API}/jobs/{done['job_id']}", headers=auth).json
    assert len(job["partial_text"]) == 50_000


# --- clients that do not read -----------------------------------------------------------------


def _web_worker_rss(port: int) -> int:
    """The resident bytes of the gunicorn worker serving `port` (the child, not the master)."""
    marker = f"PORT={port}".encode()
    found: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"gunicorn" not in (proc / "cmdline").read_bytes():
                continue
            if marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            status = (proc / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        found[int(proc.name)] = int(fields["PPid"])
    (worker,) = [pid for pid, parent in found.items() if parent in found]
    status = (Path("/proc") / str(worker) / "status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmRSS:"))) * 1024


def _pending(sock: socket.socket) -> int:
    """Bytes the kernel holds for this socket, unread."""
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    return count[0]


@pytest.fixture
def non_readers() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def test_clients_that_never_read_replays_of_large_answers_leave_the_web_small(
    settings: Settings, tmp_path: Path, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection], non_readers: list[socket.socket],
) -> None:
    # NOTE: the texts are not cut here (2 M characters), so only the pages' byte bound keeps a
    # replay page small: without it each stream's first page would hold all 20 MB of answers.
    with gunicorn(settings, tmp_path, SA_FEED_TEXT_MAX_CHARS="2000000",
                  SA_PAGE_MAX_BYTES="1048576", SA_SSE_MAX_STREAMS_PER_TOKEN="20") as base, httpx.Client(
            base_url=base, headers=auth, timeout=30.0) as http:
        for n in range(20):
            assert http.post(f"{API}/prompt", json={
                "text": f"megabyte {n} [fake:bytes=1000000]"}).status_code == 202
        workers.start()
        wait_for(lambda: _succeeded(pool) == 20, timeout=60)
        last = int(fetch_one(pool, "SELECT max(id) AS n FROM sa_job_event")["n"])
        port = int(base.rsplit(":", 1)[1])
        # NOTE: one client that reads the whole replay first, so the baseline includes it.
        with http.stream("GET", EVENTS, headers={"Last-Event-ID": "0"}) as reading:
            tail, end = b"", f"id: {last}\n".encode()
            for chunk in reading.iter_bytes():
                tail = tail[-len(end):] + chunk
                if end in tail:
                    break
        baseline = _web_worker_rss(port)

        request = (f"GET {EVENTS} HTTP/1.1\r\nHost: 127.0.0.1\r\nLast-Event-ID: 0\r\n"
                   f"Authorization: {auth['Authorization']}\r\n\r\n").encode()
        for _ in range(10):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(request)
            non_readers.append(sock)
        # NOTE: a socket's kernel buffer fills only once the server writes the replay's first
        # page, so every stream has read its page (and is stuck writing it) when this holds.
        wait_for(lambda: all(_pending(sock) >= 2048 for sock in non_readers), timeout=30)
        grown = _web_worker_rss(port) - baseline
        assert grown < 150 * 1024 * 1024, f"the web grew by {grown / 2**20:.0f} MiB"
        assert http.get("/healthz").status_code == 200
        stopping = time.monotonic()
    # NOTE: the streams stuck writing to these clients are cut when the web is told to stop;
    # without that, a stop waits gunicorn's graceful_timeout (the helper kills it after 15 s).
    assert time.monotonic() - stopping < 8
