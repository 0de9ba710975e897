"""oban (Python) with its psycopg pool: a no-op worker on one queue whose limit is `--concurrency`.

Run with the oban virtual environment's python (oban needs Python >= 3.12); see _runner.py for
the arguments and output. Like `oban start`, it runs on uvloop when uvloop is installed. The
pool holds concurrency + 5 connections (jobs, notifier, stager, leader), at most 40 (in llm
mode a job holds none while its HTTP call waits, and the server allows 100 in all).
"""

from __future__ import annotations

import argparse
import asyncio
from importlib.metadata import version
from typing import Any

from _runner import LlmCall, Probe, main, run_on_uvloop
from oban import Job, Oban, worker  # type: ignore[import-not-found]
from oban.schema import install  # type: ignore[import-not-found]

QUEUE = "default"
UNFINISHED = """
SELECT count(*) FROM oban_jobs WHERE state IN ('available', 'scheduled', 'executing', 'retryable')
"""

PROBE: Probe | None = None
CALL: LlmCall | None = None


@worker(queue=QUEUE)
class Noop:
    async def process(self, job: Job) -> None:
        assert PROBE is not None and CALL is not None
        PROBE.hit(int(job.args["seq"]))
        await CALL()


class ObanAdapter:
    name = "oban"
    version = version("oban")

    def __init__(self, args: argparse.Namespace, probe: Probe) -> None:
        global PROBE, CALL
        PROBE = probe
        CALL = LlmCall(args.provider_url, args.concurrency)
        self.url: str = args.database_url
        self.concurrency: int = args.concurrency
        self.pool: Any = None
        self.oban: Any = None

    async def setup(self) -> None:
        self.pool = await Oban.create_pool(self.url, min_size=1, max_size=min(self.concurrency + 5, 40))
        await install(self.pool)
        self.oban = Oban(pool=self.pool, queues={QUEUE: self.concurrency})

    async def enqueue(self, seq: int) -> None:
        await self.oban.enqueue(Noop.new({"seq": seq}))

    async def start_worker(self) -> None:
        await self.oban.start()

    async def stop_worker(self) -> None:
        await asyncio.wait_for(self.oban.stop(), 30)

    async def unfinished(self) -> int:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(UNFINISHED)
            row = await cursor.fetchone()
        return int(row[0])

    async def close(self) -> None:
        assert CALL is not None
        await CALL.close()
        await self.pool.close()


if __name__ == "__main__":
    main(ObanAdapter, run_on_uvloop)
