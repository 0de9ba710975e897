"""Statements on sa_job. Worker-side writes carry their guard in the WHERE clause and the name."""

__all__ = [
    "JOB_CANCEL_IF_ACTIVE",
    "JOB_COLUMNS",
    "JOB_COUNT_QUEUED_FOR_ORG_CAPPED",
    "JOB_GET",
    "JOB_GET_AS_ENQUEUED",
    "JOB_GET_LATEST_RESPONSE_ID_FOR_PROMPT",
    "JOB_GET_SUPERSEDER",
    "JOB_HEARTBEAT_MANY_IF_CLAIMED",
    "JOB_LIST_CLAIMED",
    "JOB_LIST_FOR_PROMPT_PAGE",
    "JOB_LIST_STILL_CLAIMED",
    "JOB_PAGE_PLAN_SETTINGS",
    "JOB_PLAN_SETTINGS",
    "JOB_REJECT_MANY_IF_CLAIMED",
    "JOB_RELEASE_MANY_IF_CLAIMED",
    "JOB_RETRY_IF_FINISHED",
    "JOB_RETRY_LATEST_FOR_PROMPT_IF_FINISHED",
    "JOB_SET_STATE_IF_RUNNING_MANY",
]

# PERF: a statement that finds its jobs by id writes its guard on the state as
# `state IS NOT DISTINCT FROM '...'` (the same test: state is never NULL). With `state = '...'`
# the planner may serve the statement from a partial index WHERE state = '...' (the queue, or
# every running job) walked whole: statistics taken while few jobs were queued or running price
# that walk below the probes by id, and dead entries make it longer than the rows it returns
# (a finalize batch read 16,663 entries of sa_job_heartbeat_idx under steady arrivals). The
# guard in this form cannot be proved from an index predicate, so sa_job_pkey is the only path.
# tests/test_plans.py checks every such statement (the guard form is used in
# queries/maintenance.py and queries/partial.py too).

JOB_COLUMNS = """
id, prompt_id, state, priority, attempt, max_attempts, execution_options, worker_claim,
claimed_at, started_at, running_heartbeat_at, finished_at, response_id, error_kind,
error_message, supersedes, org_id, created_by, scheduled_for, created_at, updated_at
"""

# NOTE: run in the transaction of each claim (and of the scrape-time queue read, JOB_QUEUE_DEPTH)
# just before the statement: set_config(..., true) is SET LOCAL, so it holds for that
# transaction only.
# PERF: a claim must cost the batch, not the backlog. With statistics taken while the queue was
# small (autoanalyze lags a growing backlog) the planner expected a handful of claimable rows and
# read EVERY queued row (bitmap scan, or a walk of sa_job_org_queued_idx) to sort them and keep
# the batch: 67 ms a claim at 100,000 queued against 0.2 ms. With sorts, bitmap scans and
# sequential scans priced out, the plan left is the walk of sa_job_claim_idx in claim order
# that stops after the batch, and the update probes sa_job_pkey, whatever the statistics. JIT
# is off because the price put on a sort that cannot be avoided (the final ORDER BY of the
# batch) would otherwise make the planner compile the statement: 280 ms. Measured equal in cost
# to a function carrying the same settings (`SET` attributes), which would also have moved the
# statement's text out of this module into a migration and kept the org-capped claim outside.
JOB_PLAN_SETTINGS = """
SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)
"""


