"""Concurrency model x HTTP client: N chat-completion calls kept in flight by one process.

Usage: python bench/client_models.py MODEL CLIENT N PORT [SECONDS]
  MODEL  threads | gevent | asyncio | uvloop
  CLIENT httpclient | urllib3 | httpx | h2 (threads, gevent); aiohttp | httpx (asyncio, uvloop)

The quick prototype behind sa-core's choice of gevent + the stdlib client (docs/decisions.md,
docs/performance.md): no database, only the calls, against
`python -m bench.slow_provider --port PORT` (answers after 1 s). Each of N loops makes one call
after another; after 2.5 s of warm-up it counts calls for SECONDS (default 5) and prints calls/s,
calls/s as a fraction of N / 1 s, CPU ms per call and peak RSS as one JSON line. It needs a
virtual environment with gevent, urllib3, httpx, aiohttp and uvloop (the project's has the first
three): e.g. `uv venv /tmp/models && uv pip install --python /tmp/models/bin/python gevent
urllib3 httpx aiohttp uvloop`.

`h2` is HTTP/2 in clear text (prior knowledge) with the `h2` package's state machine: the N loops
share H2_CONNECTIONS connections (default 1), each a stream per call, one reader per connection
handing each answer to its caller; the provider must speak it (`python -m bench.slow_provider
--http2`). It measures what issue 28 asked before HTTP/2 may replace the stdlib client.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

MODEL, CLIENT, N, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
SECONDS = float(sys.argv[5]) if len(sys.argv) > 5 else 5.0
WARMUP = 2.5
if MODEL == "gevent":
    from gevent import monkey

    monkey.patch_all()

URL = f"http://127.0.0.1:{PORT}/v1/chat/completions"
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello " * 20}]}).encode()
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer k"}
counts = {"calls": 0, "errors": 0}


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def done(data: bytes) -> None:
    if not isinstance(json.loads(data)["choices"][0]["message"]["content"], str):
        raise ValueError("no content")
    counts["calls"] += 1


def report(started: float, cpu_started: float, calls_started: int) -> None:
    elapsed = time.monotonic() - started
    calls = counts["calls"] - calls_started
    print(json.dumps({
        "model": MODEL, "client": CLIENT, "n": N, "calls_s": round(calls / elapsed, 1),
        "fraction": round(calls / elapsed / N, 3),
        "cpu_ms_call": round((cpu() - cpu_started) * 1000 / max(calls, 1), 3),
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "errors": counts["errors"]}), flush=True)


class _H2Connection:
    """One HTTP/2 connection shared by many callers: a lock to send, one reader thread for all."""

    def __init__(self) -> None:
        import socket
        import threading

        import h2.config
        import h2.connection
        import h2.settings

        self.sock = socket.create_connection(("127.0.0.1", PORT))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(1 << 30)
        self.lock = threading.Lock()
        self.waiting: dict[int, tuple[Any, list[bytes]]] = {}
        self.settled = threading.Event()
        self.sock.sendall(self.conn.data_to_send())
        threading.Thread(target=self._read, daemon=True).start()
        # NOTE: until the server's SETTINGS arrive, h2 allows 100 streams; past them each call
        # would fail at once and its loop spin.
        if not self.settled.wait(10):
            raise TimeoutError("no SETTINGS from the provider")

    def call(self) -> bytes:
        import threading

        done_event = threading.Event()
        parts: list[bytes] = []
        with self.lock:
            stream = self.conn.get_next_available_stream_id()
            self.waiting[stream] = (done_event, parts)
            self.conn.send_headers(stream, [(":method", "POST"), (":path", "/v1/chat/completions"),
                                            (":scheme", "http"), (":authority", "127.0.0.1"),
                                            *HEADERS.items()])
            self.conn.send_data(stream, BODY, end_stream=True)
            self.sock.sendall(self.conn.data_to_send())
        if not done_event.wait(30):
            raise TimeoutError("no answer")
        return b"".join(parts)

    def _read(self) -> None:
        import h2.events

        while data := self.sock.recv(65536):
            with self.lock:
                for event in self.conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        self.waiting[event.stream_id][1].append(event.data)
                        self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                            event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        self.waiting.pop(event.stream_id)[0].set()
                    elif isinstance(event, h2.events.RemoteSettingsChanged):
                        self.settled.set()
                self.sock.sendall(self.conn.data_to_send())


def h2_loop() -> Callable[[], None]:
    """One loop's body for the `h2` client: its calls take the shared connections in turn."""
    connections = [_H2Connection() for _ in range(int(os.environ.get("H2_CONNECTIONS", "1")))]
    turn = iter(range(1 << 62))

    def loop() -> None:
        conn = connections[next(turn) % len(connections)]
        while True:
            try:
                done(conn.call())
            except Exception:
                counts["errors"] += 1
    return loop


def blocking_loop() -> Callable[[], None]:
    """One loop's body for threads or greenlets."""
    if CLIENT == "h2":
        return h2_loop()
    if CLIENT == "httpclient":
        import http.client

        def loop() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
            while True:
                try:
                    conn.request("POST", "/v1/chat/completions", body=BODY, headers=HEADERS)
                    done(conn.getresponse().read())
                except Exception:
                    counts["errors"] += 1
                    conn.close()
        return loop
    if CLIENT == "urllib3":
        import urllib3

        pool = urllib3.HTTPConnectionPool("127.0.0.1", PORT, maxsize=N, block=True, retries=False,
                                          timeout=urllib3.Timeout(connect=10, read=30))

        def loop() -> None:
            while True:
                try:
                    done(pool.urlopen("POST", "/v1/chat/completions", body=BODY,
                                      headers=HEADERS).data)
                except Exception:
                    counts["errors"] += 1
        return loop
    import httpx

    client = httpx.Client(limits=httpx.Limits(max_connections=N, max_keepalive_connections=N),
                          timeout=30)

    def loop() -> None:
        while True:
            try:
                done(client.post(URL, content=BODY, headers=HEADERS).content)
            except Exception:
                counts["errors"] += 1
    return loop


def run_blocking() -> None:
    import threading

    loop = blocking_loop()
    for _ in range(N):
        threading.Thread(target=loop, daemon=True).start()
    time.sleep(WARMUP)
    started, cpu_started, calls_started = time.monotonic(), cpu(), counts["calls"]
    time.sleep(SECONDS)
    report(started, cpu_started, calls_started)


async def run_async() -> None:
    import asyncio

    session: Any
    if CLIENT == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=N))

        async def call() -> None:
            async with session.post(URL, data=BODY, headers=HEADERS) as response:
                done(await response.read())
    else:
        import httpx

        session = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=N, max_keepalive_connections=N), timeout=30)

        async def call() -> None:
            done((await session.post(URL, content=BODY, headers=HEADERS)).content)

    async def loop() -> None:
        while True:
            try:
                await call()
            except Exception:
                counts["errors"] += 1

    tasks = [asyncio.create_task(loop()) for _ in range(N)]
    await asyncio.sleep(WARMUP)
    started, cpu_started, calls_started = time.monotonic(), cpu(), counts["calls"]
    await asyncio.sleep(SECONDS)
    report(started, cpu_started, calls_started)
    del tasks


if __name__ == "__main__":
    if MODEL in ("threads", "gevent"):
        run_blocking()
    else:
        import asyncio

        if MODEL == "uvloop":
            import uvloop

            uvloop.install()
        asyncio.run(run_async())
    # NOTE: the loops never end; leave without waiting for them.
    os._exit(0)
