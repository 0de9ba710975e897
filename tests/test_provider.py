"""The provider adapter over real HTTP: keep-alive reuse, servers that drop idle connections, many threads."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from jobqueue.fake_provider import FakeProvider
from jobqueue.policy import ErrorKind
from jobqueue.provider import Provider, ProviderFailure

MESSAGES = [{"role": "user", "content": "hello"}]


class _ClosingServer:
    """Answers one request per connection with a keep-alive 200, then closes it (an idle timeout)."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.connections = 0
        self.hung_up = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                head, _, body = request.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                while len(body) < length:
                    body += conn.recv(65536)
                answer = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Connection: keep-alive\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))
            self.hung_up.set()

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def closing_server() -> Iterator[_ClosingServer]:
    server = _ClosingServer()
    yield server
    server.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_not_reported_as_a_failure(
    closing_server: _ClosingServer,
) -> None:
    provider = Provider(f"http://127.0.0.1:{closing_server.port}", "", 5.0)
    try:
        first = provider.complete("m", MESSAGES)
        assert closing_server.hung_up.wait(5)
        second = provider.complete("m", MESSAGES)
    finally:
        provider.close()
    assert (first.content, second.content) == ("hi", "hi")
    assert closing_server.connections == 2


def test_a_base_url_path_prefixes_the_completions_path() -> None:
    with FakeProvider() as fake:
        provider = Provider(fake.url + "/v1/", "", 5.0)
        try:
            completion = provider.complete("m", MESSAGES)
        finally:
            provider.close()
    assert completion.content == "echo[1]: user:hello"


def test_sixty_four_threads_connecting_at_once_all_get_answers() -> None:
    errors: list[str] = []
    answers: list[str] = []
    with FakeProvider() as fake:
        provider = Provider(fake.url, "", 5.0)
        barrier = threading.Barrier(64)

        def call() -> None:
            barrier.wait()
            for _ in range(3):
                try:
                    answers.append(provider.complete("m", MESSAGES).content)
                except ProviderFailure as failure:
                    errors.append(failure.message)

        threads = [threading.Thread(target=call) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        provider.close()
        served = fake.requests_served
    assert errors == []
    assert len(answers) == served == 192


def test_an_unreachable_provider_is_an_unknown_failure() -> None:
    with socket.create_server(("127.0.0.1", 0)) as reserved:
        port = reserved.getsockname()[1]
    provider = Provider(f"http://127.0.0.1:{port}", "", 5.0)
    with pytest.raises(ProviderFailure) as caught:
        provider.complete("m", MESSAGES)
    assert caught.value.kind is ErrorKind.UNKNOWN
    assert caught.value.message.startswith("provider unreachable: ConnectionRefusedError")


def test_a_provider_url_that_is_not_http_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="provider URL must be http"):
        Provider("ftp://example.com", "", 5.0)
