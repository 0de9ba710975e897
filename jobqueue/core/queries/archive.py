"""Statements of `archive-old-jobs`: pick finished prompt families, move their rows to the archive tables."""

__all__ = [
    "JOB_ARCHIVE_COUNT_RELATED",
    "JOB_ARCHIVE_MANY",
    "JOB_ARCHIVE_PICK_MANY",
    "JOB_EVENT_ARCHIVE_MANY",
    "LEDGER_ARCHIVE_MANY",
]

# served by sa_job_created_idx (created_at, id) (0002_archive.sql) for the keyset walk, then
# sa_job_prompt_idx (prompt_id, created_at DESC, id) for each scanned job's prompt family and
# sa_job_supersedes_unique (supersedes) for the cross-prompt guard (0001_core_schema.sql).
# `limit` bounds the jobs scanned, not the jobs moved; the caller pages on (created_at, id)
# until a short page, so skipped rows are passed once and never rescanned. `job_prompt_ids` gives
# each job's prompt, so the caller can move the families apart when one cannot be moved.
# NOTE: a job moves only together with every job of its prompt, and only when all of them are
# finished (terminal) and unchanged since `before`. So a job superseded by a newer, remaining
# one stays (sa_job.supersedes never dangles), queued and running jobs are never touched, and
# GET /prompts/{id} shows either the whole history or none of it.
# NOTE: FOR UPDATE SKIP LOCKED holds the family's rows until the batch commits, so a concurrent
# retry (which locks and supersedes one of them) either waits for the move and then finds no job,
# or got there first: then the row is locked (skipped) or changed (updated_at is new), and the
# family stays. Skipped rows make `count(*) < family_size`, which keeps the whole family back.
# Every new job of an existing prompt goes through such an update of one of its jobs, so a
# family cannot grow unseen. A family referenced from another prompt's job (never written by
# this service) stays too, so the move cannot fail on the foreign key.
JOB_ARCHIVE_PICK_MANY = """
WITH scanned AS (
    SELECT id, prompt_id, created_at
      FROM sa_job
     WHERE created_at < %(before)s
       AND (created_at, id) > (%(after_created_at)s, %(after_id)s)
     ORDER BY created_at, id
     LIMIT %(limit)s
), family AS (
    SELECT j.id, j.prompt_id, j.state, j.updated_at
      FROM sa_job j
     WHERE j.prompt_id IN (SELECT prompt_id FROM scanned)
       FOR UPDATE SKIP LOCKED
), family_size AS (
    SELECT prompt_id, count(*) AS jobs
      FROM sa_job
     WHERE prompt_id IN (SELECT prompt_id FROM scanned)
     GROUP BY prompt_id
), referenced_elsewhere AS (
    SELECT f.prompt_id
      FROM family f
      JOIN sa_job r ON r.supersedes = f.id
     WHERE r.prompt_id <> f.prompt_id
), movable AS (
    SELECT f.prompt_id
      FROM family f
      JOIN family_size s USING (prompt_id)
     WHERE f.prompt_id NOT IN (SELECT prompt_id FROM referenced_elsewhere)
     GROUP BY f.prompt_id, s.jobs
    HAVING count(*) = s.jobs
       AND bool_and(f.state IN ('succeeded', 'failed', 'cancelled', 'superseded')
                    AND f.updated_at < %(before)s)
), last_scanned AS (
    SELECT created_at, id FROM scanned ORDER BY created_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM scanned) AS scanned,
       (SELECT created_at FROM last_scanned) AS last_created_at,
       (SELECT id FROM last_scanned) AS last_id,
       (SELECT count(*) FROM movable) AS prompts,
       coalesce((SELECT array_agg(f.id ORDER BY f.id)
                   FROM family f JOIN movable USING (prompt_id)), '{}'::uuid[]) AS job_ids,
       coalesce((SELECT array_agg(f.prompt_id ORDER BY f.id)
                   FROM family f JOIN movable USING (prompt_id)), '{}'::uuid[]) AS job_prompt_ids
"""

# served by sa_ledger_job_idx (job_id) (0001_core_schema.sql). Runs before JOB_ARCHIVE_MANY in the
# same transaction: sa_ledger.job_id's ON DELETE CASCADE would otherwise drop these rows.
LEDGER_ARCHIVE_MANY = """
WITH moved AS (
    DELETE FROM sa_ledger
     WHERE job_id = ANY(%(job_ids)s)
    RETURNING id, org_id, job_id, attempt, model, tokens_in, tokens_out, latency_ms,
              http_status, outcome, created_at, route, cost, error_message
)
INSERT INTO sa_ledger_archive (id, org_id, job_id, attempt, model, tokens_in, tokens_out,
                               latency_ms, http_status, outcome, created_at, route, cost,
                               error_message)
SELECT id, org_id, job_id, attempt, model, tokens_in, tokens_out, latency_ms, http_status,
       outcome, created_at, route, cost, error_message
  FROM moved
"""

# served by sa_job_event_job_idx (job_id, id) (0001_core_schema.sql)
JOB_EVENT_ARCHIVE_MANY = """
WITH moved AS (
    DELETE FROM sa_job_event
     WHERE job_id = ANY(%(job_ids)s)
    RETURNING id, job_id, prompt_id, org_id, created_by, from_state, to_state, attempt,
              worker_claim, error_kind, response_id, at
)
INSERT INTO sa_job_event_archive (id, job_id, prompt_id, org_id, created_by, from_state, to_state,
                                  attempt, worker_claim, error_kind, response_id, at)
SELECT id, job_id, prompt_id, org_id, created_by, from_state, to_state, attempt, worker_claim,
       error_kind, response_id, at
  FROM moved
"""

# served by sa_job_pkey (id). One statement for the whole batch: a family's supersedes chain
# points inside the batch, and the self-referencing foreign key is checked at the end of the
# statement, once every referencing row is gone too.
JOB_ARCHIVE_MANY = """
WITH moved AS (
    DELETE FROM sa_job
     WHERE id = ANY(%(job_ids)s)
    RETURNING id, prompt_id, state, priority, attempt, max_attempts, execution_options,
              worker_claim, claimed_at, started_at, running_heartbeat_at, finished_at,
              response_id, error_kind, error_message, supersedes, org_id, created_by,
              scheduled_for, created_at, updated_at
)
INSERT INTO sa_job_archive (id, prompt_id, state, priority, attempt, max_attempts,
                            execution_options, worker_claim, claimed_at, started_at,
                            running_heartbeat_at, finished_at, response_id, error_kind,
                            error_message, supersedes, org_id, created_by, scheduled_for,
                            created_at, updated_at)
SELECT id, prompt_id, state, priority, attempt, max_attempts, execution_options, worker_claim,
       claimed_at, started_at, running_heartbeat_at, finished_at, response_id, error_kind,
       error_message, supersedes, org_id, created_by, scheduled_for, created_at, updated_at
  FROM moved
"""

# served by sa_job_event_job_idx (job_id, id) and sa_ledger_job_idx (job_id). The dry run's
# figures: what the two moves above would carry along.
JOB_ARCHIVE_COUNT_RELATED = """
SELECT (SELECT count(*) FROM sa_job_event WHERE job_id = ANY(%(job_ids)s)) AS events,
       (SELECT count(*) FROM sa_ledger WHERE job_id = ANY(%(job_ids)s)) AS ledger
"""
