"""procrastinate with its async psycopg connector: a no-op async task, one worker.

Run with the peers virtual environment's python; see _runner.py for the arguments and output.
The worker's concurrency is `--concurrency` (procrastinate's own default is 1, meant for
blocking sync tasks; async tasks are what concurrency is for), LISTEN/NOTIFY on (default), and
the connection pool holds concurrency + 2 connections so jobs never queue for one. Plain
asyncio loop, as procrastinate's CLI uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from importlib.metadata import version

from _runner import Probe, main
from procrastinate import App, PsycopgConnector  # type: ignore[import-not-found]

UNFINISHED = "SELECT count(*) AS n FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"


class ProcrastinateAdapter:
    name = "procrastinate"
    version = version("procrastinate")

    def __init__(self, args: argparse.Namespace, probe: Probe) -> None:
        self.concurrency: int = args.concurrency
        self.app = App(connector=PsycopgConnector(conninfo=args.database_url,
                                                  max_size=args.concurrency + 2))

        @self.app.task(name="noop")
        async def noop(seq: int) -> None:
            probe.hit(seq)

        self.noop = noop
        self.task: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()

    async def enqueue(self, seq: int) -> None:
        await self.noop.defer_async(seq=seq)

    async def start_worker(self) -> None:
        self.task = asyncio.create_task(self.app.run_worker_async(
            concurrency=self.concurrency, install_signal_handlers=False))

    async def stop_worker(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 30)

    async def unfinished(self) -> int:
        row = await self.app.connector.execute_query_one_async(UNFINISHED)
        return int(row["n"])

    async def close(self) -> None:
        await self.app.close_async()


if __name__ == "__main__":
    main(ProcrastinateAdapter)
