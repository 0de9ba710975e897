-- List jobs that look stuck: running without a recent heartbeat, and queued past their due time.
--
--   psql "$DATABASE_URL" [-v stale_after=300] [-v queued_after=300] [-v limit=100] \
--        -f jobqueue/sql/ops/list_stuck_jobs.sql
--
-- stale_after: seconds without a heartbeat before a running job counts as stuck (default 300,
--   SA_STALE_AFTER's default; the maintenance leader or `sa-core reclaim-stuck-jobs` requeues
--   such jobs, or fails them as 'stuck'). queued_after: seconds a claimable job may wait before
--   it is listed (default 300). limit: rows per list (default 100). Read-only.
-- Next steps: jobqueue/sql/ops/cancel_job.sql, jobqueue/sql/ops/retry_job.sql, `sa-core job-details ID`.

\set ON_ERROR_STOP on
\set QUIET on

\if :{?stale_after}
\else
    \set stale_after 300
\endif
\if :{?queued_after}
\else
    \set queued_after 300
\endif
\if :{?limit}
\else
    \set limit 100
\endif

\echo 'running jobs without a heartbeat for more than' :stale_after 'seconds (oldest heartbeat first)'
-- served by sa_job_heartbeat_idx (running_heartbeat_at) WHERE state = 'running' (0001_core_schema.sql)
SELECT id AS job_id, org_id, attempt || '/' || max_attempts AS attempt, worker_claim,
       date_trunc('second', now() - running_heartbeat_at) AS heartbeat_age,
       date_trunc('second', now() - started_at) AS running_for, prompt_id
  FROM sa_job
 WHERE state = 'running'
   AND running_heartbeat_at < now() - make_interval(secs => :stale_after)
 ORDER BY running_heartbeat_at
 LIMIT :limit;

\echo 'queued jobs due for more than' :queued_after 'seconds (longest waiting first)'
-- served by sa_job_claim_idx (priority, scheduled_for) WHERE state = 'queued' (0001_core_schema.sql)
SELECT id AS job_id, org_id, priority, attempt || '/' || max_attempts AS attempt, error_kind,
       date_trunc('second', now() - scheduled_for) AS waiting_for, created_at, prompt_id
  FROM sa_job
 WHERE state = 'queued'
   AND scheduled_for < now() - make_interval(secs => :queued_after)
 ORDER BY scheduled_for
 LIMIT :limit;