# served by sa_job_pkey (id). River's JobSetStateIfRunningMany: one statement finishes a batch of
# jobs with mixed outcomes (`to_state` succeeded, queued for a retry, or failed), given as
# parallel arrays, one element per job; a batch of one is the single-job case. Each job is
# guarded on its own: it is written only if it is still running under the same worker_claim
# and attempt, so a job that was cancelled, reclaimed or re-claimed in between writes nothing
# while the rest of its batch goes through. Per outcome:
# - succeeded: response_id set; the response entity, its flows-to edge and the audit row are
#   written for these rows only (response_id's foreign key is deferred to commit because the
#   entity is written alongside);
# - queued: the next attempt, due `delay` seconds from now (computed by policy), unclaimed; or,
#   with `spend_attempt` false, the same attempt put back while its route is throttled (its
#   first such put-back stamped in throttled_at);
# - failed: finished for good.
# A streamed attempt's partial text (sa_job_delta) goes with its finalize, whatever the
# outcome: only a succeeded attempt's text becomes a response. Every job written gets its ledger
# row, unless no provider call was made (latency_ms null: a job put back because its route was
# already paused); it names the route called and the call's cost, which `spend` adds to the
# org's day in sa_org_spend (by sa_org_spend_pkey; 0031_route_costs.sql) for the budgets. A job
# whose route failed over keeps the fallback in `route` for its next attempts. `dependents`
# says whether jobs wait on it (`after`; sa_job_waiting_idx), which the engine then settles
# (jobqueue/engine/chains.py). The statement fails as a whole if any insert does
# (jobqueue/engine/isolation.py then splits the batch). The answer is (id, attempt,
# to_state, dependents) per job written, with the attempt it was claimed at.
# PERF: one statement, so one round trip and one commit for a whole mixed batch. It is prepared,
# so its generic plan must probe at any table size: the jobs are named by `id = ANY(...)` besides
# the join to the batch, and the prompt and the partial text by key, or a plan cached while the
# tables were small would read a whole index for every batch once they have grown. The arrays go
# in binary (`%(..)b`): psycopg builds a text array element by element in Python, quoting each,
# 58 us of worker CPU per job of a 64-job batch against 22 us in binary (docs/performance.md).
JOB_SET_STATE_IF_RUNNING_MANY = """
WITH done AS (
    SELECT *
      FROM unnest(%(job_id)b::uuid[], %(claim)b::text[], %(attempt)b::int[],
                  %(to_state)b::text[], %(model)b::text[], %(tokens_in)b::int[],
                  %(tokens_out)b::int[], %(latency_ms)b::int[], %(http_status)b::int[],
                  %(response_id)b::uuid[], %(content)b::text[], %(error_kind)b::text[],
                  %(error_message)b::text[], %(delay)b::float8[], %(spend_attempt)b::bool[],
                  %(route)b::text[], %(cost)b::numeric[], %(next_route)b::text[])
        AS d(job_id, claim, attempt, to_state, model, tokens_in, tokens_out, latency_ms,
             http_status, response_id, content, error_kind, error_message, delay, spend_attempt,
             route, cost, next_route)
), job AS (
    UPDATE sa_job j
       SET state = done.to_state,
           attempt = CASE WHEN done.to_state = 'queued' AND done.spend_attempt THEN j.attempt + 1
                          ELSE j.attempt END,
           throttled_at = CASE WHEN done.to_state = 'queued' AND NOT done.spend_attempt
                               THEN coalesce(j.throttled_at, now()) ELSE j.throttled_at END,
           worker_claim = CASE WHEN done.to_state = 'queued' THEN NULL ELSE j.worker_claim END,
           running_heartbeat_at = CASE WHEN done.to_state = 'queued' THEN NULL
                                       ELSE j.running_heartbeat_at END,
           scheduled_for = CASE WHEN done.to_state = 'queued'
                                THEN now() + make_interval(secs => done.delay)
                                ELSE j.scheduled_for END,
           finished_at = CASE WHEN done.to_state = 'queued' THEN NULL ELSE now() END,
           route = coalesce(done.next_route, j.route),
           response_id = done.response_id,
           error_kind = done.error_kind,
           error_message = done.error_message
      FROM done
     WHERE j.id = ANY(%(job_id)b::uuid[])
       AND j.id = done.job_id
       AND j.state IS NOT DISTINCT FROM 'running'
       AND j.worker_claim = done.claim
       AND j.attempt = done.attempt
    RETURNING j.id, done.attempt, done.to_state, j.prompt_id, j.org_id, j.created_by
), response AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, parent_id, correlation_id,
                           causation_id, content, source_refs, truth_class, state_class)
    SELECT done.response_id, 'response', job.org_id, job.created_by, job.prompt_id,
           (SELECT prompt.correlation_id FROM sa_entity prompt WHERE prompt.id = job.prompt_id),
           job.prompt_id, done.content, '[]'::jsonb, 'generated', 'settled'
      FROM job
      JOIN done ON done.job_id = job.id AND done.attempt = job.attempt
     WHERE job.to_state = 'succeeded'
    RETURNING id, parent_id, org_id, created_by
), edge AS (
    INSERT INTO sa_edge (org_id, kind, from_id, to_id)
    SELECT org_id, 'flows-to', parent_id, id FROM response
), audit AS (
    INSERT INTO sa_audit (org_id, actor_id, action, entity_id, job_id, detail)
    SELECT job.org_id, job.created_by, 'response.created', done.response_id, job.id,
           jsonb_build_object('prompt_id', job.prompt_id, 'attempt', done.attempt)
      FROM job JOIN done ON done.job_id = job.id AND done.attempt = job.attempt
     WHERE job.to_state = 'succeeded'
), ledger AS (
    INSERT INTO sa_ledger (org_id, job_id, attempt, model, tokens_in, tokens_out, latency_ms,
                           http_status, outcome, route, cost, error_message)
    SELECT job.org_id, job.id, done.attempt, done.model, done.tokens_in, done.tokens_out,
           done.latency_ms, done.http_status,
           CASE WHEN job.to_state = 'succeeded' THEN 'succeeded' ELSE done.error_kind END,
           done.route, done.cost,
           CASE WHEN job.to_state = 'succeeded' THEN NULL ELSE done.error_message END
      FROM job JOIN done ON done.job_id = job.id AND done.attempt = job.attempt
     WHERE done.latency_ms IS NOT NULL
), spend AS (
    INSERT INTO sa_org_spend AS s (org_id, day, shard, cost)
    SELECT job.org_id, (now() AT TIME ZONE 'UTC')::date, mod(pg_backend_pid(), 8), sum(done.cost)
      FROM job JOIN done ON done.job_id = job.id AND done.attempt = job.attempt
     WHERE done.cost > 0
     GROUP BY job.org_id
    ON CONFLICT (org_id, day, shard) DO UPDATE SET cost = s.cost + excluded.cost
), partial AS (
    DELETE FROM sa_job_delta p USING job
     WHERE p.job_id = ANY(%(job_id)b::uuid[]) AND p.job_id = job.id
)
SELECT id, attempt, to_state,
       EXISTS (SELECT 1 FROM sa_job d WHERE d.after_job_id = job.id AND d.waiting) AS dependents
  FROM job
"""

