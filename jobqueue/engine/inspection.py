"""Operator reads across orgs: list jobs, one job's full history, and queue figures per org."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import NotFound
from jobqueue.core.queries import entity as entity_q
from jobqueue.core.queries import inspection as q
from jobqueue.core.states import JobState

__all__ = ["JobDetails", "OrgFigures", "QueueMetrics", "job_details", "list_jobs", "queue_metrics",
           "usage"]

Row = dict[str, Any]


def list_jobs(
    pool: ConnectionPool[DictConnection],
    *,
    state: JobState | None = None,
    org_id: int | None = None,
    since: datetime | None = None,
    limit: int = 50,
) -> list[Row]:
    """Returns jobs of any org, newest first.

    Args:
        pool: database pool.
        state: only jobs in this state.
        org_id: only this org's jobs.
        since: only jobs created at or after this instant.
        limit: at most this many rows.

    Returns:
        The jobs (no prompt text), newest first.
    """
    with pool.connection() as conn:
        return conn.execute(
            q.JOB_LIST_ANY_ORG,
            {"state": None if state is None else state.value, "org_id": org_id, "since": since,
             "limit": limit},
        ).fetchall()


@dataclass(frozen=True)
class JobDetails:
    """A job (hot or archived), its prompt and response, its transitions and its provider calls."""

    job: Row
    prompt: Row | None
    response: Row | None
    events: list[Row]
    calls: list[Row]

    def as_dict(self) -> dict[str, Any]:
        """Returns the `job-details --json` document."""
        return {"job": self.job, "prompt": self.prompt, "response": self.response,
                "transitions": self.events, "provider_calls": self.calls}


def job_details(pool: ConnectionPool[DictConnection], job_id: uuid.UUID) -> JobDetails:
    """Returns everything recorded about one job of any org, archived or not.

    Raises:
        NotFound: no job has this id, in the hot tables or the archive.
    """
    params = {"job_id": job_id}
    with pool.connection() as conn:
        job = conn.execute(q.JOB_GET_ANY_ORG, params).fetchone()
        if job is None:
            raise NotFound(f"job {job_id} not found")
        scope = {"org_id": job["org_id"]}
        prompt = conn.execute(entity_q.ENTITY_GET, {**scope, "id": job["prompt_id"]}).fetchone()
        response = None
        if job["response_id"] is not None:
            response = conn.execute(entity_q.ENTITY_GET, {**scope, "id": job["response_id"]}).fetchone()
        events = conn.execute(q.JOB_EVENT_LIST_FOR_JOB_ANY_ORG, params).fetchall()
        calls = conn.execute(q.LEDGER_LIST_FOR_JOB_ANY_ORG, params).fetchall()
    return JobDetails(job=job, prompt=prompt, response=response, events=events, calls=calls)


@dataclass
class OrgFigures:
    """Queue figures of one org, or of all orgs together (`org_id` None)."""

    org_id: int | None
    jobs_by_state: dict[str, int] = field(
        default_factory=lambda: {state.value: 0 for state in JobState})
    queued_due: int = 0
    oldest_queued_seconds: float = 0.0
    claims: int = 0
    wait_mean: float | None = None
    wait_p95: float | None = None
    attempts: int = 0
    run_mean: float | None = None
    run_p95: float | None = None
    errors: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def error_rate(self) -> float | None:
        """Errored attempts over ended attempts in the window; None without attempts."""
        return self.errors / self.attempts if self.attempts else None

    def as_dict(self) -> dict[str, Any]:
        """Returns the figures as one `queue-metrics --json` entry."""
        return {
            "org_id": self.org_id,
            "jobs_by_state": self.jobs_by_state,
            "queued_due": self.queued_due,
            "oldest_queued_seconds": self.oldest_queued_seconds,
            "claims": self.claims,
            "wait_seconds": {"mean": self.wait_mean, "p95": self.wait_p95},
            "attempts": self.attempts,
            "run_seconds": {"mean": self.run_mean, "p95": self.run_p95},
            "errors": self.errors,
            "error_rate": self.error_rate,
            "errors_by_kind": {
                kind: {"errors": n, "rate": n / self.attempts if self.attempts else None}
                for kind, n in self.errors_by_kind.items()
            },
        }


@dataclass(frozen=True)
class QueueMetrics:
    """Queue figures now (states, backlog) and over a window (latency, errors), overall and per org."""

    since: datetime
    overall: OrgFigures
    orgs: list[OrgFigures]

    def as_dict(self) -> dict[str, Any]:
        """Returns the `queue-metrics --json` document."""
        return {"since": self.since, "all": self.overall.as_dict(),
                "orgs": [org.as_dict() for org in self.orgs]}


def queue_metrics(pool: ConnectionPool[DictConnection], since: datetime) -> QueueMetrics:
    """Reads the queue's figures: jobs by state and the backlog now, latency and errors since `since`.

    Args:
        pool: database pool.
        since: start of the window for wait and run times and error rates.

    Returns:
        Figures for all orgs together and for each org that has jobs or activity.
    """
    window = {"since": since}
    with pool.connection() as conn:
        counts = conn.execute(q.JOB_COUNT_BY_ORG_STATE).fetchall()
        oldest = conn.execute(q.JOB_OLDEST_QUEUED_BY_ORG).fetchall()
        latency = conn.execute(q.JOB_EVENT_LATENCY_SINCE, window).fetchall()
        errors = conn.execute(q.JOB_EVENT_ERRORS_SINCE, window).fetchall()
    overall = OrgFigures(org_id=None)
    orgs: dict[int, OrgFigures] = {}

    def figures(row: Row) -> OrgFigures:
        if row.get("all_orgs"):
            return overall
        org_id = int(row["org_id"])
        return orgs.setdefault(org_id, OrgFigures(org_id=org_id))

    for row in counts:
        for target in (overall, figures(row)):
            target.jobs_by_state[row["state"]] += row["jobs"]
    for row in oldest:
        org = figures(row)
        org.queued_due, org.oldest_queued_seconds = row["due"], row["oldest_queued_seconds"]
        overall.queued_due += row["due"]
        overall.oldest_queued_seconds = max(overall.oldest_queued_seconds, row["oldest_queued_seconds"])
    for row in latency:
        org = figures(row)
        org.claims, org.wait_mean, org.wait_p95 = row["claims"], row["wait_mean"], row["wait_p95"]
        org.attempts, org.run_mean, org.run_p95 = row["attempts"], row["run_mean"], row["run_p95"]
        org.errors = row["errors"]
    for row in errors:
        figures(row).errors_by_kind[row["error_kind"]] = row["errors"]
    return QueueMetrics(since=since, overall=overall, orgs=[orgs[k] for k in sorted(orgs)])


def usage(pool: ConnectionPool[DictConnection], since: datetime, org_id: int | None) -> list[Row]:
    """Provider calls and tokens since `since`, per org and model, archived calls included.

    `counted_calls` is how many calls reported their tokens (a provider may report none).
    """
    with pool.connection() as conn:
        return conn.execute(q.LEDGER_USAGE_SINCE, {"since": since, "org_id": org_id}).fetchall()
