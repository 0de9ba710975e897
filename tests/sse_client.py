"""SSE clients for the tests: GET /mission/events through the WSGI app in process, over real HTTP,
or on plain sockets, parsed into frames."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import falcon
import falcon.testing
import httpx
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import create_token

__all__ = ["API", "CANCEL", "EVENTS", "Stream", "open_http_stream", "open_wsgi_stream", "raw_streams",
           "token_headers"]

API = "/sa-core/v1"
EVENTS = f"{API}/mission/events"

# NOTE: raw SQL on purpose: an open transaction holding an event id while a later one commits.
CANCEL = "UPDATE sa_job SET state = 'cancelled', finished_at = now() WHERE id = %s"


@dataclass
class Stream:
    """Parsed frames of one SSE response: dispatched events, `id:`-only frames and comments."""

    events: list[dict[str, Any]] = field(default_factory=list)
    deltas: list[dict[str, Any]] = field(default_factory=list)
    order: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ids_only: list[int] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    status: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def feed(self, chunk: bytes) -> None:
        for frame in chunk.decode().split("\n\n"):
            fields: dict[str, str] = {}
            for line in frame.splitlines():
                if line.startswith(":"):
                    self.comments.append(line[1:].strip())
                    continue
                name, _, value = line.partition(":")
                fields[name] = value.lstrip(" ")
            if "data" in fields and fields["event"] == "job.output_delta":
                assert "id" not in fields, "a delta must not move Last-Event-ID"
                self.deltas.append(json.loads(fields["data"]))
                self.order.append((fields["event"], self.deltas[-1]))
            elif "data" in fields:
                assert fields["event"] == "job.state_changed"
                data = json.loads(fields["data"])
                assert int(fields["id"]) == data["id"]
                self.events.append(data)
                self.order.append((fields["event"], data))
            elif "id" in fields:
                self.ids_only.append(int(fields["id"]))
        self.started.set()

    @property
    def ids(self) -> list[int]:
        return [e["id"] for e in self.events]

    def states(self, job_id: str) -> list[str]:
        return [e["to_state"] for e in self.events if e["job_id"] == job_id]


def open_wsgi_stream(
    app: falcon.App[falcon.Request, falcon.Response],
    headers: dict[str, str],
    query: str = "",
    stop_when: Callable[[Stream], bool] | None = None,
    path: str = EVENTS,
) -> Stream:
    """Runs the WSGI app for one SSE request in a thread, iterating the body as a server would.

    The body is closed (like a server does when the client leaves) once `stop_when` holds, or
    ends when the hub closes the subscription (hub.stop() at teardown).
    """
    stream = Stream()
    environ = falcon.testing.create_environ(path=path, query_string=query, headers=headers)

    def start_response(status: str, response_headers: list[tuple[str, str]],
                       exc_info: Any = None) -> Callable[[bytes], object]:
        stream.status = status
        stream.headers = {k.lower(): v for k, v in response_headers}
        return lambda _data: None

    def run() -> None:
        body = app(environ, start_response)
        try:
            for chunk in body:
                stream.feed(chunk)
                if stop_when is not None and stop_when(stream):
                    break
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            stream.started.set()
            stream.done.set()

    threading.Thread(target=run, daemon=True).start()
    assert stream.started.wait(10), "no first chunk: headers were not sent at once"
    return stream


def open_http_stream(base: str, headers: dict[str, str], query: str = "") -> Stream:
    """Follows GET /mission/events over real HTTP in a thread, until the server ends it."""
    stream = Stream()

    def run() -> None:
        try:
            with httpx.stream("GET", f"{base}{EVENTS}{query}", headers=headers,
                              timeout=httpx.Timeout(10.0, read=None)) as response:
                stream.status = str(response.status_code)
                stream.headers = dict(response.headers)
                buffer = b""
                for data in response.iter_bytes():
                    buffer += data
                    frames, sep, buffer = buffer.rpartition(b"\n\n")
                    if sep:
                        stream.feed(frames)
        except httpx.HTTPError:
            pass
        finally:
            stream.started.set()
            stream.done.set()

    threading.Thread(target=run, daemon=True).start()
    assert stream.started.wait(10), "no first chunk: headers were not sent at once"
    return stream


def token_headers(pool: ConnectionPool[DictConnection], org_id: int, user_id: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(pool, org_id, user_id)}"}


def raw_streams(base: str, headers: dict[str, str], count: int) -> list[socket.socket]:
    """Opens `count` SSE requests on plain sockets and waits until each has its first chunk."""
    port = int(base.rsplit(":", 1)[1])
    request = (f"GET {EVENTS} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
               + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(request)
        socks.append(sock)
    for sock in socks:
        head = b""
        while b"retry:" not in head:
            data = sock.recv(4096)
            assert data, "stream closed before its first chunk"
            head += data
        assert head.startswith(b"HTTP/1.1 200")
        sock.setblocking(False)
    return socks
