"""A provider that holds its calls open and notes when the client closed each one.

The fake provider sleeps through `[fake:latency=S]` and cannot tell when a client hangs up; a
test of "the worker closes the call within a second" needs the provider's side of that moment.
A request whose last message holds `[hold]` is never answered (streamed: headers and one chunk,
then nothing); any other gets a normal chat completion, so a worker's slot can be seen taking
new work.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Held", "HoldingProvider", "read_request"]

_HEAD_END = b"\r\n\r\n"


@dataclass
class Held:
    """One held call: when it arrived, and when the client closed its connection."""

    text: str
    streamed: bool
    arrived: float = field(default_factory=time.monotonic)
    closed_at: float | None = None
    closed: threading.Event = field(default_factory=threading.Event)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        body = _read_request(sock)
        if body is None:
            return
        text = str(body["messages"][-1]["content"])
        if "[hold]" not in text:
            _answer(sock, str(body.get("model", "m")), text)
            return
        held = Held(text, bool(body.get("stream")))
        if held.streamed:
            chunk = b'data: {"choices": [{"delta": {"content": "first words "}}]}\n\n'
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.server.note(held)
        # NOTE: nothing more is sent: the next recv returns only when the client hangs up.
        while True:
            try:
                if not sock.recv(4096):
                    break
            except OSError:
                break
        held.closed_at = time.monotonic()
        held.closed.set()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.held: list[Held] = []
        self.arrival = threading.Condition()

    def note(self, held: Held) -> None:
        with self.arrival:
            self.held.append(held)
            self.arrival.notify_all()


class HoldingProvider:
    """Runs the server on a free port until `stop()`; `held` lists the calls it holds."""

    def __init__(self) -> None:
        self._server = _Server()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The base URL a route names."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def held(self, marker: str, timeout: float = 10.0) -> Held:
        """The held call whose text holds `marker`, once it has arrived."""
        deadline = time.monotonic() + timeout
        with self._server.arrival:
            while True:
                found = [h for h in self._server.held if marker in h.text]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no call held for {marker!r} within {timeout}s")
                self._server.arrival.wait(left)

    def stop(self) -> None:
        """Stops serving; held connections end with the process's daemon threads."""
        self._server.shutdown()
        self._server.server_close()


def _read_request(sock: socket.socket) -> Any:
    """The JSON body of one HTTP request, or None when the client left first."""
    request = read_request(sock)
    return None if request is None else json.loads(request[1])


def read_request(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The head and body of one HTTP request (its body by Content-Length), or None when the
    client left first."""
    data = b""
    while _HEAD_END not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(_HEAD_END)
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head, body


def _answer(sock: socket.socket, model: str, text: str) -> None:
    payload = json.dumps({"id": "held-1", "model": model, "choices": [
        {"index": 0, "message": {"role": "assistant", "content": f"echo: {text}"},
         "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}).encode()
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
