"""Claim: move up to N queued jobs to running for one worker, in one statement.

A claimed job whose execution_options cannot be decoded (operator SQL, an older release) fails
at once as `invalid_options`; the worker gets the others and goes on.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import structlog
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from jobqueue.core import metrics, wakeup
from jobqueue.core.db import DictConnection
from jobqueue.core.policy import ErrorKind
from jobqueue.core.queries import claim as claim_q
from jobqueue.core.queries import job as q
from jobqueue.core.settings import DEFAULT_PRIORITY_AGING
from jobqueue.core.states import JobState
from jobqueue.engine import chains, quarantine, transitions
from jobqueue.engine.isolation import is_connection_failure, write_isolated

__all__ = ["DEFAULT_DEPTH", "MAX_DEPTH", "SENT_OPTIONS", "ClaimRound", "ClaimedJob", "Undecodable",
           "claim", "claim_round", "next_due", "options_error"]

log = structlog.get_logger(__name__)

# NOTE: the contract's default for the `depth` option (the OpenAPI document's ExecutionOptions):
# ancestors sent along with a prompt.
DEFAULT_DEPTH = 10

MAX_DEPTH = 50
"""Most ancestors a job may ask for; POST /prompt refuses more (service/contract.py)."""

SENT_OPTIONS = ("temperature", "top_p", "max_tokens", "stop", "response_format", "seed",
                "presence_penalty", "frequency_penalty")
"""Options passed to the provider's request body as they were validated at submit."""


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds; `claim` and `attempt` together guard every later write."""

    id: uuid.UUID
    prompt_id: uuid.UUID
    org_id: int
    created_by: int
    priority: int
    attempt: int
    max_attempts: int
    options: dict[str, Any]
    supersedes: uuid.UUID | None
    created_at: datetime
    scheduled_for: datetime
    claimed_at: datetime
    throttled_at: datetime | None
    claim: str
    claimed_monotonic: float
    context: list[dict[str, str]]
    route: str | None = None
    """The route an earlier attempt failed over to (sa_job.route), which this one calls."""


@dataclass(frozen=True)
class Undecodable:
    """A jsonb value Python cannot load (say a number of 5,000 digits), kept instead of raising."""

    error: str


def _lenient_loads(data: str | bytes) -> Any:
    # NOTE: a loader that raised would fail the fetch of the whole claim, for every worker.
    try:
        return json.loads(data)
    except ValueError as exc:
        return Undecodable(str(exc))


def options_error(options: object) -> str | None:
    """Returns why the worker cannot run a job with these execution_options, or None.

    Decodes what the worker reads (`depth`, `model`, `system`) as strictly as POST /prompt validates it;
    the claim statement reads a depth it accepts the same way, and no ancestor otherwise.
    """
    if isinstance(options, Undecodable):
        return f"execution_options cannot be decoded: {options.error:.200}"
    if not isinstance(options, dict):
        return f"execution_options must be an object, got {type(options).__name__}"
    if "depth" in options:
        depth = options["depth"]
        if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH:
            return f"execution_options.depth must be an integer within 0..{MAX_DEPTH}, got {depth!r:.80}"
    for name in ("model", "system", "prefer_provider"):
        if name in options and not isinstance(options[name], str):
            return f"execution_options.{name} must be a string, got {options[name]!r:.80}"
    if "messages" in options and not _messages_ok(options["messages"]):
        return "execution_options.messages must be a non-empty list of {role, content} strings"
    return None


def _messages_ok(messages: object) -> bool:
    """Whether `messages` (an OpenAI chat request's, sent as given) is what the provider takes."""
    return isinstance(messages, list) and bool(messages) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) and all(isinstance(v, str) for v in m.values())
        for m in messages)


@dataclass(frozen=True)
class ClaimRound:
    """What one claim took, and how many jobs it chose to take.

    `chosen` above `len(jobs)` means another claim held some of the chosen jobs (or they could
    not be run): more may be waiting, though this claim took fewer than it asked for.
    """

    jobs: list[ClaimedJob]
    chosen: int


def claim(
    pool: ConnectionPool[DictConnection],
    worker_claim: str,
    limit: int,
    priority_ceiling: int,
    org_max_running: int = 0,
    priority_aging: float = DEFAULT_PRIORITY_AGING,
    held_orgs: Sequence[int] = (),
    token_window: float = 0.0,
) -> list[ClaimedJob]:
    """The jobs `claim_round` takes (its arguments), for callers that need not tell a contended
    queue from an empty one."""
    return claim_round(pool, worker_claim, limit, priority_ceiling, org_max_running,
                       priority_aging, held_orgs, token_window).jobs


