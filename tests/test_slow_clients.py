"""Hostile clients over real sockets against gunicorn as the Procfile runs it (gevent): a token is
judged from headers before any body byte, a slow body gets 408 and frees its slot, an aborted or
malformed body or header is a 4xx, and no secret reaches the web's output."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from tests.helpers import REPO, fetch_one
from tests.processes import gunicorn

API = "/sa-core/v1"
PROMPT = f"{API}/prompt"


def connect(base: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10)


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode("latin-1")


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Reads one response with a Content-Length body: status, headers, body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before an answer: {data!r}"
        data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def json_post(token: str | None, length: int, **extra: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Content-Length": str(length), **extra}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


@pytest.fixture
def token(auth: dict[str, str]) -> str:
    return auth["Authorization"].split()[1]


def test_a_request_without_a_valid_token_is_refused_before_its_body_is_sent(
    settings: Settings, tmp_path: Path, token: str, pool: ConnectionPool[DictConnection],
) -> None:
    forms = [json_post(None, 10_000), json_post("sa_not-a-token", 10_000),
             {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
             {"Authorization": "Bearer sa_nope", "Transfer-Encoding": "chunked"}]
    with gunicorn(settings, tmp_path) as base:
        for headers in forms:
            for path in (PROMPT, f"{API}/jobs/{uuid.uuid4()}/cancel", "//sa-core/v1/prompt"):
                with connect(base) as sock:
                    sock.sendall(head("POST", path, headers))
                    status, _, body = answer(sock)
                    assert status == 401, (headers, path, body)
                    assert set(json.loads(body)) == {"title", "description"}
        body = b'{"text": "ok"}'
        with connect(base) as sock:
            sock.sendall(head("POST", PROMPT, json_post(token, len(body))) + body)
            assert answer(sock)[0] == 202
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 1


def test_slow_bodies_get_408_and_free_their_slots_for_others(
    settings: Settings, tmp_path: Path, token: str,
) -> None:
    env = {"SA_WEB_CONNECTIONS": "40", "SA_BODY_TIMEOUT": "1"}
    with gunicorn(settings, tmp_path, **env) as base:
        slow = [connect(base) for _ in range(40)]
        try:
            for sock in slow:
                sock.sendall(head("POST", PROMPT, json_post(token, 100)) + b"{")
            # NOTE: every slot is taken now; /healthz is answered once the deadline frees them.
            assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
            for sock in slow:
                status, _, body = answer(sock)
                assert status == 408
                assert json.loads(body)["title"] == "Request timeout"
        finally:
            for sock in slow:
                sock.close()


def test_a_body_dripped_a_byte_at_a_time_is_cut_at_the_deadline(
    settings: Settings, tmp_path: Path, token: str,
) -> None:
    with gunicorn(settings, tmp_path, SA_BODY_TIMEOUT="1") as base, connect(base) as sock:
        sock.sendall(head("POST", PROMPT, json_post(token, 1000)))
        stop = threading.Event()

        def drip() -> None:
            while not stop.wait(0.1):
                try:
                    sock.send(b" ")
                except OSError:
                    return

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        try:
            assert answer(sock)[0] == 408
        finally:
            stop.set()
            dripper.join(5)


@pytest.mark.parametrize("body", [b"5\r\nab", b"zz\r\nabc\r\n0\r\n\r\n", b"3\r\nabcdef\r\n"],
                         ids=["aborted", "bad-size", "bad-terminator"])
def test_an_aborted_or_malformed_chunked_body_is_a_4xx_never_a_500(
    settings: Settings, tmp_path: Path, token: str, body: bytes,
    pool: ConnectionPool[DictConnection],
) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Transfer-Encoding": "chunked"}
    with gunicorn(settings, tmp_path) as base, connect(base) as sock:
        sock.sendall(head("POST", PROMPT, headers) + body)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        # NOTE: a clean close without an answer is fine too (the client left); a 5xx never is.
        if data:
            status = int(data.split()[1])
            assert 400 <= status < 500, data
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 0


MALFORMED = [
    ("Content-Length", "abc"), ("Content-Length", "-1"), ("Content-Length", "1e3"),
    ("Content-Length", "99999999999999999999999999"), ("Authorization", "Bearer sa_\xe9\xe9"),
    ("Authorization", "B\xe9arer x"), ("X-Request-ID", "\xff" * 10), ("Idempotency-Key", "\xe9"),
    ("Content-Type", "\xe9/\xe9"), ("Transfer-Encoding", "gzip, chunked, identity"),
]


def test_malformed_headers_over_a_real_socket_answer_4xx(
    settings: Settings, tmp_path: Path, token: str, pool: ConnectionPool[DictConnection],
) -> None:
    with gunicorn(settings, tmp_path) as base:
        for name, value in MALFORMED:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                       name: value}
            with connect(base) as sock:
                sock.sendall(head("POST", PROMPT, headers) + b'{"text": "x"}')
                status = int(sock.recv(65536).split()[1])
                assert 400 <= status < 500, (name, value, status)
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 0


def test_no_token_or_database_password_reaches_the_web_output(
    settings: Settings, tmp_path: Path, token: str,
) -> None:
    password = "db-secret-" + uuid.uuid4().hex
    url = make_conninfo(settings.database_url, password=password)
    bad_token = "sa_bad-" + uuid.uuid4().hex
    # NOTE: a web process writes its log to tmp_path/gunicorn-<port>.log (tests.test_sse.gunicorn).
    with gunicorn(replace(settings, database_url=url), tmp_path) as base:
        with httpx.Client(base_url=base, timeout=10) as http:
            assert http.post(PROMPT, json={"text": "x"},
                             headers={"Authorization": f"Bearer {token}"}).status_code == 202
            assert http.get(f"{API}/mission/recent", headers={
                "Authorization": f"Bearer {bad_token}"}).status_code == 401
            assert http.get(f"{API}/mission/events", params={"access_token": bad_token}).status_code == 401
            assert http.post(PROMPT, content=b"{", headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"}).status_code == 400
        with connect(base) as sock:
            sock.sendall(head("POST", f"{PROMPT}?access_token={bad_token}",
                              json_post(token, 5)) + b"5\r\nab")
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
    output = "".join(p.read_text(errors="replace") for p in tmp_path.glob("gunicorn-*.log"))
    assert "http.request" in output
    for secret in (password, token, bad_token):
        assert secret not in output


def test_a_malformed_database_url_never_prints_its_password(settings: Settings, tmp_path: Path) -> None:
    password = "db-secret-" + uuid.uuid4().hex
    env = {**os.environ, "DATABASE_URL": f"postgres//sa:{password}@127.0.0.1/sa", "PORT": "0",
           "WEB_CONCURRENCY": "1"}
    web = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "python:service.gunicorn_conf", "service.app:create_app()"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert web.returncode != 0
    assert "malformed" in web.stdout + web.stderr
    assert password not in web.stdout + web.stderr


def test_a_slow_body_gets_408_under_the_threaded_worker_too(
    settings: Settings, tmp_path: Path, token: str,
) -> None:
    env = {"SA_WEB_WORKER_CLASS": "gthread", "SA_BODY_TIMEOUT": "1"}
    with gunicorn(settings, tmp_path, **env) as base, connect(base) as sock:
        sock.sendall(head("POST", PROMPT, json_post(token, 100)) + b"{")
        status, _, body = answer(sock)
        assert status == 408 and json.loads(body)["title"] == "Request timeout"


def test_a_client_that_never_finishes_its_headers_is_let_go(
    settings: Settings, tmp_path: Path,
) -> None:
    with gunicorn(settings, tmp_path, SA_WEB_CONNECTIONS="5") as base:
        stalled = [connect(base) for _ in range(5)]
        try:
            for sock in stalled:
                sock.sendall(b"POST /sa-core/v1/prompt HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            # NOTE: gunicorn's keep-alive (2 s, service/gunicorn_conf.py) bounds the header wait.
            for sock in stalled:
                assert sock.recv(65536) == b""
            assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        finally:
            for sock in stalled:
                sock.close()
