"""Statements of the operator console on sa_job: the jobs explorer, bulk counts and bulk changes."""

__all__ = [
    "CONSOLE_PLAN_SETTINGS",
    "JOB_CANCEL_MANY_IF_ACTIVE",
    "JOB_COUNT_FOR_CONSOLE_CAPPED",
    "JOB_EVENT_PER_MINUTE_SINCE",
    "JOB_LIST_FOR_CONSOLE_PAGE",
    "JOB_LIST_IDS_FOR_CONSOLE_PAGE",
    "JOB_RETRY_MANY_IF_FINISHED",
]

# The plan settings of the explorer's reads, run just before them in their transaction (as
# queries/job.py's JOB_PAGE_PLAN_SETTINGS): with sorts and bitmap scans priced out, the plan
# left walks sa_job_created_idx (created_at, id) (0002_archive.sql) backwards from the cursor and
# stops after the page. PERF: on statistics that take one org, state or kind for a handful of
# rows, the planner would otherwise read every row of that org (sa_job_org_user_state_idx) and
# sort them, which for a large org is the whole of its history for every page. The walk costs
# the rows it passes over: a filter that matches few of many recent jobs walks far, so the
# console sends a time range with it (`since`), and the statement timeout bounds it.
CONSOLE_PLAN_SETTINGS = """
SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('jit', 'off', true)
"""

# NOTE: the console's filter, shared by every statement here so the list, the count and the bulk
# batches reach the same jobs. NULL means "any". The prompt text is read only for a text
# search: its entity is probed by sa_entity_pkey (id), one row per job passed over. A job's
# model is its `options.model`, else the default model; `other_models` (a `*` route's filter)
# keeps the jobs whose model is none of them (an empty list keeps every job).
_FILTER = """
   AND (%(states)s::text[] IS NULL OR j.state = ANY (%(states)s::text[]))
   AND (%(org_id)s::bigint IS NULL OR j.org_id = %(org_id)s::bigint)
   AND (%(models)s::text[] IS NULL
        OR coalesce(j.execution_options->>'model', %(default_model)s::text)
           = ANY (%(models)s::text[]))
   AND (%(other_models)s::text[] IS NULL
        OR coalesce(j.execution_options->>'model', %(default_model)s::text)
           <> ALL (%(other_models)s::text[]))
   AND (%(error_kind)s::text IS NULL OR j.error_kind = %(error_kind)s::text)
   AND j.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
   AND j.created_at < coalesce(%(until)s::timestamptz, 'infinity')
   AND (%(text)s::text IS NULL
        OR j.id::text LIKE %(id_prefix)s::text
        OR j.error_message ILIKE %(text)s::text
        OR EXISTS (SELECT 1 FROM sa_entity e
                    WHERE e.id = j.prompt_id AND e.content ILIKE %(text)s::text))
"""

# NOTE: the keyset: strictly older than the cursor's (created_at, id); no cursor starts at the
# newest job. The row comparison is an index condition on sa_job_created_idx.
_BEFORE = """
 WHERE (j.created_at, j.id) < (coalesce(%(after_at)s::timestamptz, 'infinity'),
                               coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
"""

# served by sa_job_created_idx (created_at, id), walked backwards (CONSOLE_PLAN_SETTINGS); each
# row's prompt by sa_entity_pkey (id). A page of the explorer: `limit` + 1 rows are read so the
# caller knows whether there is a next page. Texts come cut to 200 characters (the job's detail
# has them whole).
JOB_LIST_FOR_CONSOLE_PAGE = (
    """
SELECT j.id, j.prompt_id, j.state, j.priority, j.attempt, j.max_attempts, j.worker_claim,
       j.error_kind, left(j.error_message, 200) AS error_message, j.org_id, j.created_by,
       j.execution_options->>'model' AS model, j.scheduled_for, j.created_at, j.updated_at,
       j.finished_at,
       (SELECT left(e.content, 200) FROM sa_entity e WHERE e.id = j.prompt_id) AS text
  FROM sa_job j"""
    + _BEFORE
    + _FILTER
    + """
 ORDER BY j.created_at DESC, j.id DESC
 LIMIT %(limit)s
"""
)

