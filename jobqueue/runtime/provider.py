"""The OpenAI-compatible provider adapter: keep-alive stdlib HTTP per thread, typed failures."""

from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jobqueue.core import metrics
from jobqueue.core.policy import ErrorKind, classify_status, parse_retry_after

__all__ = ["Completion", "Provider", "ProviderFailure"]

# NOTE: keep stored error messages short; provider bodies can be large.
_MESSAGE_LIMIT = 500


@dataclass(frozen=True)
class Completion:
    """A successful chat completion and what the ledger records about it."""

    content: str
    model: str
    tokens_in: int | None
    tokens_out: int | None
    http_status: int
    latency_ms: int
    request_id: str | None


class ProviderFailure(Exception):
    """A provider call that did not produce a completion, already classified."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        http_status: int | None = None,
        retry_after: float | None = None,
        latency_ms: int = 0,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message[:_MESSAGE_LIMIT]
        self.http_status = http_status
        self.retry_after = retry_after
        self.latency_ms = latency_ms


class Provider:
    """Calls `{base_url}/chat/completions` over one keep-alive connection per calling thread.

    PERF: the stdlib client costs about a quarter of httpx's CPU per call, and a connection of
    its own per job thread means no pool lock for 32 threads to queue on. Safe to share between
    threads. An http:// proxy named by HTTPS_PROXY / HTTP_PROXY / ALL_PROXY is used unless
    NO_PROXY exempts the provider's host (https through a CONNECT tunnel, http by absolute URL).
    """

    def __init__(self, base_url: str, api_key: str, timeout: float) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"provider URL must be http(s)://host[:port][/path], not {base_url!r}")
        self._tls = ssl.create_default_context() if url.scheme == "https" else None
        self._host = url.hostname
        self._port = url.port or (443 if self._tls else 80)
        self._path = url.path.rstrip("/") + "/chat/completions"
        self._proxy = _environment_proxy(url.scheme, self._host)
        proxy_headers = _proxy_authorization(self._proxy)
        self._tunnel_headers = proxy_headers if self._tls is not None else {}
        if self._proxy is not None and self._tls is None:
            # NOTE: a plain-http request through a proxy names its whole URL (absolute form).
            self._path = f"http://{self._host}:{self._port}{self._path}"
        self._timeout = timeout
        self._connect_timeout = min(10.0, timeout)
        self._headers = {"Content-Type": "application/json", "Accept": "application/json",
                         "User-Agent": "sa-core"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        if self._tls is None:
            self._headers.update(proxy_headers)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()

    def close(self) -> None:
        """Closes every thread's connection."""
        with self._lock:
            connections, self._open = self._open, set()
        for conn in connections:
            conn.close()

    def complete(self, model: str, messages: list[dict[str, str]]) -> Completion:
        """Runs one chat completion and records its latency by outcome.

        Args:
            model: provider model name.
            messages: OpenAI chat messages, oldest first.

        Returns:
            The completion.

        Raises:
            ProviderFailure: any failure, with its error_kind.
        """
        started = time.monotonic()
        try:
            completion = self._call(model, messages)
        except ProviderFailure as failure:
            metrics.PROVIDER_REQUEST_SECONDS.labels(outcome=failure.kind.value).observe(
                time.monotonic() - started)
            raise
        metrics.PROVIDER_REQUEST_SECONDS.labels(outcome="ok").observe(time.monotonic() - started)
        return completion

    def _call(self, model: str, messages: list[dict[str, str]]) -> Completion:
        body = json.dumps({"model": model, "messages": messages}).encode()
        started = time.monotonic()
        try:
            conn = self._connection()
            conn.request("POST", self._path, body=body, headers=self._headers)
            response = conn.getresponse()
            data = response.read()
        except TimeoutError as exc:
            self._drop()
            raise ProviderFailure(
                ErrorKind.TIMEOUT, f"provider timed out: {type(exc).__name__}",
                latency_ms=_elapsed_ms(started),
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise ProviderFailure(
                ErrorKind.UNKNOWN, f"provider unreachable: {type(exc).__name__}: {exc}",
                latency_ms=_elapsed_ms(started),
            ) from exc
        if response.will_close:
            self._drop()
        latency_ms = _elapsed_ms(started)
        if not 200 <= response.status < 300:
            raise ProviderFailure(
                classify_status(response.status),
                f"provider answered {response.status}: {_text(data)}",
                http_status=response.status,
                retry_after=parse_retry_after(response.getheader("retry-after"), datetime.now(UTC)),
                latency_ms=latency_ms,
            )
        return _parse(data, response.status, model, latency_ms)

    def _connection(self) -> http.client.HTTPConnection:
        """This thread's connection; a new one when there is none or the server has closed it."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None and not _idle_socket_readable(conn.sock):
            return conn
        if conn is not None:
            self._drop()
        host, port = self._host, self._port
        if self._proxy is not None:
            host, port = self._proxy.hostname or "", self._proxy.port or 80
        if self._tls is not None:
            conn = http.client.HTTPSConnection(host, port, timeout=self._connect_timeout,
                                               context=self._tls)
            if self._proxy is not None:
                conn.set_tunnel(self._host, self._port, headers=self._tunnel_headers)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self._connect_timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(self._timeout)
        self._local.conn = conn
        with self._lock:
            self._open.add(conn)
        return conn

    def _drop(self) -> None:
        """Closes and forgets this thread's connection, if it has one."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            return
        conn.close()
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)


def _environment_proxy(scheme: str, host: str) -> urllib.parse.SplitResult | None:
    """The proxy the environment names for `scheme`, or None (none named, or NO_PROXY exempts `host`).

    Raises:
        ValueError: the proxy is not an http:// URL.
    """
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parsed = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(f"the {scheme} proxy must be http://host[:port], not {proxy!r}")
    return parsed


def _proxy_authorization(proxy: urllib.parse.SplitResult | None) -> dict[str, str]:
    """The Proxy-Authorization header for a proxy URL with user:password, else nothing."""
    if proxy is None or proxy.username is None:
        return {}
    credentials = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
    return {"Proxy-Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


def _idle_socket_readable(sock: socket.socket) -> bool:
    """True when an idle keep-alive socket has something to read: the server closed it (or sent junk)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _text(data: bytes) -> str:
    return data[:_MESSAGE_LIMIT].decode("utf-8", "replace")


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _parse(data: bytes, status: int, model: str, latency_ms: int) -> Completion:
    try:
        body: Any = json.loads(data)
        content = body["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError("message content is not a string")
        if "\x00" in content:
            # NOTE: Postgres text cannot hold NUL; storing it would fail the finalize.
            raise ValueError("message content contains a NUL character")
        usage = body.get("usage") or {}
    except (ValueError, LookupError, TypeError, AttributeError) as exc:
        raise ProviderFailure(
            ErrorKind.PARSE,
            f"unreadable provider response ({type(exc).__name__}): {_text(data)}",
            http_status=status,
            latency_ms=latency_ms,
        ) from exc
    return Completion(
        content=content,
        model=str(body.get("model") or model),
        tokens_in=usage.get("prompt_tokens"),
        tokens_out=usage.get("completion_tokens"),
        http_status=status,
        latency_ms=latency_ms,
        request_id=body.get("id"),
    )
