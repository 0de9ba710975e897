"""Statements on sa_batch and sa_batch_request: the Batch API's batches and their requests.

The web creates, reads, lists and cancels batches (always naming the caller's org); the keeper
(jobqueue/runtime/batch_keeper.py) leases unfinished batches and, in one transaction per step
that starts with BATCH_LOCK_IF_LEASED, validates lines, feeds them in as jobs, counts the jobs
that ended, and writes the output files.
"""

from jobqueue.core.queries.answer import ANSWER_COLUMNS, ANSWER_JOINS

__all__ = [
    "BATCH_BEGIN_FINALIZING",
    "BATCH_CANCEL_IF_ACTIVE",
    "BATCH_COLUMNS",
    "BATCH_COUNT_ENDED",
    "BATCH_DELETE_FINISHED_MANY",
    "BATCH_END_PENDING_MANY",
    "BATCH_END_VALIDATION",
    "BATCH_FEED_MANY",
    "BATCH_FINISH",
    "BATCH_GET",
    "BATCH_INSERT_IF_ALLOWED",
    "BATCH_JOBS_CANCEL_MANY",
    "BATCH_LEASE_MANY",
    "BATCH_LIST_PAGE",
    "BATCH_LOCK_IF_LEASED",
    "BATCH_ORG_IN_FLIGHT",
    "BATCH_ORG_LOCK",
    "BATCH_ORG_QUEUED",
    "BATCH_OUTPUT_PAGE",
    "BATCH_RELEASE_MANY",
    "BATCH_REQUEST_ERRORS",
    "BATCH_REQUEST_FAIL_NEXT_PENDING",
    "BATCH_REQUEST_INSERT_MANY",
    "BATCH_SET_READ",
    "BATCH_SET_WRITTEN",
]

_ACTIVE = "('validating', 'in_progress', 'cancelling', 'finalizing')"

BATCH_COLUMNS = """
id, org_id, input_file_id, endpoint, completion_window, metadata, status, total, completed,
failed, tokens_in, tokens_out, output_file_id, error_file_id, errors, created_at, in_progress_at,
expires_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, cancelled_at
"""

# NOTE: serializes one org's batch creations around the count of its unfinished batches, as
# ORG_ENQUEUE_LOCK does for queued jobs (a 64-bit key of a namespaced name).
BATCH_ORG_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('sa-core batch org ' || %(org_id)s::text, 0))"
)

# served by sa_file_pkey (id) for the input, sa_batch_active_idx (org_id, created_at) WHERE
# unfinished for the cap (0025_openai_batches.sql). Writes the batch only when its input is a
# complete `batch` file of the org and the org has fewer than `max_active` unfinished batches;
# the answer is always one row, the gate's verdicts with the batch (NULLs when none was written).
BATCH_INSERT_IF_ALLOWED = """
WITH gate AS (
    SELECT EXISTS (SELECT 1 FROM sa_file
                    WHERE id = %(input_file_id)s AND org_id IS NOT DISTINCT FROM %(org_id)s
                      AND complete AND purpose = 'batch') AS input_ok,
           (SELECT count(*) FROM (SELECT 1 FROM sa_batch
                                   WHERE org_id = %(org_id)s AND status IN """ + _ACTIVE + """
                                   LIMIT %(max_active)s) a) < %(max_active)s AS under_cap
), created AS (
    INSERT INTO sa_batch (id, org_id, created_by, input_file_id, endpoint, completion_window,
                          metadata, output_ttl, expires_at)
    SELECT %(id)s, %(org_id)s, %(user_id)s, %(input_file_id)s, %(endpoint)s,
           %(completion_window)s, %(metadata)s, %(output_ttl)s,
           now() + make_interval(secs => %(window)s)
      FROM gate
     WHERE gate.input_ok AND gate.under_cap
    RETURNING """ + BATCH_COLUMNS + """
)
SELECT gate.input_ok, gate.under_cap, created.*
  FROM gate LEFT JOIN created ON true
"""

# served by sa_batch_pkey (id); the org checked on the row found.
BATCH_GET = ("SELECT " + BATCH_COLUMNS + """
  FROM sa_batch
 WHERE id = %(id)s AND org_id IS NOT DISTINCT FROM %(org_id)s
""")

# served by sa_batch_org_created_idx (org_id, created_at, id), walked backwards: the org's
# batches newest first, after the keyset `(after_created, after_id)` (NULL: from the newest).
BATCH_LIST_PAGE = ("SELECT " + BATCH_COLUMNS + """
  FROM sa_batch
 WHERE org_id = %(org_id)s
   AND (%(after_created)s::timestamptz IS NULL
        OR (created_at, id) < (%(after_created)s::timestamptz, %(after_id)s::uuid))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s
""")

