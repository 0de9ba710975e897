"""Statements on sa_job_partial: the text a streamed attempt has produced so far."""

__all__ = ["JOB_PARTIAL_APPEND_IF_CLAIMED", "JOB_PARTIAL_LIST_CHANGED", "JOB_PARTIAL_SEQ_LAST"]

# served by sa_job_pkey (id) for the guard (in the form queries/job.py explains) and
# sa_job_partial_pkey (job_id) for the upsert. Appends a streamed attempt's new text, only while
# the job is still running under this claim and attempt: no row back means the job was cancelled
# or taken away, and the worker stops the provider call at once. A new attempt's first write
# replaces the previous attempt's text.
JOB_PARTIAL_APPEND_IF_CLAIMED = """
INSERT INTO sa_job_partial AS p (job_id, prompt_id, org_id, created_by, attempt, text)
SELECT j.id, j.prompt_id, j.org_id, j.created_by, j.attempt, %(text)s
  FROM sa_job j
 WHERE j.id = %(job_id)s AND j.state IS NOT DISTINCT FROM 'running'
   AND j.worker_claim = %(claim)s
   AND j.attempt = %(attempt)s
ON CONFLICT (job_id) DO UPDATE
   SET text = CASE WHEN p.attempt = EXCLUDED.attempt THEN p.text || EXCLUDED.text
                   ELSE EXCLUDED.text END,
       attempt = EXCLUDED.attempt,
       seq = nextval('sa_job_partial_seq')
RETURNING p.seq
"""

# served by sa_job_partial_seq_idx (seq): the SSE hub's read of what grew since its last look.
JOB_PARTIAL_LIST_CHANGED = """
SELECT job_id, prompt_id, org_id, created_by, attempt, text, seq
  FROM sa_job_partial
 WHERE seq > %(after)s
 ORDER BY seq
"""

# The hub's starting point: text written before it started is sent (whole, from offset 0) only
# when its job writes again; meanwhile GET /jobs shows it.
JOB_PARTIAL_SEQ_LAST = """
SELECT coalesce(pg_sequence_last_value('sa_job_partial_seq'::regclass), 0) AS last_seq
"""
