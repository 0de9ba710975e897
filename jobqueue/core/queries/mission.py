"""Statements behind /mission/recent: a page of the event log, and the prompts it names."""

__all__ = [
    "MISSION_LATEST_FOR_ORG",
    "MISSION_LATEST_FOR_USER",
    "MISSION_ORG_AT_RUNNING_CAP",
    "MISSION_PAGE_FOR_ORG",
    "MISSION_PAGE_FOR_USER",
    "MISSION_PROMPTS_LATEST",
    "MISSION_START_FOR_ORG",
    "MISSION_START_FOR_USER",
]

# NOTE: the feed pages sa_job_event, not sa_job.updated_at: an event is written only by a
# transition (a heartbeat writes none), and `upto` is the SSE hub's delivered cursor, below
# which every id is final (jobqueue/core/horizon.py), so a page boundary never skips a late commit.

# served by sa_job_event_org_user_idx (org_id, created_by, id), 0001_core_schema.sql.
MISSION_PAGE_FOR_USER = """
SELECT id, prompt_id
  FROM sa_job_event
 WHERE org_id = %(org_id)s AND created_by = %(user_id)s
   AND id > %(after)s AND id <= %(upto)s
 ORDER BY id
 LIMIT %(limit)s
"""

# served by sa_job_event_org_idx (org_id, id), 0007_event_org_index.sql.
MISSION_PAGE_FOR_ORG = """
SELECT id, prompt_id
  FROM sa_job_event
 WHERE org_id = %(org_id)s
   AND id > %(after)s AND id <= %(upto)s
 ORDER BY id
 LIMIT %(limit)s
"""

# The snapshot's walk: the viewer's events newest first, below `before` and at most `upto` (the
# SSE hub's cursor), `scan` of them at most; the caller keeps each prompt's first (newest) one.
# served by sa_job_event_org_user_idx (org_id, created_by, id), read backwards from `before`.
MISSION_LATEST_FOR_USER = """
SELECT id, prompt_id
  FROM sa_job_event
 WHERE org_id = %(org_id)s AND created_by = %(user_id)s
   AND id < %(before)s AND id <= %(upto)s
 ORDER BY id DESC
 LIMIT %(scan)s
"""

# served by sa_job_event_org_idx (org_id, id), as MISSION_LATEST_FOR_USER.
MISSION_LATEST_FOR_ORG = """
SELECT id, prompt_id
  FROM sa_job_event
 WHERE org_id = %(org_id)s
   AND id < %(before)s AND id <= %(upto)s
 ORDER BY id DESC
 LIMIT %(scan)s
"""

# Whether the org runs as many jobs as its cap (SA_ORG_MAX_RUNNING) allows, so its due queued
# jobs wait for a slot. served by sa_job_worker_claim_idx (worker_claim) WHERE state =
# 'running' (0001_core_schema.sql): running jobs are few (the workers' slots), read `cap` at most.
MISSION_ORG_AT_RUNNING_CAP = """
SELECT count(*) >= %(cap)s AS at_cap
  FROM (SELECT 1 FROM sa_job
         WHERE org_id = %(org_id)s AND state = 'running'
         LIMIT %(cap)s) running
"""

# A first call's `since` as a cursor: the viewer's last event stamped before it (0 for none).
# served by sa_job_event_org_user_idx (org_id, created_by, id), read backwards from `upto`:
# it stops at the first event older than `since`, so it costs the events after `since`.
MISSION_START_FOR_USER = """
SELECT coalesce((SELECT id
                   FROM sa_job_event
                  WHERE org_id = %(org_id)s AND created_by = %(user_id)s
                    AND id <= %(upto)s AND at < %(since)s
                  ORDER BY id DESC
                  LIMIT 1), 0) AS after
"""

# served by sa_job_event_org_idx (org_id, id), as MISSION_START_FOR_USER.
MISSION_START_FOR_ORG = """
SELECT coalesce((SELECT id
                   FROM sa_job_event
                  WHERE org_id = %(org_id)s
                    AND id <= %(upto)s AND at < %(since)s
                  ORDER BY id DESC
                  LIMIT 1), 0) AS after
"""

# served by sa_entity_pkey (id) for the prompts, then sa_job_prompt_idx (prompt_id, created_at
# DESC, id) for each prompt's latest job, after JOB_PAGE_PLAN_SETTINGS (queries/job.py). The org
# guard keeps another org's ids out whatever is passed.
# NOTE: bounded in bytes as well as count: each text travels cut to `text_chars` characters
# (`*_truncated` says when), and the items, in the order given, stop once the texts before one
# pass `max_bytes` (the first always comes). A text counts for its stored size, at most what
# `text_chars` characters can take in UTF-8, read without reading it (octet_length() of a
# stored text reads its size only); only the items kept have their texts cut and read. `read`
# counts every item found, so the caller knows where the page was cut.
MISSION_PROMPTS_LATEST = """
WITH items AS MATERIALIZED (
SELECT o.ord, p.id AS prompt_id, p.parent_id, p.created_at,
       latest.job_id, latest.state, latest.attempt, latest.max_attempts, latest.priority,
       latest.error_kind, latest.error_message, latest.response_id, latest.updated_at,
       latest.scheduled_for, latest.after_job_id, latest.waiting,
       sum(s.size) OVER (ORDER BY o.ord) - s.size AS bytes_before
  FROM unnest(%(prompt_ids)s::uuid[]) WITH ORDINALITY AS o(id, ord)
  JOIN sa_entity p ON p.id = o.id
 CROSS JOIN LATERAL (
       SELECT id AS job_id, state, attempt, max_attempts, priority, error_kind,
              error_message, response_id, updated_at, scheduled_for, after_job_id, waiting
         FROM sa_job
        WHERE prompt_id = p.id
        ORDER BY created_at DESC, id
        LIMIT 1) latest
  LEFT JOIN sa_entity r ON r.id = latest.response_id
 CROSS JOIN LATERAL (
       SELECT least(octet_length(p.content), 4 * %(text_chars)s)
              -- NOTE: least() skips a NULL, so a job without an answer counts 0, not the cap.
              + least(coalesce(octet_length(r.content), 0), 4 * %(text_chars)s) AS size) s
 WHERE p.org_id = %(org_id)s
)
SELECT i.prompt_id, i.parent_id, t.text, i.created_at, i.job_id, i.state, i.attempt,
       i.max_attempts, i.priority, i.error_kind, i.error_message, i.response_id, i.updated_at,
       i.scheduled_for, i.after_job_id, i.waiting, t.response_text,
       octet_length(p.content) > octet_length(t.text) AS text_truncated,
       coalesce(octet_length(r.content) > octet_length(t.response_text), false)
           AS response_truncated,
       (SELECT count(*) FROM items) AS read
  FROM items i
  JOIN sa_entity p ON p.id = i.prompt_id
  LEFT JOIN sa_entity r ON r.id = i.response_id
 CROSS JOIN LATERAL (SELECT substr(p.content, 1, %(text_chars)s) AS text,
                            substr(r.content, 1, %(text_chars)s) AS response_text) t
 WHERE i.bytes_before < %(max_bytes)s
 ORDER BY i.ord
"""