# served by sa_batch_pkey (id). A validating or running batch starts cancelling (the keeper
# does the rest); the answer is the row either way, with `changed`, so the route answers 200 or
# 409 from one round trip.
BATCH_CANCEL_IF_ACTIVE = ("""
WITH target AS (
    SELECT """ + BATCH_COLUMNS + """ FROM sa_batch
     WHERE id = %(id)s AND org_id IS NOT DISTINCT FROM %(org_id)s
       FOR UPDATE
), changed AS (
    UPDATE sa_batch b
       SET status = 'cancelling', cancelling_at = now()
      FROM target
     WHERE b.id = target.id AND target.status IN ('validating', 'in_progress')
    RETURNING b.*
)
SELECT true AS changed, """ + BATCH_COLUMNS + """ FROM changed
UNION ALL
SELECT false AS changed, """ + BATCH_COLUMNS + """ FROM target
 WHERE NOT EXISTS (SELECT 1 FROM changed)
""")

# served by sa_batch_active_idx WHERE unfinished: up to `limit` unfinished batches whose lease
# is free or ran out, oldest first, leased to the caller for `seconds`. SKIP LOCKED keeps two
# keepers' leases disjoint (and skips a batch a cancel is writing).
BATCH_LEASE_MANY = """
UPDATE sa_batch b
   SET lease = %(lease)s, lease_until = now() + make_interval(secs => %(seconds)s)
 WHERE b.id IN (SELECT id FROM sa_batch
                 WHERE status IN """ + _ACTIVE + """
                   AND (lease_until IS NULL OR lease_until < now())
                 ORDER BY created_at
                 LIMIT %(limit)s
                   FOR UPDATE SKIP LOCKED)
RETURNING b.*
"""

# served by sa_batch_pkey (id): the batches a keeper is done with for this round.
BATCH_RELEASE_MANY = """
UPDATE sa_batch SET lease = NULL, lease_until = NULL
 WHERE id = ANY(%(ids)s) AND lease IS NOT DISTINCT FROM %(lease)s
"""

# served by sa_batch_pkey (id). The first statement of every keeper step: the row as it is now,
# locked for the step's transaction, only while the caller still holds the lease (a keeper that
# lost it, by stalling past lease_until, finds nothing and does nothing).
BATCH_LOCK_IF_LEASED = """
SELECT *, now() AS db_now FROM sa_batch
 WHERE id = %(id)s AND lease IS NOT DISTINCT FROM %(lease)s
   FOR UPDATE
"""

# served by sa_batch_request_pkey (batch_id, line) and sa_batch_request_custom_id_unique. A page
# of lines, as parallel arrays; a line whose custom_id the batch already has is not written (ON
# CONFLICT), and the caller stores it again as `invalid`. Answers the lines written.
BATCH_REQUEST_INSERT_MANY = """
INSERT INTO sa_batch_request (batch_id, line, custom_id, state, text, options, error)
SELECT %(batch_id)s, r.line, r.custom_id, r.state, r.text, r.options, r.error
  FROM unnest(%(lines)s::int[], %(custom_ids)s::text[], %(states)s::text[], %(texts)s::text[],
              %(options)s::text[]::jsonb[], %(errors)s::text[]::jsonb[])
       AS r(line, custom_id, state, text, options, error)
    ON CONFLICT DO NOTHING
RETURNING line
"""

# served by sa_batch_pkey (id): how far the input was read, and the lines it held.
BATCH_SET_READ = """
UPDATE sa_batch
   SET read_bytes = %(read_bytes)s, read_lines = %(read_lines)s, total = total + %(total)s,
       failed = failed + %(failed)s
 WHERE id = %(id)s
"""

# served by sa_batch_request_pkey (batch_id, line): the first invalid lines, for the `errors` of
# a batch that failed because none of its lines can run.
BATCH_REQUEST_ERRORS = """
SELECT line, error FROM sa_batch_request
 WHERE batch_id = %(id)s AND state IS NOT DISTINCT FROM 'invalid'
 ORDER BY line
 LIMIT %(limit)s
"""

# served by sa_batch_pkey (id). The whole input is read: the batch runs, or fails when no line
# can run or its input vanished (`force_fail`); `errors` then says why.
BATCH_END_VALIDATION = """
UPDATE sa_batch
   SET status = CASE WHEN total > failed AND NOT %(force_fail)s THEN 'in_progress'
                     ELSE 'failed' END,
       in_progress_at = CASE WHEN total > failed AND NOT %(force_fail)s THEN now() END,
       failed_at = CASE WHEN total > failed AND NOT %(force_fail)s THEN NULL ELSE now() END,
       errors = CASE WHEN total > failed AND NOT %(force_fail)s THEN NULL
                     ELSE %(errors)s::jsonb END
 WHERE id = %(id)s AND status IS NOT DISTINCT FROM 'validating'
RETURNING status
"""

