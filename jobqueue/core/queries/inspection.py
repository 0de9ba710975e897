"""Operator reads across orgs (list-jobs, job-details, queue-metrics), over hot and archived rows."""

__all__ = [
    "JOB_COUNT_BY_ORG_STATE",
    "JOB_EVENT_ERRORS_SINCE",
    "JOB_EVENT_LATENCY_SINCE",
    "JOB_EVENT_LIST_FOR_JOB_ANY_ORG",
    "JOB_GET_ANY_ORG",
    "JOB_LIST_ANY_ORG",
    "JOB_OLDEST_QUEUED_BY_ORG",
    "LEDGER_LIST_FOR_JOB_ANY_ORG",
    "LEDGER_USAGE_SINCE",
]

from jobqueue.core.queries.job import JOB_COLUMNS as _JOB_COLUMNS

# served by sa_job_created_idx (created_at, id) (0002_archive.sql), scanned backwards (newest
# first) and stopped after `limit`; the optional filters are checked on the way. NULL means
# "any" for `state`, `org_id` and `since` (the bound casts give the NULLs their types).
JOB_LIST_ANY_ORG = """
SELECT id, prompt_id, state, priority, attempt, max_attempts, worker_claim, error_kind,
       org_id, created_by, supersedes, scheduled_for, created_at, updated_at, finished_at
  FROM sa_job
 WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(org_id)s::bigint IS NULL OR org_id = %(org_id)s::bigint)
   AND created_at >= coalesce(%(since)s::timestamptz, '-infinity')
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s
"""

# served by sa_job_pkey and sa_job_archive_pkey (id); superseded_by by sa_job_supersedes_unique
# (supersedes), or for an archived job by sa_job_archive_prompt_idx (a retry keeps the prompt).
# NOTE: the archive is read only when the hot table has no such job (a moved job is in one of
# the two, never both: the move deletes and inserts in one transaction).
JOB_GET_ANY_ORG = (
    "WITH hot AS (SELECT "
    + _JOB_COLUMNS
    + """, NULL::timestamptz AS archived_at
      FROM sa_job
     WHERE id = %(job_id)s
), cold AS (
    SELECT """
    + _JOB_COLUMNS
    + """, archived_at
      FROM sa_job_archive
     WHERE id = %(job_id)s AND NOT EXISTS (SELECT 1 FROM hot)
), job AS (
    SELECT * FROM hot UNION ALL SELECT * FROM cold
)
SELECT job.*,
       coalesce((SELECT s.id FROM sa_job s WHERE s.supersedes = job.id),
                (SELECT s.id FROM sa_job_archive s
                  WHERE s.prompt_id = job.prompt_id AND s.supersedes = job.id)) AS superseded_by
  FROM job
"""
)

# served by sa_job_event_job_idx (job_id, id) and sa_job_event_archive_job_idx (job_id, id).
JOB_EVENT_LIST_FOR_JOB_ANY_ORG = """
SELECT id, from_state, to_state, attempt, worker_claim, error_kind, response_id, at
  FROM sa_job_event
 WHERE job_id = %(job_id)s
UNION ALL
SELECT id, from_state, to_state, attempt, worker_claim, error_kind, response_id, at
  FROM sa_job_event_archive
 WHERE job_id = %(job_id)s
 ORDER BY id
"""

# served by sa_ledger_job_idx (job_id) and sa_ledger_archive_job_idx (job_id).
LEDGER_LIST_FOR_JOB_ANY_ORG = """
SELECT id, attempt, model, tokens_in, tokens_out, latency_ms, http_status, outcome, created_at,
       route, cost::float8 AS cost, error_message
  FROM sa_ledger
 WHERE job_id = %(job_id)s
UNION ALL
SELECT id, attempt, model, tokens_in, tokens_out, latency_ms, http_status, outcome, created_at,
       route, cost::float8 AS cost, error_message
  FROM sa_ledger_archive
 WHERE job_id = %(job_id)s
 ORDER BY id
"""