def claim_round(
    pool: ConnectionPool[DictConnection],
    worker_claim: str,
    limit: int,
    priority_ceiling: int,
    org_max_running: int = 0,
    priority_aging: float = DEFAULT_PRIORITY_AGING,
    held_orgs: Sequence[int] = (),
    token_window: float = 0.0,
) -> ClaimRound:
    """Claims up to `limit` claimable jobs, most urgent (lowest priority number) then oldest first.

    Args:
        pool: database pool.
        worker_claim: this worker's id, written to `worker_claim`.
        limit: free slots; never claim more than can start now.
        priority_ceiling: only jobs with priority <= this.
        org_max_running: when > 0, no org gets more running jobs than this (exact across
            workers: capped claims serialize on an advisory lock).
        priority_aging: seconds after which a due job is claimed before every priority
            (`SA_PRIORITY_AGING`).
        held_orgs: orgs whose queued jobs are not claimed now (past their budget).
        token_window: when > 0 (`SA_FAIR_BY_TOKENS`), orgs take turns by the tokens they used
            in the last two windows of this many seconds, not by jobs (ignored with
            `org_max_running`).

    Returns:
        The claimed jobs in claim order, and how many the claim chose.
    """
    if limit <= 0:
        return ClaimRound([], 0)
    params = {"claim": worker_claim, "limit": limit, "ceiling": priority_ceiling,
              "org_cap": org_max_running, "default_depth": DEFAULT_DEPTH,
              "aging": priority_aging, "held_orgs": list(held_orgs),
              "token_window": token_window}
    with pool.connection() as conn, metrics.CLAIM_SECONDS.time(), conn.cursor() as cur:
        set_json_loads(_lenient_loads, cur)
        capped = org_max_running > 0
        try:
            rows = _planned(conn, cur, _statement(capped, token_window, many=True), params,
                            capped=capped)
            # NOTE: the capped claim skips a held job for the next one (SKIP LOCKED under its
            # LIMIT), so it takes all it chose; the others say what they chose (claim_q).
            chosen = len(rows) if capped else (rows[0]["chosen"] if rows else 0)
            rows = [r for r in rows if r["id"] is not None]
        except psycopg.Error as exc:
            if is_connection_failure(conn, exc):
                raise
            log.warning("claim.split", worker_id=worker_claim, sqlstate=exc.sqlstate,
                        error=str(exc).strip()[:300])
            rows, chosen = _claim_around(conn, cur, params, capped, token_window)
        if rows:
            wakeup.for_pool(pool).job_changed()
        for r in rows:
            transitions.record("job.claimed", JobState.QUEUED, JobState.RUNNING, job_id=str(r["id"]),
                               prompt_id=str(r["prompt_id"]), org_id=r["org_id"],
                               attempt=r["attempt"], worker_id=worker_claim)
        claimed = len(rows)
        rows = _reject_undecodable(conn, worker_claim, rows)
    if len(rows) < claimed:
        wakeup.for_pool(pool).job_changed()
    now = time.monotonic()
    jobs = [
        ClaimedJob(
            id=r["id"], prompt_id=r["prompt_id"], org_id=r["org_id"], created_by=r["created_by"],
            priority=r["priority"], attempt=r["attempt"], max_attempts=r["max_attempts"],
            options=r["execution_options"], supersedes=r["supersedes"],
            created_at=r["created_at"], scheduled_for=r["scheduled_for"],
            claimed_at=r["claimed_at"], throttled_at=r["throttled_at"], claim=worker_claim,
            claimed_monotonic=now,
            context=r["context"], route=r["route"],
        )
        for r in rows
    ]
    for job in jobs:
        metrics.WAIT_SECONDS.observe(max(0.0, (job.claimed_at - job.scheduled_for).total_seconds()))
    return ClaimRound(jobs, chosen)


def next_due(pool: ConnectionPool[DictConnection], priority_ceiling: int) -> float | None:
    """Seconds until the soonest claimable job scheduled for later falls due; None for none."""
    with pool.connection() as conn, conn.cursor() as cur:
        rows = _planned(conn, cur, claim_q.JOB_NEXT_DUE, {"ceiling": priority_ceiling})
    row = rows[0] if rows else None
    return None if row is None or row["seconds"] is None else max(0.0, float(row["seconds"]))


