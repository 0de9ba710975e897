"""The provider adapter over real HTTP: keep-alive reuse, dropped connections, proxies, streams, limits."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobqueue.core.policy import ErrorKind
from jobqueue.devtools.fake_provider import FakeProvider
from jobqueue.runtime.provider import Provider
from jobqueue.runtime.provider_answer import ProviderFailure
from tests.helpers import wait_for
from tests.holding_provider import read_request

MESSAGES = [{"role": "user", "content": "hello"}]


class _ClosingServer:
    """Answers one request per connection with a keep-alive 200, then closes it (an idle timeout).

    With `tls` it speaks HTTPS; every request head it read is kept in `heads`.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._tls = tls
        self.port = self._sock.getsockname()[1]
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.hung_up = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                conn = self._tls.wrap_socket(raw, server_side=True) if self._tls else raw
            except ssl.SSLError:
                raw.close()
                continue
            with conn:
                request = read_request(conn)
                if request is None:
                    continue
                self.heads.append(request[0])
                self.bodies.append(request[1])
                answer = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Connection: keep-alive\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))
            self.hung_up.set()

    def close(self) -> None:
        self._sock.close()


class _ConnectProxy:
    """An HTTP proxy that only tunnels (CONNECT), relaying bytes both ways; keeps each CONNECT head."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.heads: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                head += client.recv(65536)
            self.heads.append(head.split(b"\r\n\r\n")[0])
            host, _, port = head.split()[1].decode().rpartition(":")
            upstream = socket.create_connection((host, int(port)))
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=_relay, args=(src, dst), daemon=True).start()

    def close(self) -> None:
        self._sock.close()


def _relay(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


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


def test_a_plain_http_provider_is_reached_through_the_environments_proxy_with_its_credentials(
    closing_server: _ClosingServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://bot:s%40cret@127.0.0.1:{closing_server.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    provider = Provider("http://llm.internal:8080/v1", "", 5.0)
    try:
        assert provider.complete("m", MESSAGES).content == "hi"
    finally:
        provider.close()
    [head] = closing_server.heads
    assert head.startswith(b"POST http://llm.internal:8080/v1/chat/completions HTTP/1.1\r\n")
    assert b"Proxy-Authorization: Basic " + base64.b64encode(b"bot:s@cret") in head


def test_no_proxy_exempts_the_providers_host(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as reserved:
        dead_proxy = reserved.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead_proxy}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeProvider() as fake:
        provider = Provider(fake.url, "", 5.0)
        try:
            assert provider.complete("m", MESSAGES).content == "echo[1]: user:hello"
        finally:
            provider.close()


def test_an_https_provider_is_reached_through_a_connect_tunnel_and_its_certificate_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    target, proxy = _ClosingServer(tls), _ConnectProxy()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        trusted = Provider(f"https://127.0.0.1:{target.port}", "", 5.0)
        assert trusted.complete("m", MESSAGES).content == "hi"
        trusted.close()
        monkeypatch.delenv("SSL_CERT_FILE")
        untrusted = Provider(f"https://127.0.0.1:{target.port}", "", 5.0)
        with pytest.raises(ProviderFailure, match="SSLCertVerificationError"):
            untrusted.complete("m", MESSAGES)
        untrusted.close()
    finally:
        target.close()
        proxy.close()
    assert [h.split(b"\r\n")[0] for h in proxy.heads] == [
        f"CONNECT 127.0.0.1:{target.port} HTTP/1.0".encode()] * 2
    assert target.connections == 2 and len(target.heads) == 1


def test_the_base_urls_query_string_and_extra_headers_go_with_every_call(
    closing_server: _ClosingServer,
) -> None:
    provider = Provider(f"http://127.0.0.1:{closing_server.port}/openai/deployments/gpt?api-version=2024-06-01",
                        "", 5.0, headers={"api-key": "azure-secret"})
    try:
        assert provider.complete("m", MESSAGES).content == "hi"
    finally:
        provider.close()
    [head] = closing_server.heads
    assert head.startswith(
        b"POST /openai/deployments/gpt/chat/completions?api-version=2024-06-01 HTTP/1.1\r\n")
    assert b"\r\napi-key: azure-secret" in head
    assert b"Authorization" not in head


def test_every_call_sends_one_head_with_its_own_content_length(
    closing_server: _ClosingServer,
) -> None:
    # The head is built once per provider: only the Content-Length may differ between calls.
    provider = Provider(f"http://127.0.0.1:{closing_server.port}/v1", "sk-test", 5.0,
                        headers={"api-key": "azure-secret"})
    texts = ["hi", "a longer prompt, é and all " * 40]
    try:
        for text in texts:
            provider.complete("m", [{"role": "user", "content": text}])
            # NOTE: the server closes each connection after its answer; the next call opens another.
            assert closing_server.hung_up.wait(5)
            closing_server.hung_up.clear()
    finally:
        provider.close()
    for head, body, text in zip(closing_server.heads, closing_server.bodies, texts, strict=True):
        request_line, *lines = head.decode().split("\r\n")
        fields = dict(line.split(": ", 1) for line in lines)
        assert request_line == "POST /v1/chat/completions HTTP/1.1"
        assert len(fields) == len(lines)
        assert fields["Host"] == f"127.0.0.1:{closing_server.port}"
        assert fields["Authorization"] == "Bearer sk-test"
        assert fields["api-key"] == "azure-secret"
        assert fields["Content-Length"] == str(len(body))
        assert json.loads(body)["messages"] == [{"role": "user", "content": text}]


def test_a_header_with_a_line_break_is_refused_at_start_without_its_value() -> None:
    with pytest.raises(ValueError, match="'api-key'") as refused:
        Provider("http://127.0.0.1:9/v1", "", 5.0, headers={"api-key": "sk-secret\r\nX-Evil: 1"})
    assert "sk-secret" not in str(refused.value)


def test_a_streamed_answer_is_passed_on_piece_by_piece_and_kept_whole() -> None:
    pieces: list[str] = []
    with FakeProvider() as fake:
        provider = Provider(fake.url, "", 5.0)
        try:
            completion = provider.complete("m", MESSAGES, on_delta=pieces.append)
            again = provider.complete("m", MESSAGES)
        finally:
            provider.close()
        assert fake.received[0]["stream"] is True
    assert pieces == ["echo[1]:", " user:hello"]
    assert (completion.content, completion.tokens_in, completion.tokens_out) == (
        "echo[1]: user:hello", 1, 2)
    assert again.content == completion.content


def test_close_wakes_a_call_that_a_dripping_provider_holds() -> None:
    failures: list[ProviderFailure] = []
    with FakeProvider() as fake:
        provider = Provider(fake.url, "", 60.0)

        def call() -> None:
            try:
                provider.complete("m", [{"role": "user", "content": "[fake:drip=0.5]"}])
            except ProviderFailure as failure:
                failures.append(failure)

        caller = threading.Thread(target=call)
        caller.start()
        wait_for(lambda: fake.requests_served == 1)
        provider.close()
        caller.join(timeout=5)
        assert not caller.is_alive()
    assert [f.kind for f in failures] == [ErrorKind.UNKNOWN]


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "ALL_PROXY"])
def test_a_bad_proxy_is_a_one_line_error_that_hides_its_password(
    variable: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    cli: Callable[[list[str]], int],
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "socks5://bot:hunter2@proxy.internal:1080")
    monkeypatch.setenv("SA_PROVIDER_URL", "https://llm.example.com/v1")
    assert cli(["run-worker", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sa-core: the https proxy must be http://")
    assert "bot:***@proxy.internal" in err and "hunter2" not in err
    assert err.count("\n") == 1


def test_a_bad_provider_url_is_a_one_line_error_that_hides_its_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    cli: Callable[[list[str]], int],
) -> None:
    monkeypatch.setenv("SA_PROVIDER_URL", "http://bot:hunter2@llm.internal:eighty/v1")
    assert cli(["run-worker", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sa-core: provider URL must be http(s)://")
    assert "hunter2" not in err and err.count("\n") == 1


def test_the_read_timeout_ends_a_silent_call_but_not_a_stream_that_keeps_coming() -> None:
    with FakeProvider() as fake:
        provider = Provider(fake.url, "", 10.0, read_timeout=0.3)
        try:
            with pytest.raises(ProviderFailure) as silent:
                provider.complete("m", [{"role": "user", "content": "hi [fake:hang]"}])
            pieces: list[str] = []
            # NOTE: 26 chunks 0.05 s apart: 1.3 s in all, but never 0.3 s without a byte.
            streamed = provider.complete(
                "m", [{"role": "user", "content": " ".join(["w"] * 24) + " [fake:stream-gap=0.05]"}],
                on_delta=pieces.append)
        finally:
            provider.close()
    assert silent.value.kind is ErrorKind.TIMEOUT
    assert silent.value.message.startswith("no byte from the provider for SA_PROVIDER_READ_TIMEOUT")
    assert silent.value.latency_ms < 2000
    assert streamed.content == "".join(pieces) and len(pieces) == 26


def _raw_server(answer: bytes) -> tuple[socket.socket, int]:
    """Answers each request with the bytes `answer` as they are, then closes the connection."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                # NOTE: the request's body read too: a close with unread bytes is a reset, which
                # may reach the client before the answer does.
                if read_request(conn) is not None:
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _close_delimited_server(body: bytes, content_type: bytes) -> tuple[socket.socket, int]:
    """Answers each request with `body` and no length: the body ends when the server closes."""
    return _raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type
                       + b"\r\nConnection: close\r\n\r\n" + body)


