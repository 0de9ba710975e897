"""The attacks of bench/abuse.py that need more than a socket: a deep `after` chain, a wait flood,
clients that never read replays of large answers, big /mission/recent pages, a session flood.

They run in a child process of their own (`run_attacks`), so the load they generate never slows
the normal client's loop that measures the latency; each one reports how the web answered it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import multiprocessing
import socket
import time
from dataclasses import dataclass, field

__all__ = ["ATTACKS", "AttackConfig", "run_attacks"]

PROMPT = "/sa-core/v1/prompt"
JOBS = "/sa-core/v1/jobs"
EVENTS = "/sa-core/v1/mission/events"
RECENT = "/sa-core/v1/mission/recent"
SESSION = "/sa-core/v1/session"

ATTACKS = ("chain", "waits", "replays", "recent", "sessions")


@dataclass(frozen=True)
class AttackConfig:
    """Which attacks, how hard, against which port, with the abuser's token."""

    port: int
    token: str
    attacks: tuple[str, ...] = ATTACKS
    chain: int = 3000
    chain_root_delay: int = 20
    waits: int = 205
    replays: int = 10
    recent_clients: int = 40
    session_clients: int = 20


@dataclass
class Report:
    """What the web answered, by attack and outcome."""

    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    notes: list[str] = field(default_factory=list)


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str,
                path: str, token: str, body: object = None,
                headers: str = "") -> tuple[int, dict[str, str], bytes]:
    """One request on a kept-alive connection; returns the status, headers and body."""
    data = b"" if body is None else json.dumps(body).encode()
    writer.write((f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n{headers}\r\n").encode() + data)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:]
                                                           if line)}
    payload = await reader.readexactly(int(fields.get("content-length", "0")))
    return int(lines[0].split(" ", 2)[1]), fields, payload


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)


async def deep_chain(cfg: AttackConfig, report: Report) -> None:
    """Builds a chain of `cfg.chain` prompts, each `after` the previous, behind a root due in
    `cfg.chain_root_delay` seconds that fails in the worker ([fake:400]); then builds a second
    one and cancels its root."""
    reader, writer = await _connect(cfg.port)
    roots = []
    for name, root_body in (("failing", {"text": "deep chain root [fake:400]",
                                         "delay_seconds": cfg.chain_root_delay}),
                            ("cancelled", {"text": "deep chain root to cancel",
                                           "delay_seconds": 3600})):
        started = time.monotonic()
        status, _, body = await _call(reader, writer, "POST", PROMPT, cfg.token, root_body)
        previous = json.loads(body)["job_id"]
        roots.append(previous)
        built = 0
        while built < cfg.chain:
            status, _, body = await _call(reader, writer, "POST", PROMPT, cfg.token,
                                          {"text": f"{name} link {built}", "after": previous})
            if status != 202:
                report.outcomes[f"chain: a link answered {status}"] += 1
                break
            previous, built = json.loads(body)["job_id"], built + 1
        report.notes.append(f"{name} chain: {built} links built in "
                            f"{time.monotonic() - started:.1f} s")
    started = time.monotonic()
    status, _, _ = await _call(reader, writer, "POST", f"{JOBS}/{roots[1]}/cancel", cfg.token)
    report.notes.append(f"cancelling the second chain's root: {status} in "
                        f"{(time.monotonic() - started) * 1000:.0f} ms")
    writer.close()


async def wait_flood(cfg: AttackConfig, report: Report, stop: asyncio.Event) -> None:
    """`cfg.waits` concurrent `Prefer: wait=60` submits of prompts due in an hour (they never
    end by themselves): the held ones and the ones answered at once are counted."""

    async def one() -> None:
        reader, writer = await _connect(cfg.port)
        try:
            call = asyncio.ensure_future(_call(reader, writer, "POST", PROMPT, cfg.token,
                                               {"text": "wait for me", "delay_seconds": 3600},
                                               "Prefer: wait=60\r\n"))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({call, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if call.done():
                status, headers, _ = call.result()
                skipped = " (SA-Wait-Skipped)" if "sa-wait-skipped" in headers else ""
                report.outcomes[f"waits: answered {status}{skipped}"] += 1
            else:
                call.cancel()
                report.outcomes["waits: held to the end"] += 1
            stopped.cancel()
        except (OSError, asyncio.IncompleteReadError) as exc:
            report.outcomes[f"waits: {type(exc).__name__}"] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(cfg.waits)))