# served by sa_job_pkey (id). Fails claimed jobs the worker cannot run at all (claim.py's
# decode refused their execution_options): no provider call was made, so no ledger row.
JOB_REJECT_MANY_IF_CLAIMED = """
UPDATE sa_job j
   SET state = 'failed', finished_at = now(),
       error_kind = d.error_kind, error_message = d.error_message
  FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[], %(error_kinds)s::text[],
              %(error_messages)s::text[]) AS d(job_id, attempt, error_kind, error_message)
 WHERE j.id = d.job_id
   AND j.state IS NOT DISTINCT FROM 'running'
   AND j.worker_claim = %(claim)s
   AND j.attempt = d.attempt
RETURNING j.id
"""

# served by sa_job_pkey (id). Only the jobs the worker is still running are refreshed, so
# a job whose thread died loses its heartbeat and is reclaimed. Rows not returned are no
# longer ours (cancelled or reclaimed): the worker abandons them. The ids go in binary: a worker
# with 10,000 calls in flight names them all each round.
JOB_HEARTBEAT_MANY_IF_CLAIMED = """
UPDATE sa_job
   SET running_heartbeat_at = now()
 WHERE id = ANY(%(job_ids)b) AND state IS NOT DISTINCT FROM 'running'
   AND worker_claim = %(claim)s
RETURNING id, attempt
"""

# served by sa_job_pkey (id). The departure watch's check of the few jobs the event log says
# left `running`: an event may be an earlier attempt's, so the row decides. Read only, unlike
# the heartbeat: nothing to refresh.
JOB_LIST_STILL_CLAIMED = """
SELECT id, attempt FROM sa_job
 WHERE id = ANY(%(job_ids)s::uuid[]) AND state IS NOT DISTINCT FROM 'running'
   AND worker_claim IS NOT DISTINCT FROM %(claim)s
"""

# served by sa_job_worker_claim_idx (worker_claim) WHERE state = 'running': the jobs a worker
# still holds, read at shutdown before JOB_RELEASE_MANY_IF_CLAIMED puts them back.
JOB_LIST_CLAIMED = """
SELECT id, org_id FROM sa_job WHERE state = 'running' AND worker_claim = %(claim)s
"""

# served by sa_job_pkey (id). Used at shutdown: a job the worker could not finish in its grace
# period goes back to the queue without spending an attempt (not its fault). By id, so a job
# that cannot be written is set apart from the others (jobqueue/engine/isolation.py).
JOB_RELEASE_MANY_IF_CLAIMED = """
UPDATE sa_job
   SET state = 'queued', worker_claim = NULL, running_heartbeat_at = NULL,
       scheduled_for = now()
 WHERE id = ANY(%(job_ids)s::uuid[]) AND state IS NOT DISTINCT FROM 'running'
   AND worker_claim = %(claim)s
RETURNING id, prompt_id, org_id, attempt
"""

