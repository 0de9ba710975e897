"""The Batch API's statements walk the indexes their comments name, over a batch of 20,000 lines
(1,000 of them in flight) beside 50 other batches: each step costs what it touches, never the
whole batch, the other batches, or every job."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import SESSION_SETTINGS, DictConnection
from jobqueue.core.queries import answer as answer_q
from jobqueue.core.queries import batch as q
from jobqueue.core.queries import file as file_q
from tests.helpers import plan_nodes

pytestmark = pytest.mark.usefixtures("truncated_tables")

BATCH, FILE = uuid.uuid4(), uuid.uuid4()


@pytest.fixture
def big_batch(pool: ConnectionPool[DictConnection]) -> Iterator[DictConnection]:
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        conn.execute(SESSION_SETTINGS)
        conn.execute("INSERT INTO sa_file (id, org_id, created_by, purpose, filename, complete) "
                     "VALUES (%s, 1, 1, 'batch', 'in.jsonl', true)", (FILE,))
        conn.execute("INSERT INTO sa_file_chunk (file_id, seq, data) "
                     "SELECT %s, n, 'x'::bytea FROM generate_series(0, 199) n", (FILE,))
        conn.execute("INSERT INTO sa_batch (id, org_id, created_by, input_file_id, endpoint, "
                     "completion_window, expires_at, status) SELECT CASE WHEN n = 0 THEN %s "
                     "ELSE gen_random_uuid() END, n %% 5 + 1, 1, %s, '/v1/chat/completions', "
                     "'24h', now() + interval '1 day', CASE WHEN n %% 2 = 0 THEN 'in_progress' "
                     "ELSE 'completed' END FROM generate_series(0, 50) n", (BATCH, FILE))
        conn.execute("INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content) "
                     "SELECT g, 'prompt', 1, 1, g, 'x' FROM (SELECT gen_random_uuid() AS g "
                     "FROM generate_series(1, 1000)) s")
        conn.execute("INSERT INTO sa_job (id, prompt_id, org_id, created_by) "
                     "SELECT gen_random_uuid(), id, 1, 1 FROM sa_entity")
        conn.execute("INSERT INTO sa_batch_request (batch_id, line, custom_id, state, job_id) "
                     "SELECT %s, row_number() OVER (), 'c' || id, 'fed', id FROM sa_job", (BATCH,))
        conn.execute("INSERT INTO sa_batch_request (batch_id, line, custom_id, state, text, options) "
                     "SELECT %s, n, 'c' || n, CASE WHEN n < 15000 THEN 'pending' ELSE 'succeeded' "
                     "END, 'x', '{}' FROM generate_series(1001, 20000) n", (BATCH,))
        conn.execute("INSERT INTO sa_ledger (org_id, job_id, attempt, model, latency_ms, outcome) "
                     "SELECT 1, id, 1, 'm', 1, 'succeeded' FROM sa_job")
        conn.execute("ANALYZE sa_batch, sa_batch_request, sa_file, sa_file_chunk, sa_job, sa_ledger")
        yield conn


_PARAMS: dict[str, Any] = {
    "id": BATCH, "org_id": 1, "user_id": 1, "lease": uuid.uuid4(), "seconds": 60, "limit": 100,
    "room": 100, "priority": 80, "max_attempts": 3, "states": ["queued"], "ends_as": "cancelled",
    "reason": "x", "after": 0, "file_id": FILE, "seq": 10, "cap": 10, "job_id": uuid.uuid4(),
}

CASES = [
    ("BATCH_LEASE_MANY", q.BATCH_LEASE_MANY, {"sa_batch_active_idx"}),
    ("BATCH_ORG_IN_FLIGHT", q.BATCH_ORG_IN_FLIGHT, {"sa_batch_active_idx",
                                                    "sa_batch_request_fed_idx"}),
    ("BATCH_FEED_MANY", q.BATCH_FEED_MANY, {"sa_batch_request_pending_idx"}),
    ("BATCH_COUNT_ENDED", q.BATCH_COUNT_ENDED, {"sa_batch_request_fed_idx", "sa_job_pkey"}),
    ("BATCH_JOBS_CANCEL_MANY", q.BATCH_JOBS_CANCEL_MANY, {"sa_batch_request_fed_idx",
                                                          "sa_job_pkey"}),
    ("BATCH_END_PENDING_MANY", q.BATCH_END_PENDING_MANY, {"sa_batch_request_pending_idx"}),
    ("BATCH_OUTPUT_PAGE", q.BATCH_OUTPUT_PAGE, {"sa_batch_request_pkey", "sa_job_pkey",
                                                "sa_ledger_job_idx"}),
    ("JOB_ANSWER_GET", answer_q.JOB_ANSWER_GET, {"sa_job_pkey", "sa_ledger_job_idx"}),
    ("FILE_CHUNK_LIST_PAGE", file_q.FILE_CHUNK_LIST_PAGE, {"sa_file_chunk_pkey"}),
    ("FILE_NEXT_SEQ", file_q.FILE_NEXT_SEQ, {"sa_file_chunk_pkey"}),
]


@pytest.mark.parametrize(("name", "statement", "indexes"), CASES, ids=[c[0] for c in CASES])
def test_each_batch_statement_walks_its_index(big_batch: DictConnection, name: str,
                                              statement: str, indexes: set[str]) -> None:
    nodes = plan_nodes(big_batch, statement, _PARAMS)
    used = {node.get("Index Name") for node in nodes}
    assert indexes <= used, (name, used)
    scanned = {node.get("Relation Name") for node in nodes if node["Node Type"] == "Seq Scan"}
    assert not scanned & {"sa_batch", "sa_batch_request", "sa_file_chunk", "sa_job", "sa_ledger"}, (
        name, scanned)
    walked = {node.get("Index Name") for node in nodes if node["Node Type"] == "Index Scan"
              and node.get("Relation Name") == "sa_ledger"}
    assert "sa_ledger_pkey" not in walked, name