def _call_raw(answer: bytes) -> ProviderFailure:
    server, port = _raw_server(answer)
    provider = Provider(f"http://127.0.0.1:{port}", "", 5.0)
    try:
        with pytest.raises(ProviderFailure) as failed:
            provider.complete("m", MESSAGES)
    finally:
        provider.close()
        server.close()
    return failed.value


def test_a_429s_head_is_read_whole_past_a_100_continue_and_a_folded_line() -> None:
    body = json.dumps({"error": {"message": "slow down"}}).encode()
    failure = _call_raw(
        b"HTTP/1.1 100 Continue\r\nX-Ignored: yes\r\n\r\n"
        b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 7\r\n"
        b"x-ratelimit-remaining-requests: 0\r\nX-RateLimit-Reset-Requests:\r\n 2s\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert failure.kind is ErrorKind.RATE_LIMIT and failure.http_status == 429
    assert failure.retry_after == 7.0
    assert "slow down" in failure.message
    assert failure.ratelimit is not None
    assert (failure.ratelimit.remaining_requests, failure.ratelimit.reset_requests) == (0, 2.0)


def test_an_answer_head_past_a_hundred_lines_fails_the_call() -> None:
    lines = b"".join(b"X-Pad-%d: %d\r\n" % (n, n) for n in range(101))
    failure = _call_raw(b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 2\r\n\r\n{}")
    assert failure.kind is ErrorKind.UNKNOWN
    assert "more than 100 headers" in failure.message


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
def test_an_answer_whose_end_is_the_servers_close_is_read_whole(streamed: bool) -> None:
    if streamed:
        chunks = [{"choices": [{"delta": {"content": text}}]} for text in ("close", "-delimited")]
        body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        server, port = _close_delimited_server(body, b"text/event-stream")
    else:
        body = json.dumps({"choices": [{"message": {"content": "close-delimited"}}]}).encode()
        server, port = _close_delimited_server(body, b"application/json")
    pieces: list[str] = []
    provider = Provider(f"http://127.0.0.1:{port}", "", 5.0)
    try:
        answer = provider.complete("m", MESSAGES, on_delta=pieces.append if streamed else None)
    finally:
        provider.close()
        server.close()
    assert answer.content == "close-delimited"
    assert pieces == (["close", "-delimited"] if streamed else [])


class _StreamingServer:
    """Streams every answer over one keep-alive connection (HTTPS with `tls`): 30 chunked
    events, some sent together and some apart, then the last chunk, `[DONE]` and the end."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._tls = tls
        self.port = self._sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            conn = self._tls.wrap_socket(raw, server_side=True) if self._tls else raw
            with conn, contextlib.suppress(OSError):
                while self._answer(conn):
                    pass

    def _answer(self, conn: socket.socket) -> bool:
        if read_request(conn) is None:
            return False
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")
        for n in range(30):
            event = b'data: {"choices":[{"delta":{"content":"p%d "}}]}\n\n' % n
            conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            if n % 10 == 9:
                threading.Event().wait(0.02)
        end = (b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],'
               b'"usage":{"prompt_tokens":1,"completion_tokens":30}}\n\ndata: [DONE]\n\n')
        conn.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(end), end))
        return True

    def close(self) -> None:
        self._sock.close()


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_streamed_answers_are_read_whole_and_their_connection_serves_the_next_call(
    https: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Read by the process's poller (jobqueue/runtime/provider_stream.py): every piece, in
    # order, whether chunks come apart or together (over TLS too); the end of the body comes
    # with the last event, so the next call reuses the connection.
    tls = None
    if https:
        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server = _StreamingServer(tls)
    provider = Provider(f"{'https' if https else 'http'}://127.0.0.1:{server.port}", "", 5.0)
    try:
        for _ in range(2):
            pieces: list[str] = []
            completion = provider.complete("m", MESSAGES, on_delta=pieces.append)
            assert pieces == [f"p{n} " for n in range(30)]
            assert completion.content == "".join(pieces) and completion.tokens_out == 30
    finally:
        provider.close()
        server.close()
    assert server.connections == 1


def test_a_connection_a_thread_is_done_with_serves_the_next_thread() -> None:
    with FakeProvider() as fake:
        provider = Provider(fake.url, "", 5.0)
        answers: list[str] = []
        # NOTE: one thread after another, as job threads waiting on their finalize while others
        # call: one call in flight at a time needs one connection, whatever the threads.
        for _ in range(4):
            thread = threading.Thread(
                target=lambda: answers.append(provider.complete("m", MESSAGES).content))
            thread.start()
            thread.join()
        connections = len(provider._open)
        provider.close()
    assert len(answers) == 4 and connections == 1