# served by sa_job_created_idx (created_at, id), as JOB_LIST_FOR_CONSOLE_PAGE: a bulk action's
# next batch, the ids (and keys, for the next cursor) of the jobs the filter reaches.
JOB_LIST_IDS_FOR_CONSOLE_PAGE = (
    """
SELECT j.id, j.created_at
  FROM sa_job j"""
    + _BEFORE
    + _FILTER
    + """
 ORDER BY j.created_at DESC, j.id DESC
 LIMIT %(limit)s
"""
)

# served by sa_job_created_idx (created_at, id), as above, read no further than `cap` matches:
# the count an operator sees before a bulk action (the action reaches at most that many).
JOB_COUNT_FOR_CONSOLE_CAPPED = (
    """
SELECT count(*) AS jobs
  FROM (SELECT 1
          FROM sa_job j"""
    + _BEFORE
    + _FILTER
    + """
         LIMIT %(cap)s) AS capped
"""
)

# NOTE: the guards are written `state IS NOT DISTINCT FROM`, and whether jobs wait on a job as a
# scalar subquery, not EXISTS (which the planner may run as one hashed read of every waiting
# job), so that sa_job_pkey and one probe per job are the only paths (queries/job.py's PERF note).

# served by sa_job_pkey (id). JOB_CANCEL_IF_ACTIVE for a batch of ids: each job still queued or
# running is cancelled (the UPDATE re-reads a row it waited for, so a job that finished since it
# was listed is left alone). A cancel keeps worker_claim: a job answered with one was running.
# Answers each cancelled job, and whether jobs wait on it (sa_job_waiting_idx), which the engine
# then settles.
JOB_CANCEL_MANY_IF_ACTIVE = """
WITH cancelled AS (
    UPDATE sa_job
       SET state = 'cancelled', waiting = false, finished_at = now(), error_message = %(reason)s
     WHERE id = ANY (%(ids)s::uuid[])
       AND (state IS NOT DISTINCT FROM 'queued' OR state IS NOT DISTINCT FROM 'running')
    RETURNING id, prompt_id, org_id, attempt, worker_claim
)
SELECT c.*,
       coalesce((SELECT true FROM sa_job d WHERE d.after_job_id = c.id AND d.waiting LIMIT 1),
                false) AS dependents
  FROM cancelled c
"""

# served by sa_job_pkey (id); `rearm` by sa_job_after_idx (after_job_id). queries/job.py's
# JOB_RETRY_IF_FINISHED for a batch of ids: each job still finished (and never superseded) is
# locked, superseded, and a new queued job for its prompt inserted with its settings. Answers
# each pair, and whether jobs were submitted after the old one (`rearm`: the engine re-arms the
# chain its end cancelled, in the same transaction).
JOB_RETRY_MANY_IF_FINISHED = """
WITH old AS (
    SELECT id, prompt_id, state, priority, max_attempts, execution_options, org_id, created_by
      FROM sa_job
     WHERE id = ANY (%(ids)s::uuid[])
       AND (state IS NOT DISTINCT FROM 'succeeded' OR state IS NOT DISTINCT FROM 'failed'
            OR state IS NOT DISTINCT FROM 'cancelled')
       FOR UPDATE
), superseded AS (
    UPDATE sa_job j
       SET state = 'superseded'
      FROM old
     WHERE j.id = old.id
    RETURNING j.id
), fresh AS (
    INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id,
                        created_by, supersedes)
    SELECT gen_random_uuid(), old.prompt_id, old.priority, old.max_attempts,
           old.execution_options, old.org_id, old.created_by, old.id
      FROM old JOIN superseded USING (id)
    RETURNING id, supersedes
)
SELECT old.id AS old_id, old.state AS old_state, old.prompt_id, old.org_id, fresh.id AS job_id,
       coalesce((SELECT true FROM sa_job d WHERE d.after_job_id = old.id LIMIT 1), false) AS rearm
  FROM fresh JOIN old ON old.id = fresh.supersedes
"""