# NOTE: each attempt that called the provider (its outcome, model, route, status, latency, tokens
# and cost), oldest first, and a running streamed
# attempt's text so far; a GET shows them with the job. Served by sa_ledger_job_idx (job_id) and
# sa_job_delta_job_idx (job_id, attempt, offset), one range each per job: the running attempt's
# rows, each starting where the previous ended, in order.
_READ_COLUMNS = """
, coalesce((SELECT jsonb_agg(jsonb_build_object('attempt', l.attempt, 'tokens_in', l.tokens_in,
                                                'tokens_out', l.tokens_out, 'route', l.route,
                                                'cost', l.cost, 'outcome', l.outcome,
                                                'model', l.model, 'http_status', l.http_status,
                                                'latency_ms', l.latency_ms, 'at', l.created_at)
                             ORDER BY l.id)
              FROM sa_ledger l
             WHERE l.job_id = sa_job.id), '[]'::jsonb) AS usage,
(SELECT string_agg(p.text, '' ORDER BY p."offset") FROM sa_job_delta p
  WHERE p.job_id = sa_job.id AND p.attempt = sa_job.attempt AND sa_job.state = 'running')
    AS partial_text
"""

# served by sa_job_pkey (id). A job as PROMPT_INSERT_WITH_JOB answers it, gate passed: what an
# enqueue retried after a lost answer finds its first try wrote.
JOB_GET_AS_ENQUEUED = """
SELECT true AS parent_ok, true AS under_cap, NULL::text AS after_state, true AS depth_ok,
       id, prompt_id, state, created_at, scheduled_for, waiting
  FROM sa_job
 WHERE id = %(job_id)s
"""

# served by sa_job_pkey (id)
JOB_GET = (
    "SELECT "
    + JOB_COLUMNS
    + _READ_COLUMNS
    + """, after_job_id, waiting
  FROM sa_job
 WHERE id = %(job_id)s AND org_id = %(org_id)s
"""
)

# The plan settings of the web's reads of a prompt's jobs in (created_at DESC, id) order (its
# jobs page, its newest response, /mission/recent's latest job per prompt), run just before
# them in their transaction: sorts priced out leave sa_job_prompt_idx, which holds that order
# (0020_prompt_jobs_page.sql), as the only plan. PERF: on statistics that took one prompt for
# most of the table, the planner walked sa_job_created_idx (every job newer than the page)
# with an incremental sort instead. JIT is off for the reason JOB_PLAN_SETTINGS gives.
JOB_PAGE_PLAN_SETTINGS = """
SELECT set_config('enable_sort', 'off', true), set_config('enable_incremental_sort', 'off', true),
       set_config('jit', 'off', true)
"""

# served by sa_job_prompt_idx (prompt_id, created_at DESC, id), walked from the keyset
# (`before_at`, `before_id`: the last job of the previous page; NULL for the first) and
# stopped by the LIMIT: a page costs its jobs, never the prompt's whole history. Bounded in
# bytes as well as count: the page stops once the options and error messages before a job pass
# `max_bytes` (the first always comes); `read` counts every job read, so the caller knows
# whether jobs remain (`limit` is one more than the page, for the same reason).
JOB_LIST_FOR_PROMPT_PAGE = (
    """
WITH page AS MATERIALIZED (
SELECT """
    + JOB_COLUMNS
    + _READ_COLUMNS
    + """,
       sum(octet_length(execution_options::text) + coalesce(octet_length(error_message), 0))
           OVER (ORDER BY created_at DESC, id)
       - octet_length(execution_options::text) - coalesce(octet_length(error_message), 0)
           AS bytes_before
  FROM sa_job
 WHERE prompt_id = %(prompt_id)s AND org_id = %(org_id)s
   AND created_at <= coalesce(%(before_at)s::timestamptz, 'infinity')
   AND (created_at < coalesce(%(before_at)s::timestamptz, 'infinity') OR id > %(before_id)s::uuid)
 ORDER BY created_at DESC, id
 LIMIT %(limit)s
)
SELECT """
    + JOB_COLUMNS
    + """, usage, partial_text, (SELECT count(*) FROM page) AS read
  FROM page
 WHERE bytes_before < %(max_bytes)s
 ORDER BY created_at DESC, id
"""
)

# served by sa_job_prompt_idx (prompt_id, created_at DESC, id), walked to the newest job that
# has a response: GET /prompts/{id} shows that response whatever page of jobs it answers.
JOB_GET_LATEST_RESPONSE_ID_FOR_PROMPT = """
SELECT response_id
  FROM sa_job
 WHERE prompt_id = %(prompt_id)s AND org_id = %(org_id)s AND response_id IS NOT NULL
 ORDER BY created_at DESC, id
 LIMIT 1
"""

