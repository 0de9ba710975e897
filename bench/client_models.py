"""Concurrency model x HTTP client: N chat-completion calls kept in flight by one process.

Usage: python bench/client_models.py MODEL CLIENT N PORT [SECONDS]
  MODEL  threads | gevent | asyncio | uvloop
  CLIENT httpclient | urllib3 | httpx (threads, gevent); aiohttp | httpx (asyncio, uvloop)

The quick prototype behind sa-core's choice of gevent + the stdlib client (docs/decisions.md,
docs/performance.md): no database, only the calls, against
`python -m bench.slow_provider --port PORT` (answers after 1 s). Each of N loops makes one call
after another; after 2.5 s of warm-up it counts calls for SECONDS (default 5) and prints calls/s,
calls/s as a fraction of N / 1 s, CPU ms per call and peak RSS as one JSON line. It needs a
virtual environment with gevent, urllib3, httpx, aiohttp and uvloop (the project's has the first
three): e.g. `uv venv /tmp/models && uv pip install --python /tmp/models/bin/python gevent
urllib3 httpx aiohttp uvloop`.
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


def blocking_loop() -> Callable[[], None]:
    """One loop's body for threads or greenlets."""
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
