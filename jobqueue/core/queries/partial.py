"""Statements on sa_job_delta: the text a streamed attempt has produced so far, one row per write."""

__all__ = ["JOB_DELTA_APPEND_MANY_IF_CLAIMED", "JOB_DELTA_LIST_AFTER", "JOB_DELTA_LIST_RANGES",
           "JOB_DELTA_SEQ_LAST", "JOB_DELTA_SWEEP_ENDED"]

# served by sa_job_pkey (id), one probe per job (the guard, in the form queries/job.py explains),
# and sa_job_delta_pkey (seq) with sa_job_delta_job_idx for the inserts. One worker's writes of
# every streaming job for one interval: given as parallel arrays, one element per job with text
# pending, each written only while its job is still running under this claim and attempt. The
# answer is the jobs NOT written: each was cancelled or taken away, and the worker stops its
# provider call at once.
# PERF: one statement (one round trip, one commit) per worker per interval, however many jobs
# stream; a row costs what it holds, never the answer so far. The arrays go in binary (`%(..)b`:
# no quoting of each text element) and the answer is usually empty (no row to build per job).
JOB_DELTA_APPEND_MANY_IF_CLAIMED = """
WITH d AS (
    SELECT *
      FROM unnest(%(job_id)b::uuid[], %(claim)b::text[], %(attempt)b::int[], %(offset)b::int[],
                  %(text)b::text[]) AS d(job_id, claim, attempt, text_offset, text)
), written AS (
    INSERT INTO sa_job_delta (job_id, attempt, "offset", prompt_id, org_id, created_by, text)
    SELECT j.id, j.attempt, d.text_offset, j.prompt_id, j.org_id, j.created_by, d.text
      FROM d
      JOIN sa_job j ON j.id = d.job_id
     WHERE j.state IS NOT DISTINCT FROM 'running'
       AND j.worker_claim = d.claim
       AND j.attempt = d.attempt
    RETURNING job_id
)
SELECT d.job_id FROM d WHERE NOT EXISTS (SELECT 1 FROM written w WHERE w.job_id = d.job_id)
"""

# served by sa_job_delta_pkey (seq): a hub's keyset page of the writes since its last look. A
# row's text comes as its last `tail` characters (a delta carries no more) with its length.
JOB_DELTA_LIST_AFTER = """
SELECT seq, job_id, attempt, "offset", prompt_id, org_id, created_by,
       char_length(text) AS length, right(text, %(tail)s) AS text
  FROM sa_job_delta
 WHERE seq > %(after)s
 ORDER BY seq
 LIMIT %(limit)s
"""

# served by sa_job_delta_job_idx (job_id, attempt, offset), one range per job: the rows a hub
# skipped because their write committed after a later one it had read (two workers' writes
# commit in either order), found when a job's next row starts past what the hub sent.
JOB_DELTA_LIST_RANGES = """
SELECT d.job_id, d."offset", char_length(d.text) AS length, right(d.text, %(tail)s) AS text
  FROM unnest(%(job_id)s::uuid[], %(attempt)s::int[], %(start)s::int[], %(stop)s::int[])
        AS r(job_id, attempt, start, stop)
  JOIN sa_job_delta d ON d.job_id = r.job_id AND d.attempt = r.attempt
                     AND d."offset" >= r.start AND d."offset" < r.stop
 ORDER BY d.job_id, d."offset"
"""

# A hub's starting point: rows written before it started are not sent (GET /jobs shows them).
JOB_DELTA_SEQ_LAST = """
SELECT coalesce(pg_sequence_last_value('sa_job_delta_seq'::regclass), 0) AS last_seq
"""

# The maintenance leader's cleanup of the rows whose attempt ended without its finalize (a
# cancel, a reclaim): sa_job_delta_job_idx lists the attempts with rows, each probed by
# sa_job_pkey. The finalize deletes the rest (queries/job.py).
JOB_DELTA_SWEEP_ENDED = """
WITH ended AS (
    SELECT a.job_id, a.attempt
      FROM (SELECT DISTINCT job_id, attempt FROM sa_job_delta) a
     WHERE NOT EXISTS (SELECT 1 FROM sa_job j
                        WHERE j.id = a.job_id AND j.attempt = a.attempt
                          AND j.state IS NOT DISTINCT FROM 'running')
)
DELETE FROM sa_job_delta d USING ended
 WHERE d.job_id = ended.job_id AND d.attempt = ended.attempt
"""

