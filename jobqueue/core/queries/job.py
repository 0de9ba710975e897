"""Statements on sa_job. Worker-side writes carry their guard in the WHERE clause and the name."""

__all__ = [
    "JOB_CANCEL_IF_ACTIVE",
    "JOB_CLAIM_LOCK_ORG_CAPPED",
    "JOB_CLAIM_MANY",
    "JOB_CLAIM_MANY_ORG_CAPPED",
    "JOB_COLUMNS",
    "JOB_GET",
    "JOB_GET_LATEST_RESPONSE_ID_FOR_PROMPT",
    "JOB_GET_SUPERSEDER",
    "JOB_HEARTBEAT_MANY_IF_CLAIMED",
    "JOB_LIST_FOR_PROMPT_PAGE",
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

# NOTE: shared by both claim statements: what a claim writes and hands back. Each job comes
# with its context (the prompt and up to `depth` ancestors, oldest first, by sa_entity_pkey
# probes) so running it needs no further read: PERF, one round trip fewer per job.
# NOTE: the depth is read with no cast that can fail (one undecodable row would fail the whole
# claim, for every worker): a depth that is not 0..99 reads no ancestor, and claim.py then fails
# that job as invalid_options.
# PERF: the entities are looked up by id alone and their org checked on the rows found (a row
# of another org is neither returned nor followed). With `org_id = ...` beside `id = ...` in the
# lookup, statistics taken on a small table let the planner walk sa_entity_org_updated_idx,
# every entity of the org for each job claimed: 200 ms a claim after a few thousand jobs.
_CLAIM_SET = """
, claimed AS (
    UPDATE sa_job j
       SET state = 'running',
           worker_claim = %(claim)s,
           claimed_at = now(),
           started_at = now(),
           running_heartbeat_at = now()
      FROM picked
     WHERE j.id = picked.id
    RETURNING j.id, j.prompt_id, j.org_id, j.created_by, j.priority, j.attempt, j.max_attempts,
              j.execution_options, j.supersedes, j.created_at, j.scheduled_for, j.claimed_at,
              j.throttled_at
)
SELECT claimed.*, (
    WITH RECURSIVE chain AS (
        SELECT id, org_id, kind, parent_id, content, 0 AS depth
          FROM sa_entity
         WHERE id = claimed.prompt_id
        UNION ALL
        SELECT e.id, e.org_id, e.kind, e.parent_id, e.content, chain.depth + 1
          FROM sa_entity e
          JOIN chain ON e.id = chain.parent_id
         WHERE chain.org_id = claimed.org_id
           AND chain.depth < CASE
               WHEN NOT claimed.execution_options ? 'depth' THEN %(default_depth)s
               WHEN jsonb_typeof(claimed.execution_options -> 'depth') = 'number'
                    AND claimed.execution_options ->> 'depth' ~ '^[0-9]{1,2}$'
               THEN (claimed.execution_options ->> 'depth')::int
               ELSE 0
           END
    )
    SELECT jsonb_agg(jsonb_build_object('kind', kind, 'content', content) ORDER BY depth DESC)
      FROM chain
     WHERE org_id = claimed.org_id
) AS context
  FROM claimed
 ORDER BY claimed.priority, claimed.scheduled_for
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

# Fair sharing: within a priority, orgs take turns. `orgs` lists the orgs with queued work by a
# loose index scan of sa_job_org_queued_idx (org_id) WHERE state = 'queued' (0004), one probe
# per org; `heads` reads each org's first `limit` claimable jobs in (priority, scheduled_for)
# order from sa_job_org_claim_idx (org_id, priority, scheduled_for) WHERE state = 'queued'
# (0014), numbering them per priority (`turn`, from the index order: no sort of the backlog);
# `picked` takes, most urgent priority first, every org's first turn, then every org's second,
# ..., oldest first within a turn, up to the caller's free slots, and locks them by sa_job_pkey.
# SKIP LOCKED keeps concurrent claimers disjoint (a head another claimer holds is skipped, not
# replaced: that claim takes fewer, and the next round more).
# Priority aging: among those heads, one due for `aging` seconds or more ranks before every
# priority (`rank` -1), still taking turns with the other orgs' aged heads, so another org's
# low-priority work waits about that long at most behind a flood of urgent work. An org's own
# low-priority jobs stay behind its own more urgent ones (they are not among its heads).
# PERF: reads at most (orgs with queued work) x `limit` index entries and sorts only those, so
# its cost grows with the number of orgs waiting, never with the backlog (tests/test_plans.py,
# bench/fairness.py). Run under JOB_PLAN_SETTINGS.
JOB_CLAIM_MANY = (
    """
WITH RECURSIVE orgs AS (
    (SELECT org_id FROM sa_job WHERE state = 'queued' ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.org_id FROM sa_job j
             WHERE j.state = 'queued' AND j.org_id > orgs.org_id
             ORDER BY j.org_id LIMIT 1)
      FROM orgs
     WHERE orgs.org_id IS NOT NULL
), heads AS (
    SELECT head.id, head.scheduled_for, head.turn,
           CASE WHEN head.scheduled_for <= now() - make_interval(secs => %(aging)s) THEN -1
                ELSE head.priority END AS rank
      FROM orgs
     CROSS JOIN LATERAL (
           SELECT j.id, j.priority, j.scheduled_for,
                  row_number() OVER (PARTITION BY j.priority ORDER BY j.scheduled_for) AS turn
             FROM sa_job j
            WHERE j.state = 'queued'
              AND j.org_id = orgs.org_id
              AND j.priority <= %(ceiling)s
              AND j.scheduled_for <= now()
            ORDER BY j.priority, j.scheduled_for
            LIMIT %(limit)s) AS head
), picked AS (
    SELECT j.id
      FROM sa_job j
     WHERE j.id = ANY (ARRAY(SELECT heads.id FROM heads
                              ORDER BY heads.rank, heads.turn, heads.scheduled_for
                              LIMIT %(limit)s))
       AND j.state IS NOT DISTINCT FROM 'queued'
       FOR UPDATE SKIP LOCKED
)
"""
    + _CLAIM_SET
)


# NOTE: taken (in the claim's transaction, before the claim statement takes its snapshot) only
# when a per-org running cap is set, so capped claims see each other's results and the cap holds
# exactly. Uncapped claims never take it.
JOB_CLAIM_LOCK_ORG_CAPPED = "SELECT pg_advisory_xact_lock(hashtext('sa-core claim org-capped'))"

# served by sa_job_claim_idx for the queued rows and sa_job_worker_claim_idx (worker_claim)
# WHERE state = 'running' for the running counts. Ranks each org's claimable jobs so one
# claim never takes more than an org's remaining room (`org_cap` minus its running jobs).
# PERF: reads every claimable row to rank it, so its cost grows with the backlog whatever the plan
# (the per-org rank needs them all); only used when SA_ORG_MAX_RUNNING is set. It runs under
# JOB_PLAN_SETTINGS too, so it reads them through sa_job_claim_idx, never the table.
JOB_CLAIM_MANY_ORG_CAPPED = (
    """
WITH running AS (
    SELECT org_id, count(*) AS n FROM sa_job WHERE state = 'running' GROUP BY org_id
), ranked AS (
    SELECT q.id, q.priority, q.scheduled_for, coalesce(r.n, 0) AS running,
           row_number() OVER (PARTITION BY q.org_id ORDER BY q.priority, q.scheduled_for) AS rank
      FROM sa_job q LEFT JOIN running r USING (org_id)
     WHERE q.state = 'queued'
       AND q.priority <= %(ceiling)s
       AND q.scheduled_for <= now()
), picked AS (
    SELECT id FROM sa_job
     WHERE id IN (SELECT id FROM ranked WHERE running + rank <= %(org_cap)s)
       AND state = 'queued'
     ORDER BY priority, scheduled_for
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
"""
    + _CLAIM_SET
)

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
# A streamed attempt's partial text (sa_job_partial) goes with its finalize, whatever the
# outcome: only a succeeded attempt's text becomes a response. Every job written gets its ledger
# row, unless no provider call was made (latency_ms null: a job put back because its route was
# already paused). A job's waiting dependents (`after`) are released or ended by trigger
# sa_job_settle_dependents (0015_settle_by_predecessor.sql) in this same statement; `dependents` counts them
# (the statement's snapshot predates the trigger's writes), served by sa_job_after_idx. The
# statement fails as a whole if any insert does (the completer then splits the batch). The
# answer is (id, attempt, to_state, dependents) per job written, with
# the attempt it was claimed at.
# PERF: one statement, so one round trip and one commit for a whole mixed batch.
JOB_SET_STATE_IF_RUNNING_MANY = """
WITH done AS (
    SELECT *
      FROM unnest(%(job_id)s::uuid[], %(claim)s::text[], %(attempt)s::int[],
                  %(to_state)s::text[], %(model)s::text[], %(tokens_in)s::int[],
                  %(tokens_out)s::int[], %(latency_ms)s::int[], %(http_status)s::int[],
                  %(response_id)s::uuid[], %(content)s::text[], %(error_kind)s::text[],
                  %(error_message)s::text[], %(delay)s::float8[], %(spend_attempt)s::bool[])
        AS d(job_id, claim, attempt, to_state, model, tokens_in, tokens_out, latency_ms,
             http_status, response_id, content, error_kind, error_message, delay, spend_attempt)
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
           response_id = done.response_id,
           error_kind = done.error_kind,
           error_message = done.error_message
      FROM done
     WHERE j.id = done.job_id
       AND j.state IS NOT DISTINCT FROM 'running'
       AND j.worker_claim = done.claim
       AND j.attempt = done.attempt
    RETURNING j.id, done.attempt, done.to_state, j.prompt_id, j.org_id, j.created_by
), response AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, parent_id, correlation_id,
                           causation_id, content, source_refs, truth_class, state_class)
    SELECT done.response_id, 'response', job.org_id, job.created_by, job.prompt_id,
           prompt.correlation_id, job.prompt_id, done.content, '[]'::jsonb, 'generated', 'settled'
      FROM job
      JOIN done ON done.job_id = job.id AND done.attempt = job.attempt
      JOIN sa_entity prompt ON prompt.id = job.prompt_id
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
                           http_status, outcome)
    SELECT job.org_id, job.id, done.attempt, done.model, done.tokens_in, done.tokens_out,
           done.latency_ms, done.http_status,
           CASE WHEN job.to_state = 'succeeded' THEN 'succeeded' ELSE done.error_kind END
      FROM job JOIN done ON done.job_id = job.id AND done.attempt = job.attempt
     WHERE done.latency_ms IS NOT NULL
), partial AS (
    DELETE FROM sa_job_partial p USING job WHERE p.job_id = job.id
)
SELECT id, attempt, to_state,
       (SELECT count(*) FILTER (WHERE d.state = 'queued'
                                  AND d.scheduled_for = '9999-12-31 00:00:00+00')
          FROM sa_job d WHERE d.after_job_id = job.id) AS dependents
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
# longer ours (cancelled or reclaimed): the worker abandons them.
JOB_HEARTBEAT_MANY_IF_CLAIMED = """
UPDATE sa_job
   SET running_heartbeat_at = now()
 WHERE id = ANY(%(job_ids)s) AND state IS NOT DISTINCT FROM 'running'
   AND worker_claim = %(claim)s
RETURNING id, attempt
"""

