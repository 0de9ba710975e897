"""Worker statements carry statement and lock timeouts: a stray lock never holds a worker for long."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest

from jobqueue.core.settings import Settings
from jobqueue.engine.claim import claim
from jobqueue.runtime.assembly import assemble_worker
from jobqueue.runtime.worker import Worker
from jobqueue.runtime.worker_config import WorkerConfig

__all__: list[str] = []


@pytest.fixture
def worker(settings: Settings) -> Iterator[Worker]:
    parts = assemble_worker(replace(settings, statement_timeout=0.5, lock_timeout=0.2),
                            WorkerConfig())
    yield parts.worker
    parts.close()


def test_worker_sessions_carry_the_configured_timeouts(worker: Worker) -> None:
    with worker.pool.connection() as conn:
        row = conn.execute("SELECT current_setting('statement_timeout') AS statement, "
                           "current_setting('lock_timeout') AS lock").fetchone()
    assert row == {"statement": "500ms", "lock": "200ms"}


def test_a_worker_statement_behind_a_stray_lock_gives_up_then_works_again(
    worker: Worker, database_url: str,
) -> None:
    with psycopg.connect(database_url) as stray:
        # An operator's forgotten transaction holding the job table.
        stray.execute("LOCK TABLE sa_job IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            claim(worker.pool, worker.worker_id, 1, 100)
    assert claim(worker.pool, worker.worker_id, 1, 100) == []
