"""Statements behind /mission/recent: a page of the event log, and the prompts it names."""

__all__ = [
    "MISSION_PAGE_FOR_ORG",
    "MISSION_PAGE_FOR_USER",
    "MISSION_PROMPTS_LATEST",
    "MISSION_START_FOR_ORG",
    "MISSION_START_FOR_USER",
]

# NOTE: the feed pages sa_job_event, not sa_job.updated_at: an event is written only by a
# transition (a heartbeat writes none), and `upto` is the SSE hub's delivered cursor, below
# which every id is final (service/events/horizon.py), so a page boundary never skips a late commit.

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

# served by sa_entity_pkey (id) for the prompts, then sa_job_prompt_idx (prompt_id, created_at)
# for each prompt's latest job. The org guard keeps another org's ids out whatever is passed.
MISSION_PROMPTS_LATEST = """
SELECT p.id AS prompt_id, p.parent_id, p.content AS text, p.created_at,
       latest.job_id, latest.state, latest.attempt, latest.max_attempts, latest.priority,
       latest.error_kind, latest.error_message, latest.response_id, latest.updated_at,
       r.content AS response_text
  FROM sa_entity p
 CROSS JOIN LATERAL (
       SELECT id AS job_id, state, attempt, max_attempts, priority, error_kind,
              error_message, response_id, updated_at
         FROM sa_job
        WHERE prompt_id = p.id
        ORDER BY created_at DESC, id
        LIMIT 1) latest
  LEFT JOIN sa_entity r ON r.id = latest.response_id
 WHERE p.id = ANY(%(prompt_ids)s) AND p.org_id = %(org_id)s
"""