# served by sa_batch_active_idx (org_id) and sa_batch_request_fed_idx (batch_id, line) WHERE
# state = 'fed': the org's batch requests whose jobs are queued or running, which the bulk lane
# keeps under SA_BATCH_MAX_QUEUED.
BATCH_ORG_IN_FLIGHT = """
SELECT count(*) AS n
  FROM sa_batch b JOIN sa_batch_request r ON r.batch_id = b.id AND r.state = 'fed'
 WHERE b.org_id = %(org_id)s AND b.status IN """ + _ACTIVE

# served by sa_job_org_queued_idx (org_id) WHERE state = 'queued' (0004_idempotency.sql), run
# under JOB_PLAN_SETTINGS and ORG_ENQUEUE_LOCK as the enqueue's own count: the org's queued
# jobs, counted up to `cap` (SA_ORG_MAX_QUEUED), so the bulk lane leaves its share to the rest.
BATCH_ORG_QUEUED = """
SELECT count(*) AS n
  FROM (SELECT 1 FROM sa_job WHERE org_id = %(org_id)s AND state = 'queued' LIMIT %(cap)s) c
"""

# served by sa_batch_request_pending_idx: the next pending line, which the database refused to
# turn into a job (BATCH_FEED_MANY split down to it), ends invalid, a failed request.
BATCH_REQUEST_FAIL_NEXT_PENDING = """
WITH next AS (
    SELECT line FROM sa_batch_request
     WHERE batch_id = %(id)s AND state = 'pending'
     ORDER BY line
     LIMIT 1
), marked AS (
    UPDATE sa_batch_request r
       SET state = 'invalid', text = NULL, options = NULL, error = %(error)s::jsonb
      FROM next
     WHERE r.batch_id = %(id)s AND r.line = next.line
    RETURNING r.line
)
UPDATE sa_batch SET failed = failed + (SELECT count(*) FROM marked) WHERE id = %(id)s
"""

# served by sa_batch_request_pending_idx (batch_id, line) WHERE state = 'pending'. Turns the
# next `room` pending lines (in line order) into prompts and queued jobs in the bulk lane
# (`priority`), each line marked fed with its job's id, in one statement: a line becomes one job
# once, whatever happens after the commit.
BATCH_FEED_MANY = """
WITH picked AS (
    SELECT r.line, r.text, r.options, gen_random_uuid() AS prompt_id, gen_random_uuid() AS job_id
      FROM sa_batch_request r
     WHERE r.batch_id = %(id)s AND r.state = 'pending'
     ORDER BY r.line
     LIMIT %(room)s
), prompt AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content)
    SELECT prompt_id, 'prompt', %(org_id)s, %(user_id)s, prompt_id, text FROM picked
), job AS (
    INSERT INTO sa_job (id, prompt_id, priority, max_attempts, execution_options, org_id,
                        created_by)
    SELECT job_id, prompt_id, %(priority)s, %(max_attempts)s, options, %(org_id)s, %(user_id)s
      FROM picked
), fed AS (
    UPDATE sa_batch_request r
       SET state = 'fed', job_id = picked.job_id, text = NULL, options = NULL
      FROM picked
     WHERE r.batch_id = %(id)s AND r.line = picked.line
    RETURNING r.line
)
SELECT count(*) AS fed FROM fed
"""

# served by sa_batch_request_fed_idx (batch_id, line) WHERE state = 'fed', then sa_job_pkey per
# job: the batch's jobs that ended since the last look move their lines to succeeded or failed
# (anything but a success is a failure of that request), and the batch's counts with them.
# Answers how many lines moved and how many are still in flight.
BATCH_COUNT_ENDED = """
WITH fed AS (
    SELECT r.line, j.state
      FROM sa_batch_request r JOIN sa_job j ON j.id = r.job_id
     WHERE r.batch_id = %(id)s AND r.state = 'fed'
), moved AS (
    UPDATE sa_batch_request r
       SET state = CASE WHEN fed.state = 'succeeded' THEN 'succeeded' ELSE 'failed' END
      FROM fed
     WHERE r.batch_id = %(id)s AND r.line = fed.line
       AND fed.state IN ('succeeded', 'failed', 'cancelled', 'superseded')
    RETURNING r.state
), counted AS (
    UPDATE sa_batch
       SET completed = completed + (SELECT count(*) FROM moved WHERE state = 'succeeded'),
           failed = failed + (SELECT count(*) FROM moved WHERE state = 'failed')
     WHERE id = %(id)s
)
SELECT (SELECT count(*) FROM moved) AS ended,
       (SELECT count(*) FROM fed) - (SELECT count(*) FROM moved) AS in_flight,
       EXISTS (SELECT 1 FROM sa_batch_request
                WHERE batch_id = %(id)s AND state = 'pending') AS backlog
"""

