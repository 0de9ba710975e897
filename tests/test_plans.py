"""Every statement on the hot path keeps a plan whose cost does not grow with the backlog or history.

One table (HOT_PATH) lists the statements a worker, the maintenance leader and a /metrics scrape
run over and over; a new one slots in as one more row. Each is EXPLAINed, as a plan for its
values and as the generic plan a long-lived session caches, twice over the same table of
100,000 queued jobs behind a finished history: first with the statistics taken when the queue
was still empty (autoanalyze lags a growing backlog: the case that made the claim read and sort
every queued row), then after ANALYZE. No plan may read sa_job sequentially, through a bitmap,
or sort rows read from it, and sa_entity (the prompts, as large as the history) is only ever
probed by its primary key.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries import maintenance as maintenance_q
from jobqueue.core.queries import metrics as metrics_q
from jobqueue.core.queries import partial as partial_q
from jobqueue.core.queries import route as route_q
from jobqueue.engine.claim import DEFAULT_DEPTH
from tests.helpers import plan_tree

BACKLOG = 100_000
HISTORY = 2_000
RUNNING = 200


@dataclass(frozen=True)
class HotStatement:
    """A statement run on the hot path, with the values it is EXPLAINed with.

    `prelude` runs first in the same transaction, as the code runs it (the claim's plan settings).
    `sorts_backlog` is True for the one statement that must rank every claimable row.
    """

    name: str
    statement: str
    params: dict[str, Any] | tuple[Any, ...]
    prelude: str | None = None
    sorts_backlog: bool = False


_IDS = [uuid.uuid4() for _ in range(3)]
# NOTE: one batch of each outcome, as the completer writes them together.
_FINALIZE = {"job_id": _IDS, "claim": ["w1"] * 3, "attempt": [1] * 3,
             "to_state": ["succeeded", "queued", "failed"], "model": ["m"] * 3,
             "tokens_in": [1] * 3, "tokens_out": [1] * 3, "latency_ms": [1] * 3,
             "http_status": [200, 503, 400], "response_id": [uuid.uuid4(), None, None],
             "content": ["a", None, None], "error_kind": [None, "provider_5xx", "provider_4xx"],
             "error_message": [None, "boom", "bad"], "delay": [None, 1.5, None],
             "spend_attempt": [True, True, True]}
_CLAIM = {"claim": "w", "limit": 32, "ceiling": 100, "default_depth": DEFAULT_DEPTH, "org_cap": 4,
          "aging": 300.0}

HOT_PATH = [
    HotStatement("claim", job_q.JOB_CLAIM_MANY, _CLAIM, job_q.JOB_PLAN_SETTINGS),
    # NOTE: the per-org rank needs every claimable row (see its comment), so it may sort them,
    # but it still reads them through the claim index, never the table.
    HotStatement("claim_org_capped", job_q.JOB_CLAIM_MANY_ORG_CAPPED, _CLAIM,
                 job_q.JOB_PLAN_SETTINGS, sorts_backlog=True),
    HotStatement("finalize_mixed", job_q.JOB_SET_STATE_IF_RUNNING_MANY, _FINALIZE),
    HotStatement("heartbeat", job_q.JOB_HEARTBEAT_MANY_IF_CLAIMED, {"job_ids": _IDS, "claim": "w1"}),
    HotStatement("release", job_q.JOB_RELEASE_MANY_IF_CLAIMED, {"claim": "w1"}),
    HotStatement("reclaim_read", maintenance_q.JOB_LIST_RECLAIMABLE_PAGE,
                 {"now": None, "stale_after": 300.0, "stuck_after": 900.0,
                  "after_heartbeat": None, "after_id": None, "limit": 500}),
    HotStatement("reclaim_write", maintenance_q.JOB_RECLAIM_MANY_IF_CLAIMED_AND_STALE,
                 {"job_ids": _IDS, "claims": ["w1"] * 3, "attempts": [1] * 3,
                  "to_states": ["queued", "failed", "queued"], "error_kinds": ["stuck"] * 3,
                  "error_messages": ["m"] * 3, "as_of": datetime.now(UTC),
                  "stale_after": 300.0, "stuck_after": 900.0}),
    HotStatement("metrics_queue_depth", metrics_q.JOB_QUEUE_DEPTH, {}, job_q.JOB_PLAN_SETTINGS),
    # NOTE: a streamed attempt's write, once per SA_STREAM_INTERVAL per job, and the route gate's
    # reads and writes (jobqueue/runtime/gate.py, jobqueue/runtime/streaming.py).
    HotStatement("partial_append", partial_q.JOB_PARTIAL_APPEND_IF_CLAIMED,
                 {"job_id": _IDS[0], "claim": "w1", "attempt": 1, "text": "so far"}),
    HotStatement("partial_changed", partial_q.JOB_PARTIAL_LIST_CHANGED, {"after": 0}),
    HotStatement("route_pause", route_q.ROUTE_PAUSE, {"route": "r", "seconds": 1.0,
                                                      "reason": "429"}),
    HotStatement("route_pauses_active", route_q.ROUTE_PAUSES_ACTIVE, {}),
    HotStatement("route_window_take", route_q.ROUTE_WINDOW_TAKE,
                 {"route": "r", "rpm": 10, "tpm": 0, "window": 60.0}),
]


def _reads_sa_job(node: dict[str, Any]) -> bool:
    """True when `node` or its input (InitPlans and SubPlans aside) scans sa_job."""
    if node.get("Relation Name") == "sa_job" and node["Node Type"] != "ModifyTable":
        return True
    return any(_reads_sa_job(child) for child in node.get("Plans", [])
               if child.get("Parent Relationship") not in ("InitPlan", "SubPlan"))


# NOTE: a bitmap over these reads no more than the rows the statement names (ids, by the primary
# key) or the running jobs (partial indexes WHERE state = 'running', 0001_core_schema.sql: at
# most the workers' total concurrency), never the queue or the history.
_BOUNDED_INDEXES = frozenset({"sa_job_pkey", "sa_job_worker_claim_idx", "sa_job_heartbeat_idx"})


def _probes_ids(bitmap_heap_scan: dict[str, Any]) -> bool:
    """True when a bitmap scan only reads the rows the statement names or the running jobs."""
    leaves = []
    stack = list(bitmap_heap_scan.get("Plans", []))
    while stack:
        node = stack.pop()
        if node["Node Type"] == "Bitmap Index Scan":
            leaves.append(node.get("Index Name"))
        stack += node.get("Plans", [])
    return bool(leaves) and all(name in _BOUNDED_INDEXES for name in leaves)


def _bounded(node: dict[str, Any]) -> bool:
    """True when every read of sa_job under `node` goes through a _BOUNDED_INDEXES index, or
    stops at a LIMIT (the fair claim's per-org heads; a sort under the LIMIT is checked itself)."""
    if node["Node Type"] == "Limit":
        return True
    if node.get("Relation Name") == "sa_job" and node["Node Type"] != "ModifyTable":
        kind = node["Node Type"]
        if kind == "Bitmap Heap Scan":
            return _probes_ids(node)
        return kind in ("Index Scan", "Index Only Scan") and node.get("Index Name") in _BOUNDED_INDEXES
    return all(_bounded(child) for child in node.get("Plans", []))


def _violations(node: dict[str, Any], hot: HotStatement) -> list[str]:
    """Every node of the plan that reads sa_job in full or sorts what it read from it."""
    found = []
    kind = node["Node Type"]
    if node.get("Relation Name") == "sa_job" and (
            kind == "Seq Scan" or (kind == "Bitmap Heap Scan" and not _probes_ids(node))):
        found.append(f"{kind} on sa_job")
    if node.get("Relation Name") == "sa_entity" and kind != "ModifyTable" and (
            kind != "Index Scan" or node.get("Index Name") != "sa_entity_pkey"):
        found.append(f"{kind} {node.get('Index Name') or ''} on sa_entity".replace("  ", " "))
    # NOTE: sorting the running jobs (reclaim's keyset order) costs the workers' slots, not the queue.
    if kind == "Sort" and not hot.sorts_backlog and _reads_sa_job(node) and not _bounded(node):
        found.append(f"Sort ({', '.join(node.get('Sort Key', []))}) of rows read from sa_job")
    for child in node.get("Plans", []):
        found += _violations(child, hot)
    return found


_PROMPTS = ("INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content) "
            "SELECT g, 'prompt', 1, 1, g, 'x' "
            "FROM (SELECT gen_random_uuid() AS g FROM generate_series(1, %s)) s")


# NOTE: a job in `state` for every prompt that has none yet.
_JOBS = ("INSERT INTO sa_job (id, prompt_id, org_id, created_by, state, worker_claim, claimed_at, "
         "                    started_at, running_heartbeat_at, finished_at) "
         "SELECT gen_random_uuid(), e.id, e.org_id, 1, %(state)s, s.claim, s.at, s.at, s.at, "
         "       CASE WHEN %(state)s = 'cancelled' THEN now() END "
         "  FROM sa_entity e, LATERAL (SELECT CASE WHEN %(state)s = 'queued' THEN NULL "
         "                                         ELSE 'w' || (random() * 20)::int END AS claim, "
         "                                    CASE WHEN %(state)s = 'queued' THEN NULL "
         "                                         ELSE now() END AS at) s "
         " WHERE NOT EXISTS (SELECT 1 FROM sa_job j WHERE j.prompt_id = e.id)")


@pytest.fixture
def backlog(pool: ConnectionPool[DictConnection]) -> Iterator[DictConnection]:
    """A finished history ANALYZEd while nothing was queued or running; then a few running jobs
    and 100,000 queued ones with their prompts, not analyzed. In a transaction rolled back after."""
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        # NOTE: no transition events for rows that only exist to be planned over: faster.
        conn.execute("ALTER TABLE sa_job DISABLE TRIGGER USER")
        conn.execute(_PROMPTS, (HISTORY,))
        conn.execute(_JOBS, {"state": "cancelled"})
        conn.execute("ANALYZE sa_job")
        conn.execute("ANALYZE sa_entity")
        conn.execute(_PROMPTS, (RUNNING,))
        conn.execute(_JOBS, {"state": "running"})
        conn.execute(_PROMPTS, (BACKLOG,))
        conn.execute(_JOBS, {"state": "queued"})
        yield conn


def _check_all(conn: DictConnection) -> list[str]:
    problems = []
    for hot in HOT_PATH:
        for generic in (False, True):
            # NOTE: rolled back to the savepoint, so neither the prelude's SET LOCAL nor the
            # plan cache mode outlives the statement it is for.
            with conn.transaction(force_rollback=True):
                if hot.prelude is not None:
                    conn.execute(hot.prelude)
                plan = plan_tree(conn, hot.statement, hot.params, generic=generic)
            for found in _violations(plan, hot):
                problems.append(f"{hot.name} ({'generic' if generic else 'custom'} plan): {found}")
    return problems


def test_hot_path_plans_hold_with_statistics_from_an_empty_queue_and_after_analyze(
    backlog: DictConnection,
) -> None:
    queued = backlog.execute("SELECT count(*) AS n FROM sa_job WHERE state = 'queued'").fetchone()
    assert queued == {"n": BACKLOG}

    stale = _check_all(backlog)
    backlog.execute("ANALYZE sa_job")
    backlog.execute("ANALYZE sa_entity")
    analyzed = _check_all(backlog)

    assert stale == [], "statistics from an empty queue:\n" + "\n".join(stale)
    assert analyzed == [], "after ANALYZE:\n" + "\n".join(analyzed)


def test_without_its_plan_settings_the_claim_would_sort_the_backlog(backlog: DictConnection) -> None:
    # The check above can fail: the same claim, planned without JOB_PLAN_SETTINGS on these
    # statistics, reads every queued row and sorts them.
    bare = HotStatement("claim", job_q.JOB_CLAIM_MANY, _CLAIM)
    assert any("Sort" in v for v in _violations(plan_tree(backlog, bare.statement, bare.params),
                                                bare))
