"""A TCP proxy in front of Postgres that tests can cut and restore, to play a database outage."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

# NOTE: what Postgres sends a session pg_terminate_backend ends: an ErrorResponse, FATAL 57P01.
_ADMIN_SHUTDOWN_FIELDS = (b"SFATAL\0VFATAL\0C57P01\0"
                          b"Mterminating connection due to administrator command\0\0")
ADMIN_SHUTDOWN = b"E" + struct.pack("!I", 4 + len(_ADMIN_SHUTDOWN_FIELDS)) + _ADMIN_SHUTDOWN_FIELDS


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
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Refuses new connections and resets the open ones, as a crashed server would."""
        self._open.clear()
        with self._lock:
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
                client, _ = self._listener.accept()
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
                self._sockets.update((client, upstream))
                self._clients.add(client)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _connect_upstream(self) -> socket.socket:
        host, port = self._target
        if not host.startswith("/"):
            return socket.create_connection(self._target)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(f"{host}/.s.PGSQL.{port}")
        return upstream

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    ending = src in self._terminating
                    # NOTE: the asking client last: when its FATAL arrives, every other session
                    # already has its own, as when a kill is over (a client that retried at
                    # once could otherwise check a connection whose FATAL was not sent yet).
                    doomed = ([c for c in self._terminating if c is not src] + [src]
                              if ending else [])
                    self._terminating.difference_update(doomed)
                for client in doomed:
                    with contextlib.suppress(OSError):
                        client.sendall(ADMIN_SHUTDOWN)
                        client.shutdown(socket.SHUT_RDWR)
                if ending:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