# served by sa_batch_request_fed_idx, then sa_job_pkey per job. Cancels up to `limit` of the
# batch's jobs that are in one of `states` (the cancel: queued ones, so running calls finish;
# the window's end: running ones too), their lines marked `ends_as` (cancelled or expired).
# Answers each job cancelled with the state it left, for the transition log.
BATCH_JOBS_CANCEL_MANY = """
WITH doomed AS (
    SELECT r.line, j.id, j.prompt_id, j.org_id, j.state
      FROM sa_batch_request r JOIN sa_job j ON j.id = r.job_id
     WHERE r.batch_id = %(id)s AND r.state = 'fed' AND j.state = ANY(%(states)s::text[])
     ORDER BY r.line
     LIMIT %(limit)s
       FOR UPDATE OF j
), cancelled AS (
    UPDATE sa_job j
       SET state = 'cancelled', finished_at = now(), error_message = %(reason)s
      FROM doomed
     WHERE j.id = doomed.id
    RETURNING j.id
), marked AS (
    UPDATE sa_batch_request r
       SET state = %(ends_as)s
      FROM doomed
     WHERE r.batch_id = %(id)s AND r.line = doomed.line
       AND doomed.id IN (SELECT id FROM cancelled)
)
SELECT doomed.id, doomed.prompt_id, doomed.org_id, doomed.state
  FROM doomed JOIN cancelled USING (id)
"""

# served by sa_batch_request_pending_idx: up to `limit` lines never fed end as `ends_as`.
BATCH_END_PENDING_MANY = """
UPDATE sa_batch_request r
   SET state = %(ends_as)s, text = NULL, options = NULL
  FROM (SELECT line FROM sa_batch_request
         WHERE batch_id = %(id)s AND state = 'pending'
         ORDER BY line
         LIMIT %(limit)s) p
 WHERE r.batch_id = %(id)s AND r.line = p.line
"""

# served by sa_batch_pkey (id): every request has ended; the output files are written next.
BATCH_BEGIN_FINALIZING = """
UPDATE sa_batch
   SET status = 'finalizing', ends_as = %(ends_as)s, finalizing_at = now(), written_line = 0,
       tokens_in = 0, tokens_out = 0
 WHERE id = %(id)s
"""

# served by sa_batch_request_pkey (batch_id, line), then sa_job_pkey, sa_entity_pkey and
# sa_ledger_job_idx per line: the next `limit` lines after `after`, with what their answers are
# built from (queries/answer.py).
BATCH_OUTPUT_PAGE = ("""
SELECT r.line, r.custom_id, r.state AS request_state, r.error, r.job_id AS request_job_id, """
                     + ANSWER_COLUMNS + """
  FROM sa_batch_request r
  LEFT JOIN sa_job j ON j.id = r.job_id""" + ANSWER_JOINS + """
 WHERE r.batch_id = %(id)s AND r.line > %(after)s
 ORDER BY r.line
 LIMIT %(limit)s
""")

# served by sa_batch_pkey (id)
BATCH_SET_WRITTEN = """
UPDATE sa_batch
   SET written_line = %(line)s, tokens_in = tokens_in + %(tokens_in)s,
       tokens_out = tokens_out + %(tokens_out)s
 WHERE id = %(id)s
"""

# served by sa_batch_pkey (id): the batch ends as it was to (completed, cancelled, expired),
# with its files (NULL for one left empty).
BATCH_FINISH = """
UPDATE sa_batch
   SET status = ends_as, output_file_id = %(output_file_id)s, error_file_id = %(error_file_id)s,
       completed_at = CASE WHEN ends_as = 'completed' THEN now() END,
       cancelled_at = CASE WHEN ends_as = 'cancelled' THEN now() END,
       expired_at = CASE WHEN ends_as = 'expired' THEN now() END,
       lease = NULL, lease_until = NULL
 WHERE id = %(id)s AND status IS NOT DISTINCT FROM 'finalizing'
"""

# served by sa_batch_created_idx (created_at): the retention's removal of batches finished more
# than `age` seconds ago, `limit` at a time, their request rows with them (ON DELETE CASCADE).
BATCH_DELETE_FINISHED_MANY = """
DELETE FROM sa_batch b
 USING (SELECT id FROM sa_batch
         WHERE created_at <= now() - make_interval(secs => %(age)s)
           AND status NOT IN """ + _ACTIVE + """
           AND coalesce(completed_at, cancelled_at, expired_at, failed_at)
               <= now() - make_interval(secs => %(age)s)
         ORDER BY created_at
         LIMIT %(limit)s) old
 WHERE b.id = old.id
"""
