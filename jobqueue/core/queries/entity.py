"""Statements on sa_entity (prompts and responses) and the enqueue that writes a prompt with its job."""

__all__ = ["ENTITY_GET", "PROMPT_INSERT_WITH_JOB", "PROMPT_INSERT_WITH_JOB_MANY"]

# NOTE: one statement, so enqueue costs one round trip and is atomic in autocommit mode: the
# prompt, its job and the idempotency key row are written together or not at all. The caller
# (`org_id`, `user_id`) was authenticated before (service.auth): this statement trusts it.
# served by sa_entity_pkey (id) for the
# parent, sa_job_org_queued_idx (org_id) WHERE state = 'queued' (0004_idempotency.sql) for the
# cap, sa_idempotency_key_pkey for the key.
# - The parent must exist in the caller's org; a prompt inherits its thread's correlation id.
# - The cap counts the org's queued jobs, stopping at `max_queued` (0 = no cap: LIMIT 0 counts
#   nothing). Exact only under ORG_ENQUEUE_LOCK, which the caller takes first when a cap is set.
# - With a key (`idempotency_key` not NULL), the prompt and job are written only if the key row
#   is: a new key, or one older than `key_ttl` seconds (expired: taken over). A live key, even one
#   a concurrent transaction is still writing (ON CONFLICT waits for it), writes nothing; the
#   caller then reads the key row (IDEMPOTENCY_KEY_GET_LIVE) and replays or refuses.
# - A scheduled prompt (`run_at`, or `delay_seconds` from the database's now) waits queued with
#   that scheduled_for; the claim skips it until then (sa_job_claim_idx orders by it).
# - With `after` (a job id, or a prompt id meaning its latest job; sa_job_pkey or
#   sa_job_prompt_idx), the predecessor must be of the org, not failed, cancelled or superseded
#   (`after_state`), and fewer than `max_chain_depth` links from its chain's first job
#   (`depth_ok`). Still active: the job is `waiting` until the predecessor's end settles it
#   (jobqueue/engine/chains.py); the predecessor is locked FOR SHARE, so its end commits either
#   before this statement reads it or after this job exists, and the settling sees the job.
#   Already succeeded: it is due at once and, unless `parent_id` is given, its prompt continues
#   the predecessor's thread (the response is its parent). Either way it runs no sooner than
#   `run_at` or `delay_seconds` ask.
# The answer is always one row: the gate's verdicts and the job's columns (NULL when nothing was
# written), so the caller tells "unknown parent", "queue full" and "key taken" apart.
# PERF: the org checks on rows found by id take the guard form queries/job.py explains: with
# `org_id = ...` the planner may walk every row of the org (an index led by org_id) to find one
# id, as it did for the parent on a table never analyzed.
PROMPT_INSERT_WITH_JOB = """
WITH target AS (
    SELECT coalesce(
        (SELECT j.id FROM sa_job j
          WHERE j.id = %(after)s AND j.org_id IS NOT DISTINCT FROM %(org_id)s),
        (SELECT j.id FROM sa_job j
          WHERE j.prompt_id = %(after)s AND j.org_id IS NOT DISTINCT FROM %(org_id)s
          ORDER BY j.created_at DESC
          LIMIT 1)) AS id
), pred AS (
    SELECT j.id, j.state, j.response_id, j.chain_depth
      FROM sa_job j
     WHERE j.id = (SELECT id FROM target)
       FOR SHARE
), parent AS (
    SELECT e.id, e.correlation_id
      FROM sa_entity e
     WHERE e.id = coalesce(%(parent_id)s::uuid,
                           (SELECT response_id FROM pred WHERE state = 'succeeded'))
       AND e.org_id IS NOT DISTINCT FROM %(org_id)s
), gate AS (
    SELECT %(org_id)s::bigint AS org_id, %(user_id)s::bigint AS user_id,
           (%(parent_id)s::uuid IS NULL OR EXISTS (SELECT 1 FROM parent)) AS parent_ok,
           (SELECT state FROM pred) AS after_state,
           coalesce((SELECT chain_depth FROM pred) < %(max_chain_depth)s, true) AS depth_ok,
           (%(max_queued)s = 0
            OR (SELECT count(*)
                  FROM (SELECT 1
                          FROM sa_job
                         WHERE org_id = %(org_id)s AND state = 'queued'
                         LIMIT %(max_queued)s) AS capped) < %(max_queued)s) AS under_cap
), idempotency AS (
    INSERT INTO sa_idempotency_key AS k (org_id, user_id, key, request_hash, prompt_id, job_id)
    SELECT gate.org_id, gate.user_id, %(idempotency_key)s, %(request_hash)s, %(prompt_id)s,
           %(job_id)s
      FROM gate
     WHERE gate.parent_ok AND gate.under_cap AND gate.depth_ok
       AND %(idempotency_key)s::text IS NOT NULL
       AND (%(after)s::uuid IS NULL
            OR gate.after_state IN ('queued', 'running', 'succeeded'))
        ON CONFLICT (org_id, user_id, key) DO UPDATE
       SET request_hash = excluded.request_hash, prompt_id = excluded.prompt_id,
           job_id = excluded.job_id, created_at = excluded.created_at
     WHERE k.created_at <= now() - make_interval(secs => %(key_ttl)s)
    RETURNING k.key
), prompt AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, parent_id, correlation_id,
                           causation_id, content)
    SELECT %(prompt_id)s, 'prompt', gate.org_id, gate.user_id, (SELECT id FROM parent),
           coalesce((SELECT correlation_id FROM parent), %(prompt_id)s),
           (SELECT id FROM parent), %(text)s
      FROM gate
     WHERE gate.parent_ok AND gate.under_cap AND gate.depth_ok
       AND (%(after)s::uuid IS NULL
            OR gate.after_state IN ('queued', 'running', 'succeeded'))
       AND (%(idempotency_key)s::text IS NULL OR EXISTS (SELECT 1 FROM idempotency))
    RETURNING id, org_id, created_by
), job AS (
    INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id,
                        created_by, supersedes, scheduled_for, after_job_id, waiting, chain_depth)
    SELECT %(job_id)s, prompt.id, %(priority)s, %(max_attempts)s, %(options)s, prompt.org_id,
           prompt.created_by, NULL,
           coalesce(%(run_at)s::timestamptz,
                    now() + make_interval(secs => coalesce(%(delay_seconds)s::int, 0))),
           pred.id, coalesce(pred.state IN ('queued', 'running'), false),
           coalesce(pred.chain_depth + 1, 0)
      FROM prompt
      LEFT JOIN pred ON true
    RETURNING id, prompt_id, state, created_at, scheduled_for, waiting
)
SELECT gate.parent_ok, gate.under_cap, gate.after_state, gate.depth_ok, job.id, job.prompt_id,
       job.state, job.created_at, job.scheduled_for, job.waiting
  FROM gate
  LEFT JOIN job ON true
"""