# served by sa_job_pkey (id). Locks the row first so a concurrent claim either lands before
# (and we cancel the running job) or after (and finds it cancelled). Answers the columns of the
# row it locked, with `changed`, so the caller picks 200 or 409 without a second query and an
# unchanged job shows its latest state, and whether jobs wait on it (sa_job_waiting_idx), which the
# engine then settles. `org_id` NULL is the operator's cancel (any org); API callers always pass
# theirs.
JOB_CANCEL_IF_ACTIVE = (
    "WITH target AS (SELECT "
    + JOB_COLUMNS
    + """
      FROM sa_job
     WHERE id = %(job_id)s AND (%(org_id)s::bigint IS NULL OR org_id = %(org_id)s)
       FOR UPDATE
), cancelled AS (
    UPDATE sa_job j
       SET state = 'cancelled', waiting = false, finished_at = now(), error_message = %(reason)s
      FROM target
     WHERE j.id = target.id AND target.state IN ('queued', 'running')
    RETURNING j.*
)
SELECT true AS changed, """
    + JOB_COLUMNS
    + """, EXISTS (SELECT 1 FROM sa_job d WHERE d.after_job_id = cancelled.id AND d.waiting)
           AS dependents
  FROM cancelled
UNION ALL
SELECT false AS changed, """
    + JOB_COLUMNS
    + """, false AS dependents FROM target
 WHERE NOT EXISTS (SELECT 1 FROM cancelled)
"""
)

# served by sa_job_org_queued_idx (org_id) WHERE state = 'queued' (0004_idempotency.sql), read no
# further than `cap` entries: the org's queued jobs (waiting ones included) against its cap.
JOB_COUNT_QUEUED_FOR_ORG_CAPPED = """
SELECT count(*) AS queued
  FROM (SELECT 1 FROM sa_job WHERE org_id = %(org_id)s AND state = 'queued' LIMIT %(cap)s) AS capped
"""

# NOTE: the shared body of the user retry. `old` is the locked job being retried (one row at
# most). Only a finished job that was never superseded moves to 'superseded', and the new
# queued job is inserted only alongside it, so both happen or neither. The answer always has
# the old job's state (or no row when it does not exist), so the caller picks 202, 404 or 409
# without a second query. Concurrent retries of one job queue up on the row lock; the loser
# finds it superseded. sa_job_supersedes_unique stops any other writer racing past that.
_RETRY_OLD_COLUMNS = "id, prompt_id, state, priority, max_attempts, execution_options, org_id, created_by"
_RETRY_TAIL = """
), superseded AS (
    UPDATE sa_job j
       SET state = 'superseded'
      FROM old
     WHERE j.id = old.id AND old.state IN ('succeeded', 'failed', 'cancelled')
    RETURNING j.id
), fresh AS (
    INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id,
                        created_by, supersedes)
    SELECT %(new_job_id)s, old.prompt_id, old.priority, old.max_attempts,
           old.execution_options, old.org_id, old.created_by, old.id
      FROM old JOIN superseded USING (id)
    RETURNING id, state, supersedes, created_at
)
SELECT old.id AS old_id, old.prompt_id, old.org_id, old.state AS old_state,
       fresh.id AS job_id, fresh.state, fresh.supersedes, fresh.created_at,
       (SELECT s.id FROM sa_job s WHERE s.supersedes = old.id) AS superseded_by
  FROM old LEFT JOIN fresh ON true
"""

# served by sa_job_pkey (id); superseded_by by sa_job_supersedes_unique (supersedes).
# `org_id` NULL is the operator's retry (any org).
JOB_RETRY_IF_FINISHED = (
    "WITH old AS (SELECT "
    + _RETRY_OLD_COLUMNS
    + """
      FROM sa_job
     WHERE id = %(job_id)s AND (%(org_id)s::bigint IS NULL OR org_id = %(org_id)s)
       FOR UPDATE
"""
    + _RETRY_TAIL
)

# served by sa_job_prompt_idx (prompt_id, created_at DESC, id). Retries the prompt's latest job, in
# JOB_LIST_FOR_PROMPT_PAGE's order (newest first).
JOB_RETRY_LATEST_FOR_PROMPT_IF_FINISHED = (
    "WITH old AS (SELECT "
    + _RETRY_OLD_COLUMNS
    + """
      FROM sa_job
     WHERE prompt_id = %(prompt_id)s AND org_id = %(org_id)s
     ORDER BY created_at DESC, id
     LIMIT 1
       FOR UPDATE
"""
    + _RETRY_TAIL
)

# served by sa_job_supersedes_unique (supersedes)
JOB_GET_SUPERSEDER = "SELECT id FROM sa_job WHERE supersedes = %(job_id)s"
