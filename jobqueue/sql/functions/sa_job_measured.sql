-- One definition of the figures behind `sa-core queue-metrics` and sql/ops/queue_metrics.sql.
--
-- sa_job_measured(since) reads the event log from `since` on and returns one row per measured
-- interval: a job's wait (creation to its first claim) or an attempt's run (claim to the end of
-- that attempt), with whether the attempt errored:
-- - wait: the event before a job's first `queued -> running` is its creation event (from_state
--   NULL); a retry's backoff is not waiting for a worker;
-- - run: the event before any `running -> X` is its claim;
-- - errored: the attempt ended `failed`, or back in `queued` with attempt + 1 (a retry or a
--   reclaim). A release at shutdown (`running -> queued`, same attempt) is not an attempt's end:
--   the job was put back unharmed, so it is left out of run times and rates.
-- NOTE: a function, not a view, because the window is a parameter. LANGUAGE sql, STABLE and one
-- SELECT, so the planner inlines it into the caller's query: the window is still served by
-- sa_job_event_at_brin (at) (0002_archive.sql), and each event's predecessor by
-- sa_job_event_job_idx (job_id, id). Read-only, so it also works on a read-only replica.
CREATE OR REPLACE FUNCTION sa_job_measured(since timestamptz)
RETURNS TABLE (org_id bigint, measure text, seconds float8, errored boolean, error_kind text)
LANGUAGE sql STABLE AS $$
WITH recent AS (
    SELECT e.id, e.job_id, e.org_id, e.from_state, e.to_state, e.attempt, e.error_kind, e.at
      FROM sa_job_event e
     WHERE e.at >= since
       AND ((e.from_state = 'queued' AND e.to_state = 'running') OR e.from_state = 'running')
), paired AS (
    SELECT r.*, prev.at AS prev_at, prev.from_state AS prev_from_state,
           prev.attempt AS prev_attempt
      FROM recent r
     CROSS JOIN LATERAL (
           SELECT p.at, p.from_state, p.attempt
             FROM sa_job_event p
            WHERE p.job_id = r.job_id AND p.id < r.id
            ORDER BY p.id DESC
            LIMIT 1) prev
)
SELECT org_id,
       CASE WHEN from_state = 'queued' THEN 'wait' ELSE 'run' END,
       extract(epoch FROM at - prev_at)::float8,
       (to_state = 'failed' OR (to_state = 'queued' AND attempt > prev_attempt)),
       error_kind
  FROM paired
 WHERE (from_state = 'queued' AND prev_from_state IS NULL)
    OR (from_state = 'running' AND NOT (to_state = 'queued' AND attempt = prev_attempt))
$$;
