"""pgqueuer on asyncpg: a no-op entrypoint, one QueueManager (its `pgq run` defaults: batch 10, no cap).

In llm mode the entrypoint makes the HTTP call, and the worker is capped at `--concurrency`
picked jobs (`max_concurrent_tasks`, which must be at least twice the batch: batch C/2, at
most 100).

Run with the peers virtual environment's python; see _runner.py for the arguments and output.
Like the `pgq` CLI, it runs on uvloop when uvloop is installed.
"""

from __future__ import annotations

import argparse
import asyncio
from importlib.metadata import version

import asyncpg  # type: ignore[import-not-found]
from _runner import LlmCall, Probe, main, run_on_uvloop
from pgqueuer import AsyncpgDriver, Job, QueueManager  # type: ignore[import-not-found]
from pgqueuer.queries import Queries  # type: ignore[import-not-found]

ENTRYPOINT = "noop"


class PgQueuerAdapter:
    name = "pgqueuer"
    version = version("pgqueuer")

    def __init__(self, args: argparse.Namespace, probe: Probe) -> None:
        self.url: str = args.database_url
        self.llm = args.mode == "llm"
        self.concurrency: int = args.concurrency
        self.batch_size: int = max(1, min(args.concurrency // 2, 100)) if self.llm else args.concurrency
        self.probe = probe
        self.call = LlmCall(args.provider_url, args.concurrency)
        self.producer: asyncpg.Connection | None = None
        self.consumer: asyncpg.Connection | None = None
        self.queries: Queries | None = None
        self.qm: QueueManager | None = None
        self.task: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        self.producer = await asyncpg.connect(self.url)
        self.consumer = await asyncpg.connect(self.url)
        self.queries = Queries(AsyncpgDriver(self.producer))
        await self.queries.install()

    async def enqueue(self, seq: int) -> None:
        assert self.queries is not None
        await self.queries.enqueue(ENTRYPOINT, str(seq).encode())

    async def start_worker(self) -> None:
        qm = QueueManager(Queries(AsyncpgDriver(self.consumer)))
        probe, call = self.probe, self.call

        @qm.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            probe.hit(int(job.payload))
            await call()

        self.qm = qm
        cap = self.concurrency if self.llm else None
        self.task = asyncio.create_task(qm.run(batch_size=self.batch_size, max_concurrent_tasks=cap))

    async def stop_worker(self) -> None:
        assert self.qm is not None and self.task is not None
        self.qm.shutdown.set()
        await asyncio.wait_for(self.task, 30)

    async def unfinished(self) -> int:
        assert self.producer is not None
        count: int = await self.producer.fetchval("SELECT count(*) FROM pgqueuer")
        return count

    async def close(self) -> None:
        await self.call.close()
        for conn in (self.producer, self.consumer):
            if conn is not None:
                await conn.close()


if __name__ == "__main__":
    main(PgQueuerAdapter, run_on_uvloop)
