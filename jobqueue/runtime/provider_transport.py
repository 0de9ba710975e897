"""The provider client's sockets: one deadline per call, proxies from the environment, the cut.

http.client does the HTTP; these classes bound every read by what is left of the call's
deadline, and `cut` ends a call from another thread (jobqueue/runtime/run_control.py).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import ipaddress
import itertools
import math
import select
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jobqueue.core.redact import redact

__all__ = ["Connection", "DeadlineReader", "SourceAddresses", "TLSConnection", "cut",
           "environment_proxy", "idle_socket_readable", "proxy_authorization", "remaining",
           "request_head"]

# PERF: every call waiting for its answer holds this buffer (allocated with the response, before
# a byte arrives); at 10,000 calls in flight 64 KiB buffers held 120 MiB more per worker and let
# its RSS climb with every round of calls (docs/performance.md). An answer larger than the buffer
# is read past it, straight into its bytes.
_READ_BUFFER = 8192

# NOTE: http.client's own bounds on a response head (its _MAXLINE and _MAXHEADERS).
_MAX_HEAD_LINE = 65536
_MAX_HEAD_LINES = 100


class DeadlineReader(io.RawIOBase):
    """A response's socket reads, each bounded by what is left of the call's deadline.

    NOTE: a per-read timeout alone lets a server that sends one byte a second hold a call for
    ever (status line and headers included); checking the deadline before every recv does not.
    """

    def __init__(self, sock: socket.socket, conn: Connection) -> None:
        super().__init__()
        self._sock = sock
        self._conn = conn
        # NOTE: read through the socket's own file, which keeps its descriptor open until the
        # response is done: http.client closes the connection as soon as it sees an answer whose
        # end is the server's close (no length, not chunked), before that answer is read.
        self._file = sock.makefile("rb", buffering=0)

        # NOTE: while a poller reads the body (provider_stream.py), reads never wait: None (and
        # `blocked`) when nothing has arrived; the poller keeps the deadline then.
        self.polled = False
        self.blocked = False
        # NOTE: a TLS socket may hold decrypted bytes that no readiness event announces.
        self.tls = isinstance(sock, ssl.SSLSocket)

    @property
    def fd(self) -> int:
        """The socket's descriptor."""
        return self._sock.fileno()

    @property
    def deadline(self) -> float:
        """The call's deadline (time.monotonic())."""
        return self._conn.deadline

    @property
    def idle_timeout(self) -> float:
        """The most seconds between two reads that bring something (0: no bound)."""
        return self._conn.read_timeout

    def poll_mode(self, on: bool) -> None:
        """Makes reads return at once (None when nothing has arrived), or wait again."""
        self.polled = on
        if on:
            self._sock.settimeout(0.0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        if self.polled:
            try:
                got: int | None = self._file.readinto(buffer)
            except ssl.SSLWantReadError:
                got = None
            self.blocked = got is None
            return got
        left = remaining(self._conn.deadline)
        idle = self._conn.read_timeout
        self._sock.settimeout(min(left, idle) if idle else left)
        read: int | None = self._file.readinto(buffer)
        return read or 0

    def close(self) -> None:
        self._file.close()
        super().close()


class _DeadlineSocket:
    """What http.client's response reads from: `makefile()` is all it asks of its socket."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def makefile(self, mode: str) -> io.BufferedReader:
        assert self._conn.sock is not None
        return io.BufferedReader(DeadlineReader(self._conn.sock, self._conn), _READ_BUFFER)


def _response_class(conn: Connection) -> Callable[..., http.client.HTTPResponse]:
    def build(sock: socket.socket, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
        return _Response(_DeadlineSocket(conn), *args, **kwargs)  # type: ignore[arg-type]
    return build


class _Response(http.client.HTTPResponse):
    """http.client's response, its head read without the email package.

    PERF: http.client hands a response's header lines to email.parser's feed parser, about 30 us
    of a call's 170 us of client CPU against the bench's provider; `_read_head` builds the same
    HTTPMessage line by line. The rest is http.client's `begin` as it stands since Python 3.5.
    """

    def begin(self) -> None:
        if self.headers is not None:
            return
        while True:
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            _read_head(self.fp)
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = _read_head(self.fp)
        encoding = self.headers.get("transfer-encoding")
        self.chunked = bool(encoding) and encoding.lower() == "chunked"
        if self.chunked:
            self.chunk_left = None
        self.will_close = self._check_close()
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            with contextlib.suppress(ValueError):
                self.length = int(length)
            if self.length is not None and self.length < 0:
                self.length = None
        if status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED) or 100 <= status < 200 \
                or self._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


def _read_head(fp: io.BufferedIOBase) -> http.client.HTTPMessage:
    """The header lines up to the blank line, under http.client's bounds (64 KiB a line, 100
    lines); a line folded onto the next (obs-fold) is joined to it.

    Raises:
        http.client.LineTooLong: a line past 64 KiB.
        http.client.HTTPException: more than 100 lines.
    """
    head = http.client.HTTPMessage()
    name, value, count = "", "", 0
    while True:
        line = fp.readline(_MAX_HEAD_LINE + 1)
        if len(line) > _MAX_HEAD_LINE:
            raise http.client.LineTooLong("header line")
        count += 1
        if count > _MAX_HEAD_LINES:
            raise http.client.HTTPException(f"got more than {_MAX_HEAD_LINES} headers")
        if line[:1] in (b" ", b"\t") and name:
            value += " " + line.decode("iso-8859-1").strip()
            continue
        if name:
            head[name] = value
        if line in (b"\r\n", b"\n", b""):
            return head
        text = line.decode("iso-8859-1")
        name, _, value = text.partition(":")
        name, value = name.strip(), value.strip()


class Connection(http.client.HTTPConnection):
    """A plain-http connection whose responses read under the call's `deadline`, and whose
    requests go out whole; TLSConnection adds TLS."""

    deadline: float = math.inf
    read_timeout: float = 0.0
    # NOTE: http.client opens its socket through this (undeclared in its stubs); SourceAddresses
    # replaces it.
    _create_connection: Callable[..., socket.socket]
    _buffer: list[bytes]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_class = _response_class(self)  # type: ignore[assignment]

    def post(self, head: bytes, body: bytes) -> http.client.HTTPResponse:
        """Sends a POST whose head `request_head` built, and returns its response with the
        status and headers read.

        PERF: http.client builds and checks the request line and every header line again on each
        request (putrequest, putheader): a fifth of a call's client CPU against the bench's
        provider (bench/provider_call.py), where a provider's requests differ only by their
        Content-Length. Head and body go in one write: http.client's two cost two syscalls and,
        on loopback, two wake-ups of the provider. The response is read as getresponse() reads
        it; http.client's own request state is never used, so it stays idle.
        """
        self.send(b"%s%d\r\n\r\n%s" % (head, len(body), body))
        response: http.client.HTTPResponse = self.response_class(self.sock, method="POST")
        response.begin()
        return response


def request_head(template: Connection, path: str, headers: Mapping[str, str]) -> bytes:
    """The head of a POST to `path` with `headers` as http.client writes it on `template` (its
    Host header, its checks of every name and value), up to the value of its Content-Length.

    `template` is a connection configured like the calls' (tunnel included), never opened.

    Raises:
        ValueError: a header name or value http.client refuses (the message names the header,
            never its value: it may be a key).
    """
    names = {name.lower() for name in headers}
    template.putrequest("POST", path, skip_host="host" in names,
                        skip_accept_encoding="accept-encoding" in names)
    for name, value in headers.items():
        try:
            template.putheader(name, value)
        except ValueError:
            raise ValueError(f"the provider header {name[:64]!r} holds a character HTTP does not "
                             "allow (a line break?)") from None
    template.putheader("Content-Length", "")
    return b"\r\n".join(template._buffer)


class TLSConnection(Connection, http.client.HTTPSConnection):
    """A TLS connection whose responses read under the call's `deadline`, sent whole."""


