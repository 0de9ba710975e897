"""Statements on sa_worker: the running workers, as each last said."""

__all__ = ["WORKER_DELETE", "WORKER_DELETE_STALE", "WORKER_LIST_SEEN_SINCE", "WORKER_SEEN"]

# served by sa_worker_pkey (id). A worker's sign of life: its slots and how many are busy.
WORKER_SEEN = """
INSERT INTO sa_worker AS w (id, slots, busy)
VALUES (%(id)s, %(slots)s, %(busy)s)
ON CONFLICT (id) DO UPDATE SET slots = EXCLUDED.slots, busy = EXCLUDED.busy, seen_at = now()
"""

# served by sa_worker_pkey (id). A worker that stops says so.
WORKER_DELETE = "DELETE FROM sa_worker WHERE id = %(id)s"

# NOTE: a sequential read of a handful of rows (one per worker running or lately dead): no index.
# The rows of workers silent for `seconds` (they died without a word).
WORKER_DELETE_STALE = """
DELETE FROM sa_worker WHERE seen_at < now() - make_interval(secs => %(seconds)s)
"""

# NOTE: a sequential read of a handful of rows, as above; the running jobs of each come by
# sa_job_worker_claim_idx (worker_claim) WHERE state = 'running' (0001_core_schema.sql). The
# workers heard from within `seconds`, each with the jobs it holds now (none: idle).
WORKER_LIST_SEEN_SINCE = """
SELECT w.id AS worker_id, split_part(w.id, ':', 1) AS host, w.slots, w.started_at, w.seen_at,
       coalesce(j.slots_in_use, 0) AS slots_in_use, j.last_heartbeat, j.oldest_claim,
       coalesce(j.orgs, '{}') AS orgs
  FROM sa_worker w
  LEFT JOIN LATERAL (
       SELECT count(*) AS slots_in_use, max(running_heartbeat_at) AS last_heartbeat,
              min(claimed_at) AS oldest_claim, array_agg(DISTINCT org_id ORDER BY org_id) AS orgs
         FROM sa_job
        WHERE state = 'running' AND worker_claim = w.id) j ON true
 WHERE w.seen_at >= now() - make_interval(secs => %(seconds)s)
 ORDER BY w.id
"""
