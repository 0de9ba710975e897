"""Holding a chat request open while its job runs: who may (admission) and for how long.

A non-streamed answer waits as POST /prompt's `Prefer: wait` does (the event hub's
`watching`; no pool connection while it waits), under the same caps (service/waits.py), at most
SA_OPENAI_MAX_WAIT (60 s) and never
past the client's own read timeout (the SDK sends it, `X-Stainless-Read-Timeout`). A streamed one
stays open at most SA_OPENAI_STREAM_MAX. Either way the job is durable: a client that gives up
leaves a job that still finishes, and a retry with the same Idempotency-Key attaches to it.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.openai_wire import Body
from jobqueue.core.queries.answer import JOB_ANSWER_GET
from jobqueue.core.states import TERMINAL
from jobqueue.core.tokens import Caller
from service.events.hub import EventHub

__all__ = ["CLIENT_TIMEOUT_HEADER", "Slot", "WaitGate", "hold_seconds", "read_answer", "wait_for_end"]

CLIENT_TIMEOUT_HEADER = "X-Stainless-Read-Timeout"
"""Seconds the official SDKs will wait for an answer before they give up (and maybe retry)."""

_MARGIN = 1.0
"""Seconds an answer is sent before the client's own read timeout."""


@dataclass
class Slot:
    """One admitted wait (or stream); `release` frees it, once."""

    gate: WaitGate
    token: bytes
    released: bool = field(default=False)

    def release(self) -> None:
        """Frees the slot (idempotent)."""
        if not self.released:
            self.released = True
            self.gate.leave(self.token)


class WaitGate:
    """How many chat requests a web process holds open, in all and per token.

    NOTE: every chat request, held or streamed, takes one of these; a held one also takes a slot
    of the web's shared wait caps (service/waits.py), as `Prefer: wait` does.
    """

    def __init__(self, max_waiting: int, max_per_token: int) -> None:
        self.max_waiting = max_waiting
        self.max_per_token = max_per_token
        self._lock = threading.Lock()
        self._count = 0
        self._per_token: dict[bytes, int] = defaultdict(int)

    @property
    def waiting(self) -> int:
        """Requests held open now."""
        with self._lock:
            return self._count

    def admit(self, caller: Caller, token: bytes) -> Slot | None:
        """A slot for one more held request of this token, or None when a cap is reached."""
        with self._lock:
            if self._count >= self.max_waiting or self._per_token[token] >= self.max_per_token:
                return None
            self._count += 1
            self._per_token[token] += 1
        return Slot(self, token)

    def leave(self, token: bytes) -> None:
        """Gives a slot back (through `Slot.release`)."""
        with self._lock:
            self._count -= 1
            self._per_token[token] -= 1
            if not self._per_token[token]:
                del self._per_token[token]


def read_answer(pool: ConnectionPool[DictConnection], caller: Caller,
                job_id: uuid.UUID) -> Body:
    """The job with what its answer is built from (queries/answer.py), in the caller's org."""
    with pool.connection() as conn:
        row = conn.execute(JOB_ANSWER_GET, {"job_id": job_id, "org_id": caller.org_id}).fetchone()
    assert row is not None  # NOTE: the caller enqueued it (or replayed its key) just now
    return row


def wait_for_end(pool: ConnectionPool[DictConnection], hub: EventHub, caller: Caller,
                 job_id: uuid.UUID, seconds: float) -> Body:
    """Waits up to `seconds` for the job to end; returns its answer row, ended or not."""
    with hub.watching(job_id) as finished:
        # NOTE: read once after watching: the job may have ended before the watch began.
        row = read_answer(pool, caller, job_id)
        if row["state"] not in TERMINAL and seconds > 0 and finished.wait(seconds):
            row = read_answer(pool, caller, job_id)
    return row


def hold_seconds(max_wait: float, client_timeout: str | None) -> float:
    """How long to hold an answer: the cap, or less when the client gives up sooner."""
    if client_timeout is None:
        return max_wait
    try:
        timeout = float(client_timeout)
    except ValueError:
        return max_wait
    if not timeout > _MARGIN:  # NOTE: also refuses NaN
        return max_wait
    return min(max_wait, timeout - _MARGIN)
