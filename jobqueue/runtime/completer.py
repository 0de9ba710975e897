"""Batches the finalizes of a worker's job threads: one transaction for whatever is waiting.

It carries what each call came to (jobqueue/core/attempt.py) to the engine and its answer back;
it decides nothing (jobqueue/engine/finalize.py does).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from jobqueue.core.attempt import AttemptResult
from jobqueue.core.db import DictConnection
from jobqueue.core.states import JobState
from jobqueue.engine import finalize
from jobqueue.engine.claim import ClaimedJob

__all__ = ["Completer", "FinishTimeout"]

# NOTE: a batch that meets a database restart is retried briefly; past this its jobs stay running
# without heartbeats and the reclaimer returns them to the queue.
_WRITE_TRIES = 5

# NOTE: bounds one statement's arrays (and the transaction's row locks).
_MAX_BATCH = 256

# NOTE: past every retry (each may wait the pool's 30 s checkout), with room for a long batch;
# only a wedged writer gets there.
FINISH_WAIT = 300.0


class FinishTimeout(Exception):
    """A finalize was not written in time; the job stays running and the reclaimer takes it back."""

T = TypeVar("T")


@dataclass
class _Pending:
    job: ClaimedJob
    result: AttemptResult
    done: threading.Event = field(default_factory=threading.Event)
    written: JobState | None = None
    error: BaseException | None = None


class Completer:
    """Writes finalizes from many jobs in batches; each caller waits for its own result.

    PERF: River's batch completer idea. A job thread hands its finalize over and waits; one
    thread writes everything waiting in one transaction, so under load many jobs share a commit
    and idle workers pay no extra wait (a batch is whatever queued up during the last write).
    Each job keeps its own claim guard inside the batch, and a job whose outcome cannot be
    written is set apart from its neighbours (see finalize.finish).
    """

    def __init__(self, pool: ConnectionPool[DictConnection], rules: finalize.FinishRules) -> None:
        self._pool = pool
        self._rules = rules
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        # NOTE: for tests and benchmarks (like Worker.claim_rounds), read without a lock.
        self.batches = 0

    def finish(self, job: ClaimedJob, result: AttemptResult) -> JobState | None:
        """Finalizes one job with whatever else is waiting; blocks until it is committed.

        Args:
            job: the claimed job.
            result: what its provider call came to; the engine decides the transition.

        Returns:
            The state written, or None when the claim was lost (nothing written for this job).

        Raises:
            psycopg.Error: the write failed (after retries, for connection errors).
            RuntimeError: the completer is closed.
            FinishTimeout: not written within FINISH_WAIT seconds (it may still be, later).
        """
        pending = _Pending(job, result)
        with self._lock:
            if self._closed:
                raise RuntimeError("the completer is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sa-completer", daemon=True)
                self._thread.start()
            self._queue.put(pending)
        if not pending.done.wait(FINISH_WAIT):
            raise FinishTimeout(f"finalize not written within {FINISH_WAIT:g}s")
        if pending.error is not None:
            raise pending.error
        return pending.written

    @property
    def waiting(self) -> int:
        """Finalizes queued for the next batch."""
        return self._queue.qsize()

    def close(self, timeout: float = 30.0) -> None:
        """Writes what is already waiting, then stops; later finishes raise RuntimeError."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while (first := self._queue.get()) is not None:
            batch = [first]
            stopping = False
            while len(batch) < _MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._write(batch)
            if stopping:
                return

    def _write(self, batch: list[_Pending]) -> None:
        try:
            written = _with_retries(lambda: finalize.finish(
                self._pool, [(p.job, p.result) for p in batch], self._rules))
        except Exception as exc:
            for pending in batch:
                pending.error = exc
                pending.done.set()
            return
        self.batches += 1
        for pending, state in zip(batch, written, strict=True):
            pending.written = state
            pending.done.set()


def _with_retries(write: Callable[[], T]) -> T:
    for attempt in range(1, _WRITE_TRIES + 1):
        try:
            return write()
        except psycopg.OperationalError:
            if attempt == _WRITE_TRIES:
                raise
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")
