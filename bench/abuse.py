"""A normal client's POST /prompt latency while hostile clients lean on the Procfile's web.

Against gunicorn exactly as the Procfile's `web:` line runs it (service/gunicorn_conf.py: gevent,
WEB_CONCURRENCY=2, SA_WEB_CONNECTIONS=1000 per process), on a scratch database:

- `--slow` slow-body connections (1,000): POST /prompt with the abuser's valid token, a
  Content-Length of 1,000, then one body byte and nothing more; each one that is answered or
  dropped reconnects at once, so the pressure stays on for the whole run;
- `--streams` event streams (200): GET /sa-core/v1/mission/events with the same token, held
  open and drained;
- one normal client (another org's token) POSTing /prompt at `--rate` per second (100) for
  `--seconds` (20), open loop over a few keep-alive connections: latency runs from each
  request's scheduled time, so a stall is charged to every request it delays.

Prints the normal client's p50/p99/max and errors (target: p99 under 50 ms, 0 errors), and what
became of the abusive connections (answered 408, 401 or 429, dropped, refused). Counts are
reported, not asserted: stream caps (429) depend on the server's settings.

Everything runs on one asyncio loop with raw sockets, so the load generator stays light.

Usage: .venv/bin/python -m bench.abuse [--slow 1000] [--streams 200] [--rate 100] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import resource
import time
from dataclasses import dataclass, field

from bench.common import percentile, scratch_database, web_server
from jobqueue.core.db import open_pool
from jobqueue.core.tokens import create_token

PROMPT = "/sa-core/v1/prompt"
EVENTS = "/sa-core/v1/mission/events"
NORMAL_CONNECTIONS = 8


@dataclass
class Tally:
    """What happened to the abusive connections, by outcome."""

    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, outcome: str) -> None:
        self.outcomes[outcome] += 1


def request(method: str, path: str, token: str, extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"{extra}\r\n").encode()


async def status_of(reader: asyncio.StreamReader) -> int:
    """Reads a response's head and returns its status code."""
    head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1])


async def slow_body(port: int, token: str, stop: asyncio.Event, tally: Tally) -> None:
    """Holds one slow-body POST open at a time, reconnecting whenever the server lets go."""
    head = request("POST", PROMPT, token,
                   "Content-Type: application/json\r\nContent-Length: 1000\r\n")
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            tally.add("slow: refused")
            await asyncio.sleep(0.1)
            continue
        try:
            writer.write(head + b"{")
            await writer.drain()
            done = asyncio.ensure_future(status_of(reader))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if done.done():
                tally.add(f"slow: answered {done.result()}")
            else:
                done.cancel()
                tally.add("slow: still open at the end")
            stopped.cancel()
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            tally.add("slow: dropped without an answer")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def stream(port: int, token: str, stop: asyncio.Event, tally: Tally,
                 opened: asyncio.Semaphore) -> None:
    """Opens one event stream and drains it until the run ends."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        tally.add("stream: refused")
        opened.release()
        return
    try:
        writer.write(request("GET", EVENTS, token, "Accept: text/event-stream\r\n"))
        status = await asyncio.wait_for(status_of(reader), 30)
        tally.add(f"stream: answered {status}")
        opened.release()
        while not stop.is_set():
            reading = asyncio.ensure_future(reader.read(65536))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({reading, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not reading.done():
                reading.cancel()
                break
            if not reading.result():
                tally.add("stream: ended by the server")
                break
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        tally.add("stream: dropped without an answer")
        opened.release()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def normal_client(port: int, token: str, rate: float, seconds: float
                        ) -> tuple[list[float], collections.Counter[str]]:
    """POSTs at `rate`/s for `seconds`; returns latencies (ms, from the scheduled time) and errors."""
    errors: collections.Counter[str] = collections.Counter()
    latencies: list[float] = []
    free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(NORMAL_CONNECTIONS):
        free.put_nowait(await asyncio.open_connection("127.0.0.1", port))

    async def one(i: int, scheduled: float) -> None:
        body = json.dumps({"text": f"normal {i}"}).encode()
        head = request("POST", PROMPT, token, "Content-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n")
        reader, writer = await free.get()
        try:
            writer.write(head + body)
            await writer.drain()
            head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            status = int(head_bytes.split(b" ", 2)[1])
            length = next(int(line.split(b":", 1)[1]) for line in head_bytes.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            latencies.append((time.perf_counter() - scheduled) * 1000)
            if status != 202:
                errors[f"status {status}"] += 1
            free.put_nowait((reader, writer))
        except (TimeoutError, OSError, asyncio.IncompleteReadError, StopIteration) as exc:
            errors[type(exc).__name__] += 1
            writer.close()
            free.put_nowait(await asyncio.open_connection("127.0.0.1", port))

    started = time.perf_counter()
    tasks = []
    for i in range(int(rate * seconds)):
        scheduled = started + i / rate
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(i, scheduled)))
    await asyncio.gather(*tasks)
    while not free.empty():
        free.get_nowait()[1].close()
    return latencies, errors


async def run(port: int, abuser: str, normal: str, args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    tally = Tally()
    opened = asyncio.Semaphore(0)
    abusers = [asyncio.ensure_future(stream(port, abuser, stop, tally, opened))
               for _ in range(args.streams)]
    for _ in range(args.streams):
        await opened.acquire()
    abusers += [asyncio.ensure_future(slow_body(port, abuser, stop, tally))
                for _ in range(args.slow)]
    await asyncio.sleep(args.settle)
    latencies, errors = await normal_client(port, normal, args.rate, args.seconds)
    stop.set()
    await asyncio.gather(*abusers)
    print(f"normal client: {len(latencies)} answers at {args.rate:g}/s over {args.seconds:g} s, "
          f"p50 {percentile(latencies, 50):.1f} ms  p99 {percentile(latencies, 99):.1f} ms  "
          f"max {max(latencies):.1f} ms  errors {sum(errors.values())} {dict(errors) or ''}")
    print(f"abusers: {args.slow} slow-body connections (reconnecting), {args.streams} event "
          f"streams, one token")
    for outcome, count in sorted(tally.outcomes.items()):
        print(f"  {outcome}: {count}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds between the abusers' arrival and the normal client's start")
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    with scratch_database() as url:
        pool = open_pool(url, name="bench-abuse", max_size=1)
        try:
            abuser, normal = create_token(pool, 1, 1), create_token(pool, 2, 2)
        finally:
            pool.close()
        with web_server({"DATABASE_URL": url}, args.port):
            asyncio.run(run(args.port, abuser, normal, args))


if __name__ == "__main__":
    main()
