"""OpenAI-compatible fake LLM server for demos and tests (stdlib only).

``POST /chat/completions`` (or ``/v1/chat/completions``) answers a normal ``chat.completion``
whose reply is deterministic, so tests can check how the worker assembled the context::

    "echo[" + str(len(messages)) + "]: "
    + " | ".join(f"{m['role']}:{m['content']}" for m in messages)

e.g. ``echo[2]: system:be brief | user:hi``. Usage counts are whitespace-split word counts of
all message contents (prompt) and of the reply (completion). The id is ``fake-`` + a body hash.

Markers anywhere in the LAST user message pick a behaviour per request (unknown ones are ignored;
latency combines with the rest, otherwise the first failure marker in text order wins):

* ``[fake:latency=S]`` sleep S seconds first; ``[fake:hang]`` never answer.
* ``[fake:429]`` / ``[fake:429=N]`` 429 with ``Retry-After: 1`` / ``N``; ``[fake:429-nohdr]`` none.
* ``[fake:400|401|403|404|422]`` and ``[fake:5xx]`` (a concrete code) answer that status.
* ``[fake:malformed]`` 200 with truncated JSON; ``[fake:empty]`` 200 JSON without ``choices``.
* ``[fake:flaky=K]`` the first K requests with this exact message text answer 503, later ones 200.
* ``[fake:drip=S]`` the normal answer, status line and headers included, one byte every S seconds.
* ``[fake:bytes=N]`` a normal answer whose reply is N characters long.
* ``[fake:nul]`` / ``[fake:surrogate]`` a reply holding a NUL / a lone surrogate (``\\ud800``):
  valid JSON that Postgres cannot store.

A body with ``"stream": true`` gets the reply as OpenAI's server-sent chunks (one per word, a
last chunk with ``finish_reason`` and ``usage``, then ``data: [DONE]``), chunked transfer encoding;
``[fake:stream-gap=S]`` paces the chunks, ``[fake:stream-cut=N]`` drops the first such answer
after N chunks.

``POST /openai/deployments/NAME/chat/completions?api-version=V`` is Azure's path: without an
``api-version`` it answers 404, and errors use Azure's body. With ``api_key`` configured, a call
without the key answers 401 (``Authorization: Bearer KEY``; Azure paths ``api-key: KEY``).
``flavour`` picks the error bodies elsewhere: OpenAI's, vLLM's or Ollama's. With
``throttle_seconds``, every chat call answers 429 (``Retry-After: throttle_retry_after``) for
that long after the first one: a provider throttling the whole deployment.

Server-wide knobs live in :class:`FakeConfig`. ``GET /healthz`` answers ``{"ok": true}``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import random
import re
import select
import signal
import socket
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Literal, cast

import structlog

__all__ = ["FakeConfig", "FakeProvider", "add_arguments", "config_from_args", "serve_forever"]

_log = structlog.get_logger(__name__)

_CHAT_PATHS = frozenset({"/chat/completions", "/v1/chat/completions"})
_AZURE_PATH_RE = re.compile(r"/openai/deployments/[^/]+/chat/completions")
_FLAVOURS = ("openai", "azure", "vllm", "ollama")
_MARKER_RE = re.compile(r"\[fake:([^\]\s]+)\]")
_CLIENT_ERRORS = frozenset({400, 401, 403, 404, 422})
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 422: "invalid_request_error", 429: "rate_limit_error"}
_RECEIVED_MAX = 1000
_POLL_S = 0.05  # NOTE: bounds how long stop() waits on a hanging handler or the serve loop.


@dataclass(frozen=True)
class FakeConfig:
    """Server-wide behaviour; rates are probabilities in [0, 1] drawn per request."""

    latency: float = 0.0
    fail_rate: float = 0.0
    rate_limit_rate: float = 0.0
    hang_rate: float = 0.0
    seed: int | None = None
    verbose: bool = False
    api_key: str | None = None
    flavour: str = "openai"
    throttle_seconds: float = 0.0
    throttle_retry_after: str | None = "1"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError("latency must be a finite number >= 0")
        for name in ("fail_rate", "rate_limit_rate", "hang_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if self.flavour not in _FLAVOURS:
            raise ValueError(f"flavour must be one of: {', '.join(_FLAVOURS)}")


@dataclass(frozen=True)
class _Outcome:
    kind: Literal["ok", "status", "malformed", "empty", "hang", "drip", "bytes", "nul",
                  "surrogate"] = "ok"
    status: int = 200
    retry_after: str | None = None
    amount: float = 0.0


class _Server(ThreadingHTTPServer):
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
        self.rng = random.Random(config.seed)
        self.served = 0
        self.bodies: deque[dict[str, Any]] = deque(maxlen=_RECEIVED_MAX)
        self.flaky_seen: dict[str, int] = {}
        self.first_call: float | None = None
        self.streams_cut = 0
        self.arrivals: deque[tuple[float, bool]] = deque(maxlen=_RECEIVED_MAX)
        self.conns: set[socket.socket] = set()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # NOTE: clients that give up mid-response are normal here; tracebacks only when asked.
        if self.config.verbose and not self.stop_event.is_set():
            _log.info("fake_provider.request_failed", client=client_address[0], exc_info=True)

    def plan(self, text: str) -> tuple[float, _Outcome]:
        """Turn the last user message into (extra latency, outcome), then apply random knobs."""
        latency, outcome = 0.0, None
        for token in _MARKER_RE.findall(text):
            if token.startswith("latency="):
                latency += _nonneg_float(token[8:]) or 0.0
            elif outcome is None:
                outcome = self._marker_outcome(token, text)
        if outcome is None:
            cfg = self.config
            with self.lock:
                draw = self.rng.random()
            if draw < cfg.hang_rate:
                outcome = _Outcome("hang")
            elif draw < cfg.hang_rate + cfg.rate_limit_rate:
                outcome = _Outcome("status", 429, "1")
            elif draw < cfg.hang_rate + cfg.rate_limit_rate + cfg.fail_rate:
                outcome = _Outcome("status", 500)
        return latency, outcome or _Outcome()

    def _marker_outcome(self, token: str, text: str) -> _Outcome | None:
        if token in ("malformed", "empty", "hang", "nul", "surrogate"):
            return _Outcome(cast(Literal["malformed", "empty", "hang", "nul", "surrogate"], token))
        for kind in ("drip", "bytes"):
            if token.startswith(kind + "=") and (amount := _nonneg_float(token[len(kind) + 1:])):
                return _Outcome(kind, amount=amount)
        if token == "429":
            return _Outcome("status", 429, "1")
        if token == "429-nohdr":
            return _Outcome("status", 429)
        if token.startswith("429=") and _nonneg_float(token[4:]) is not None:
            return _Outcome("status", 429, token[4:])
        if token.isdigit() and (int(token) in _CLIENT_ERRORS or 500 <= int(token) <= 599):
            return _Outcome("status", int(token))
        if token.startswith("flaky=") and token[6:].isdigit():
            with self.lock:
                seen = self.flaky_seen.get(text, 0)
                self.flaky_seen[text] = seen + 1
            return _Outcome("status", 503) if seen < int(token[6:]) else None
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # PERF: headers and body go out in separate writes; with Nagle on, the body waits for the
    # client's delayed ACK (about 40 ms a request on keep-alive connections).
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.flavour = self.server.config.flavour
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
            self._send_error(401, _UNAUTHORIZED[self.flavour])
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send_error(400, "Request body is not valid JSON")
            return
        if isinstance(body, dict):
            with self.server.lock:
                self.server.bodies.append(copy.deepcopy(body))
        messages = _valid_messages(body)
        if messages is None:
            self._send_error(400, "Body needs a string 'model' and a 'messages' list of "
                                  "{role, content} strings")
            return
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        latency, outcome = self.server.plan(last_user)
        if self.server.stop_event.wait(self.server.config.latency + latency):
            self.close_connection = True
            return
        self._answer(outcome, body["model"], messages, raw, body.get("stream") is True)

    def _authorized(self, azure: bool) -> bool:
        """Azure's deployments take the key as `api-key`; everyone else as a Bearer token."""
        key = self.server.config.api_key
        if key is None:
            return True
        if azure:
            return self.headers.get("api-key") == key
        return self.headers.get("Authorization") == f"Bearer {key}"

    def _answer(self, outcome: _Outcome, model: str, messages: list[dict[str, str]],
                raw: bytes, stream: bool) -> None:
        if outcome.kind in ("ok", "bytes", "nul", "surrogate"):
            completion = _completion(model, messages, raw, _REPLIES.get(outcome.kind))
            if outcome.kind == "bytes":
                completion["choices"][0]["message"]["content"] = "x" * int(outcome.amount)
            if stream:
                self._stream(completion, _stream_plan(self.server, messages))
            else:
                self._send_json(200, completion)
        elif outcome.kind == "drip":
            self._drip(_completion(model, messages, raw), outcome.amount)
        elif outcome.kind == "hang":
            self._hang()
        elif outcome.kind == "status":
            headers = {"Retry-After": outcome.retry_after} if outcome.retry_after else {}
            self._send_error(outcome.status, f"Fake failure {outcome.status}", headers)
        elif outcome.kind == "malformed":
            self._send(200, b'{"choices": [')
        else:
            self._send_json(200, {"id": "fake-empty", "object": "chat.completion", "model": model})

    def _drip(self, completion: dict[str, Any], interval: float) -> None:
        body = json.dumps(completion).encode()
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

    def _stream(self, completion: dict[str, Any], plan: tuple[float, int | None]) -> None:
        gap, cut_after = plan
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {key: completion[key] for key in ("id", "created", "model")}
        words = completion["choices"][0]["message"]["content"].split(" ")
        chunks = [{**base, "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": {"content": word if i == 0 else " " + word},
                                "finish_reason": None}]} for i, word in enumerate(words)]
        chunks.append({**base, "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "usage": completion["usage"]})
        events = [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks]
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
            readable, _, _ = select.select([self.connection], [], [], _POLL_S)
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return
                except OSError:
                    return
                self.server.stop_event.wait(_POLL_S)  # NOTE: pipelined bytes; avoid a busy loop.

    def _send_error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, _error_body(self.flavour, status, message), headers)

    def _send_json(self, status: int, payload: dict[str, Any],
                   headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


_UNAUTHORIZED = {
    "openai": "Incorrect API key provided.",
    "azure": "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
             "provide a valid key for an active subscription and use a correct regional API "
             "endpoint for your resource.",
    "vllm": "Unauthorized",
    "ollama": "unauthorized",
}


def _error_body(flavour: str, status: int, message: str) -> dict[str, Any]:
    """An error body as each server family writes it (their documented or observed shapes)."""
    if flavour == "azure":
        return {"error": {"code": str(status), "message": message}}
    if flavour == "vllm":
        return {"object": "error", "message": message,
                "type": "BadRequestError" if status < 500 else "InternalServerError",
                "param": None, "code": status}
    if flavour == "ollama":
        return {"error": message}
    kind = _ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}


def _stream_plan(server: _Server, messages: list[dict[str, str]]) -> tuple[float, int | None]:
    """A streamed answer's pace and cut from the last user message's markers:
    ``[fake:stream-gap=S]`` waits S seconds after each chunk; ``[fake:stream-cut=N]`` drops the
    connection after N chunks, the first time this exact text asks (later asks stream whole)."""
    text = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    gap, cut = 0.0, None
    for token in _MARKER_RE.findall(text):
        if token.startswith("stream-gap="):
            gap = _nonneg_float(token[11:]) or 0.0
        elif token.startswith("stream-cut=") and token[11:].isdigit():
            with server.lock:
                seen = server.flaky_seen.get("cut:" + text, 0)
                server.flaky_seen["cut:" + text] = seen + 1
            cut = int(token[11:]) if seen == 0 else None
    return gap, cut


def _nonneg_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _valid_messages(body: Any) -> list[dict[str, str]] | None:
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        return None
    return messages


_REPLIES = {"nul": "a NUL \x00 here", "surrogate": "a lone \ud800 surrogate"}


def _completion(model: str, messages: list[dict[str, str]], raw: bytes,
                reply: str | None = None) -> dict[str, Any]:
    if reply is None:
        reply = f"echo[{len(messages)}]: " + " | ".join(f"{m['role']}:{m['content']}" for m in messages)
    prompt_tokens = sum(len(m["content"].split()) for m in messages)
    completion_tokens = len(reply.split())
    return {
        "id": "fake-" + hashlib.sha256(raw).hexdigest()[:12],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class FakeProvider:
    """Runs the fake server in a background thread (for tests and `sa-core dev`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 config: FakeConfig = FakeConfig()) -> None:
        self._address = (host, port)
        self._config = config
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeProvider:
        """Binds the socket and serves in a daemon thread.

        Returns:
            This provider, so ``FakeProvider().start()`` can be assigned directly.

        Raises:
            OSError: The address cannot be bound.
            RuntimeError: The provider was already started.
        """
        if self._server is not None:
            raise RuntimeError("FakeProvider already started")
        self._server = _Server(self._address, self._config)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": _POLL_S},
                                        name="fake-provider", daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        """Base URL without a trailing slash, e.g. ``http://127.0.0.1:54321``."""
        host, port = self._require().server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def received(self) -> list[dict[str, Any]]:
        """Copies of the last 1000 JSON-object bodies posted to the chat endpoint, oldest first."""
        server = self._require()
        with server.lock:
            return copy.deepcopy(list(server.bodies))

    @property
    def streams_cut(self) -> int:
        """Streamed answers the client stopped reading before their end (its socket closed)."""
        server = self._require()
        with server.lock:
            return server.streams_cut

    @property
    def arrivals(self) -> list[tuple[float, bool]]:
        """(time.monotonic() at arrival, answered 429 by the throttle) of the last 1000 chat calls."""
        server = self._require()
        with server.lock:
            return list(server.arrivals)

    @property
    def requests_served(self) -> int:
        """Number of requests to the chat endpoint so far, failures included."""
        server = self._require()
        with server.lock:
            return server.served

    def stop(self) -> None:
        """Releases hanging handlers, stops serving, closes all sockets and joins the thread."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stop_event.set()
        server.shutdown()
        with server.lock:
            conns = list(server.conns)
        for conn in conns:
            # NOTE: wakes handlers blocked reading an idle keep-alive connection.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _require(self) -> _Server:
        if self._server is None:
            raise RuntimeError("FakeProvider is not running")
        return self._server


def serve_forever(host: str, port: int, config: FakeConfig) -> None:
    """Blocking entry point for the `sa-core fake-provider` CLI command.

    Logs `fake_provider.listening` with the URL (at warning, so that LOG_LEVEL=warning still
    shows it), then serves until SIGINT or SIGTERM and stops cleanly.

    Args:
        host: Interface to bind.
        port: TCP port to bind (0 picks a free one).
        config: Server-wide behaviour.

    Raises:
        OSError: The address cannot be bound.
    """

    def _on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    provider = FakeProvider(host, port, config).start()
    # NOTE: signal handlers can only be installed from the main thread; elsewhere rely on SIGINT.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_term) if main else None
    _log.warning("fake_provider.listening", url=provider.url)
    try:
        while True:
            time.sleep(3600)  # NOTE: sleep is interrupted by the signal's KeyboardInterrupt.
    except KeyboardInterrupt:
        pass
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        provider.stop()


def _fraction(text: str) -> float:
    value = _nonneg_float(text)
    if value is None or value > 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _seconds(text: str) -> float:
    if (value := _nonneg_float(text)) is None:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the fake provider's options to a subcommand parser.

    Args:
        parser: The ``fake-provider`` subcommand parser.
    """
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--port", type=int, default=8090, help="TCP port (0 picks a free one)")
    parser.add_argument("--latency", type=_seconds, default=0.0, help="seconds added per request")
    parser.add_argument("--fail-rate", type=_fraction, default=0.0, help="probability of 500")
    parser.add_argument("--rate-limit-rate", type=_fraction, default=0.0, help="probability of 429")
    parser.add_argument("--hang-rate", type=_fraction, default=0.0, help="probability of no answer")
    parser.add_argument("--seed", type=int, default=None, help="seed for the random choices")
    parser.add_argument("--verbose", action="store_true", help="log one line per request")
    parser.add_argument("--api-key", default=None,
                        help="require this key (Bearer; `api-key` on Azure deployment paths)")
    parser.add_argument("--throttle-seconds", type=_seconds, default=0.0,
                        help="answer every call 429 for this long after the first one")
    parser.add_argument("--flavour", choices=_FLAVOURS, default="openai",
                        help="whose error bodies to answer with (Azure paths always Azure's)")


def config_from_args(args: argparse.Namespace) -> FakeConfig:
    """Builds a :class:`FakeConfig` from options parsed by :func:`add_arguments`.

    Args:
        args: The parsed namespace.

    Returns:
        The server-wide configuration.

    Raises:
        ValueError: A value is out of range.
    """
    return FakeConfig(latency=args.latency, fail_rate=args.fail_rate,
                      rate_limit_rate=args.rate_limit_rate, hang_rate=args.hang_rate,
                      seed=args.seed, verbose=args.verbose, api_key=args.api_key,
                      flavour=args.flavour, throttle_seconds=args.throttle_seconds)