def _planned(conn: DictConnection, cur: psycopg.Cursor[dict[str, Any]], statement: str,
             params: dict[str, Any], *, capped: bool = False) -> list[dict[str, Any]]:
    """Runs `statement` under the plan settings (and the org-capped lock) in one round trip.

    PERF: BEGIN, the settings, the statement and COMMIT cost four round trips one by one. In
    pipeline mode they all go out before the one Sync that ends them, and the client waits once
    (under gevent too, where each statement waited its turn on the hub before going out:
    jobqueue/core/green_wait.py). The pool's connections are autocommit, so no BEGIN is sent:
    everything before a Sync is one implicit transaction, which the Sync commits, or rolls back
    whole when a statement failed (the server skips the rest). set_config(..., true) therefore
    holds for this statement only and never stays on the session, a transaction-mode pooler's
    included (it hands the server session back only at the Sync's ReadyForQuery).
    tests/test_claim_round_trips.py counts the Syncs.
    """
    with conn.pipeline():
        conn.execute(q.JOB_PLAN_SETTINGS)
        if capped:
            conn.execute(claim_q.JOB_CLAIM_LOCK_ORG_CAPPED)
        cur.execute(statement, params)
    return cur.fetchall()


def _prepare(cur: psycopg.Cursor[dict[str, Any]], capped: bool) -> None:
    """The claim transaction's first statements: the plan settings, and the org-capped lock."""
    cur.execute(q.JOB_PLAN_SETTINGS)
    if capped:
        cur.execute(claim_q.JOB_CLAIM_LOCK_ORG_CAPPED)


def _statement(capped: bool, token_window: float, *, many: bool) -> str:
    """The claim (`many`) or its candidates: org-capped, fair by tokens, or by turns."""
    if capped:
        return claim_q.JOB_CLAIM_MANY_ORG_CAPPED if many else claim_q.JOB_CLAIM_CANDIDATES_ORG_CAPPED
    if token_window > 0:
        return claim_q.JOB_CLAIM_MANY_BY_TOKENS if many else claim_q.JOB_CLAIM_CANDIDATES_BY_TOKENS
    return claim_q.JOB_CLAIM_MANY if many else claim_q.JOB_CLAIM_CANDIDATES


def _claim_around(conn: DictConnection, cur: psycopg.Cursor[dict[str, Any]],
                  params: dict[str, Any], capped: bool,
                  token_window: float) -> tuple[list[dict[str, Any]], int]:
    """Claims the jobs the failed claim would have taken, by id, around the one that cannot be
    written, which is quarantined so no later claim chooses it again; returns them and how many
    were chosen."""
    with conn.transaction():
        _prepare(cur, capped)
        candidates = cur.execute(_statement(capped, token_window, many=False),
                                 params).fetchall()

        def take(c: DictConnection, part: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
            return cur.execute(claim_q.JOB_CLAIM_IDS, {**params, "job_ids": [r["id"] for r in part]},
                               prepare=False).fetchall()

        done = write_isolated(conn, candidates, take)
        for row, exc in done.failed:
            quarantine.set_aside(conn, row["id"], row["org_id"], "claim", exc)
    return done.rows, len(candidates)


def _reject_undecodable(
    conn: DictConnection, worker_claim: str, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Fails the claimed rows whose options cannot be decoded; returns the others."""
    errors = {r["id"]: error for r in rows if (error := options_error(r["execution_options"]))}
    if not errors:
        return rows
    bad = [r for r in rows if r["id"] in errors]

    def reject(c: DictConnection, part: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        # NOTE: planned for each batch (prepare=False): rare, and a generic plan cached while
        # sa_job was small could walk all of its key (docs/architecture.md, "Plans that hold under load").
        return c.execute(q.JOB_REJECT_MANY_IF_CLAIMED, {
            "job_ids": [r["id"] for r in part], "attempts": [r["attempt"] for r in part],
            "error_kinds": [ErrorKind.INVALID_OPTIONS.value] * len(part),
            "error_messages": [errors[r["id"]] for r in part], "claim": worker_claim,
        }, prepare=False).fetchall()

    done = write_isolated(conn, bad, reject)
    for r, exc in done.failed:
        quarantine.set_aside(conn, r["id"], r["org_id"], "reject", exc)
    failed = {out["id"] for out in done.rows}
    chains.settle(conn, list(failed))
    for r in bad:
        if r["id"] in failed:
            transitions.record("job.options_invalid", JobState.RUNNING, JobState.FAILED,
                               error_kind=ErrorKind.INVALID_OPTIONS, level="warning",
                               job_id=str(r["id"]), prompt_id=str(r["prompt_id"]),
                               org_id=r["org_id"], attempt=r["attempt"], worker_id=worker_claim,
                               error=errors[r["id"]])
    return [r for r in rows if r["id"] not in errors]
