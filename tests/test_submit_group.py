"""Group commit of plain submits (jobqueue/engine/submit_group.py): submits waiting for a writer
are written together, one caller per statement, each with its own ids, log line and answer."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.logs import configure_logging
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import Enqueued, Submission
from jobqueue.engine.submit_group import GroupWaitTimeout, SubmitGroup, is_plain
from tests.helpers import fetch_all, wait_for

A = Caller(org_id=1, user_id=10)
B = Caller(org_id=2, user_id=20)


@contextmanager
def _writes_held(database_url: str) -> Iterator[None]:
    """Holds every insert into sa_job (a SHARE lock) until the block ends, so the first write
    blocks and later submits wait for a writer."""
    with psycopg.connect(database_url) as conn:
        conn.execute("LOCK TABLE sa_job IN SHARE MODE")
        yield
        conn.rollback()


class _Submitter:
    """Submits in a thread of its own, with a request id bound as the web binds one."""

    def __init__(self, group: SubmitGroup, caller: Caller, text: str) -> None:
        self.caller, self.text = caller, text
        self.request_id = f"req-{text}"
        self.result: Enqueued | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(group,))
        self._thread.start()

    def _run(self, group: SubmitGroup) -> None:
        structlog.contextvars.bind_contextvars(request_id=self.request_id)
        try:
            self.result = group.submit(self.caller, Submission(text=self.text, priority=7))
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()


def _start(group: SubmitGroup, plan: list[tuple[Caller, str]]) -> list[_Submitter]:
    """Starts the submits one after another, each once the previous one leads or waits."""
    started: list[_Submitter] = []
    for n, (caller, text) in enumerate(plan):
        started.append(_Submitter(group, caller, text))
        # NOTE: the first leads (and blocks on the held table); each later one waits.
        wait_for(lambda n=n: group.writing == 1 and group.waiting == n)  # type: ignore[misc]
    return started


def _rows(pool: ConnectionPool[DictConnection], jobs: list[Any]) -> dict[str, dict[str, Any]]:
    return {str(r["id"]): r for r in fetch_all(
        pool, "SELECT j.id, j.prompt_id, j.org_id, j.created_by, j.priority, j.state, e.content, "
              "(SELECT count(*) FROM sa_job_event v WHERE v.job_id = j.id AND v.from_state IS NULL"
              " AND v.to_state = 'queued') AS created "
              "FROM sa_job j JOIN sa_entity e ON e.id = j.prompt_id WHERE j.id = ANY(%s::uuid[])",
        [str(j) for j in jobs])}


def _sizes() -> tuple[list[int], Callable[[int], None]]:
    sizes: list[int] = []
    return sizes, sizes.append


def test_submits_waiting_for_the_writer_are_written_together_each_with_its_own_ids_and_line(
    database_url: str, pool: ConnectionPool[DictConnection], capfd: pytest.CaptureFixture[str],
) -> None:
    configure_logging(buffered=False)
    sizes, on_write = _sizes()
    group = SubmitGroup(pool, writers=1, on_write=on_write)
    with _writes_held(database_url):
        submitters = _start(group, [(A, f"p{n}") for n in range(5)])
    for s in submitters:
        s.join()
        assert s.error is None
    assert sizes == [1, 4]
    results = [s.result for s in submitters]
    assert all(r is not None and r.state == "queued" for r in results)
    rows = _rows(pool, [r.job_id for r in results if r])
    assert len(rows) == 5
    for s in submitters:
        assert s.result is not None
        row = rows[str(s.result.job_id)]
        assert (row["prompt_id"], row["content"], row["org_id"], row["created_by"],
                row["priority"], row["state"], row["created"]) == (
            s.result.prompt_id, s.text, A.org_id, A.user_id, 7, "queued", 1)
    # NOTE: each submit's job.enqueued line carries its own request's id, grouped or not.
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()
             if '"job.enqueued"' in line]
    by_job = {line["job_id"]: line["request_id"] for line in lines}
    assert by_job == {str(s.result.job_id): s.request_id for s in submitters if s.result}


def test_a_group_holds_one_caller_and_the_oldest_waiting_submit_leads_next(
    database_url: str, pool: ConnectionPool[DictConnection],
) -> None:
    sizes, on_write = _sizes()
    group = SubmitGroup(pool, writers=1, on_write=on_write)
    with _writes_held(database_url):
        submitters = _start(group, [(A, "a1"), (B, "b1"), (A, "a2"), (B, "b2"), (A, "a3")])
    for s in submitters:
        s.join()
        assert s.error is None
    # NOTE: a1 alone (it led while the table was held), then b1 with b2, then a2 with a3.
    assert sizes == [1, 2, 2]
    rows = _rows(pool, [s.result.job_id for s in submitters if s.result])
    for s in submitters:
        assert s.result is not None
        row = rows[str(s.result.job_id)]
        assert (row["content"], row["org_id"], row["created_by"]) == (
            s.text, s.caller.org_id, s.caller.user_id)


def test_a_group_the_database_refuses_is_written_again_one_submit_at_a_time(
    database_url: str, pool: ConnectionPool[DictConnection],
) -> None:
    sizes, on_write = _sizes()
    group = SubmitGroup(pool, writers=1, on_write=on_write)
    # NOTE: the web refuses NUL with a 422 long before; here it stands for any refusal of one row.
    with _writes_held(database_url):
        submitters = _start(group, [(A, "first"), (A, "fine"), (A, "bad\x00"), (A, "also fine")])
    for s in submitters:
        s.join()
    assert sizes == [1, 1, 1]  # NOTE: the refused one wrote nothing
    assert isinstance(submitters[2].error, psycopg.DataError)
    written = [s for s in submitters if s.text != "bad\x00"]
    assert all(s.error is None and s.result is not None for s in written)
    rows = _rows(pool, [s.result.job_id for s in written if s.result])
    assert sorted(r["content"] for r in rows.values()) == ["also fine", "fine", "first"]


def test_a_submit_no_write_took_in_time_is_withdrawn_and_never_written(
    database_url: str, pool: ConnectionPool[DictConnection],
) -> None:
    group = SubmitGroup(pool, writers=1, wait=0.2)
    with _writes_held(database_url):
        first = _Submitter(group, A, "held")
        wait_for(lambda: group.writing == 1)
        late = _Submitter(group, A, "late")
        late.join()
        assert isinstance(late.error, GroupWaitTimeout)
        assert group.waiting == 0
    first.join()
    assert first.error is None and first.result is not None
    contents = [r["content"] for r in fetch_all(pool, "SELECT content FROM sa_entity")]
    assert contents == ["held"]


def test_only_submits_no_guard_can_refuse_may_join_a_group() -> None:
    assert is_plain(Submission(text="x"), idempotency_key=None, max_queued=0)
    assert not is_plain(Submission(text="x"), idempotency_key="k", max_queued=0)
    assert not is_plain(Submission(text="x"), idempotency_key=None, max_queued=5)
    for guarded in (Submission(text="x", parent_id=uuid.uuid4()),
                    Submission(text="x", after=uuid.uuid4()),
                    Submission(text="x", run_at=datetime.now(UTC) + timedelta(minutes=1)),
                    Submission(text="x", delay_seconds=3)):
        assert not is_plain(guarded, idempotency_key=None, max_queued=0)
    assert is_plain(Submission(text="x", delay_seconds=0), idempotency_key=None, max_queued=0)
