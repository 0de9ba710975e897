"""The OpenAI-compatible provider adapter: keep-alive stdlib HTTP per job, one deadline, typed failures.

The client and its routes live here; the sockets and their deadline in provider_transport.py,
the reading of an answer in provider_answer.py.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from jobqueue.core import metrics
from jobqueue.core.policy import ErrorKind, classify_status, parse_retry_after
from jobqueue.core.redact import redact
from jobqueue.core.routes import Route, Routes
from jobqueue.core.settings import DEFAULT_MAX_RESPONSE_BYTES
from jobqueue.core.token_estimate import RateLimitHeaders
from jobqueue.runtime.provider_answer import (
    Completion,
    ProviderFailure,
    TooLarge,
    completion_from,
    elapsed_ms,
    error_message,
    parse_answer,
)
from jobqueue.runtime.provider_stream import ChunkedBody, StreamedAnswer, poller
from jobqueue.runtime.provider_transport import (
    Connection,
    DeadlineReader,
    SourceAddresses,
    TLSConnection,
    cut,
    environment_proxy,
    idle_socket_readable,
    proxy_authorization,
    remaining,
    request_head,
)
from jobqueue.runtime.run_control import CallAbandoned, RunControl

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "Provider", "RoutedProviders"]

# NOTE: connecting takes at most this long by default (or the call's deadline, if sooner).
DEFAULT_CONNECT_TIMEOUT = 10.0


class Provider:
    """Calls `{base_url}/chat/completions` over keep-alive connections, one per call in flight.

    PERF: the stdlib client measured at about half urllib3's CPU per call and a thirtieth of
    httpx's at 1,024 calls in flight (docs/decisions.md); a
    connection of its own per call means no pool lock to queue on. Between calls a connection
    waits on a stack that any thread takes from (a deque's append and pop need no lock), so the
    connections open are the most calls ever in flight at once, not the job threads (of which
    there are more, while finished calls wait for their finalize). Safe to share between threads
    and greenlets. An http:// proxy named by HTTPS_PROXY / HTTP_PROXY / ALL_PROXY is used unless
    NO_PROXY exempts the provider's host (https through a CONNECT tunnel, http by absolute URL).

    Every call ends by `timeout` seconds of wall clock whatever the server does (each socket
    wait is bounded by what is left of it), and reads at most `max_response_bytes`.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float,
        *,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = 0.0,
        sources: SourceAddresses | None = None,
    ) -> None:
        """Checks the URL and the environment's proxy once.

        Args:
            base_url: `http(s)://host[:port][/path][?query]`; the query string is kept on every call.
            api_key: sent as `Authorization: Bearer ...` when not empty.
            timeout: the wall-clock deadline of one call, in seconds.
            max_response_bytes: a larger answer fails the call (`parse`, not retried).
            headers: more request headers (e.g. Azure's `api-key`); they win over the defaults.
            connect_timeout: longest wait for the TCP (and TLS, and proxy) connection.
            read_timeout: longest wait for the next bytes once the request is sent (0: only the
                deadline); a streamed answer that keeps coming is never cut by it.
            sources: local addresses new connections take in turn (None: the kernel's choice).

        Raises:
            ValueError: the URL, the proxy or a header is unusable (the message names no password
                nor key).
        """
        url = urllib.parse.urlsplit(base_url)
        try:
            port = url.port
        except ValueError:
            port = -1
        if url.scheme not in ("http", "https") or not url.hostname or port == -1:
            raise ValueError("provider URL must be http(s)://host[:port][/path][?query], "
                             f"not {redact(base_url)!r}")
        self._tls = ssl.create_default_context() if url.scheme == "https" else None
        self._host = url.hostname
        self._port = port or (443 if self._tls else 80)
        self._path = url.path.rstrip("/") + "/chat/completions" + (f"?{url.query}" if url.query else "")
        self._proxy = environment_proxy(url.scheme, self._host)
        proxy_headers = proxy_authorization(self._proxy)
        self._tunnel_headers = proxy_headers if self._tls is not None else {}
        if self._proxy is not None and self._tls is None:
            # NOTE: a plain-http request through a proxy names its whole URL (absolute form).
            self._path = f"http://{self._host}:{self._port}{self._path}"
        self._timeout = timeout
        self._connect_timeout = min(connect_timeout, timeout)
        self._read_timeout = read_timeout
        self._max_bytes = max_response_bytes
        self._sources = sources
        self._headers = {"Content-Type": "application/json", "Accept": "application/json",
                         "User-Agent": "sa-core"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        if self._tls is None:
            self._headers.update(proxy_headers)
        self._headers.update(headers or {})
        self._head = request_head(self._new_connection(self._connect_timeout), self._path,
                                  self._headers)
        self._local = threading.local()
        self._idle: deque[Connection] = deque()
        self._lock = threading.Lock()
        self._open: set[Connection] = set()

    def close(self) -> None:
        """Closes every connection, waking any call still reading (it fails at once)."""
        with self._lock:
            connections, self._open = self._open, set()
        self._idle.clear()
        for conn in connections:
            # NOTE: SIGTERM never waits on a provider that drips.
            if conn.sock is not None:
                cut(conn.sock)
            conn.close()

    def complete(
        self,
        model: str,
        messages: list[dict[str, str]],
        on_delta: Callable[[str], None] | None = None,
        params: Mapping[str, Any] | None = None,
        control: RunControl | None = None,
    ) -> Completion:
        """Runs one chat completion and records its latency by outcome.

        Args:
            model: provider model name.
            messages: OpenAI chat messages, oldest first.
            on_delta: when given, the call asks for a streamed answer (`stream: true`, server-sent
                events) and passes each piece of text as it arrives; the completion holds them all.
            params: more request body fields (temperature, stop...), sent as they are.
            control: the run's control; abandoning it closes the call's connection at once.

        Returns:
            The completion.

        Raises:
            ProviderFailure: any failure, with its error_kind.
            CallAbandoned: `control` was abandoned during the call (its connection is closed).
        """
        started = time.monotonic()
        try:
            completion = self._call(model, messages, on_delta, params or {}, started, control)
        except ProviderFailure as failure:
            if control is not None and control.abandoned:
                raise CallAbandoned("the call was cut: the job is no longer ours") from failure
            metrics.PROVIDER_REQUEST_SECONDS.labels(outcome=failure.kind.value).observe(
                time.monotonic() - started)
            raise
        finally:
            if control is not None:
                control.detach()
            # NOTE: only once detached: no late cut can reach the call that takes it next.
            self._release()
        metrics.PROVIDER_REQUEST_SECONDS.labels(outcome="ok").observe(time.monotonic() - started)
        return completion

    def _call(self, model: str, messages: list[dict[str, str]],
              on_delta: Callable[[str], None] | None, params: Mapping[str, Any],
              started: float, control: RunControl | None) -> Completion:
        request: dict[str, Any] = {**params, "model": model, "messages": messages}
        if on_delta is not None:
            # NOTE: OpenAI reports a stream's token counts only when asked (a last chunk).
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
        body = json.dumps(request).encode()
        deadline = started + self._timeout
        try:
            conn = self._connection(deadline)
            assert conn.sock is not None
            if control is not None:
                control.attach(partial(cut, conn.sock))
            conn.sock.settimeout(remaining(deadline))
            response = conn.post(self._head, body)
            try:
                return self._answer(response, model, on_delta, started)
            finally:
                if response.will_close or not response.isclosed():
                    self._drop()
        except TimeoutError as exc:
            self._drop()
            why = (f"no byte from the provider for SA_PROVIDER_READ_TIMEOUT={self._read_timeout:g}s"
                   if self._read_timeout and time.monotonic() < deadline else
                   f"provider call exceeded SA_PROVIDER_TIMEOUT={self._timeout:g}s")
            raise ProviderFailure(ErrorKind.TIMEOUT, f"{why} ({type(exc).__name__})",
                                  latency_ms=elapsed_ms(started)) from exc
        except TooLarge as exc:
            raise ProviderFailure(
                ErrorKind.PARSE,
                f"provider response larger than SA_PROVIDER_MAX_RESPONSE_BYTES={self._max_bytes}",
                http_status=exc.status, latency_ms=elapsed_ms(started),
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            if control is not None and control.abandoned:
                raise CallAbandoned("the call was cut: the job is no longer ours") from exc
            raise ProviderFailure(
                ErrorKind.UNKNOWN, f"provider unreachable: {type(exc).__name__}: {exc}",
                latency_ms=elapsed_ms(started),
            ) from exc

    def _answer(self, response: http.client.HTTPResponse, model: str,
                on_delta: Callable[[str], None] | None, started: float) -> Completion:
        """Reads the answer to the end: a completion, or a ProviderFailure for an error status;
        either carries the answer's `x-ratelimit-*` headers."""
        limits = RateLimitHeaders.read(response.getheader)
        if not 200 <= response.status < 300:
            data = self._read(response)
            raise ProviderFailure(
                classify_status(response.status),
                f"provider answered {response.status}: {error_message(data)}",
                http_status=response.status,
                retry_after=parse_retry_after(response.getheader("retry-after"), datetime.now(UTC)),
                latency_ms=elapsed_ms(started), ratelimit=limits,
            )
        if on_delta is not None and (response.getheader("content-type") or "").startswith(
                "text/event-stream"):
            answer = self._read_stream(response, model, on_delta, started)
        else:
            answer = parse_answer(self._read(response), response.status, model,
                                  elapsed_ms(started))
        return answer if limits is None else replace(answer, ratelimit=limits)

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        """The whole body, refusing one past the size cap before reading it when its length says so."""
        if (response.length or 0) > self._max_bytes:
            raise TooLarge(response.status)
        data = response.read(self._max_bytes + 1)
        if len(data) > self._max_bytes:
            raise TooLarge(response.status)
        return data

    def _read_stream(self, response: http.client.HTTPResponse, model: str,
                     on_delta: Callable[[str], None], started: float) -> Completion:
        """Reads OpenAI's server-sent chunks line by line up to `data: [DONE]`.

        A stream that ends before `[DONE]` and before any chunk gave a `finish_reason` was cut
        (a provider restart, a proxy timeout): its text is partial, so the call fails (retried),
        never succeeds with half an answer.
        """
        answer = StreamedAnswer(on_delta, response.status, started)
        if response.chunked:
            body = ChunkedBody(response, self._max_bytes)
            reader = poller() if isinstance(body.fp.raw, DeadlineReader) else None
            if reader is not None:
                reader.read(body, answer.line)
            else:
                for line in body:
                    if answer.line(line):
                        break
        else:
            for line in self._lines(response):
                if answer.line(line):
                    break
        if not answer.finished:
            raise ProviderFailure(ErrorKind.UNKNOWN,
                                  "provider stream ended before its last chunk (cut short)",
                                  http_status=response.status, latency_ms=elapsed_ms(started))
        if response.chunked:
            body.finish()
        return completion_from(answer.last, "".join(answer.parts), answer.usage, model,
                               response.status, elapsed_ms(started))

    def _lines(self, response: http.client.HTTPResponse) -> Iterator[bytes]:
        """A streamed body that is not chunked (a length, or the server's close), line by line."""
        seen = 0
        while line := response.readline(self._max_bytes + 1 - seen):
            seen += len(line)
            if seen > self._max_bytes:
                raise TooLarge(response.status)
            yield line

    def _connection(self, deadline: float) -> Connection:
        """This thread's connection, else an idle one; a new one when there is none or the server
        has closed it."""
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            with contextlib.suppress(IndexError):
                conn = self._local.conn = self._idle.pop()
        if conn is not None and conn.sock is not None and not idle_socket_readable(conn.sock):
            conn.deadline = deadline
            conn.read_timeout = self._read_timeout
            return conn
        if conn is not None:
            self._drop()
        conn = self._new_connection(min(self._connect_timeout, remaining(deadline)))
        # NOTE: the deadline bounds the proxy's CONNECT answer too.
        conn.deadline = deadline
        conn.read_timeout = self._read_timeout
        with self._lock:
            self._open.add(conn)
        self._local.conn = conn
        conn.connect()
        return conn

    def _new_connection(self, timeout: float) -> Connection:
        """A connection to the provider (through the proxy, if any), not yet opened."""
        host, port = self._host, self._port
        if self._proxy is not None:
            host, port = self._proxy.hostname or "", self._proxy.port or 80
        conn: Connection
        if self._tls is not None:
            conn = TLSConnection(host, port, timeout=timeout, context=self._tls)
            if self._proxy is not None:
                conn.set_tunnel(self._host, self._port, headers=self._tunnel_headers)
        else:
            conn = Connection(host, port, timeout=timeout)
        if self._sources is not None:
            conn._create_connection = self._sources.connect
        return conn

    def _release(self) -> None:
        """Puts this thread's connection, if it kept one, on the stack for the next call."""
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            self._idle.append(conn)

    def _drop(self) -> None:
        """Closes and forgets this job's connection, if it has one."""
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            return
        conn.close()
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)


@dataclass
class RoutedProviders:
    """One Provider per model route; a job's model picks its route."""

    routes: Routes
    providers: dict[str, Provider]

    @classmethod
    def build(cls, routes: Routes, timeout: float, max_response_bytes: int,
              connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
              read_timeout: float = 0.0,
              source_addresses: tuple[str, ...] = ()) -> RoutedProviders:
        """Makes a client per route (its URL with its query, its auth header).

        `source_addresses`: the local addresses every route's new connections take in turn.

        Raises:
            ValueError: a route's URL, the environment's proxy or a source address is unusable.
        """
        sources = SourceAddresses(source_addresses) if source_addresses else None
        return cls(routes, {route.name: Provider(route.url, "", timeout,
                                                 max_response_bytes=max_response_bytes,
                                                 headers=route.headers,
                                                 connect_timeout=connect_timeout,
                                                 read_timeout=read_timeout, sources=sources)
                            for route in routes.routes})

    def for_model(self, model: str) -> tuple[Route, Provider] | None:
        """The route serving `model` and its client, or None when no route serves it."""
        route = self.routes.for_model(model)
        return None if route is None else (route, self.providers[route.name])

    def close(self) -> None:
        """Closes every route's connections."""
        for provider in self.providers.values():
            provider.close()
