-- Queue figures, overall and per org: jobs by state, the claimable backlog and its oldest job,
-- wait and run times (mean, p95) and error rates by error_kind over a window.
--
--   psql "$DATABASE_URL" [-v window='24 hours'] -f jobqueue/sql/ops/queue_metrics.sql
--
-- window: a Postgres interval ('90 minutes', '7 days'; default '24 hours'). Read-only.
-- The same figures as `sa-core queue-metrics --since <age>` (jobqueue/core/queries/inspection.py;
-- a test keeps the two in step):
-- - wait: creation to first claim; run: claim to the end of that attempt;
-- - an attempt errored when it ended 'failed', or back in 'queued' with attempt + 1 (a retry or
--   a reclaim); a release at shutdown (same attempt) is not an attempt's end and is left out;
-- - error rate: errored attempts / ended attempts in the window.
-- Rows with org_id 'all' are the totals.

\set ON_ERROR_STOP on
\set QUIET on

\if :{?window}
\else
    \set window '24 hours'
\endif

\echo 'jobs by state (hot tables; `sa-core archive-old-jobs` moves old finished ones out)'
-- served by sa_job_org_user_state_idx (org_id, created_by, state) when index-only, else a scan of
-- the hot table: an operator's read, never on a request path.
SELECT CASE WHEN GROUPING(org_id) = 1 THEN 'all' ELSE org_id::text END AS org_id,
       count(*) FILTER (WHERE state = 'queued') AS queued,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE state = 'superseded') AS superseded
  FROM sa_job
 GROUP BY GROUPING SETS ((), (org_id))
 ORDER BY GROUPING(org_id) DESC, sa_job.org_id;

\echo 'claimable backlog (queued, due, not waiting for a predecessor) and its oldest job, by due time'
-- served by sa_job_claim_idx (priority, scheduled_for) WHERE state = 'queued' AND NOT waiting
SELECT CASE WHEN GROUPING(org_id) = 1 THEN 'all' ELSE org_id::text END AS org_id,
       count(*) FILTER (WHERE scheduled_for <= now()) AS due,
       round(coalesce(extract(epoch FROM now() - min(scheduled_for)
                                            FILTER (WHERE scheduled_for <= now())), 0), 3)
           AS oldest_queued_seconds
  FROM sa_job
 WHERE state = 'queued' AND NOT waiting
 GROUP BY GROUPING SETS ((), (org_id))
 ORDER BY GROUPING(org_id) DESC, sa_job.org_id;

\echo 'wait (created -> first claim) and run (claim -> end of attempt), seconds, over the last' :'window'
-- sa_job_measured (0009_measured_attempts.sql) is the one definition of these figures, shared with
-- the CLI; the planner inlines it, so sa_job_event_at_brin (at) serves the window.
WITH measured AS (SELECT * FROM sa_job_measured(now() - :'window'::interval))
SELECT CASE WHEN GROUPING(org_id) = 1 THEN 'all' ELSE org_id::text END AS org_id,
       count(*) FILTER (WHERE measure = 'wait') AS claims,
       round(avg(seconds) FILTER (WHERE measure = 'wait')::numeric, 3) AS wait_mean,
       round((percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds)
                  FILTER (WHERE measure = 'wait'))::numeric, 3) AS wait_p95,
       count(*) FILTER (WHERE measure = 'run') AS attempts,
       round(avg(seconds) FILTER (WHERE measure = 'run')::numeric, 3) AS run_mean,
       round((percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds)
                  FILTER (WHERE measure = 'run'))::numeric, 3) AS run_p95,
       count(*) FILTER (WHERE measure = 'run' AND errored) AS errors,
       round(100.0 * count(*) FILTER (WHERE measure = 'run' AND errored)
             / nullif(count(*) FILTER (WHERE measure = 'run'), 0), 1) AS error_rate_pct
  FROM measured
 GROUP BY GROUPING SETS ((), (org_id))
 ORDER BY GROUPING(org_id) DESC, measured.org_id;

\echo 'errored attempts by error_kind over the last' :'window' '(rate: of the attempts that ended)'
WITH measured AS (
    SELECT * FROM sa_job_measured(now() - :'window'::interval)
), attempts AS (
    SELECT org_id, count(*) AS n FROM measured WHERE measure = 'run' GROUP BY org_id
), errs AS (
    SELECT org_id, coalesce(error_kind, 'unknown') AS error_kind, count(*) AS errors
      FROM measured
     WHERE measure = 'run' AND errored
     GROUP BY org_id, coalesce(error_kind, 'unknown')
)
SELECT org_id, error_kind, errors, rate_pct
  FROM (SELECT NULL::bigint AS sort_org, 'all' AS org_id, error_kind, sum(errors) AS errors,
               round(100.0 * sum(errors) / (SELECT sum(n) FROM attempts), 1) AS rate_pct
          FROM errs
         GROUP BY error_kind
        UNION ALL
        SELECT e.org_id, e.org_id::text, e.error_kind, e.errors, round(100.0 * e.errors / a.n, 1)
          FROM errs e JOIN attempts a USING (org_id)) rows
 ORDER BY sort_org NULLS FIRST, errors DESC, error_kind;
