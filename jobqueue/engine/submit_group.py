"""Group commit of plain submits: concurrent POST /prompt of one process share a statement and a commit."""

from __future__ import annotations

import json
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.budget import Budgets
from jobqueue.core.db import DictConnection, reconnecting
from jobqueue.core.queries import entity as q
from jobqueue.core.queries import job as job_q
from jobqueue.core.settings import KEY_TTL_SECONDS
from jobqueue.core.states import JobState
from jobqueue.core.tokens import Caller
from jobqueue.engine import transitions
from jobqueue.engine.enqueue import Enqueued, Submission, enqueue
from jobqueue.engine.spend import check_budget

__all__ = ["GROUP_MAX", "GROUP_WAIT", "WRITERS", "GroupWaitTimeout", "SubmitGroup", "is_plain"]

WRITERS = 1
"""Group writes one process runs at once; a submit arriving while all are busy joins the next.

PERF: one, not two: with a second write free, half the writes of a loaded process carried one
submit, and at 1,000 POST/s against a 10 s provider that cost Postgres 7-9 % of a core and
POST p99 80-88 ms against 57-70 ms with one (three interleaved pairs; docs/performance.md,
Issue 28 on a ninth VM)."""

GROUP_MAX = 64
"""Submits written by one statement at most."""

GROUP_WAIT = 30.0
"""Seconds a submit waits for the write that carries it before it is answered 503."""


class GroupWaitTimeout(psycopg.OperationalError):
    """The write carrying a submit did not end within GROUP_WAIT.

    NOTE: an OperationalError, so the app answers it as the database outage it nearly always is
    (503 with Retry-After), never as a bug.
    """


def is_plain(submission: Submission, *, idempotency_key: str | None, max_queued: int) -> bool:
    """Whether a submit may join a group: nothing in it can refuse it but the database itself.

    NOTE: a parent, a predecessor, a key or the org's queued cap can each refuse one submit of a
    group, and a schedule makes a wake-up of its own; those keep the one-prompt statement, whose
    guards answer for the one request that asked (jobqueue/engine/enqueue.py).
    """
    return (idempotency_key is None and max_queued == 0 and submission.parent_id is None
            and submission.after is None and submission.run_at is None
            and not submission.delay_seconds)


@dataclass
class _Pending:
    """One submit: what it asks, the caller, and (once written) its answer or error."""

    caller: Caller
    submission: Submission
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    result: Enqueued | None = None
    error: BaseException | None = None
    alone: bool = False


