"""A TCP proxy in front of Postgres that tests can cut and restore, to play a database outage,
and that counts the messages each client sends, to count a client's round trips."""

from __future__ import annotations

import collections
import contextlib
import socket
import struct
import threading

# NOTE: what Postgres sends a session pg_terminate_backend ends: an ErrorResponse, FATAL 57P01.
_ADMIN_SHUTDOWN_FIELDS = (b"SFATAL\0VFATAL\0C57P01\0"
                          b"Mterminating connection due to administrator command\0\0")
ADMIN_SHUTDOWN = b"E" + struct.pack("!I", 4 + len(_ADMIN_SHUTDOWN_FIELDS)) + _ADMIN_SHUTDOWN_FIELDS


# NOTE: the protocol 3.0 startup packet's code; SSLRequest and GSSENCRequest come before it, also
# untyped (a test that counts messages connects with sslmode=disable, so nothing is encrypted).
_PROTOCOL_3 = 196608
class FrontendCount:
    """Counts one client's Postgres frontend messages by type, from the bytes it sends, and the
    points at which it may wait for the server: each Sync (the end of an extended-protocol
    series), each simple Query, and each Flush that follows something else (psycopg sends one
    right behind a pipeline's closing Sync, which asks for nothing the Sync did not)."""

    def __init__(self) -> None:
        self.types: collections.Counter[str] = collections.Counter()
        self.wait_points = 0
        self._previous = ""
        self._buffer = b""
        self._started = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            head = 4 if not self._started else 5
            if len(self._buffer) < head:
                return
            if not self._started:
                size = struct.unpack("!I", self._buffer[:4])[0]
                if len(self._buffer) < size:
                    return
                self._started = struct.unpack("!I", self._buffer[4:8])[0] == _PROTOCOL_3
            else:
                size = 1 + struct.unpack("!I", self._buffer[1:5])[0]
                if len(self._buffer) < size:
                    return
                self._count(chr(self._buffer[0]))
            self._buffer = self._buffer[size:]

    def _count(self, kind: str) -> None:
        self.types[kind] += 1
        if kind in "SQ" or (kind == "H" and self._previous not in ("S", "H")):
            self.wait_points += 1
        self._previous = kind


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; `cut()` drops every connection and refuses new ones."""

    def __init__(self, target_host: str, target_port: int) -> None:
        # NOTE: a host that is a folder means a Unix socket (the embedded Postgres uses one).
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._clients: set[socket.socket] = set()
        self._terminating: set[socket.socket] = set()
        self._terminating_alone: set[socket.socket] = set()
        self._counts: dict[int, FrontendCount] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Refuses new connections and resets the open ones, as a crashed server would."""
        with self._lock:
            self._open.clear()
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def terminate_on_next_query(self) -> None:
        """Ends every open session as pg_terminate_backend does, caught mid-way: the next message
        a client sends is answered FATAL 57P01 instead of being passed on, so a client that
        checked its idle connection just before sees nothing wrong until it asks; by then the
        other sessions have their FATAL too (the kill is over), and the lines close."""
        with self._lock:
            self._terminating.update(self._clients)

    def terminate_each_on_its_next_query(self) -> None:
        """Ends every open session as pg_terminate_backend does while its backends are still
        exiting: each session answers FATAL 57P01 to the next message its own client sends, and
        the others show nothing until they ask."""
        with self._lock:
            self._terminating_alone.update(self._clients)

    def frontend(self, client_port: int) -> FrontendCount:
        """What the client connected from `client_port` (its local port) has sent so far."""
        with self._lock:
            return self._counts[client_port]

    def restore(self) -> None:
        """Accepts connections again."""
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, (_, client_port) = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                client.close()
                continue
            try:
                upstream = self._connect_upstream()
            except OSError:
                client.close()
                continue
            with self._lock:
                # NOTE: a cut while this connection was being made must end it too, or it would
                # outlive the outage that the test plays.
                if not self._open.is_set():
                    client.close()
                    upstream.close()
                    continue
                self._sockets.update((client, upstream))
                self._clients.add(client)
                count = self._counts[client_port] = FrontendCount()
            for src, dst, seen in ((client, upstream, count), (upstream, client, None)):
                threading.Thread(target=self._pipe, args=(src, dst, seen), daemon=True).start()

    def _connect_upstream(self) -> socket.socket:
        host, port = self._target
        if not host.startswith("/"):
            return socket.create_connection(self._target)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(f"{host}/.s.PGSQL.{port}")
        return upstream

    def _pipe(self, src: socket.socket, dst: socket.socket, seen: FrontendCount | None) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    if src in self._terminating_alone:
                        self._terminating_alone.discard(src)
                        ending, doomed = True, [src]
                    else:
                        ending = src in self._terminating
                        # NOTE: the asking client last: when its FATAL arrives, every other
                        # session already has its own, as when a kill is over (a client that
                        # retried at once could otherwise check a connection whose FATAL was
                        # not sent yet).
                        doomed = ([c for c in self._terminating if c is not src] + [src]
                                  if ending else [])
                        self._terminating.difference_update(doomed)
                for client in doomed:
                    with contextlib.suppress(OSError):
                        client.sendall(ADMIN_SHUTDOWN)
                        client.shutdown(socket.SHUT_RDWR)
                if ending:
                    break
                if seen is not None:
                    with self._lock:
                        seen.feed(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
