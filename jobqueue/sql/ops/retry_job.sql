-- Force a retry of one finished job: queue a new job for its prompt that supersedes it.
--
--   psql "$DATABASE_URL" -v job_id=<uuid> -f jobqueue/sql/ops/retry_job.sql
--
-- Same effect as `sa-core retry-job ID` (jobqueue/engine/control.py, JOB_RETRY_ANY_ORG_IF_FINISHED): in
-- ONE transaction the old job goes succeeded|failed|cancelled -> superseded and a new queued
-- job is inserted with supersedes = the old id, the same prompt, org, user, priority,
-- max_attempts and execution options, and attempt 1. Workers wake on the NOTIFY at the end.
--
-- The transition trigger sa_job_guard (0001_core_schema.sql) refuses a queued or running job
-- (cancel it first: jobqueue/sql/ops/cancel_job.sql) and an already superseded one, with its message;
-- sa_job_supersedes_unique refuses a second retry of the same job racing this one. Any refusal
-- rolls the whole transaction back: both changes happen, or neither.
-- Exit status: 0 retried; 3 refused, unknown id or bad arguments.

\set ON_ERROR_STOP on
\set QUIET on

\if :{?job_id}
\else
    \echo 'usage: psql "$DATABASE_URL" -v job_id=<uuid> -f jobqueue/sql/ops/retry_job.sql'
    -- NOTE: psql has no "exit with status" command; a failing statement ends the script with 3.
    DO $$ BEGIN RAISE EXCEPTION 'missing variable: -v job_id=<uuid>'; END $$;
\endif

BEGIN;

-- served by sa_job_pkey (id). First, so the row is locked and the trigger has judged the
-- transition before the new job exists.
UPDATE sa_job
   SET state = 'superseded'
 WHERE id = :'job_id';

SELECT :ROW_COUNT = 1 AS found, :'job_id' AS job_id \gset
\if :found
\else
    ROLLBACK;
    SELECT set_config('sa_ops.job_id', :'job_id', false) AS job_id \gset
    DO $$ BEGIN RAISE EXCEPTION 'job % not found', current_setting('sa_ops.job_id'); END $$;
\endif

-- served by sa_job_pkey (id); the insert itself by sa_job_supersedes_unique (supersedes).
INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id,
                    created_by, supersedes)
SELECT gen_random_uuid(), prompt_id, priority, max_attempts, execution_options, org_id,
       created_by, id
  FROM sa_job
 WHERE id = :'job_id'
RETURNING id AS new_job_id, prompt_id, org_id, state, supersedes;

-- Wake the workers and the SSE streams, at commit (the trigger no longer notifies:
-- 0006_notify_out_of_band.sql).
NOTIFY sa_job_queued;
NOTIFY sa_job_event;

COMMIT;
\echo 'job' :job_id 'superseded by the new queued job above'