# NOTE: PROMPT_INSERT_WITH_JOB for a whole batch, in one statement: the items come as parallel
# arrays (unnest keeps their order), and the gate is the batch's: every parent must exist in the
# caller's org and the whole batch fit under the cap, or nothing is written (all-or-nothing).
# served by sa_entity_pkey (id) for the parents, sa_job_org_queued_idx (org_id) WHERE state =
# 'queued' for the cap, sa_idempotency_key_pkey for the key (0004_idempotency.sql).
# - `bad_parents` lists the 0-based positions whose parent_id names no entity of the org.
# - The key row holds every item's ids (batch_prompt_ids, batch_job_ids; 0014_workflows.sql).
# The answer is one row: the gate's verdicts and how many jobs were written (0 or all).
# PERF: the arrays go in binary (`%(..)b`, as queries/job.py's finalize explains): the web's
# group submit (jobqueue/engine/submit_group.py) writes every POST /prompt through this one.
PROMPT_INSERT_WITH_JOB_MANY = """
WITH item AS (
    SELECT i.*
      FROM unnest(%(prompt_ids)b::uuid[], %(job_ids)b::uuid[], %(parent_ids)b::uuid[],
                  %(texts)b::text[], %(priorities)b::int[], %(max_attempts)b::int[],
                  %(options)b::text[]::jsonb[], %(run_ats)b::timestamptz[], %(delays)b::int[])
           WITH ORDINALITY AS i(prompt_id, job_id, parent_id, text, priority, max_attempts,
                                options, run_at, delay_seconds, n)
), parent AS (
    SELECT e.id, e.correlation_id
      FROM (SELECT DISTINCT parent_id FROM item WHERE parent_id IS NOT NULL) AS named
      JOIN sa_entity e ON e.id = named.parent_id
     WHERE e.org_id IS NOT DISTINCT FROM %(org_id)s
), gate AS (
    SELECT %(org_id)s::bigint AS org_id, %(user_id)s::bigint AS user_id,
           (SELECT array_agg(item.n - 1 ORDER BY item.n)
              FROM item
             WHERE item.parent_id IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM parent WHERE parent.id = item.parent_id))
               AS bad_parents,
           (%(max_queued)s = 0
            OR (SELECT count(*)
                  FROM (SELECT 1
                          FROM sa_job
                         WHERE org_id = %(org_id)s AND state = 'queued'
                         LIMIT %(max_queued)s) AS capped)
               + cardinality(%(job_ids)b::uuid[]) <= %(max_queued)s) AS under_cap
), idempotency AS (
    INSERT INTO sa_idempotency_key AS k (org_id, user_id, key, request_hash, prompt_id, job_id,
                                         batch_prompt_ids, batch_job_ids)
    SELECT gate.org_id, gate.user_id, %(idempotency_key)s, %(request_hash)s,
           (%(prompt_ids)b::uuid[])[1], (%(job_ids)b::uuid[])[1], %(prompt_ids)b, %(job_ids)b
      FROM gate
     WHERE gate.bad_parents IS NULL AND gate.under_cap
       AND %(idempotency_key)s::text IS NOT NULL
        ON CONFLICT (org_id, user_id, key) DO UPDATE
       SET request_hash = excluded.request_hash, prompt_id = excluded.prompt_id,
           job_id = excluded.job_id, batch_prompt_ids = excluded.batch_prompt_ids,
           batch_job_ids = excluded.batch_job_ids, created_at = excluded.created_at
     WHERE k.created_at <= now() - make_interval(secs => %(key_ttl)s)
    RETURNING k.key
), prompt AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, parent_id, correlation_id,
                           causation_id, content)
    SELECT item.prompt_id, 'prompt', gate.org_id, gate.user_id, item.parent_id,
           coalesce(parent.correlation_id, item.prompt_id), item.parent_id, item.text
      FROM item
      CROSS JOIN gate
      LEFT JOIN parent ON parent.id = item.parent_id
     WHERE gate.bad_parents IS NULL AND gate.under_cap
       AND (%(idempotency_key)s::text IS NULL OR EXISTS (SELECT 1 FROM idempotency))
    RETURNING id
), job AS (
    INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id,
                        created_by, supersedes, scheduled_for)
    SELECT item.job_id, item.prompt_id, item.priority, item.max_attempts, item.options,
           %(org_id)s, %(user_id)s, NULL,
           coalesce(item.run_at, now() + make_interval(secs => coalesce(item.delay_seconds, 0)))
      FROM item
      JOIN prompt ON prompt.id = item.prompt_id
    RETURNING scheduled_for
)
SELECT gate.bad_parents, gate.under_cap, (SELECT count(*) FROM job) AS written, now() AS created_at,
       (SELECT array_agg(DISTINCT extract(epoch FROM scheduled_for)::float8)
          FROM job WHERE scheduled_for > now()) AS dues
  FROM gate
"""

# served by sa_entity_pkey (id)
ENTITY_GET = """
SELECT id, kind, parent_id, correlation_id, causation_id, content, source_refs,
       truth_class, state_class, created_by, created_at, updated_at
  FROM sa_entity
 WHERE id = %(id)s AND org_id = %(org_id)s
"""