async def non_reading_replays(cfg: AttackConfig, report: Report, stop: asyncio.Event) -> None:
    """`cfg.replays` streams from Last-Event-ID 0 over the abuser's large answers, never read."""
    socks = []
    for _ in range(cfg.replays):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", cfg.port))
        await asyncio.sleep(0)
        socks.append(sock)
    request = (f"GET {EVENTS} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {cfg.token}"
               "\r\nLast-Event-ID: 0\r\n\r\n").encode()
    loop = asyncio.get_running_loop()
    for sock in socks:
        await loop.sock_sendall(sock, request)
    report.outcomes["replays: opened, never read"] += len(socks)
    await stop.wait()
    for sock in socks:
        sock.close()


async def recent_pages(cfg: AttackConfig, report: Report, stop: asyncio.Event) -> None:
    """`cfg.recent_clients` clients reading `/mission/recent?limit=500` back to back."""
    sizes: list[int] = []

    async def one() -> None:
        reader, writer = await _connect(cfg.port)
        try:
            while not stop.is_set():
                status, _, body = await _call(reader, writer, "GET", f"{RECENT}?limit=500",
                                              cfg.token)
                report.outcomes[f"recent: answered {status}"] += 1
                sizes.append(len(body))
        except (OSError, asyncio.IncompleteReadError) as exc:
            report.outcomes[f"recent: {type(exc).__name__}"] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(cfg.recent_clients)))
    if sizes:
        report.notes.append(f"recent pages: largest {max(sizes) / 2**20:.2f} MiB, "
                            f"{len(sizes)} read")


async def session_flood(cfg: AttackConfig, report: Report, stop: asyncio.Event) -> None:
    """`cfg.session_clients` clients opening sessions back to back with one token."""

    async def one() -> None:
        reader, writer = await _connect(cfg.port)
        try:
            while not stop.is_set():
                status, _, _ = await _call(reader, writer, "POST", SESSION, cfg.token)
                report.outcomes[f"sessions: answered {status}"] += 1
        except (OSError, asyncio.IncompleteReadError) as exc:
            report.outcomes[f"sessions: {type(exc).__name__}"] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(cfg.session_clients)))


async def _attack(cfg: AttackConfig, seconds: float) -> Report:
    report, stop = Report(), asyncio.Event()
    tasks = []
    if "chain" in cfg.attacks:
        tasks.append(asyncio.ensure_future(deep_chain(cfg, report)))
    for name, attack in (("waits", wait_flood), ("replays", non_reading_replays),
                         ("recent", recent_pages), ("sessions", session_flood)):
        if name in cfg.attacks:
            tasks.append(asyncio.ensure_future(attack(cfg, report, stop)))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    return report


def _child(cfg: AttackConfig, seconds: float, out: multiprocessing.Queue[Report]) -> None:
    out.put(asyncio.run(_attack(cfg, seconds)))


def run_attacks(cfg: AttackConfig, seconds: float) -> tuple[multiprocessing.process.BaseProcess,
                                                            multiprocessing.Queue[Report]]:
    """Starts the attacks in a child process for `seconds`; its Report arrives on the queue.

    NOTE: a spawned child, not a fork: it inherits no pool, thread or socket of the bench.
    """
    spawned = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[Report] = spawned.Queue()
    child = spawned.Process(target=_child, args=(cfg, seconds, out), daemon=True)
    child.start()
    return child, out
