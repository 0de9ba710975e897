"""The fake provider's HTTP server: routes, keep-alive, authorization, the throttle, and the
sending of each answer (plain, dripped, streamed, hung); what a request gets is decided in
jobqueue/devtools/fake_markers.py and its bodies built in jobqueue/devtools/fake_answers.py."""

from __future__ import annotations

import copy
import json
import re
import select
import socket
import threading
import time
import urllib.parse
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from jobqueue.devtools.fake_answers import (
    REPLIES,
    UNAUTHORIZED,
    completion,
    error_body,
    max_tokens_of,
    stream_events,
    valid_messages,
)
from jobqueue.devtools.fake_limits import ProviderLimits
from jobqueue.devtools.fake_markers import FakeConfig, Markers, Outcome

__all__ = ["POLL_S", "FakeServer"]

_log = structlog.get_logger(__name__)

_CHAT_PATHS = frozenset({"/chat/completions", "/v1/chat/completions"})
_AZURE_PATH_RE = re.compile(r"/openai/deployments/[^/]+/chat/completions")
_RECEIVED_MAX = 1000
POLL_S = 0.05  # NOTE: bounds how long stop() waits on a hanging handler or the serve loop.


class FakeServer(ThreadingHTTPServer):
    """The server and what its handlers share: the config, the markers' memory, the records."""

    daemon_threads = True
    allow_reuse_address = True
    # NOTE: idle keep-alive handlers would make server_close() wait for clients; stop() closes them.
    block_on_close = False
    # NOTE: socketserver's default backlog of 5 resets connections when a worker's job threads
    # all connect at once; a real provider's listen queue is far deeper.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], config: FakeConfig) -> None:
        super().__init__(address, _Handler)
        self.config = config
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.markers = Markers(config)
        self.limits = ProviderLimits(config.rpm, config.tpm, config.limit_window)
        self.served = 0
        self.bodies: deque[dict[str, Any]] = deque(maxlen=_RECEIVED_MAX)
        self.first_call: float | None = None
        self.streams_cut = 0
        self.arrivals: deque[tuple[float, bool]] = deque(maxlen=_RECEIVED_MAX)
        self.conns: set[socket.socket] = set()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # NOTE: clients that give up mid-response are normal here; tracebacks only when asked.
        if self.config.verbose and not self.stop_event.is_set():
            _log.info("fake_provider.request_failed", client=client_address[0], exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # PERF: headers and body go out in separate writes; with Nagle on, the body waits for the
    # client's delayed ACK (about 40 ms a request on keep-alive connections).
    disable_nagle_algorithm = True
    server: FakeServer

    def setup(self) -> None:
        super().setup()
        self.flavour = self.server.config.flavour
        # NOTE: the x-ratelimit-* headers of the request being answered (its limits' state).
        self.limit_headers: dict[str, str] = {}
        with self.server.lock:
            self.server.conns.add(self.connection)

    def finish(self) -> None:
        with self.server.lock:
            self.server.conns.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.config.verbose:
            _log.info("fake_provider.request", client=self.client_address[0], line=format % args)

    def do_GET(self) -> None:
        if self._read_body() is None:
            return
        if self.path == "/healthz":
            self._send_json(200, {"ok": True})
        else:
            self._send_error(404, "Not found")

    def do_OTHER(self) -> None:
        if self._read_body() is not None:
            self._send_error(404, "Not found")

    do_PUT = do_PATCH = do_DELETE = do_OTHER

    def _read_body(self) -> bytes | None:
        # NOTE: keep-alive needs the whole body consumed; without a usable length we answer
        # 400 and drop the connection rather than guess where the next request starts.
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._send_error(400, "Invalid Content-Length")
            return None
        return self.rfile.read(length)

    def do_POST(self) -> None:
        raw = self._read_body()
        if raw is None:
            return
        self.limit_headers = {}
        url = urllib.parse.urlsplit(self.path)
        azure = _AZURE_PATH_RE.fullmatch(url.path) is not None
        self.flavour = "azure" if azure else self.server.config.flavour
        if url.path not in _CHAT_PATHS and not azure:
            self._send_error(404, "Not found")
            return
        with self.server.lock:
            self.server.served += 1
            now = time.monotonic()
            if self.server.first_call is None:
                self.server.first_call = now
            throttled = now - self.server.first_call < self.server.config.throttle_seconds
            self.server.arrivals.append((now, throttled))
        if throttled:
            retry_after = self.server.config.throttle_retry_after
            self._send_error(429, "Rate limit reached for requests",
                             {"Retry-After": retry_after} if retry_after else None)
            return
        if azure and "api-version" not in urllib.parse.parse_qs(url.query):
            self._send_error(404, "Resource not found")
            return
        if not self._authorized(azure):
            self._send_error(401, UNAUTHORIZED[self.flavour])
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send_error(400, "Request body is not valid JSON")
            return
        if isinstance(body, dict):
            with self.server.lock:
                self.server.bodies.append(copy.deepcopy(body))
        messages = valid_messages(body)
        if messages is None:
            self._send_error(400, "Body needs a string 'model' and a 'messages' list of "
                                  "{role, content} strings")
            return
        max_tokens = max_tokens_of(body)
        if self.server.limits.active and not self._within_limits(messages, raw, max_tokens):
            return
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        latency, outcome = self.server.markers.plan(last_user)
        if self.server.stop_event.wait(self.server.config.latency + latency):
            self.close_connection = True
            return
        self._answer(outcome, body["model"], messages, raw, body.get("stream") is True,
                     max_tokens)

    def _within_limits(self, messages: list[dict[str, str]], raw: bytes,
                       max_tokens: int | None) -> bool:
        """Counts the call against the server's rpm/tpm (its prompt's tokens and `max_tokens`,
        else its reply's); answers 429 and returns False past them."""
        usage = completion("m", messages, raw, max_tokens=max_tokens)["usage"]
        admission = self.server.limits.admit(
            usage["prompt_tokens"] + (max_tokens or usage["completion_tokens"]))
        self.limit_headers = admission.headers
        if not admission.allowed:
            self._send_error(429, "Rate limit reached for tokens or requests",
                             {"Retry-After": admission.retry_after or "1"})
        return admission.allowed

    def _authorized(self, azure: bool) -> bool:
        """Azure's deployments take the key as `api-key`; everyone else as a Bearer token."""
        key = self.server.config.api_key
        if key is None:
            return True
        if azure:
            return self.headers.get("api-key") == key
        return self.headers.get("Authorization") == f"Bearer {key}"

    def _answer(self, outcome: Outcome, model: str, messages: list[dict[str, str]],
                raw: bytes, stream: bool, max_tokens: int | None) -> None:
        if outcome.kind in ("ok", "bytes", "nul", "surrogate"):
            answer = completion(model, messages, raw, REPLIES.get(outcome.kind),
                                max_tokens if outcome.kind == "ok" else None)
            if outcome.kind == "bytes":
                answer["choices"][0]["message"]["content"] = "x" * int(outcome.amount)
            if stream:
                last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"),
                                 "")
                self._stream(answer, self.server.markers.stream_plan(last_user))
            else:
                self._send_json(200, answer)
        elif outcome.kind == "drip":
            self._drip(completion(model, messages, raw), outcome.amount)
        elif outcome.kind == "hang":
            self._hang()
        elif outcome.kind == "status":
            headers = {"Retry-After": outcome.retry_after} if outcome.retry_after else {}
            self._send_error(outcome.status, f"Fake failure {outcome.status}", headers)
        elif outcome.kind == "malformed":
            self._send(200, b'{"choices": [')
        else:
            self._send_json(200, {"id": "fake-empty", "object": "chat.completion", "model": model})

    def _drip(self, reply: dict[str, Any], interval: float) -> None:
        body = json.dumps(reply).encode()
        answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        self.close_connection = True
        for i in range(len(answer)):
            if self.server.stop_event.wait(interval):
                return
            try:
                self.wfile.write(answer[i:i + 1])
            except OSError:
                return

    def _stream(self, answer: dict[str, Any], plan: tuple[float, int | None]) -> None:
        gap, cut_after = plan
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in self.limit_headers.items():
            self.send_header(name, value)
        self.end_headers()
        events = stream_events(answer)
        for n, event in enumerate([*events, b"data: [DONE]\n\n", b""]):
            if n == cut_after:
                # NOTE: the connection drops mid-answer, as a provider restart would do it.
                self.close_connection = True
                return
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            except OSError:
                with self.server.lock:
                    self.server.streams_cut += 1
                self.close_connection = True
                return
            if gap and event and self.server.stop_event.wait(gap):
                return

    def _hang(self) -> None:
        # NOTE: poll rather than sleep once, so stop() is prompt and a client that gave up
        # (peer closed: readable with no data) frees this thread.
        self.close_connection = True
        while not self.server.stop_event.is_set():
            readable, _, _ = select.select([self.connection], [], [], POLL_S)
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return
                except OSError:
                    return
                self.server.stop_event.wait(POLL_S)  # NOTE: pipelined bytes; avoid a busy loop.

    def _send_error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, error_body(self.flavour, status, message), headers)

    def _send_json(self, status: int, payload: dict[str, Any],
                   headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**self.limit_headers, **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