# served by sa_job_org_user_state_idx (org_id, created_by, state) (0001_core_schema.sql) as an
# index-only scan when the visibility map allows, else by a scan of sa_job. Either way it reads
# every hot job once: an operator's read (the CLI, or the operator view's GET /ops/overview every
# few seconds while it is open), never on a user's request path; `archive-old-jobs` keeps the hot
# table small.
JOB_COUNT_BY_ORG_STATE = """
SELECT org_id, state, count(*) AS jobs
  FROM sa_job
 GROUP BY org_id, state
 ORDER BY org_id, state
"""

# served by sa_job_org_queued_idx (org_id) WHERE state = 'queued': only the backlog is read. Age
# counts from the due time, as the sa_job_oldest_queued_seconds gauge does; a job waiting for its
# predecessor is not due.
JOB_OLDEST_QUEUED_BY_ORG = """
SELECT org_id,
       count(*) FILTER (WHERE scheduled_for <= now() AND NOT waiting) AS due,
       coalesce(extract(epoch FROM now() - min(scheduled_for)
                                  FILTER (WHERE scheduled_for <= now() AND NOT waiting)),
                0)::float8 AS oldest_queued_seconds
  FROM sa_job
 WHERE state = 'queued'
 GROUP BY org_id
 ORDER BY org_id
"""

# The measured intervals of the event log since a moment: sa_job_measured (0009_measured_attempts.sql),
# the one definition shared with jobqueue/sql/ops/queue_metrics.sql; inlined by the planner, so its window
# is served by sa_job_event_at_brin (at) and each predecessor by sa_job_event_job_idx (job_id, id).
_MEASURED = """
WITH measured AS (SELECT * FROM sa_job_measured(%(since)s))
"""

# One row for all orgs (`all_orgs` true) then one per org. Seconds are float8; means and p95 are
# NULL when nothing was measured.
JOB_EVENT_LATENCY_SINCE = (
    _MEASURED
    + """
SELECT GROUPING(org_id) = 1 AS all_orgs, org_id,
       count(*) FILTER (WHERE measure = 'wait') AS claims,
       avg(seconds) FILTER (WHERE measure = 'wait') AS wait_mean,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds)
           FILTER (WHERE measure = 'wait') AS wait_p95,
       count(*) FILTER (WHERE measure = 'run') AS attempts,
       avg(seconds) FILTER (WHERE measure = 'run') AS run_mean,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds)
           FILTER (WHERE measure = 'run') AS run_p95,
       count(*) FILTER (WHERE measure = 'run' AND errored) AS errors
  FROM measured
 GROUP BY GROUPING SETS ((), (org_id))
 ORDER BY all_orgs DESC, org_id
"""
)

# Errored attempts by error_kind, for all orgs (`all_orgs` true) and per org.
JOB_EVENT_ERRORS_SINCE = (
    _MEASURED
    + """
SELECT GROUPING(org_id) = 1 AS all_orgs, org_id, coalesce(error_kind, 'unknown') AS error_kind,
       count(*) AS errors
  FROM measured
 WHERE measure = 'run' AND errored
 GROUP BY GROUPING SETS ((error_kind), (org_id, error_kind))
 ORDER BY all_orgs DESC, org_id, errors DESC, error_kind
"""
)

# served by sa_ledger_created_brin and sa_ledger_archive_created_brin (created_at)
# (0013_llm_routes.sql). Archived calls count too: usage is billing, not the hot set.
LEDGER_USAGE_SINCE = """
SELECT org_id, model, route, count(*) AS calls, count(tokens_in) AS counted_calls,
       coalesce(sum(tokens_in), 0) AS tokens_in, coalesce(sum(tokens_out), 0) AS tokens_out,
       coalesce(sum(cost), 0)::float8 AS cost
  FROM (SELECT org_id, model, route, tokens_in, tokens_out, cost
          FROM sa_ledger
         WHERE created_at >= %(since)s AND (%(org_id)s::bigint IS NULL OR org_id = %(org_id)s)
        UNION ALL
        SELECT org_id, model, route, tokens_in, tokens_out, cost
          FROM sa_ledger_archive
         WHERE created_at >= %(since)s AND (%(org_id)s::bigint IS NULL OR org_id = %(org_id)s)
       ) calls
 GROUP BY org_id, model, route
 ORDER BY org_id, model, route
"""