class SubmitGroup:
    """Writes plain submits (`is_plain`) the way `enqueue` does, several in one statement under load.

    A submit that finds a writer free is written at once, alone, by the one-prompt statement
    (`enqueue`): an idle or lightly loaded process answers exactly as without the group. While
    `writers` writes are running, submits wait; when a write ends, its submit hands the lead to
    the oldest waiting one, which writes every waiting submit of the same caller (up to
    `max_group`) in one statement (PROMPT_INSERT_WITH_JOB_MANY) and one commit.

    PERF: Postgres spends about 240 us per prompt written alone, 95 us each in a group of four
    and 60 us in one of eight (the web's own side: 100, 44 and 25 us; bench/group_commit.py),
    and a group wakes one backend instead of one per submit, which is what a loaded machine runs
    short of (POST /prompt waited for a CPU longer than it ran: docs/performance.md, Sustained
    arrivals).

    Guarantees are the single submit's: each submit is answered once its own rows are committed
    (202), with its own ids, and logs its own `job.enqueued` line in its own request context;
    budgets are checked for each before it joins. A group whose rows the database refuses is
    written again one submit at a time, so each gets its own answer and none fails for another's
    sake; an outage (a lost connection `reconnecting` could not save, a timeout) is every
    member's answer, a 503, as it would have been each one's alone.

    Works with gevent's patched primitives (the Procfile's web) and with threads alike.
    """

    def __init__(self, pool: ConnectionPool[DictConnection], *, writers: int = WRITERS,
                 max_group: int = GROUP_MAX, wait: float = GROUP_WAIT,
                 on_write: Callable[[int], None] | None = None) -> None:
        """Creates the process's group (one per web app).

        Args:
            pool: the web's pool; a write holds one connection.
            writers: writes run at once; more submits wait and are grouped.
            max_group: submits written by one statement at most.
            wait: seconds a submit waits for a write to take it, then for that write to end.
            on_write: called with the number of submits after each write (tests).

        Raises:
            ValueError: `writers` or `max_group` under 1, or `wait` not positive.
        """
        if writers < 1 or max_group < 1 or wait <= 0:
            raise ValueError("writers and max_group must be >= 1, wait > 0")
        self._pool = pool
        self._writers = writers
        self._max_group = max_group
        self._wait = wait
        self._on_write = on_write
        self._lock = threading.Lock()
        self._waiting: deque[_Pending] = deque()
        self._running = 0

    @property
    def waiting(self) -> int:
        """Submits waiting for a write now."""
        return len(self._waiting)

    @property
    def writing(self) -> int:
        """Writes running now."""
        return self._running

    def submit(self, caller: Caller, submission: Submission, *,
               budgets: Budgets | None = None) -> Enqueued:
        """Writes one plain submit (`is_plain`), alone or in a group; returns its ids.

        Raises:
            OverBudget: the org has spent a budget.
            GroupWaitTimeout: the write carrying it did not end within `wait` seconds.
            psycopg.Error: the database refused it (or the connection was lost twice).
        """
        if budgets is not None:
            check_budget(self._pool, caller.org_id, budgets)
        me = _Pending(caller, submission)
        with self._lock:
            if self._running < self._writers:
                self._running += 1
                me.lead = True
            else:
                self._waiting.append(me)
        if not me.lead:
            self._await_turn(me)
            if not me.lead:
                return self._answered(me)
        try:
            group = self._take_group(me)
            if len(group) == 1:
                return self._alone(me)
            self._write_group(group)
        finally:
            self._pass_lead()
        return self._answered(me)

    def _await_turn(self, me: _Pending) -> None:
        """Waits until `me` is written by a group or made the lead.

        Raises:
            GroupWaitTimeout: no write took it within `wait` (it is withdrawn, so none ever
                will), or the write that took it has not ended within `wait` more.
        """
        if me.done.wait(self._wait):
            return
        with self._lock:
            if me in self._waiting:
                self._waiting.remove(me)
                raise GroupWaitTimeout(f"no write took this submit within {self._wait:g} s")
        # NOTE: a group took it (or it was just made the lead): that write is under way, bounded
        # by the pool's checkout timeout and the statement's.
        if not me.done.wait(self._wait):
            raise GroupWaitTimeout(f"the write of this submit did not end within {2 * self._wait:g} s")

    def _take_group(self, me: _Pending) -> list[_Pending]:
        """`me` and the waiting submits of its caller, oldest first, up to `max_group`."""
        group = [me]
        with self._lock:
            if self._waiting:
                rest: deque[_Pending] = deque()
                for item in self._waiting:
                    if len(group) < self._max_group and item.caller == me.caller:
                        group.append(item)
                    else:
                        rest.append(item)
                self._waiting = rest
        return group

    def _pass_lead(self) -> None:
        """Hands the write to the oldest waiting submit, or frees the writer."""
        with self._lock:
            following = self._waiting.popleft() if self._waiting else None
            if following is None:
                self._running -= 1
                return
            following.lead = True
        following.done.set()

    def _write_group(self, group: list[_Pending]) -> None:
        """Writes the group and sets every member's outcome; raises for no member's sake."""
        try:
            self._write_many(group)
        except psycopg.OperationalError as exc:
            for item in group:
                item.error = exc
        except psycopg.Error:
            # NOTE: nothing was committed (one statement, autocommit): each is written again
            # alone, by its own request, and gets the answer that request deserves.
            for item in group:
                item.alone = True
        except Exception as exc:
            for item in group:
                item.error = exc
        finally:
            for item in group[1:]:
                item.done.set()

    def _alone(self, item: _Pending) -> Enqueued:
        """Writes one submit by the one-prompt statement, which logs its line (`enqueue`)."""
        s = item.submission
        done = enqueue(self._pool, item.caller, s.text, priority=s.priority,
                       max_attempts=s.max_attempts, options=s.options)
        if self._on_write is not None:
            self._on_write(1)
        return done

    def _write_many(self, group: list[_Pending]) -> None:
        """One PROMPT_INSERT_WITH_JOB_MANY for the group; sets each member's ids."""
        prompt_ids = [uuid.uuid4() for _ in group]
        job_ids = [uuid.uuid4() for _ in group]
        caller = group[0].caller
        params: dict[str, Any] = {
            "org_id": caller.org_id, "user_id": caller.user_id,
            "parent_ids": [None] * len(group),
            "texts": [item.submission.text for item in group],
            "priorities": [item.submission.priority for item in group],
            "max_attempts": [item.submission.max_attempts for item in group],
            # PERF: as enqueue_many: JSON text, cast by the statement.
            "options": [json.dumps(item.submission.options) for item in group],
            "run_ats": [None] * len(group), "delays": [None] * len(group),
            "max_queued": 0, "idempotency_key": None, "request_hash": None,
            "key_ttl": KEY_TTL_SECONDS, "prompt_ids": prompt_ids, "job_ids": job_ids,
        }

        def attempt(conn: DictConnection) -> datetime:
            try:
                row = conn.execute(q.PROMPT_INSERT_WITH_JOB_MANY, params).fetchone()
            except psycopg.errors.UniqueViolation as exc:
                # NOTE: only a second try after a lost answer meets its own ids (uuid4): the
                # first one committed the whole group.
                if exc.diag.constraint_name != "sa_entity_pkey":
                    raise
                found = conn.execute(job_q.JOB_GET_AS_ENQUEUED,
                                     {"job_id": job_ids[0]}).fetchone()
                assert found is not None  # NOTE: written with the group, in one statement
                created: datetime = found["created_at"]
                return created
            # NOTE: no guard of the statement can refuse a plain group.
            assert row is not None and row["written"] == len(group)
            created = row["created_at"]
            return created

        created_at = reconnecting(self._pool, attempt)
        wakeup.for_pool(self._pool).job_queued(None)
        for item, prompt_id, job_id in zip(group, prompt_ids, job_ids, strict=True):
            item.result = Enqueued(prompt_id=prompt_id, job_id=job_id,
                                   state=JobState.QUEUED.value, created_at=created_at)
        if self._on_write is not None:
            self._on_write(len(group))

    def _answered(self, item: _Pending) -> Enqueued:
        """A follower's outcome, in its own request context: it logs its `job.enqueued` line
        here (or writes itself alone, when its group was refused)."""
        if item.error is not None:
            raise item.error
        if item.alone:
            return self._alone(item)
        assert item.result is not None  # NOTE: set by the group's write, or `error` or `alone` was
        done = item.result
        transitions.record("job.enqueued", None, JobState.QUEUED, job_id=str(done.job_id),
                               prompt_id=str(done.prompt_id), org_id=item.caller.org_id,
                               user_id=item.caller.user_id, priority=item.submission.priority)
        return done
