"""Statements behind /mission/recent: a safe cursor and the prompts changed since one."""

__all__ = ["MISSION_CURSOR", "MISSION_RECENT"]

# NOTE: rows are stamped with clock_timestamp() at write time, but become visible only at
# commit. A cursor beyond the start of a transaction that already wrote (holds an xid) and
# has not committed would skip its rows, so the cursor never passes the oldest such start.
# A transaction that has not written yet will stamp its rows later than this moment.
# Must run as its own statement BEFORE the read: a transaction that commits in between
# then falls inside the overlap instead of the gap.
MISSION_CURSOR = """
SELECT least(clock_timestamp(),
             (SELECT min(xact_start)
                FROM pg_stat_activity
               WHERE datname = current_database() AND backend_xid IS NOT NULL)) AS as_of
"""

# served by sa_job_org_updated_idx (org_id, updated_at) for the changed set, then
# sa_job_prompt_idx (prompt_id, created_at) for each prompt's latest job.
# `limit` NULL means no limit (used when the client passed a cursor).
MISSION_RECENT = """
WITH changed AS (
    SELECT DISTINCT prompt_id
      FROM sa_job
     WHERE org_id = %(org_id)s AND updated_at >= %(since)s
)
SELECT p.id AS prompt_id, p.parent_id, p.content AS text, p.created_at,
       latest.job_id, latest.state, latest.attempt, latest.max_attempts, latest.priority,
       latest.error_kind, latest.error_message, latest.response_id, latest.updated_at,
       r.content AS response_text
  FROM changed
  JOIN sa_entity p ON p.id = changed.prompt_id
 CROSS JOIN LATERAL (
       SELECT id AS job_id, state, attempt, max_attempts, priority, error_kind,
              error_message, response_id, updated_at
         FROM sa_job
        WHERE prompt_id = changed.prompt_id
        ORDER BY created_at DESC, id
        LIMIT 1) latest
  LEFT JOIN sa_entity r ON r.id = latest.response_id
 ORDER BY latest.updated_at DESC
 LIMIT %(limit)s
"""
