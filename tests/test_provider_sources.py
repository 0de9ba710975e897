"""Past one address and one process's descriptors: SA_PROVIDER_SOURCE_ADDRESSES over real HTTP (new
provider connections take the listed local addresses in turn; a bad list stops the worker at
start), and the worker's descriptor limit raised and checked against its concurrency."""

from __future__ import annotations

import http.server
import json
import resource
import socketserver
import threading
from collections.abc import Callable, Iterator

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import enqueue
from jobqueue.runtime.provider import Provider
from jobqueue.runtime.provider_transport import SourceAddresses

__all__: list[str] = []

MESSAGES = [{"role": "user", "content": "hello"}]
SOURCES = ("127.0.0.2", "127.0.0.3")


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every chat completion on a keep-alive connection; the server keeps who connected."""

    protocol_version = "HTTP/1.1"
    server: _RecordingServer

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.peers.append(self.client_address[0])

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _RecordingServer(socketserver.ThreadingTCPServer):
    """A provider on 127.0.0.1 that records the source address of every connection it accepts."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.peers: list[str] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def recording() -> Iterator[_RecordingServer]:
    server = _RecordingServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_new_connections_take_the_source_addresses_in_turn_and_are_kept(
    recording: _RecordingServer,
) -> None:
    provider = Provider(recording.url, "", 5.0, sources=SourceAddresses(SOURCES))
    answers: list[str] = []
    barrier = threading.Barrier(6)

    def calls() -> None:
        barrier.wait()
        for _ in range(3):
            answers.append(provider.complete("m", MESSAGES).content)

    threads = [threading.Thread(target=calls) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    provider.close()
    assert answers == ["hi"] * 18
    # NOTE: one keep-alive connection per thread, so 6 connections for 18 calls, 3 per address.
    assert sorted(recording.peers) == sorted(SOURCES * 3)


def test_the_worker_sends_from_the_listed_addresses(
    recording: _RecordingServer, pool: ConnectionPool[DictConnection],
    monkeypatch: pytest.MonkeyPatch, cli: Callable[[list[str]], int],
) -> None:
    jobs = [enqueue(pool, Caller(org_id=1, user_id=1), f"prompt {n}").job_id for n in range(4)]
    monkeypatch.setenv("SA_PROVIDER_URL", recording.url)
    monkeypatch.setenv("SA_PROVIDER_SOURCE_ADDRESSES", ", ".join(SOURCES))
    assert cli(["run-worker", "--once", "--concurrency", "4"]) == 0
    with pool.connection() as conn:
        states = conn.execute("SELECT state FROM sa_job WHERE id = ANY(%s)", (jobs,)).fetchall()
    assert [row["state"] for row in states] == ["succeeded"] * 4
    assert set(recording.peers) == set(SOURCES)


@pytest.mark.parametrize(("value", "message"), [
    ("127.0.0.2,llm.internal", "sa-core: SA_PROVIDER_SOURCE_ADDRESSES: 'llm.internal' is not an IP"),
    ("127.0.0.2,127.0.0.2", "sa-core: SA_PROVIDER_SOURCE_ADDRESSES: an address is listed twice"),
    # NOTE: TEST-NET-1 (RFC 5737): never an address of this host.
    ("192.0.2.1", "sa-core: SA_PROVIDER_SOURCE_ADDRESSES: cannot send from 192.0.2.1"),
])
def test_a_source_address_the_host_cannot_send_from_stops_the_worker_with_one_line(
    value: str, message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], cli: Callable[[list[str]], int],
) -> None:
    monkeypatch.setenv("SA_PROVIDER_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("SA_PROVIDER_SOURCE_ADDRESSES", value)
    assert cli(["run-worker", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_a_concurrency_the_descriptor_limit_cannot_hold_is_warned_of_at_start(
    recording: _RecordingServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], cli: Callable[[list[str]], int],
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    concurrency = hard if hard != resource.RLIM_INFINITY else 1 << 21
    monkeypatch.setenv("SA_PROVIDER_URL", recording.url)
    assert cli(["run-worker", "--once", "--concurrency", str(concurrency)]) == 0
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    warning = next(json.loads(line) for line in capsys.readouterr().err.splitlines()
                   if "worker.descriptors_short" in line)
    # NOTE: the soft limit was raised to the hard one first; even that leaves no room to spare.
    assert soft == hard or hard == resource.RLIM_INFINITY
    assert warning["limit"] == soft and warning["concurrency"] == concurrency
