"""A normal client's POST /prompt latency while hostile clients lean on the Procfile's web.

Against gunicorn exactly as the Procfile's `web:` line runs it (service/gunicorn_conf.py: gevent,
WEB_CONCURRENCY=2, SA_WEB_CONNECTIONS=1000 per process), two workers (`sa-core run-worker`) and
the fake provider, on a scratch database. One token (org 1) abuses, all at once:

- `--slow` slow-body connections (1,000): POST /prompt with a Content-Length of 1,000, then one
  body byte and nothing more; each one that is answered or dropped reconnects at once;
- `--streams` event streams (200), held open and drained;
- and, from a child process of their own (bench/abuse_attacks.py): a deep chain (`--chain`
  3,000 prompts, each `after` the previous, behind a root that fails in the worker, and a
  second chain whose root is cancelled), a wait flood (`--waits` 205 concurrent `Prefer:
  wait=60` that never end by themselves), `--replays` (10) streams from Last-Event-ID 0 over
  `--large` (60) answers of `--large-bytes` (4 MB) that never read, `--recent-clients` (40)
  reading /mission/recent?limit=500 back to back, and `--session-clients` (20) opening
  sessions back to back.

The slow bodies and streams run in one child process and the other attacks in another, so the
normal client's event loop serves it alone (its lag would count in the latencies).

Meanwhile one normal client (org 2) POSTs /prompt at `--rate` per second (100) for `--seconds`
(40), open loop over a few keep-alive connections (latency runs from each request's scheduled
time, so a stall is charged to every request it delays); and org 3's job, running on a worker
of its own, has that worker SIGKILLed `--kill-at` seconds in: the other worker's maintenance
must reclaim it within SA_STALE_AFTER plus a few reclaim rounds.

Prints the normal client's p50/p99/max and errors (target: p99 under 50 ms, 0 errors), the web
processes' largest RSS (target: under 300 MiB), whether org 3's job was reclaimed on time, and
what became of each attack. Counts are reported, not asserted.

Usage: .venv/bin/python -m bench.abuse [--seconds 40] [--attacks slow,streams,chain,...]
       [--large 60 --large-bytes 4000000] (smaller --large runs faster on a busy machine)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing
import os
import resource
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import httpx
from psycopg_pool import ConnectionPool

from bench.abuse_attacks import ATTACKS, AttackConfig, run_attacks
from bench.common import VENV_BIN, percentile, scratch_database, spawn, wait_http, web_server
from jobqueue.core.db import DictConnection, open_pool
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
                        ) -> tuple[list[tuple[float, float]], collections.Counter[str]]:
    """POSTs at `rate`/s for `seconds`; returns (seconds in, latency in ms from the scheduled
    time) of each answer, and the errors."""
    errors: collections.Counter[str] = collections.Counter()
    latencies: list[tuple[float, float]] = []
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
            latencies.append((scheduled - started, (time.perf_counter() - scheduled) * 1000))
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


async def hold_connections(port: int, token: str, slow: int, streams: int,
                           opened: EventType, stop: EventType) -> dict[str, int]:
    """The slow bodies and event streams, until `stop`; returns what became of them."""
    tally = Tally()
    done = asyncio.Event()
    started = asyncio.Semaphore(0)
    abusers = [asyncio.ensure_future(stream(port, token, done, tally, started))
               for _ in range(streams)]
    for _ in range(streams):
        await started.acquire()
    abusers += [asyncio.ensure_future(slow_body(port, token, done, tally)) for _ in range(slow)]
    opened.set()
    await asyncio.get_running_loop().run_in_executor(None, stop.wait)
    done.set()
    await asyncio.gather(*abusers)
    return dict(tally.outcomes)


def _hold_child(port: int, token: str, slow: int, streams: int, opened: EventType,
                stop: EventType, out: multiprocessing.Queue[dict[str, int]]) -> None:
    out.put(asyncio.run(hold_connections(port, token, slow, streams, opened, stop)))


def run(port: int, abuser: str, normal: str, args: argparse.Namespace) -> None:
    """The slow bodies and streams from a child process, so the normal client's own event loop
    (whose lag would count in its latencies) serves the normal client alone."""
    spawned = multiprocessing.get_context("spawn")
    opened, stop = spawned.Event(), spawned.Event()
    out: multiprocessing.Queue[dict[str, int]] = spawned.Queue()
    slow = args.slow if "slow" in args.attacks else 0
    streams = args.streams if "streams" in args.attacks else 0
    child = spawned.Process(target=_hold_child, daemon=True,
                            args=(port, abuser, slow, streams, opened, stop, out))
    child.start()
    if not opened.wait(120):
        raise SystemExit("the event streams did not all open within 2 minutes")
    time.sleep(args.settle)
    timed, errors = asyncio.run(normal_client(port, normal, args.rate, args.seconds))
    stop.set()
    outcomes = out.get(timeout=120)
    child.join(30)
    latencies = [ms for _, ms in timed]
    print(f"normal client: {len(latencies)} answers at {args.rate:g}/s over {args.seconds:g} s, "
          f"p50 {percentile(latencies, 50):.1f} ms  p99 {percentile(latencies, 99):.1f} ms  "
          f"max {max(latencies):.1f} ms  errors {sum(errors.values())} {dict(errors) or ''}")
    by_tens = [[ms for at, ms in timed if start <= at < start + 10]
               for start in range(0, int(args.seconds), 10)]
    print("  p99 by 10 s: " + ", ".join(f"{percentile(part, 99):.0f}" for part in by_tens if part)
          + f" ms; 1-minute load average at the end {os.getloadavg()[0]:.1f}")
    print(f"abusers: {slow} slow-body connections (reconnecting), {streams} event streams, "
          "one token")
    for outcome, count in sorted(outcomes.items()):
        print(f"  {outcome}: {count}")


def _web_rss(master: int) -> list[int]:
    """The resident bytes of each web worker process (the gunicorn master's children)."""
    sizes = []
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        for pid in children:
            with contextlib.suppress(OSError, StopIteration):
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
                sizes.append(int(next(line for line in status if line.startswith("VmRSS:"))
                                 .split()[1]) * 1024)
    return sizes


class RssSampler(threading.Thread):
    """Samples the web workers' RSS every half second; keeps the largest seen per sample."""

    def __init__(self, master: int) -> None:
        super().__init__(daemon=True)
        self._master = master
        self._done = threading.Event()
        self.largest = 0
        self.largest_total = 0

    def run(self) -> None:
        while not self._done.wait(0.5):
            sizes = _web_rss(self._master)
            if sizes:
                self.largest = max(self.largest, max(sizes))
                self.largest_total = max(self.largest_total, sum(sizes))

    def stop(self) -> None:
        self._done.set()
        self.join()


def _submit(port: int, token: str, body: dict[str, object]) -> dict[str, object]:
    answer = httpx.post(f"http://127.0.0.1:{port}{PROMPT}", json=body, timeout=30.0,
                        headers={"Authorization": f"Bearer {token}"})
    answer.raise_for_status()
    return dict(answer.json())


def _poll(pool: ConnectionPool[DictConnection], query: str, params: tuple[object, ...],
          until: float) -> dict[str, object] | None:
    """Runs `query` every 0.2 s until it returns a row or `until` (monotonic) passes."""
    while time.monotonic() < until:
        with pool.connection() as conn:
            row = conn.execute(query, params).fetchone()
        if row is not None:
            return dict(row)
        time.sleep(0.2)
    return None


def _reclaim_probe(pool: ConnectionPool[DictConnection], victim: subprocess.Popen[bytes],
                   job_id: object, kill_at: float, deadline: float) -> threading.Thread:
    """SIGKILLs the victim's worker at `kill_at` (monotonic) and reports when its job left it."""

    def probe() -> None:
        time.sleep(max(0.0, kill_at - time.monotonic()))
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        left = _poll(pool, "SELECT state, attempt FROM sa_job WHERE id = %s AND NOT "
                           "(state = 'running' AND worker_claim LIKE %s)",
                     (job_id, f"%:{victim.pid}:%"), killed + deadline + 10)
        if left is None:
            print(f"org 3's job: NOT reclaimed within {deadline + 10:.0f} s of its worker's SIGKILL")
            return
        took = time.monotonic() - killed
        verdict = "on time" if took <= deadline else "LATE"
        print(f"org 3's job: reclaimed {took:.1f} s after its worker's SIGKILL ({verdict}: "
              f"within {deadline:.0f} s), now {left['state']} at attempt {left['attempt']}")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    return thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds between the abusers' arrival and the normal client's start")
    parser.add_argument("--attacks", default=",".join(("slow", "streams", *ATTACKS)),
                        help="comma-separated: slow, streams, " + ", ".join(ATTACKS))
    parser.add_argument("--chain", type=int, default=3000)
    parser.add_argument("--waits", type=int, default=205)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--large", type=int, default=60, help="large answers to replay")
    parser.add_argument("--large-bytes", type=int, default=4_000_000)
    parser.add_argument("--recent-clients", type=int, default=40)
    parser.add_argument("--session-clients", type=int, default=20)
    parser.add_argument("--kill-at", type=float, default=25.0,
                        help="seconds into the normal client's run when org 3's worker is killed")
    parser.add_argument("--stale-after", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--provider-port", type=int, default=8767)
    args = parser.parse_args()
    args.attacks = tuple(name for name in args.attacks.split(",") if name)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    with scratch_database() as url:
        _run_against(url, args)


def _run_against(url: str, args: argparse.Namespace) -> None:
    pool = open_pool(url, name="bench-abuse", max_size=2)
    abuser, normal, victim_token = (create_token(pool, org, org) for org in (1, 2, 3))
    provider_url = f"http://127.0.0.1:{args.provider_port}"
    worker_env = {"DATABASE_URL": url, "SA_PROVIDER_URL": f"{provider_url}/v1",
                  "SA_HEARTBEAT_INTERVAL": "2", "SA_STALE_AFTER": str(args.stale_after),
                  "SA_RECLAIM_INTERVAL": "1"}
    children = [spawn([str(VENV_BIN / "sa-core"), "fake-provider", "--port",
                       str(args.provider_port)], {})]
    try:
        wait_http(f"{provider_url}/healthz")
        with web_server({"DATABASE_URL": url}, args.port) as web:
            # NOTE: org 3's worker has one slot, taken by its one long job before the other starts.
            victim = spawn([str(VENV_BIN / "sa-core"), "run-worker", "--concurrency", "1"],
                           worker_env)
            children.append(victim)
            job_id = _submit(args.port, victim_token, {"text": "victim [fake:latency=600]",
                                                       "priority": 0})["job_id"]
            if _poll(pool, "SELECT 1 FROM sa_job WHERE id = %s AND state = 'running'",
                     (job_id,), time.monotonic() + 30) is None:
                raise SystemExit("org 3's job did not start")
            children.append(spawn([str(VENV_BIN / "sa-core"), "run-worker"], worker_env))
            _seed_large_answers(pool, args, abuser)
            sampler = RssSampler(web.pid)
            sampler.start()
            attacks = tuple(a for a in args.attacks if a in ATTACKS)
            child, reports = run_attacks(AttackConfig(
                port=args.port, token=abuser, attacks=attacks, chain=args.chain,
                waits=args.waits, replays=args.replays, recent_clients=args.recent_clients,
                session_clients=args.session_clients), args.settle + args.seconds + 5)
            probe = _reclaim_probe(pool, victim, job_id,
                                   time.monotonic() + args.settle + args.kill_at,
                                   args.stale_after + 5)
            run(args.port, abuser, normal, args)
            report = reports.get(timeout=120)
            child.join(30)
            probe.join(args.stale_after + 60)
            sampler.stop()
            print(f"web: largest worker RSS {sampler.largest / 2**20:.0f} MiB, all workers "
                  f"together at most {sampler.largest_total / 2**20:.0f} MiB")
            print(f"attacks ({', '.join(attacks) or 'none'}):")
            for note in report.notes:
                print(f"  {note}")
            for outcome, count in sorted(report.outcomes.items()):
                print(f"  {outcome}: {count}")
    finally:
        for proc in children:
            proc.terminate()
        for proc in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        pool.close()


def _seed_large_answers(pool: ConnectionPool[DictConnection], args: argparse.Namespace,
                        abuser: str) -> None:
    """The abuser's `--large` answers of `--large-bytes`, for the replays to stream."""
    if "replays" not in args.attacks or not args.large:
        return
    started = time.monotonic()
    for n in range(args.large):
        _submit(args.port, abuser, {"text": f"large {n} [fake:bytes={args.large_bytes}]"})
    done = _poll(pool, "SELECT 1 FROM sa_job WHERE org_id = 1 HAVING count(*) FILTER "
                       "(WHERE state = 'succeeded') >= %s", (args.large,), time.monotonic() + 600)
    if done is None:
        raise SystemExit("the large answers did not all succeed within 10 minutes")
    print(f"seeded {args.large} answers of {args.large_bytes / 1e6:g} MB in "
          f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
