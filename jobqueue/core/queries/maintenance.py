"""Statements of the maintenance role: the leader's advisory lock and the stuck-job reclaim."""

__all__ = [
    "JOB_RECLAIM_MANY_IF_STALE",
    "MAINTENANCE_SET_STATEMENT_TIMEOUT",
    "MAINTENANCE_TRY_LOCK",
    "MAINTENANCE_UNLOCK",
]

# NOTE: a fixed key ('sa-core maintenance'), shared by every long-running worker, so exactly
# one session in the database holds the maintenance role. Session-level: it lives as long as
# the connection that took it, and Postgres drops it when that backend ends.
MAINTENANCE_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtext('sa-core maintenance')) AS locked"
MAINTENANCE_UNLOCK = "SELECT pg_advisory_unlock(hashtext('sa-core maintenance')) AS unlocked"

# NOTE: set_config(..., true) is SET LOCAL with a bindable value (SET takes no parameters);
# it lasts until the end of the current transaction. Value in milliseconds, as text.
MAINTENANCE_SET_STATEMENT_TIMEOUT = "SELECT set_config('statement_timeout', %(timeout_ms)s, true)"

# served by sa_job_heartbeat_idx (running_heartbeat_at) WHERE state = 'running'
# (0001_core_schema.sql): the scan starts at the oldest heartbeat and stops after `limit`.
# Spec §5/§8: a running job whose heartbeat is older than `stale_after` goes back to the
# queue (attempt + 1, error_kind 'worker_crash') while it has attempts left and this attempt
# started less than `stuck_after` ago; otherwise it fails as 'stuck'.
# NOTE: `now` moves only the comparisons (tests pass a future instant); the stamps written
# are the real now(), so a requeued job is claimable at once. SKIP LOCKED passes over a row a
# worker is finalizing right now: if it finishes, it is no longer running; if not, the next
# page or round takes it. The caller pages until a short page: every full page moves its rows
# out of 'running', so the loop always ends.
JOB_RECLAIM_MANY_IF_STALE = """
WITH picked AS (
    SELECT id, worker_claim AS lost_claim, running_heartbeat_at AS last_heartbeat,
           (attempt < max_attempts
            AND started_at > coalesce(%(now)s::timestamptz, now())
                             - make_interval(secs => %(stuck_after)s)) AS requeue
      FROM sa_job
     WHERE state = 'running'
       AND running_heartbeat_at < coalesce(%(now)s::timestamptz, now())
                                  - make_interval(secs => %(stale_after)s)
     ORDER BY running_heartbeat_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE sa_job j
   SET state = CASE WHEN picked.requeue THEN 'queued' ELSE 'failed' END,
       attempt = CASE WHEN picked.requeue THEN j.attempt + 1 ELSE j.attempt END,
       worker_claim = CASE WHEN picked.requeue THEN NULL ELSE j.worker_claim END,
       running_heartbeat_at = CASE WHEN picked.requeue THEN NULL ELSE j.running_heartbeat_at END,
       scheduled_for = CASE WHEN picked.requeue THEN now() ELSE j.scheduled_for END,
       finished_at = CASE WHEN picked.requeue THEN NULL ELSE now() END,
       error_kind = CASE WHEN picked.requeue THEN 'worker_crash' ELSE 'stuck' END,
       error_message = CASE
           WHEN picked.requeue THEN
               'worker ' || picked.lost_claim || ' lost the job: no heartbeat since '
               || picked.last_heartbeat::text || '; attempt ' || j.attempt || ' of '
               || j.max_attempts || ' requeued'
           WHEN j.attempt >= j.max_attempts THEN
               'stuck: worker ' || picked.lost_claim || ' stopped heartbeating at '
               || picked.last_heartbeat::text || ' on the last attempt (' || j.attempt
               || ' of ' || j.max_attempts || ')'
           ELSE
               'stuck: worker ' || picked.lost_claim || ' stopped heartbeating at '
               || picked.last_heartbeat::text || '; attempt ' || j.attempt || ' started at '
               || j.started_at::text || ', longer ago than the stuck limit'
       END
  FROM picked
 WHERE j.id = picked.id
   AND j.state = 'running'
RETURNING j.id, j.prompt_id, j.org_id, j.state, j.attempt, j.max_attempts,
          picked.lost_claim, picked.last_heartbeat
"""
