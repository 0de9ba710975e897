"""What an OpenAI answer is built from: a job with its response text and its last call's usage.

One column list serves the chat route (a job) and a batch's output files (a page of them), so
both answer from the same figures.
"""

__all__ = ["ANSWER_COLUMNS", "ANSWER_JOINS", "JOB_ANSWER_GET"]

# NOTE: the response by sa_entity_pkey (id), the last attempt's ledger row by sa_ledger_job_idx
# (job_id): the tokens of the call that produced the answer (or of the last one that failed).
# PERF: ordered by attempt first, which no index serves: `ORDER BY id DESC LIMIT 1` alone let the
# planner walk sa_ledger_pkey backwards over every job's rows (3 s for a page of 50 lines of a
# 50,000-line batch); a job's own few rows, probed and sorted, are all it reads now.
ANSWER_COLUMNS = """
j.id AS job_id, j.created_at, j.state, j.execution_options, j.error_kind, j.error_message,
e.content AS response_text, l.tokens_in, l.tokens_out, l.model AS used_model
"""
ANSWER_JOINS = """
  LEFT JOIN sa_entity e ON e.id = j.response_id
  LEFT JOIN LATERAL (SELECT tokens_in, tokens_out, model FROM sa_ledger
                      WHERE job_id = j.id ORDER BY attempt DESC, id DESC LIMIT 1) l ON true
"""

# served by sa_job_pkey (id); the org is checked on the row found (queries/job.py explains why).
# A running streamed attempt's text so far (its rows in order, by sa_job_delta_job_idx), for a
# stream that attaches late.
JOB_ANSWER_GET = ("SELECT " + ANSWER_COLUMNS + """, j.attempt,
       (SELECT string_agg(p.text, '' ORDER BY p."offset") FROM sa_job_delta p
         WHERE p.job_id = j.id AND p.attempt = j.attempt AND j.state = 'running') AS partial_text
  FROM sa_job j""" + ANSWER_JOINS + """
 WHERE j.id = %(job_id)s AND j.org_id IS NOT DISTINCT FROM %(org_id)s
""")