# The console's charts: per minute since `since` (an hour), jobs enqueued (creation events),
# succeeded and failed, and the p50 and p95 of the waits (creation to first claim) and runs
# (claim to the attempt's end) measured in that minute. The window of the event log is served by
# sa_job_event_at_brin (at) (0002_archive.sql), each measured event's predecessor by
# sa_job_event_job_idx (job_id, id). NOTE: `paired` and its filter are sa_job_measured's
# (jobqueue/sql/functions/sa_job_measured.sql), which does not return when a measure was taken;
# the two must say the same. Also per minute: the transitions that carried an error, by its kind
# (`errors`), and the tokens the provider reported, by route (`tokens`, from the ledger's rows of
# the hour: sa_ledger_created_brin (created_at), 0013_llm_routes.sql).
JOB_EVENT_PER_MINUTE_SINCE = """
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', %(since)s::timestamptz), date_trunc('minute', now()),
                           interval '1 minute') AS minute
), window_events AS (
    SELECT e.id, e.job_id, e.from_state, e.to_state, e.attempt, e.error_kind, e.at
      FROM sa_job_event e
     WHERE e.at >= %(since)s::timestamptz
), counts AS (
    SELECT date_trunc('minute', at) AS minute,
           count(*) FILTER (WHERE from_state IS NULL) AS enqueued,
           count(*) FILTER (WHERE to_state = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE to_state = 'failed') AS failed
      FROM window_events
     GROUP BY 1
), paired AS (
    SELECT r.at, r.from_state, r.to_state, r.attempt, prev.at AS prev_at,
           prev.from_state AS prev_from_state, prev.attempt AS prev_attempt
      FROM window_events r
     CROSS JOIN LATERAL (
           SELECT p.at, p.from_state, p.attempt
             FROM sa_job_event p
            WHERE p.job_id = r.job_id AND p.id < r.id
            ORDER BY p.id DESC
            LIMIT 1) prev
     WHERE (r.from_state = 'queued' AND r.to_state = 'running') OR r.from_state = 'running'
), measured AS (
    SELECT date_trunc('minute', at) AS minute,
           CASE WHEN from_state = 'queued' THEN 'wait' ELSE 'run' END AS measure,
           extract(epoch FROM at - prev_at)::float8 AS seconds
      FROM paired
     WHERE (from_state = 'queued' AND prev_from_state IS NULL)
        OR (from_state = 'running' AND NOT (to_state = 'queued' AND attempt = prev_attempt))
), latency AS (
    SELECT minute,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE measure = 'wait')
               AS wait_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE measure = 'wait')
               AS wait_p95,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE measure = 'run')
               AS run_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE measure = 'run')
               AS run_p95
      FROM measured
     GROUP BY minute
), errors AS (
    SELECT minute, jsonb_object_agg(error_kind, n) AS errors
      FROM (SELECT date_trunc('minute', at) AS minute, error_kind, count(*) AS n
              FROM window_events
             WHERE error_kind IS NOT NULL
             GROUP BY 1, 2) k
     GROUP BY minute
), tokens AS (
    SELECT minute, jsonb_object_agg(route, n) AS tokens
      FROM (SELECT date_trunc('minute', l.created_at) AS minute,
                   coalesce(l.route, 'default') AS route,
                   sum(coalesce(l.tokens_in, 0) + coalesce(l.tokens_out, 0)) AS n
              FROM sa_ledger l
             WHERE l.created_at >= %(since)s::timestamptz
             GROUP BY 1, 2
            HAVING sum(coalesce(l.tokens_in, 0) + coalesce(l.tokens_out, 0)) > 0) t
     GROUP BY minute
)
SELECT m.minute, coalesce(c.enqueued, 0) AS enqueued, coalesce(c.succeeded, 0) AS succeeded,
       coalesce(c.failed, 0) AS failed, l.wait_p50, l.wait_p95, l.run_p50, l.run_p95,
       coalesce(er.errors, '{}'::jsonb) AS errors, coalesce(t.tokens, '{}'::jsonb) AS tokens
  FROM minutes m
  LEFT JOIN counts c USING (minute)
  LEFT JOIN latency l USING (minute)
  LEFT JOIN errors er USING (minute)
  LEFT JOIN tokens t USING (minute)
 ORDER BY m.minute
"""
