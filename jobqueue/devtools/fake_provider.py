"""OpenAI-compatible fake LLM server for demos and tests (stdlib only): start, stop and the
`sa-core fake-provider` command.

``POST /chat/completions`` (or ``/v1/chat/completions``) answers a normal ``chat.completion``
whose reply is deterministic, so tests can check how the worker assembled the context::

    "echo[" + str(len(messages)) + "]: "
    + " | ".join(f"{m['role']}:{m['content']}" for m in messages)

e.g. ``echo[2]: system:be brief | user:hi``. Usage counts are whitespace-split word counts of
all message contents (prompt) and of the reply (completion). The id is ``fake-`` + a body hash.

Markers in the last user message (``[fake:429]``, ``[fake:latency=S]``, ...) pick a behaviour
per request; jobqueue/devtools/fake_markers.py lists and parses them.

A body with ``"stream": true`` gets the reply as OpenAI's server-sent chunks (one per word, a
last chunk with ``finish_reason`` and ``usage``, then ``data: [DONE]``), chunked transfer encoding.

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
import signal
import socket
import threading
import time
from types import FrameType, TracebackType
from typing import Any

import structlog

from jobqueue.devtools.fake_markers import FLAVOURS, FakeConfig, nonneg_float
from jobqueue.devtools.fake_server import POLL_S, FakeServer

__all__ = ["FakeConfig", "FakeProvider", "add_arguments", "config_from_args", "serve_forever"]

_log = structlog.get_logger(__name__)

_DEFAULT_CONFIG = FakeConfig()


class FakeProvider:
    """Runs the fake server in a background thread (for tests and `sa-core dev`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 config: FakeConfig = _DEFAULT_CONFIG) -> None:
        self._address = (host, port)
        self._config = config
        self._server: FakeServer | None = None
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
        self._server = FakeServer(self._address, self._config)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": POLL_S},
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
    def limited(self) -> int:
        """Chat calls answered 429 because they went past the server's --rpm/--tpm."""
        return self._require().limits.limited

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

    def _require(self) -> FakeServer:
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
    value = nonneg_float(text)
    if value is None or value > 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _seconds(text: str) -> float:
    if (value := nonneg_float(text)) is None:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def _positive(text: str) -> float:
    if not (value := nonneg_float(text)):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
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
    parser.add_argument("--flavour", choices=FLAVOURS, default="openai",
                        help="whose error bodies to answer with (Azure paths always Azure's)")
    parser.add_argument("--rpm", type=_count, default=0,
                        help="requests per limit window (0: none); past it 429, and "
                             "x-ratelimit-* headers on every answer")
    parser.add_argument("--tpm", type=_count, default=0,
                        help="tokens per limit window (prompt + max_tokens; 0: none)")
    parser.add_argument("--limit-window", type=_positive, default=60.0,
                        help="seconds of the --rpm/--tpm window (60)")


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
                      flavour=args.flavour, throttle_seconds=args.throttle_seconds,
                      rpm=args.rpm, tpm=args.tpm, limit_window=args.limit_window)
