"""Statements of the maintenance role: the leader's advisory lock and the stuck-job reclaim."""

__all__ = [
    "JOB_LIST_RECLAIMABLE_PAGE",
    "JOB_RECLAIM_MANY_IF_CLAIMED_AND_STALE",
    "MAINTENANCE_SET_KEEPALIVES",
    "MAINTENANCE_SET_STATEMENT_TIMEOUT",
    "MAINTENANCE_TRY_LOCK",
    "MAINTENANCE_UNLOCK",
]

# NOTE: a fixed key ('sa-core maintenance'), shared by every long-running worker, so exactly
# one session in the database holds the maintenance role. Session-level: it lives as long as
# the connection that took it, and Postgres drops it when that backend ends.
MAINTENANCE_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtext('sa-core maintenance')) AS locked"
MAINTENANCE_UNLOCK = "SELECT pg_advisory_unlock(hashtext('sa-core maintenance')) AS unlocked"

# NOTE: the leader's session-level server-side TCP keepalives, so Postgres notices a vanished
# leader host (and drops its advisory lock) within about a minute instead of the kernel's default
# two hours. set_config(..., false) is SET for the session; each answer is the value the server
# then shows, which for these settings is read back from the socket (0 on a Unix socket, where
# they do not apply). Values as text: seconds, a count, and milliseconds for tcp_user_timeout.
MAINTENANCE_SET_KEEPALIVES = """
SELECT set_config('tcp_keepalives_idle', %(idle)s, false) AS tcp_keepalives_idle,
       set_config('tcp_keepalives_interval', %(interval)s, false) AS tcp_keepalives_interval,
       set_config('tcp_keepalives_count', %(count)s, false) AS tcp_keepalives_count,
       set_config('tcp_user_timeout', %(user_timeout_ms)s, false) AS tcp_user_timeout
"""

# NOTE: set_config(..., true) is SET LOCAL with a bindable value (SET takes no parameters);
# it lasts until the end of the current transaction. Value in milliseconds, as text.
MAINTENANCE_SET_STATEMENT_TIMEOUT = "SELECT set_config('statement_timeout', %(timeout_ms)s, true)"

# served by sa_job_heartbeat_idx (running_heartbeat_at) WHERE state = 'running'
# (0001_core_schema.sql), keyset-paged on (running_heartbeat_at, id). Reads the running jobs
# that may have to leave `running` (spec §5/§8): heartbeat older than `stale_after`, or attempt
# started `stuck_after` ago or more, heartbeat or not. jobqueue/core/policy.py's decide_reclaim
# decides each one; this statement only narrows the read to a superset of what it acts on.
# A quarantined job (sa_job_quarantine_pkey, one probe per candidate) is left out: no write to it
# succeeds (jobqueue/engine/quarantine.py).
# NOTE: no lock is taken: the write (JOB_RECLAIM_MANY_IF_CLAIMED_AND_STALE) re-checks every
# condition against `as_of`, so a job that finished, was re-claimed or heartbeated meanwhile is
# left alone. `now` moves only the comparisons (tests pass a future instant).
# PERF: a job stuck while heartbeating sits at the fresh end of the index, so a round scans
# every running job's index entry; their number is bounded by the workers' slots.
JOB_LIST_RECLAIMABLE_PAGE = """
SELECT id, org_id, worker_claim, attempt, max_attempts, started_at,
       running_heartbeat_at AS last_heartbeat,
       coalesce(%(now)s::timestamptz, now()) AS as_of
  FROM sa_job
 WHERE state = 'running'
   AND (%(after_heartbeat)s::timestamptz IS NULL
        OR (running_heartbeat_at, id) > (%(after_heartbeat)s::timestamptz, %(after_id)s::uuid))
   AND (running_heartbeat_at < coalesce(%(now)s::timestamptz, now())
                               - make_interval(secs => %(stale_after)s)
        OR started_at <= coalesce(%(now)s::timestamptz, now())
                         - make_interval(secs => %(stuck_after)s))
   AND NOT EXISTS (SELECT 1 FROM sa_job_quarantine q WHERE q.job_id = sa_job.id)
 ORDER BY running_heartbeat_at, id
 LIMIT %(limit)s
"""

# served by sa_job_pkey (id) alone: the state guard takes the form queries/job.py explains.
# Applies one page of decide_reclaim's decisions, mixed requeues and failures, in one statement.
# Each job is guarded on its own: still running under the same worker_claim and attempt, and still
# stale or stuck at `as_of` (the instant the decision was made against), so a heartbeat or a
# finalize that landed after the read wins. The stamps written are the real now(), so a requeued
# job is claimable at once.
JOB_RECLAIM_MANY_IF_CLAIMED_AND_STALE = """
UPDATE sa_job j
   SET state = d.to_state,
       attempt = CASE WHEN d.to_state = 'queued' THEN j.attempt + 1 ELSE j.attempt END,
       worker_claim = CASE WHEN d.to_state = 'queued' THEN NULL ELSE j.worker_claim END,
       running_heartbeat_at = CASE WHEN d.to_state = 'queued' THEN NULL
                                   ELSE j.running_heartbeat_at END,
       scheduled_for = CASE WHEN d.to_state = 'queued' THEN now() ELSE j.scheduled_for END,
       finished_at = CASE WHEN d.to_state = 'queued' THEN NULL ELSE now() END,
       error_kind = d.error_kind,
       error_message = d.error_message
  FROM unnest(%(job_ids)s::uuid[], %(claims)s::text[], %(attempts)s::int[],
              %(to_states)s::text[], %(error_kinds)s::text[], %(error_messages)s::text[])
       AS d(job_id, claim, attempt, to_state, error_kind, error_message)
 WHERE j.id = d.job_id
   AND j.state IS NOT DISTINCT FROM 'running'
   AND j.worker_claim = d.claim
   AND j.attempt = d.attempt
   AND (j.running_heartbeat_at < %(as_of)s::timestamptz - make_interval(secs => %(stale_after)s)
        OR j.started_at <= %(as_of)s::timestamptz - make_interval(secs => %(stuck_after)s))
RETURNING j.id, j.prompt_id, j.org_id, j.state, j.attempt
"""