class SourceAddresses:
    """Local addresses that a client's new connections take in turn (SA_PROVIDER_SOURCE_ADDRESSES).

    NOTE: the kernel tells connections to one provider address and port apart by their source
    address and port, so one source address reaches one provider port over at most the
    ephemeral range (about 28,000 on Linux); each more source address adds that many again.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        """Checks that this host can send from every address.

        Raises:
            ValueError: an entry is not an IP address, or not one of this host's.
        """
        self.addresses = tuple(addresses)
        for address in self.addresses:
            try:
                family = _family(address)
            except ValueError:
                raise ValueError(f"SA_PROVIDER_SOURCE_ADDRESSES: {address!r} is not an IP "
                                 "address") from None
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind((address, 0))
                except OSError as exc:
                    raise ValueError(f"SA_PROVIDER_SOURCE_ADDRESSES: cannot send from {address} "
                                     f"({exc.strerror}): not an address of this host") from None
        self._turn = itertools.cycle(self.addresses)

    def connect(self, address: tuple[str, int], timeout: float | None,
                source_address: object = None) -> socket.socket:
        """Opens a TCP connection to `address` from the next source address (http.client's
        `_create_connection`; its own `source_address` is never set here).

        Raises:
            OSError: no address of `host` of the source's family answered.
        """
        source = next(self._turn)
        family = _family(source)
        host, port = address
        error: OSError | None = None
        for _, kind, proto, _, target in socket.getaddrinfo(host, port, family, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                # PERF: the port is chosen at connect, for this provider address alone; bound
                # first, it would have to be free towards every address, which caps a source
                # address at one ephemeral range in all.
                with contextlib.suppress(AttributeError, OSError):
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_BIND_ADDRESS_NO_PORT, 1)
                sock.bind((source, 0))
                sock.settimeout(timeout)
                sock.connect(target)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError(f"{host} has no address of the family of {source}")


def _family(address: str) -> socket.AddressFamily:
    """AF_INET or AF_INET6, as the literal `address` is; raises ValueError for anything else."""
    return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET


def cut(sock: socket.socket) -> None:
    """Ends a call from another thread: shutdown() wakes the reader blocked in recv() (close()
    alone does not) and tells the provider at once that nobody waits for its answer."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def remaining(deadline: float) -> float:
    """Seconds left before `deadline`; raises TimeoutError when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the call's deadline has passed")
    return left


def environment_proxy(scheme: str, host: str) -> urllib.parse.SplitResult | None:
    """The proxy the environment names for `scheme`, or None (none named, or NO_PROXY exempts `host`).

    Raises:
        ValueError: the proxy is not an http:// URL (the message hides its password).
    """
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parsed = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme != "http" or not parsed.hostname or port == -1:
        raise ValueError(f"the {scheme} proxy must be http://[user:password@]host[:port], "
                         f"not {redact(parsed.geturl())!r}")
    return parsed


def proxy_authorization(proxy: urllib.parse.SplitResult | None) -> dict[str, str]:
    """The Proxy-Authorization header for a proxy URL with user:password, else nothing."""
    if proxy is None or proxy.username is None:
        return {}
    credentials = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
    return {"Proxy-Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


def idle_socket_readable(sock: socket.socket) -> bool:
    """True when an idle keep-alive socket has something to read: the server closed it (or sent junk).

    PERF: a non-blocking peek, not select(): under gevent a select() call sets up and tears down
    a watcher on the hub, several times the cost of one recv syscall. TLS sockets take no recv
    flags and keep select().
    """
    try:
        sock.settimeout(0)
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except ValueError:
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)
    except OSError:
        return True
    return True