# served by sa_job_worker_claim_idx. Used at shutdown: a job the worker could not finish in
# its grace period goes back to the queue without spending an attempt (not its fault).
JOB_RELEASE_MANY_IF_CLAIMED = """
UPDATE sa_job
   SET state = 'queued', worker_claim = NULL, running_heartbeat_at = NULL,
       scheduled_for = now()
 WHERE state = 'running' AND worker_claim = %(claim)s
RETURNING id, prompt_id, org_id, attempt
"""

# NOTE: the tokens of each attempt that called the provider, oldest first, and a running streamed
# attempt's text so far; a GET shows them with the job. Served by sa_ledger_job_idx (job_id) and
# sa_job_partial_pkey (job_id), one probe each per job.
_READ_COLUMNS = """
, coalesce((SELECT jsonb_agg(jsonb_build_object('attempt', l.attempt, 'tokens_in', l.tokens_in,
                                                'tokens_out', l.tokens_out) ORDER BY l.id)
              FROM sa_ledger l
             WHERE l.job_id = sa_job.id), '[]'::jsonb) AS usage,
(SELECT p.text FROM sa_job_partial p
  WHERE p.job_id = sa_job.id AND p.attempt = sa_job.attempt AND sa_job.state = 'running')
    AS partial_text
"""

# served by sa_job_pkey (id)
JOB_GET = (
    "SELECT "
    + JOB_COLUMNS
    + _READ_COLUMNS
    + """, after_job_id
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
# unchanged job shows its latest state. `org_id` NULL is the operator's cancel (any org); API
# callers always pass theirs.
JOB_CANCEL_IF_ACTIVE = (
    "WITH target AS (SELECT "
    + JOB_COLUMNS
    + """
      FROM sa_job
     WHERE id = %(job_id)s AND (%(org_id)s::bigint IS NULL OR org_id = %(org_id)s)
       FOR UPDATE
), cancelled AS (
    UPDATE sa_job j
       SET state = 'cancelled', finished_at = now(), error_message = %(reason)s
      FROM target
     WHERE j.id = target.id AND target.state IN ('queued', 'running')
    RETURNING j.*
)
SELECT true AS changed, """
    + JOB_COLUMNS
    + """ FROM cancelled
UNION ALL
SELECT false AS changed, """
    + JOB_COLUMNS
    + """ FROM target
 WHERE NOT EXISTS (SELECT 1 FROM cancelled)
"""
)

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
