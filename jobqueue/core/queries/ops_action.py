"""Statements on sa_ops_action: the log of what operators did (0032_ops_console.sql)."""

__all__ = ["OPS_ACTION_ADD_BATCH", "OPS_ACTION_FINISH", "OPS_ACTION_INSERT", "OPS_ACTION_LIST_PAGE"]

# served by sa_ops_action_pkey (id) on insert. An action's row, written before its first change
# (a bulk action) or with its one change (a single job, a route).
OPS_ACTION_INSERT = """
INSERT INTO sa_ops_action (org_id, user_id, action, target, job_count, job_ids, batches,
                           finished_at)
VALUES (%(org_id)s, %(user_id)s, %(action)s, %(target)s, %(job_count)s, %(job_ids)s::uuid[],
        %(batches)s, CASE WHEN %(finished)s THEN now() END)
RETURNING id, at
"""

# served by sa_ops_action_pkey (id). Adds one committed batch to its action, in the batch's own
# transaction: the row never counts a change that rolled back.
OPS_ACTION_ADD_BATCH = """
UPDATE sa_ops_action
   SET job_count = job_count + cardinality(%(job_ids)s::uuid[]),
       job_ids = job_ids || %(job_ids)s::uuid[],
       batches = batches + 1
 WHERE id = %(id)s
"""

# served by sa_ops_action_pkey (id)
OPS_ACTION_FINISH = "UPDATE sa_ops_action SET finished_at = now() WHERE id = %(id)s"

# served by sa_ops_action_pkey (id), walked backwards from the cursor: a page of the log, newest
# first. The ids come cut to the first 20 (the count says how many there were).
OPS_ACTION_LIST_PAGE = """
SELECT id, at, finished_at, org_id, user_id, action, target, job_count, batches,
       job_ids[1:20] AS job_ids
  FROM sa_ops_action
 WHERE id < coalesce(%(before)s::bigint, 9223372036854775807)
 ORDER BY id DESC
 LIMIT %(limit)s
"""
