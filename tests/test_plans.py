"""Every statement on the hot path keeps a plan whose cost does not grow with the backlog or history.

One table (HOT_PATH) lists the statements a submit, a worker, the maintenance leader and a
/metrics scrape run over and over, and the ones that settle a chain when its first job ends; a
new one slots in as one more row. Each is EXPLAINed, as a plan for
its values and as the generic plan a long-lived session caches, in the service's own sessions:
on a young deployment (a few jobs, analyzed), then over 100,000 queued jobs behind a finished
history, first with the statistics taken when the queue was still empty (autoanalyze lags a
growing backlog: the case that made the claim read and sort every queued row), then after
ANALYZE. Every read of sa_job must probe what the statement names or walk an index under a LIMIT
(see _violations), and sa_entity (the prompts, as large as the history) is only ever probed by
its primary key.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.console import JobFilter
from jobqueue.core.db import DictConnection
from jobqueue.core.queries import answer as answer_q
from jobqueue.core.queries import chain as chain_q
from jobqueue.core.queries import claim as claim_q
from jobqueue.core.queries import console as console_q
from jobqueue.core.queries import entity as entity_q
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries import job_event as event_q
from jobqueue.core.queries import maintenance as maintenance_q
from jobqueue.core.queries import metrics as metrics_q
from jobqueue.core.queries import org_token as org_token_q
from jobqueue.core.queries import partial as partial_q
from jobqueue.core.queries import route as route_q
from jobqueue.core.queries import worker as worker_q
from jobqueue.engine.claim import DEFAULT_DEPTH
from tests.helpers import plan_tree

pytestmark = pytest.mark.usefixtures("truncated_tables")

BACKLOG = 100_000
HISTORY = 2_000
RUNNING = 200


@dataclass(frozen=True)
class HotStatement:
    """A statement run on the hot path, with the values it is EXPLAINed with.

    `prelude` runs first in the same transaction, as the code runs it (the claim's plan settings).
    `reads_backlog` is True for the statements that must read every queued or running row: the
    capped claim ranks them all, the scrape counts them. `prepared` False for a statement the
    code runs unprepared, planned for each execution: only that plan is checked.
    """

    name: str
    statement: str
    params: dict[str, Any] | tuple[Any, ...]
    prelude: str | None = None
    reads_backlog: bool = False
    prepared: bool = True


_IDS = [uuid.uuid4() for _ in range(3)]
# NOTE: one batch of each outcome, as the completer writes them together.
_FINALIZE = {"job_id": _IDS, "claim": ["w1"] * 3, "attempt": [1] * 3,
             "to_state": ["succeeded", "queued", "failed"], "model": ["m"] * 3,
             "tokens_in": [1] * 3, "tokens_out": [1] * 3, "latency_ms": [1] * 3,
             "http_status": [200, 503, 400], "response_id": [uuid.uuid4(), None, None],
             "content": ["a", None, None], "error_kind": [None, "provider_5xx", "provider_4xx"],
             "error_message": [None, "boom", "bad"], "delay": [None, 1.5, None],
             "spend_attempt": [True, True, True], "route": ["r"] * 3, "cost": [0.001, None, None],
             "next_route": [None, "r2", None]}
_ENQUEUE = {"parent_id": None, "org_id": 1, "user_id": 1, "text": "t", "priority": 50,
            "max_attempts": 3, "options": "{}", "max_queued": 0, "idempotency_key": "k",
            "request_hash": "h", "key_ttl": 86400, "run_at": None, "delay_seconds": None,
            "after": None, "max_chain_depth": 1000,
            "prompt_id": uuid.uuid4(), "job_id": uuid.uuid4()}
_CLAIM = {"claim": "w", "limit": 32, "ceiling": 100, "default_depth": DEFAULT_DEPTH, "org_cap": 4,
          "aging": 300.0, "held_orgs": [7]}

_NO_CURSOR = {"after_at": None, "after_id": None}
# NOTE: the operator console's filter, every part given (the text search probes the prompts).
_CONSOLE_FILTER = {**JobFilter(states=("queued", "failed"), org_id=1, models=("m",),
                               other_models=("n",), default_model="m", error_kind="timeout",
                               since=datetime(2026, 1, 1, tzinfo=UTC), text="needle").params(),
                   "after_at": datetime.now(UTC), "after_id": uuid.uuid4()}

HOT_PATH = [
    HotStatement("enqueue", entity_q.PROMPT_INSERT_WITH_JOB, _ENQUEUE),
    HotStatement("enqueue_after_capped", entity_q.PROMPT_INSERT_WITH_JOB,
                 {**_ENQUEUE, "after": _IDS[0], "parent_id": _IDS[1], "max_queued": 1000},
                 job_q.JOB_PLAN_SETTINGS),
    HotStatement("claim", claim_q.JOB_CLAIM_MANY, _CLAIM, job_q.JOB_PLAN_SETTINGS),
    # NOTE: the per-org rank needs every claimable row (see its comment), so it may sort them,
    # but it still reads them through the claim index, never the table.
    # NOTE: fair by tokens (SA_FAIR_BY_TOKENS): the same heads, plus one probe of the orgs'
    # recent tokens each.
    HotStatement("claim_by_tokens", claim_q.JOB_CLAIM_MANY_BY_TOKENS,
                 {**_CLAIM, "token_window": 60.0}, job_q.JOB_PLAN_SETTINGS),
    HotStatement("claim_candidates_by_tokens", claim_q.JOB_CLAIM_CANDIDATES_BY_TOKENS,
                 {**_CLAIM, "token_window": 60.0}, job_q.JOB_PLAN_SETTINGS),
    HotStatement("claim_org_capped", claim_q.JOB_CLAIM_MANY_ORG_CAPPED, _CLAIM,
                 job_q.JOB_PLAN_SETTINGS, reads_backlog=True),
    HotStatement("finalize_mixed", job_q.JOB_SET_STATE_IF_RUNNING_MANY, _FINALIZE),
    HotStatement("reject", job_q.JOB_REJECT_MANY_IF_CLAIMED,
                 {"job_ids": _IDS, "attempts": [1] * 3, "error_kinds": ["invalid_options"] * 3,
                  "error_messages": ["m"] * 3, "claim": "w1"}, prepared=False),
    HotStatement("claim_candidates", claim_q.JOB_CLAIM_CANDIDATES, _CLAIM, job_q.JOB_PLAN_SETTINGS),
    HotStatement("claim_ids", claim_q.JOB_CLAIM_IDS, {**_CLAIM, "job_ids": _IDS}, prepared=False),
    HotStatement("next_due", claim_q.JOB_NEXT_DUE, {"ceiling": 100}, job_q.JOB_PLAN_SETTINGS),
    HotStatement("heartbeat", job_q.JOB_HEARTBEAT_MANY_IF_CLAIMED, {"job_ids": _IDS, "claim": "w1"}),
    # NOTE: every worker's departure watch, twice a second: its page of the event log, then a
    # probe of the few jobs it holds that appear there (jobqueue/engine/departures.py).
    HotStatement("departures_read", event_q.JOB_EVENT_LIST_LEFT_RUNNING_AFTER,
                 {"after": 0, "upto": 1000, "limit": 1000}),
    HotStatement("departures_check", job_q.JOB_LIST_STILL_CLAIMED,
                 {"job_ids": _IDS, "claim": "w1"}),
    # NOTE: the shutdown release reads every running job (at most the workers' slots), once per
    # shutdown, then releases them by id.
    HotStatement("claimed_by_worker", job_q.JOB_LIST_CLAIMED, {"claim": "w1"}, reads_backlog=True),
    HotStatement("release", job_q.JOB_RELEASE_MANY_IF_CLAIMED, {"job_ids": _IDS, "claim": "w1"}),
    HotStatement("count_queued_capped", job_q.JOB_COUNT_QUEUED_FOR_ORG_CAPPED,
                 {"org_id": 1, "cap": 1000}),
    # NOTE: what settles a chain when its first job ends, and the leader's sweep.
    HotStatement("release_dependents", chain_q.JOB_RELEASE_DEPENDENTS_MANY, {"job_ids": _IDS},
                 prepared=False),
    HotStatement("cancel_dependents", chain_q.JOB_CANCEL_DEPENDENTS_MANY, {"job_ids": _IDS},
                 prepared=False),
    HotStatement("cancel_orphaned", chain_q.JOB_CANCEL_ORPHANED_MANY, {"pred_ids": _IDS},
                 prepared=False),
    HotStatement("rearm_dependents", chain_q.JOB_REARM_DEPENDENTS,
                 {"old_job_id": _IDS[0], "new_job_id": _IDS[1]}, prepared=False),
    HotStatement("waited_on_page", chain_q.JOB_LIST_WAITED_ON_PAGE,
                 {"after": uuid.UUID(int=0), "limit": 500}),
    # NOTE: the maintenance leader's reclaim reads every running job (at most the workers'
    # slots), once per maintenance round.
    HotStatement("reclaim_read", maintenance_q.JOB_LIST_RECLAIMABLE_PAGE,
                 {"now": None, "stale_after": 300.0, "stuck_after": 900.0,
                  "after_heartbeat": None, "after_id": None, "limit": 500},
                 reads_backlog=True),
    HotStatement("reclaim_write", maintenance_q.JOB_RECLAIM_MANY_IF_CLAIMED_AND_STALE,
                 {"job_ids": _IDS, "claims": ["w1"] * 3, "attempts": [1] * 3,
                  "to_states": ["queued", "failed", "queued"], "error_kinds": ["stuck"] * 3,
                  "error_messages": ["m"] * 3, "as_of": datetime.now(UTC),
                  "stale_after": 300.0, "stuck_after": 900.0}, prepared=False),
    HotStatement("metrics_queue_depth", metrics_q.JOB_QUEUE_DEPTH, {}, job_q.JOB_PLAN_SETTINGS,
                 reads_backlog=True),
    # NOTE: a worker's write of its streaming jobs' new text, once per SA_STREAM_INTERVAL; an SSE
    # hub's look at what was written since its last (and its read of ranges it skipped); a GET of
    # a job assembling its text so far; the maintenance leader's sweep, which reads every row of
    # sa_job_delta (the running attempts' text) but probes sa_job by id; and the route gate's
    # reads and writes (jobqueue/runtime/streaming.py, service/events/deltas.py, gate.py).
    HotStatement("delta_append", partial_q.JOB_DELTA_APPEND_MANY_IF_CLAIMED,
                 {"job_id": _IDS, "claim": ["w1"] * 3, "attempt": [1] * 3, "offset": [0, 5, 9],
                  "text": ["so far"] * 3}, prepared=False),
    HotStatement("delta_after", partial_q.JOB_DELTA_LIST_AFTER,
                 {"after": 0, "limit": 2000, "tail": 16384}),
    HotStatement("delta_ranges", partial_q.JOB_DELTA_LIST_RANGES,
                 {"job_id": _IDS, "attempt": [1] * 3, "start": [0] * 3, "stop": [100] * 3,
                  "tail": 16384}, prepared=False),
    HotStatement("answer_with_partial_text", answer_q.JOB_ANSWER_GET,
                 {"job_id": _IDS[0], "org_id": 1}),
    HotStatement("delta_sweep", partial_q.JOB_DELTA_SWEEP_ENDED, {}, reads_backlog=True),
    HotStatement("route_pause", route_q.ROUTE_PAUSE, {"route": "r", "seconds": 1.0,
                                                      "reason": "429"}),
    HotStatement("route_pauses_active", route_q.ROUTE_PAUSES_ACTIVE, {}),
    HotStatement("route_window_take", route_q.ROUTE_WINDOW_TAKE,
                 {"route": "r", "rpm": 10, "tpm": 0, "window": 60.0}),
    # NOTE: not the hot path, but the large reads of the operator console (/ops/), which an open
    # console repeats: a keyset page of every org's jobs, with or without a filter, the count
    # shown before a bulk action and each of its batches (jobqueue/core/queries/console.py).
    HotStatement("console_page", console_q.JOB_LIST_FOR_CONSOLE_PAGE,
                 {**JobFilter().params(), **_NO_CURSOR, "limit": 51},
                 console_q.CONSOLE_PLAN_SETTINGS),
    HotStatement("console_page_filtered", console_q.JOB_LIST_FOR_CONSOLE_PAGE,
                 {**_CONSOLE_FILTER, "limit": 51}, console_q.CONSOLE_PLAN_SETTINGS),
    HotStatement("console_count_capped", console_q.JOB_COUNT_FOR_CONSOLE_CAPPED,
                 {**_CONSOLE_FILTER, "cap": 10_001}, console_q.CONSOLE_PLAN_SETTINGS),
    HotStatement("console_bulk_ids", console_q.JOB_LIST_IDS_FOR_CONSOLE_PAGE,
                 {**JobFilter(states=("queued", "running"), org_id=1).params(), **_NO_CURSOR,
                  "limit": 500}, console_q.CONSOLE_PLAN_SETTINGS),
    HotStatement("console_cancel_many", console_q.JOB_CANCEL_MANY_IF_ACTIVE,
                 {"ids": _IDS, "reason": "r"}),
    HotStatement("console_retry_many", console_q.JOB_RETRY_MANY_IF_FINISHED, {"ids": _IDS}),
    HotStatement("console_workers", worker_q.WORKER_LIST_SEEN_SINCE, {"seconds": 90},
                 reads_backlog=True),
    HotStatement("console_charts", console_q.JOB_EVENT_PER_MINUTE_SINCE,
                 {"since": datetime.now(UTC)}),
    HotStatement("route_window_reserve", route_q.ROUTE_WINDOW_RESERVE,
                 {"route": "r", "rpm": 10, "tpm": 1000, "tokens": 100, "window": 60.0}),
    HotStatement("route_window_settle", route_q.ROUTE_WINDOW_SETTLE,
                 {"route": "r", "window_start": datetime.now(UTC), "reserved": 100, "used": 80}),
    HotStatement("org_token_window_add", org_token_q.ORG_TOKEN_WINDOW_ADD,
                 {"org_id": 1, "tokens": 80, "calls": 1, "window": 60.0}),
]


# NOTE: the indexes a statement may probe without a LIMIT: by the ids it names (primary key),
# by a predecessor (after_job_id), by a superseded job, or by one worker's claim (its running
# jobs, at most its slots).
_PROBE_INDEXES = frozenset({"sa_job_pkey", "sa_job_after_idx", "sa_job_waiting_idx",
                            "sa_job_worker_claim_idx", "sa_job_supersedes_unique"})
# NOTE: these read every input row before giving one out, so a LIMIT above them bounds nothing.
_BLOCKING = frozenset({"Sort", "Incremental Sort", "Hash", "Aggregate", "Materialize", "SetOp"})


def _bitmap_leaves(bitmap_heap_scan: dict[str, Any]) -> list[dict[str, Any]]:
    leaves = []
    stack = list(bitmap_heap_scan.get("Plans", []))
    while stack:
        node = stack.pop()
        if node["Node Type"] == "Bitmap Index Scan":
            leaves.append(node)
        stack += node.get("Plans", [])
    return leaves


def _probe(node: dict[str, Any]) -> bool:
    """True when an index read of sa_job looks up what the statement names: a condition on
    one of _PROBE_INDEXES."""
    return node.get("Index Name") in _PROBE_INDEXES and "Index Cond" in node


def _scan_violation(node: dict[str, Any], limited: bool, hot: HotStatement) -> str | None:
    """Why this read of sa_job may cost the backlog or the history, or None when it cannot."""
    kind = node["Node Type"]
    if kind == "Seq Scan":
        return "Seq Scan on sa_job"
    if kind == "Bitmap Heap Scan":
        leaves = _bitmap_leaves(node)
        if leaves and all(_probe(leaf) for leaf in leaves):
            return None
        return "Bitmap Heap Scan on sa_job over " + ", ".join(
            str(leaf.get("Index Name")) for leaf in leaves)
    if kind in ("Index Scan", "Index Only Scan"):
        if limited or _probe(node) or hot.reads_backlog:
            return None
        return f"{kind} on sa_job over {node.get('Index Name')} with no probe and no LIMIT"
    return None


def _keyed_event_read(node: dict[str, Any], limited: bool) -> bool:
    """True when a read of sa_job_event goes through an index condition (the statement's id
    range), or walks an index under a LIMIT: never the whole log."""
    kind = node["Node Type"]
    if kind == "Bitmap Heap Scan":
        leaves = _bitmap_leaves(node)
        return bool(leaves) and all("Index Cond" in leaf for leaf in leaves)
    return kind in ("Index Scan", "Index Only Scan") and ("Index Cond" in node or limited)


def _violations(node: dict[str, Any], hot: HotStatement, limited: bool = False) -> list[str]:
    """Every node of the plan that may read sa_job in full, sa_entity other than by id, or
    sa_job_event or sa_job_delta other than through an index condition.

    A read of sa_job must probe what the statement names (_PROBE_INDEXES, with a condition) or
    walk an index under a LIMIT that stops it (the claim's heads, a keyset page); a statement
    that `reads_backlog` may walk a partial index whole, never the table.
    """
    found = []
    kind = node["Node Type"]
    if node.get("Relation Name") == "sa_job" and kind != "ModifyTable":
        problem = _scan_violation(node, limited, hot)
        if problem is not None:
            found.append(problem)
    if node.get("Relation Name") == "sa_job_event" and kind != "ModifyTable" and (
            not _keyed_event_read(node, limited)):
        found.append(f"{kind} {node.get('Index Name') or ''} on sa_job_event with no index "
                     "condition".replace("  ", " "))
    if node.get("Relation Name") == "sa_job_delta" and kind != "ModifyTable" and (
            not hot.reads_backlog and not _keyed_event_read(node, limited)):
        found.append(f"{kind} {node.get('Index Name') or ''} on sa_job_delta with no index "
                     "condition".replace("  ", " "))
    if node.get("Relation Name") == "sa_entity" and kind != "ModifyTable" and (
            kind != "Index Scan" or node.get("Index Name") != "sa_entity_pkey"):
        found.append(f"{kind} {node.get('Index Name') or ''} on sa_entity".replace("  ", " "))
    if kind == "Limit":
        limited = True
    elif kind in _BLOCKING:
        limited = False
    for child in node.get("Plans", []):
        # NOTE: an InitPlan or SubPlan is a plan of its own: a LIMIT above does not stop it.
        own = child.get("Parent Relationship") in ("InitPlan", "SubPlan")
        found += _violations(child, hot, limited and not own)
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
        for generic in (False, True)[:1 + hot.prepared]:
            # NOTE: rolled back to the savepoint, so neither the prelude's SET LOCAL nor the
            # plan cache mode outlives the statement it is for.
            with conn.transaction(force_rollback=True):
                if hot.prelude is not None:
                    conn.execute(hot.prelude)
                plan = plan_tree(conn, hot.statement, hot.params, generic=generic)
            for found in _violations(plan, hot):
                problems.append(f"{hot.name} ({'generic' if generic else 'custom'} plan): {found}")
    return problems


def _check_then_analyze(conn: DictConnection) -> tuple[list[str], list[str]]:
    """`_check_all` on the statistics as they are, then again after ANALYZE."""
    before = _check_all(conn)
    conn.execute("ANALYZE sa_job")
    conn.execute("ANALYZE sa_entity")
    return before, _check_all(conn)


def test_hot_path_plans_hold_with_statistics_from_an_empty_queue_and_after_analyze(
    backlog: DictConnection,
) -> None:
    queued = backlog.execute("SELECT count(*) AS n FROM sa_job WHERE state = 'queued'").fetchone()
    assert queued == {"n": BACKLOG}

    stale, analyzed = _check_then_analyze(backlog)

    assert stale == [], "statistics from an empty queue:\n" + "\n".join(stale)
    assert analyzed == [], "after ANALYZE:\n" + "\n".join(analyzed)


def test_without_its_plan_settings_the_claim_would_read_the_backlog(backlog: DictConnection) -> None:
    # The check above can fail: the same claim, planned without JOB_PLAN_SETTINGS on these
    # statistics, walks every queued row instead of stopping after the batch.
    bare = HotStatement("claim", claim_q.JOB_CLAIM_MANY, _CLAIM)
    assert _violations(plan_tree(backlog, bare.statement, bare.params), bare)


def _rows_read(node: dict[str, Any]) -> int:
    """Rows an analyzed plan's reads of sa_job went through: returned and filtered out, over all
    their loops."""
    own = 0
    if node.get("Relation Name") == "sa_job" and node["Node Type"] != "ModifyTable":
        own = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


@pytest.mark.parametrize("name", ["claim", "claim_by_tokens", "claim_candidates"])
def test_a_claim_reads_its_batch_not_the_backlog(backlog: DictConnection, name: str) -> None:
    # The checks above see a LIMIT over the walk of each org's heads; this counts what the claim
    # really read, over one org's 100,000 queued jobs, all due at the same instant. Each was once
    # a read of the whole queue: the heads' window read every peer of its first row (its RANGE
    # frame), and, once ANALYZE saw a single org, the loose scan's last row (a NULL org) walked
    # sa_job_claim_idx for heads no job has (over such a queue with distinct due times, 68 ms a
    # claim of 8 against 3.8 ms now; here, with both faults, minutes).
    hot = next(h for h in HOT_PATH if h.name == name)
    assert hot.prelude is not None
    read = {}
    for analyzed in (False, True):
        if analyzed:
            backlog.execute("ANALYZE sa_job")
        for generic in (False, True):
            with backlog.transaction(force_rollback=True):
                # NOTE: the walk of the queue once took minutes here; fail in seconds instead.
                backlog.execute("SET LOCAL statement_timeout = '10s'")
                backlog.execute(hot.prelude)
                plan = plan_tree(backlog, hot.statement, hot.params, generic=generic, analyze=True)
            read[analyzed, generic] = _rows_read(plan)
    assert all(n <= 4 * _CLAIM["limit"] for n in read.values()), read


@pytest.fixture
def young(pool: ConnectionPool[DictConnection]) -> Iterator[DictConnection]:
    """A deployment's first minutes: a few jobs in tables never analyzed. In a transaction
    rolled back after."""
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        conn.execute("TRUNCATE sa_entity, sa_job CASCADE")
        conn.execute("ALTER TABLE sa_job DISABLE TRIGGER USER")
        conn.execute(_PROMPTS, (20,))
        conn.execute(_JOBS, {"state": "running"})
        conn.execute(_PROMPTS, (20,))
        conn.execute(_JOBS, {"state": "queued"})
        yield conn


def test_hot_path_plans_hold_on_a_young_deployment(young: DictConnection) -> None:
    # The plans a session caches in its first minutes are the ones it keeps while the tables grow
    # (until they are next analyzed): with the service's session settings (jobqueue/core/db.py)
    # they already probe by index, before the first ANALYZE and after it.
    assert young.execute("SHOW enable_seqscan").fetchone() == {"enable_seqscan": "off"}
    unanalyzed, analyzed = _check_then_analyze(young)

    assert unanalyzed == [], "never analyzed:\n" + "\n".join(unanalyzed)
    assert analyzed == [], "after ANALYZE:\n" + "\n".join(analyzed)
