"""oban (Python) with its psycopg pool: a no-op worker on one queue whose limit is `--concurrency`.

Run with the oban virtual environment's python (oban needs Python >= 3.12); see _runner.py for
the arguments and output. Like `oban start`, it runs on uvloop when uvloop is installed. The
pool holds concurrency + 5 connections (jobs, notifier, stager, leader).
"""

from __future__ import annotations

import argparse
import asyncio
from importlib.metadata import version
from typing import Any

from _runner import Probe, main, run_on_uvloop
from oban import Job, Oban, worker  # type: ignore[import-not-found]
from oban.schema import install  # type: ignore[import-not-found]

QUEUE = "default"
UNFINISHED = """
SELECT count(*) FROM oban_jobs WHERE state IN ('available', 'scheduled', 'executing', 'retryable')
"""

PROBE: Probe | None = None


@worker(queue=QUEUE)
class Noop:
    async def process(self, job: Job) -> None:
        assert PROBE is not None
        PROBE.hit(int(job.args["seq"]))


class ObanAdapter:
    name = "oban"
    version = version("oban")

    def __init__(self, args: argparse.Namespace, probe: Probe) -> None:
        global PROBE
        PROBE = probe
        self.url: str = args.database_url
        self.concurrency: int = args.concurrency
        self.pool: Any = None
        self.oban: Any = None

    async def setup(self) -> None:
        self.pool = await Oban.create_pool(self.url, min_size=1, max_size=self.concurrency + 5)
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
        await self.pool.close()


if __name__ == "__main__":
    main(ObanAdapter, run_on_uvloop)
